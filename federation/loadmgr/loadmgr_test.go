package loadmgr

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/mpa"
)

const period = 5 * time.Second

func testConfig() Config {
	return Config{Period: period, SettleEvery: time.Minute}
}

func terms(edit func(*federation.ProposeRequest)) federation.ProposeRequest {
	pmin, pmax := mpa.SuggestedPrices(mpa.DefaultUtilisation)
	r := federation.ProposeRequest{PriceMin: pmin, PriceMax: pmax, MaxLoad: 6, ValidFor: 24 * time.Hour, Direction: "out", Notice: 30 * time.Second}
	if edit != nil {
		edit(&r)
	}
	return r
}

// Load moves only to a partner holding an active contract that allows the
// move, and only when the owner gains (its marginal cost exceeds price +
// migration cost) and the partner gains (its marginal cost with the load
// stays below the price). Every org has 10 cores (capacity 8 at U 0.8);
// gamma is idle and has no contract, so it must never receive anything.
func TestMovesOnlyToPartnersAndOnlyWhenBothGain(t *testing.T) {
	for _, tc := range []struct {
		name          string
		alpha, beta   int // tasks of load 1
		class         string
		edit          func(*federation.ProposeRequest)
		pending       bool
		before        time.Duration // clock advance after the contract
		wantMoves     bool
		wantRefusedBy string // a word in the last decisions when nothing moves
	}{
		{name: "overloaded owner, idle partner", alpha: 12, beta: 2, wantMoves: true},
		{name: "partner as loaded as the owner", alpha: 12, beta: 12, wantRefusedBy: "not profitable"},
		{name: "owner below the offer line", alpha: 7, beta: 0},
		{name: "direction in: only beta's tasks may move", alpha: 12, beta: 0, edit: func(r *federation.ProposeRequest) { r.Direction = "in" }},
		{name: "contract expired", alpha: 12, beta: 0, edit: func(r *federation.ProposeRequest) { r.ValidFor = time.Hour }, before: 2 * time.Hour},
		{name: "task class excluded", alpha: 12, beta: 0, class: "netmon", edit: func(r *federation.ProposeRequest) { r.Tasks = []string{"reports"} }},
		{name: "max load below every task", alpha: 12, beta: 0, edit: func(r *federation.ProposeRequest) { r.MaxLoad = 0.5 }},
		{name: "contract not accepted", alpha: 12, beta: 0, pending: true},
		{name: "fixed price below the partner's marginal cost", alpha: 12, beta: 2,
			edit: func(r *federation.ProposeRequest) { r.PriceMin, r.PriceMax = 1.5, 1.5 }, wantRefusedBy: "not profitable"},
		{name: "fixed price above the owner's marginal cost", alpha: 12, beta: 0,
			edit: func(r *federation.ProposeRequest) { r.PriceMin, r.PriceMax = 5000, 5000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10, "gamma": 10})
			class := tc.class
			if class == "" {
				class = "q"
			}
			f.w.addTasks("alpha", tc.alpha, 1, class)
			f.w.addTasks("beta", tc.beta, 1, "q")
			var id string
			req := terms(tc.edit)
			if tc.pending {
				ctx := context.Background()
				for _, p := range [][2]string{{"alpha", "beta"}, {"beta", "alpha"}} {
					if err := f.orgs[p[0]].Pin(ctx, p[1], f.orgs[p[1]].PublicKey()); err != nil {
						t.Fatal(err)
					}
				}
				req.To = "beta"
				doc, err := f.orgs["alpha"].Propose(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				id = doc.Terms.ID
			} else {
				id = f.contract("alpha", "beta", req)
			}
			f.advance(tc.before)
			for range 4 {
				f.step(period)
			}
			moves := f.movers["alpha"].moves()
			if tc.wantMoves != (len(moves) > 0) {
				t.Fatalf("moves %v, want some: %v; alpha decided %q", moves, tc.wantMoves, f.mgrs["alpha"].Status().Last)
			}
			for _, mv := range moves {
				if !strings.HasPrefix(mv, "move ") || !strings.HasSuffix(mv, " beta "+id) {
					t.Fatalf("move %q is not to beta under %s", mv, id)
				}
			}
			if got := f.w.running("gamma"); got != 0 {
				t.Fatalf("gamma, without a contract, runs load %v", got)
			}
			if len(f.movers["beta"].moves()) != 0 || len(f.movers["gamma"].moves()) != 0 {
				t.Fatalf("beta or gamma moved tasks: %v %v", f.movers["beta"].moves(), f.movers["gamma"].moves())
			}
			// Every move is in both ledgers, co-signed, and both verify.
			for _, org := range []string{"alpha", "beta"} {
				if n := len(f.records(org, ledger.KindMove)); n != len(moves) {
					t.Fatalf("%s's ledger holds %d moves, the mover made %d", org, n, len(moves))
				}
				es, _ := f.orgs[org].Entries()
				if rep := ledger.Verify(es, f.keys()); !rep.Valid {
					t.Fatalf("%s's ledger: %+v", org, rep)
				}
			}
			if !tc.wantMoves {
				if tc.wantRefusedBy != "" && !strings.Contains(strings.Join(f.mgrs["alpha"].Status().Last, "\n"), tc.wantRefusedBy) {
					t.Fatalf("alpha's decisions %q do not say %q", f.mgrs["alpha"].Status().Last, tc.wantRefusedBy)
				}
				return
			}
			// Both gained: alpha is no longer far over capacity, beta's
			// marginal cost stays below the highest price, and beta hosts
			// no more than the contract's max load.
			b := f.mgrs["beta"].Status()
			if b.MarginalCost >= req.PriceMax {
				t.Fatalf("beta's marginal cost %v reached p_max %v", b.MarginalCost, req.PriceMax)
			}
			if h := hosted(placementMap(b.In), id); h > req.MaxLoad+1e-9 {
				t.Fatalf("beta hosts %v, max load %v", h, req.MaxLoad)
			}
			if a := f.w.running("alpha"); a >= 12 {
				t.Fatalf("alpha still runs %v", a)
			}
			for _, r := range f.records("beta", ledger.KindMove) {
				if p := num(r.Fields[FieldPrice]); p < req.PriceMin || p > req.PriceMax {
					t.Fatalf("move at price %v outside [%v, %v]", p, req.PriceMin, req.PriceMax)
				}
			}
		})
	}
}

func placementMap(ps []Placement) map[string]Placement {
	m := map[string]Placement{}
	for _, p := range ps {
		m[p.Task] = p
	}
	return m
}

// A quote or offer naming a contract the sender is not party to, or no
// contract at all, is refused before the manager sees it.
func TestQuotesOnlyFromContractPartners(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10, "gamma": 10})
	id := f.contract("alpha", "beta", terms(nil))
	f.step(period)
	for _, tc := range []struct {
		from, contract, want string
	}{
		{"gamma", id, "not between gamma and beta"},
		{"gamma", "c-nope", "no such contract"},
	} {
		ans, err := f.orgs["beta"].Receive(context.Background(), federation.Message{Kind: federation.MsgQuote, From: tc.from,
			Load: &federation.LoadMessage{Contract: tc.contract, OwnerMarginal: 1e6}})
		if err != nil || ans.Kind != federation.MsgRefused || !strings.Contains(ans.Reason, tc.want) {
			t.Fatalf("quote from %s under %s: %+v %v", tc.from, tc.contract, ans, err)
		}
	}
	// The partner applies its own accept rule, whatever the owner
	// computed: at a price its marginal cost does not stay below, it
	// takes nothing; at a high price it takes no more than the contract's
	// max load (6), reserving it.
	offer := func(price float64, n int) federation.Message {
		var ts []mpa.Task
		for i := range n {
			ts = append(ts, mpa.Task{ID: "alpha/x" + string(rune('a'+i)), Class: "q", Load: 1})
		}
		ans, err := f.orgs["beta"].Receive(context.Background(), federation.Message{Kind: federation.MsgOffer, From: "alpha",
			Load: &federation.LoadMessage{Contract: id, Price: price, Tasks: ts}})
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	f.w.addTasks("beta", 7, 1, "q") // 7 of capacity 8
	for range 30 {                  // let the smoothed load rise
		f.step(period)
	}
	pmin, pmax := mpa.SuggestedPrices(mpa.DefaultUtilisation)
	if ans := offer(pmin, 1); ans.Kind != federation.MsgRefused || !strings.Contains(ans.Reason, "not profitable") {
		t.Fatalf("offer at p_min to a loaded partner: %+v", ans)
	}
	f.w.setLoad("beta", 0)
	for range 30 { // let the smoothed load fall
		f.step(period)
	}
	if ans := offer(pmax, 8); ans.Kind != federation.MsgOK || len(ans.Load.Tasks) != 6 {
		t.Fatalf("offer of 8 under max load 6: %+v", ans)
	}
	if b := f.mgrs["beta"]; !b.Expecting("alpha", id, "alpha/xa") || b.Expecting("gamma", id, "alpha/xa") || b.Expecting("alpha", id, "alpha/xh") {
		t.Fatalf("beta expects the wrong tasks")
	}
	if ans := offer(pmax, 1); ans.Kind != federation.MsgRefused {
		t.Fatalf("offer past the max load with 6 reserved: %+v", ans)
	}
	// beta's own tasks may not move to alpha under alpha's out-only
	// contract: alpha refuses beta's offer.
	ans, err := f.orgs["alpha"].Receive(context.Background(), federation.Message{Kind: federation.MsgOffer, From: "beta",
		Load: &federation.LoadMessage{Contract: id, Price: 20, Tasks: []mpa.Task{{ID: "beta/t00", Load: 1}}}})
	if err != nil || ans.Kind != federation.MsgRefused || !strings.Contains(ans.Reason, "does not let beta's tasks run at alpha") {
		t.Fatalf("reverse offer: %+v %v", ans, err)
	}
}

// Load that wanders +-10% around 85% of capacity moves nothing: the
// smoothed load stays under the offer line, and the dead band between
// the accept and offer lines absorbs the rest.
func TestNoiseDoesNotMoveTasks(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10})
	f.contract("alpha", "beta", terms(nil))
	f.w.addTasks("alpha", 17, 0.4, "q") // 6.8 = 85% of 8
	f.w.addTasks("beta", 4, 1, "q")
	// A fixed pseudo-random sequence in [0.9, 1.1].
	x := uint32(12345)
	for range 60 {
		x = x*1664525 + 1013904223
		f.w.mu.Lock()
		f.w.noise["alpha"] = 0.9 + 0.2*float64(x>>8)/float64(1<<24)
		f.w.mu.Unlock()
		f.step(period)
	}
	if m := f.movers["alpha"].moves(); len(m) != 0 {
		t.Fatalf("noise moved tasks: %v", m)
	}
	// The same noise around an overloaded level does move: the test can
	// fail.
	f.w.setLoad("alpha", 0.7) // 11.9
	for range 3 {
		f.step(period)
	}
	if len(f.movers["alpha"].moves()) == 0 {
		t.Fatalf("an overloaded alpha moved nothing: %q", f.mgrs["alpha"].Status().Last)
	}
}

// Moved tasks come home once the owner's marginal cost with them would be
// below p_min (by the return margin), and only after that held for the
// contract's notice period without a break; a dip shorter than the
// notice brings nothing home. Each return is co-signed in both ledgers.
func TestTasksComeHomeAfterNotice(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10})
	const notice = 30 * time.Second
	id := f.contract("alpha", "beta", terms(func(r *federation.ProposeRequest) { r.Notice = notice }))
	f.w.addTasks("alpha", 12, 1, "q")
	for range 3 {
		f.step(period)
	}
	moved := len(f.movers["alpha"].moves())
	if moved == 0 {
		t.Fatalf("nothing moved: %q", f.mgrs["alpha"].Status().Last)
	}
	home := func() int { return len(f.records("alpha", ledger.KindReturn)) }
	noticeEnd := func() time.Time {
		for _, p := range f.mgrs["alpha"].Status().Out {
			if !p.ReturningAt.IsZero() {
				return p.ReturningAt
			}
		}
		return time.Time{}
	}
	// A dip: the load falls until notice is given, then rises again
	// before the notice ends; nothing comes home.
	f.w.setLoad("alpha", 0.1)
	for i := 0; noticeEnd().IsZero(); i++ {
		if i > 20 {
			t.Fatalf("no notice given after the load fell: %q", f.mgrs["alpha"].Status().Last)
		}
		f.step(period)
	}
	end := noticeEnd()
	f.w.setLoad("alpha", 1)
	for !noticeEnd().IsZero() {
		if !f.clock().Before(end) {
			t.Fatalf("the notice was not withdrawn before it ended")
		}
		f.step(period)
	}
	if home() != 0 {
		t.Fatalf("a dip shorter than the notice brought tasks home")
	}
	// A lasting fall: home only once the notice has run.
	f.w.setLoad("alpha", 0.1)
	for i := 0; home() == 0; i++ {
		if i > 100 {
			t.Fatalf("nothing came home: %q", f.mgrs["alpha"].Status().Last)
		}
		if e := noticeEnd(); !e.IsZero() {
			end = e
		}
		f.step(period)
	}
	if first := f.records("alpha", ledger.KindReturn)[0]; first.Time.Before(end) {
		t.Fatalf("a task came home at %s, before its notice ended at %s", first.Time, end)
	}
	for i := 0; home() < moved && i < 30; i++ {
		f.step(period)
	}
	if home() != moved {
		t.Fatalf("%d of %d tasks came home", home(), moved)
	}
	if n := len(f.records("beta", ledger.KindReturn)); n != moved {
		t.Fatalf("beta's ledger holds %d returns, want %d", n, moved)
	}
	if f.w.running("beta") != 0 || len(f.movers["alpha"].TasksAtPartners()) != 0 {
		t.Fatalf("tasks still away: beta runs %v", f.w.running("beta"))
	}
	for _, r := range f.records("alpha", ledger.KindReturn) {
		if r.Contract != id || len(r.Fields[FieldTask]) == 0 {
			t.Fatalf("return record %+v", r)
		}
	}
}

// Periodic settlements charge load-seconds x price for the time each task
// was away, are co-signed by both orgs, land in both ledgers, and verify
// with the public keys alone.
func TestSettlementsAreCoSignedAndVerify(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10})
	id := f.contract("alpha", "beta", terms(nil))
	f.untilFirstSettlement()
	sets := f.records("alpha", ledger.KindSettlement)
	if len(sets) == 0 {
		t.Fatalf("no settlement after a minute: %q", f.mgrs["alpha"].Status().Last)
	}
	s := sets[0]
	from, _ := time.Parse(time.RFC3339Nano, s.Fields["from"])
	to, _ := time.Parse(time.RFC3339Nano, s.Fields["to"])
	want := 0.0
	for _, mv := range f.records("alpha", ledger.KindMove) {
		since := mv.Time
		if since.Before(from) {
			since = from
		}
		want += num(mv.Fields[FieldLoad]) * num(mv.Fields[FieldPrice]) * to.Sub(since).Seconds()
	}
	got := num(s.Fields["amount"])
	if ls, p := num(s.Fields["load_seconds"]), num(s.Fields["price"]); math.Abs(ls*p-got) > 1e-9*got {
		t.Fatalf("amount %v is not load_seconds %v x price %v", got, ls, p)
	}
	if s.A != "alpha" || s.B != "beta" || s.Contract != id || math.Abs(got-want) > 1e-6*want {
		t.Fatalf("settlement %+v: amount %v, want %v", s, got, want)
	}
	if n := len(f.records("beta", ledger.KindSettlement)); n != len(sets) {
		t.Fatalf("beta holds %d settlements, alpha %d", n, len(sets))
	}
	keysDir := t.TempDir()
	if err := ledger.WriteKeyDir(keysDir, f.keys()); err != nil {
		t.Fatal(err)
	}
	for _, org := range []string{"alpha", "beta"} {
		es, _ := f.orgs[org].Entries()
		// As `ledger export` then `ledger verify --file F --keys DIR` do.
		data, err := ledger.MarshalEntries(es)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ledger.UnmarshalEntries(data)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := ledger.LoadKeyDir(keysDir)
		if err != nil {
			t.Fatal(err)
		}
		if rep := ledger.Verify(back, keys); !rep.Valid {
			t.Fatalf("%s: %+v", org, rep)
		}
		// Tampering with a settlement's amount is caught.
		for i := range es {
			if es[i].Record.Kind == ledger.KindSettlement {
				es[i].Record.Fields["amount"] = "0"
				break
			}
		}
		if rep := ledger.Verify(es, f.keys()); rep.Valid {
			t.Fatalf("%s: a changed settlement verifies", org)
		}
	}
	// The next settlement starts where the last ended.
	for f.clock().Sub(to) <= time.Minute+period {
		f.step(period)
	}
	next := f.records("alpha", ledger.KindSettlement)
	if len(next) <= len(sets) || next[len(next)-1].Fields["from"] != s.Fields["to"] {
		t.Fatalf("next settlement %+v does not follow %s", next[len(next)-1].Fields, s.Fields["to"])
	}
}

// The auto-accept policy accepts proposals from listed orgs within its
// bounds and leaves the rest for an operator.
func TestAutoAccept(t *testing.T) {
	cfg := testConfig()
	pmin, _ := mpa.SuggestedPrices(mpa.DefaultUtilisation)
	cfg.AutoAccept = AutoAccept{From: []string{"alpha"}, PriceMinAtLeast: pmin, MaxLoadAtMost: 8, MaxValidity: 48 * time.Hour}
	ctx := context.Background()
	for _, tc := range []struct {
		name, from string
		edit       func(*federation.ProposeRequest)
		want       string
	}{
		{"listed, within bounds", "alpha", nil, federation.StatusActive},
		{"not listed", "gamma", nil, federation.StatusPending},
		{"price below the policy", "alpha", func(r *federation.ProposeRequest) { r.PriceMin = pmin / 2 }, federation.StatusPending},
		{"load above the policy", "alpha", func(r *federation.ProposeRequest) { r.MaxLoad = 9 }, federation.StatusPending},
		{"too long", "alpha", func(r *federation.ProposeRequest) { r.ValidFor = 72 * time.Hour }, federation.StatusPending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFed(t, false, cfg, map[string]float64{"alpha": 10, "beta": 10, "gamma": 10})
			for _, p := range [][2]string{{tc.from, "beta"}, {"beta", tc.from}} {
				if err := f.orgs[p[0]].Pin(ctx, p[1], f.orgs[p[1]].PublicKey()); err != nil {
					t.Fatal(err)
				}
			}
			req := terms(tc.edit)
			req.To = "beta"
			doc, err := f.orgs[tc.from].Propose(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			f.step(period)
			for _, org := range []string{"beta", tc.from} {
				got, err := f.orgs[org].Contract(doc.Terms.ID)
				want := tc.want
				if org == tc.from && want == federation.StatusPending {
					want = federation.StatusProposed
				}
				if err != nil || got.Status != want {
					t.Fatalf("%s sees %s, want %s (%v)", org, got.Status, want, err)
				}
			}
		})
	}
}

// A move the Mover could not make leaves the task at home and records
// nothing.
func TestFailedMoveRecordsNothing(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10})
	f.contract("alpha", "beta", terms(nil))
	f.w.addTasks("alpha", 12, 1, "q")
	f.movers["alpha"].fail = errors.New("partner did not start the task")
	for range 3 {
		f.step(period)
	}
	if n := len(f.records("alpha", ledger.KindMove)); n != 0 || f.w.running("beta") != 0 {
		t.Fatalf("%d moves recorded, beta runs %v", n, f.w.running("beta"))
	}
	if !strings.Contains(strings.Join(f.mgrs["alpha"].Status().Last, "\n"), "partner did not start the task") {
		t.Fatalf("decisions: %q", f.mgrs["alpha"].Status().Last)
	}
}

// Three orgs, each manager in its own loop on the real clock: alpha's
// overload spreads to both partners, and nothing goes where there is no
// contract.
func TestLoopSpreadsOverloadToPartners(t *testing.T) {
	cfg := testConfig()
	cfg.Period = 20 * time.Millisecond
	f := newFed(t, true, cfg, map[string]float64{"alpha": 10, "beta": 5, "gamma": 5, "delta": 10})
	f.contract("alpha", "beta", terms(nil))
	f.contract("gamma", "alpha", terms(func(r *federation.ProposeRequest) { r.Direction = "in" })) // alpha's tasks may run at gamma
	f.w.addTasks("alpha", 16, 1, "q")                                                              // 2x capacity
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	for _, m := range f.mgrs {
		go func() { defer func() { done <- struct{}{} }(); m.Run(ctx) }()
	}
	defer func() {
		cancel()
		for range f.mgrs {
			<-done
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for f.w.running("beta") == 0 || f.w.running("gamma") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("beta runs %v, gamma %v after 30s; alpha decided %q", f.w.running("beta"), f.w.running("gamma"), f.mgrs["alpha"].Status().Last)
		}
		time.Sleep(10 * time.Millisecond) // polling the condition, not synchronising
	}
	if f.w.running("delta") != 0 {
		t.Fatalf("delta, without a contract, got load")
	}
}

// A settlement charges each task for the part of the period it was away:
// from its move (or the period's start) to its return (or the period's
// end), at its move's price.
func TestAccruedOverlap(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	h := []Placement{
		{Task: "a", Owner: "alpha", Contract: "c", Load: 2, Price: 10, Since: at(-30)},                // away all period: 60 s
		{Task: "b", Owner: "alpha", Contract: "c", Load: 1, Price: 10, Since: at(10), Until: at(40)},  // 30 s
		{Task: "c", Owner: "alpha", Contract: "c", Load: 1, Price: 20, Since: at(50)},                 // 10 s
		{Task: "d", Owner: "alpha", Contract: "c", Load: 1, Price: 20, Since: at(-60), Until: at(-1)}, // before: 0
		{Task: "e", Owner: "alpha", Contract: "other", Load: 5, Price: 10, Since: at(0)},
		{Task: "f", Owner: "beta", Contract: "c", Load: 5, Price: 10, Since: at(0)},
	}
	got := accrued(h, "alpha", "c", at(0), at(60))
	if len(got) != 2 || got[10] != 2*60+30 || got[20] != 10 {
		t.Fatalf("accrued %v", got)
	}
}

// Once an overload has been shed, +-10% noise on the owner's load moves
// nothing more either way: the returns line sits well below the offer
// line, so a task that left does not come back and leave again.
func TestNoiseAfterSheddingMovesNothing(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10})
	f.contract("alpha", "beta", terms(func(r *federation.ProposeRequest) { r.Notice = 10 * time.Second }))
	f.w.addTasks("alpha", 20, 0.5, "q") // 10 = 125% of 8
	f.w.addTasks("beta", 8, 0.5, "q")   // 4 = 50%
	for range 20 {
		f.step(period)
	}
	settled := len(f.movers["alpha"].moves())
	if settled == 0 {
		t.Fatalf("the overload was not shed: %q", f.mgrs["alpha"].Status().Last)
	}
	x := uint32(99)
	for range 60 {
		x = x*1664525 + 1013904223
		f.w.mu.Lock()
		f.w.noise["alpha"] = 0.9 + 0.2*float64(x>>8)/float64(1<<24)
		f.w.mu.Unlock()
		f.step(period)
	}
	if m := f.movers["alpha"].moves(); len(m) != settled {
		t.Fatalf("noise after shedding made %d more moves or returns: %v", len(m)-settled, m[settled:])
	}
}

// A move whose record could not be co-signed (the partner became
// unreachable right after the task moved) is recorded once the partner is
// back, and the task is not moved twice meanwhile.
func TestUnrecordedMoveIsRecordedLater(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10})
	f.contract("alpha", "beta", terms(nil))
	f.w.addTasks("alpha", 12, 1, "q")
	f.step(period) // beta measures
	cut := func(v bool) {
		f.net.mu.Lock()
		f.net.cut["beta"] = v
		f.net.mu.Unlock()
	}
	f.movers["alpha"].after = func() { cut(true) }
	f.step(period)
	moved := len(f.movers["alpha"].moves())
	if moved == 0 {
		t.Fatalf("nothing moved: %q", f.mgrs["alpha"].Status().Last)
	}
	if n := len(f.records("alpha", ledger.KindMove)); n != 0 {
		t.Fatalf("%d moves recorded while beta was cut off", n)
	}
	f.movers["alpha"].after = nil
	f.step(period)
	if len(f.movers["alpha"].moves()) != moved {
		t.Fatalf("moves while beta was unreachable: %v", f.movers["alpha"].moves())
	}
	cut(false)
	f.step(period)
	for _, org := range []string{"alpha", "beta"} {
		recorded := map[string]bool{}
		for _, r := range f.records(org, ledger.KindMove) {
			recorded[r.Fields[FieldTask]] = true
		}
		for _, mv := range f.movers["alpha"].moves()[:moved] {
			if task := strings.Fields(mv)[1]; !recorded[task] {
				t.Fatalf("%s's ledger lacks the move of %s after beta came back", org, task)
			}
		}
	}
}

// untilFirstSettlement has alpha move tasks to beta and steps until its
// first settlement is due (a minute after the first settle check) and
// one period more.
func (f *fed) untilFirstSettlement() {
	f.t.Helper()
	f.w.addTasks("alpha", 12, 1, "q")
	f.step(period) // alpha finds beta not measured yet
	f.step(period) // moves at t0
	moves := f.records("alpha", ledger.KindMove)
	if len(moves) == 0 {
		f.t.Fatalf("nothing moved: %q", f.mgrs["alpha"].Status().Last)
	}
	for t0 := moves[0].Time; f.clock().Sub(t0) <= time.Minute; {
		f.step(period)
	}
	f.step(period)
}

// A settlement whose answer was lost after the partner recorded it is
// settled again for the same period start the next period: the partner
// answers with its copy, which alpha records, so both ledgers hold the
// same settlements and no period is charged twice.
func TestSettlementRetriedAfterLostAnswerChargedOnce(t *testing.T) {
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10})
	f.contract("alpha", "beta", terms(nil))
	lost := 0
	f.net.mu.Lock()
	f.net.lose = func(to string, m federation.Message) bool {
		if lost == 0 && to == "beta" && m.Kind == federation.MsgCoSign && m.Signed.Record.Kind == ledger.KindSettlement {
			lost++
			return true
		}
		return false
	}
	f.net.mu.Unlock()
	f.untilFirstSettlement()
	if lost != 1 {
		t.Fatalf("no settlement answer was lost: %q", f.mgrs["alpha"].Status().Last)
	}
	for deadline := f.clock().Add(time.Hour); len(f.records("alpha", ledger.KindSettlement)) == 0 && f.clock().Before(deadline); {
		f.step(period)
	}
	a, b := f.records("alpha", ledger.KindSettlement), f.records("beta", ledger.KindSettlement)
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("alpha holds %d settlements, beta %d", len(a), len(b))
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Fields["from"] != b[i].Fields["from"] || a[i].Fields["to"] != b[i].Fields["to"] {
			t.Fatalf("settlement %d: alpha %+v, beta %+v", i, a[i], b[i])
		}
		if i > 0 && a[i].Fields["from"] != a[i-1].Fields["to"] {
			t.Fatalf("settlement %d starts at %s, the one before ends at %s", i, a[i].Fields["from"], a[i-1].Fields["to"])
		}
	}
	for _, org := range []string{"alpha", "beta"} {
		if rep, err := f.orgs[org].Verify(); err != nil || !rep.Valid {
			t.Fatalf("%s: %+v %v", org, rep, err)
		}
	}
}
