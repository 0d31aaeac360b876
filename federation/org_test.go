package federation

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/mpa"
	"github.com/fedstream/fedstream/fsm"
)

// raftStore is one org's Raft cluster (a single voter with in-memory
// stores) behind the Store interface.
type raftStore struct {
	r *raft.Raft
	f *fsm.FSM
}

func (s *raftStore) State() *fsm.StateStore { return s.f.State() }

func (s *raftStore) Apply(ctx context.Context, t fsm.MessageType, body any) (any, error) {
	data, err := fsm.Encode(t, body)
	if err != nil {
		return nil, err
	}
	fut := s.r.Apply(data, 10*time.Second)
	if err := fut.Error(); err != nil {
		return nil, err
	}
	res := fut.Response().(*fsm.ApplyResult)
	return res.Value, res.Err
}

func startRaft(t *testing.T, name string) *raftStore {
	t.Helper()
	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(name)
	conf.HeartbeatTimeout = 50 * time.Millisecond
	conf.ElectionTimeout = 50 * time.Millisecond
	conf.LeaderLeaseTimeout = 50 * time.Millisecond
	conf.CommitTimeout = 5 * time.Millisecond
	conf.Logger = hclog.NewNullLogger()
	f, err := fsm.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	store := raft.NewInmemStore()
	snaps := raft.NewInmemSnapshotStore()
	_, trans := raft.NewInmemTransport(raft.ServerAddress(name))
	cfg := raft.Configuration{Servers: []raft.Server{{ID: conf.LocalID, Address: trans.LocalAddr()}}}
	if err := raft.BootstrapCluster(conf, store, store, snaps, trans, cfg); err != nil {
		t.Fatal(err)
	}
	r, err := raft.NewRaft(conf, f, store, store, snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown().Error() })
	deadline := time.Now().Add(20 * time.Second)
	for r.State() != raft.Leader {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no leader", name)
		}
		select {
		case <-r.LeaderCh():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return &raftStore{r: r, f: f}
}

// inproc delivers messages between orgs in one process. tamper, when
// set, may change a message in flight.
type inproc struct {
	mu     sync.Mutex
	orgs   map[string]*Org
	tamper func(to string, m *Message)
}

func (n *inproc) Known(org string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.orgs[org]
	return ok
}

func (n *inproc) Call(ctx context.Context, to string, m Message) (Message, error) {
	n.mu.Lock()
	o, ok := n.orgs[to]
	tamper := n.tamper
	n.mu.Unlock()
	if !ok {
		return Message{}, fmt.Errorf("no route to %s", to)
	}
	// Through JSON, as over a wire.
	data, err := json.Marshal(m)
	if err != nil {
		return Message{}, err
	}
	var wire Message
	if err := json.Unmarshal(data, &wire); err != nil {
		return Message{}, err
	}
	if tamper != nil {
		tamper(to, &wire)
	}
	return o.Receive(ctx, wire)
}

type fed struct {
	net  *inproc
	orgs map[string]*Org
	now  time.Time
}

func newFed(t *testing.T, names ...string) *fed {
	t.Helper()
	f := &fed{net: &inproc{orgs: map[string]*Org{}}, orgs: map[string]*Org{}, now: time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)}
	clock := func() time.Time { return f.now }
	for _, n := range names {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		o := NewOrg(n, key, startRaft(t, n), f.net, clock)
		if err := o.EnsureIdentity(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.net.orgs[n] = o
		f.orgs[n] = o
	}
	return f
}

// pinBoth pins a's key at b and b's at a, as an operator does before the
// first proposal.
func (f *fed) pin(t *testing.T, a, b string) {
	t.Helper()
	if err := f.orgs[a].Pin(context.Background(), b, f.orgs[b].PublicKey()); err != nil {
		t.Fatal(err)
	}
}

func proposal(to string) ProposeRequest {
	return ProposeRequest{To: to, PriceMin: 12, PriceMax: 60, MaxLoad: 8, ValidFor: 24 * time.Hour, Direction: "out", Tasks: []string{"operator"}, Notice: time.Minute}
}

func TestContractLifecycleBothSign(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta")
	a, b := f.orgs["alpha"], f.orgs["beta"]
	f.pin(t, "alpha", "beta")

	doc, err := a.Propose(ctx, proposal("beta"))
	if err != nil {
		t.Fatal(err)
	}
	id := doc.Terms.ID
	if got, _ := b.Contract(id); got.Status != StatusPending || got.Terms.MaxLoad != 8 || got.Terms.Direction != mpa.DirOut {
		t.Fatalf("beta sees %+v", got)
	}
	if got, _ := a.Contract(id); got.Status != StatusProposed {
		t.Fatalf("alpha sees %s", got.Status)
	}
	// Only the partner accepts.
	if _, err := a.Accept(ctx, id); !errors.Is(err, ErrContractState) {
		t.Fatalf("proposer accepting its own proposal: %v", err)
	}
	if _, err := b.Accept(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, o := range []*Org{a, b} {
		c, err := o.Contract(id)
		if err != nil || c.Status != StatusActive {
			t.Fatalf("%s: %+v %v", o.Name(), c, err)
		}
		keys := ledger.Keyring{"alpha": a.PublicKey(), "beta": b.PublicKey()}
		if err := c.Signed.Verify(keys); err != nil {
			t.Fatalf("%s's copy of the contract: %v", o.Name(), err)
		}
	}
	// Events of the contract are co-signed and land in both ledgers.
	if _, err := a.CoSign(ctx, ledger.KindMove, id, map[string]string{"tasks": "q/f/0/0", "price": "20", "load": "1.5"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CoSign(ctx, ledger.KindReturn, id, map[string]string{"tasks": "q/f/0/0"}); err != nil {
		t.Fatal(err)
	}
	fields, err := SettlementFields(90, 20, f.now, f.now.Add(time.Minute))
	if err != nil || fields["amount"] != "1800" {
		t.Fatalf("settlement fields %v %v", fields, err)
	}
	if _, err := a.CoSign(ctx, ledger.KindSettlement, id, fields); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][2]float64{{-1, 20}, {90, -1}} {
		if _, err := SettlementFields(bad[0], bad[1], f.now, f.now.Add(time.Minute)); !errors.Is(err, ledger.ErrBadRecord) {
			t.Fatalf("settlement %v: %v", bad, err)
		}
	}
	if _, err := SettlementFields(1, 1, f.now, f.now); !errors.Is(err, ledger.ErrBadRecord) {
		t.Fatalf("empty period: %v", err)
	}
	if _, err := b.Terminate(ctx, id, "season over"); err != nil {
		t.Fatal(err)
	}
	for _, o := range []*Org{a, b} {
		c, _ := o.Contract(id)
		if c.Status != StatusTerminated {
			t.Fatalf("%s: status %s after terminate", o.Name(), c.Status)
		}
		es, err := o.Entries()
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range es {
			kinds = append(kinds, e.Record.Kind)
		}
		// identity, pin (alpha pinned before proposing, beta on accept),
		// contract, move, return, settlement, terminate.
		want := "identity pin contract move return settlement terminate"
		if strings.Join(kinds, " ") != want {
			t.Fatalf("%s's ledger: %v, want %s", o.Name(), kinds, want)
		}
		rep, err := o.Verify()
		if err != nil || !rep.Valid {
			t.Fatalf("%s: online verify %+v %v", o.Name(), rep, err)
		}
		// Offline, from the public keys only.
		rep = ledger.Verify(es, ledger.Keyring{"alpha": a.PublicKey(), "beta": b.PublicKey()})
		if !rep.Valid {
			t.Fatalf("%s offline: %+v", o.Name(), rep)
		}
	}
	// A terminated contract records nothing more.
	if _, err := a.CoSign(ctx, ledger.KindMove, id, nil); !errors.Is(err, ErrContractState) {
		t.Fatalf("move under a terminated contract: %v", err)
	}
}

func TestProposeRefusesInvalidTerms(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta", "gamma")
	a := f.orgs["alpha"]
	f.pin(t, "alpha", "beta")
	for _, tc := range []struct {
		name string
		edit func(*ProposeRequest)
		want error
		says string
	}{
		{"p_min above p_max", func(r *ProposeRequest) { r.PriceMin, r.PriceMax = 50, 10 }, mpa.ErrBadTerms, "p_min 50 is above p_max 10"},
		{"non-positive load", func(r *ProposeRequest) { r.MaxLoad = 0 }, mpa.ErrBadTerms, "max load"},
		{"expired", func(r *ProposeRequest) { r.ValidFor = -time.Hour }, mpa.ErrBadTerms, "expired"},
		{"unknown org", func(r *ProposeRequest) { r.To = "omega" }, ErrUnknownOrg, `"omega"`},
		{"no pinned key", func(r *ProposeRequest) { r.To = "gamma" }, ErrNoPinnedKey, `"gamma"`},
		{"self", func(r *ProposeRequest) { r.To = "alpha" }, mpa.ErrBadTerms, "itself"},
		{"direction", func(r *ProposeRequest) { r.Direction = "up" }, mpa.ErrBadTerms, "direction"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := proposal("beta")
			tc.edit(&req)
			_, err := a.Propose(ctx, req)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Propose = %v, want %v saying %q", err, tc.want, tc.says)
			}
		})
	}
	if cs, _ := f.orgs["beta"].Contracts(); len(cs) != 0 {
		t.Fatalf("beta got %d contracts from refused proposals", len(cs))
	}
}

func TestRejectAndExpiry(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta")
	a, b := f.orgs["alpha"], f.orgs["beta"]
	f.pin(t, "alpha", "beta")
	doc, err := a.Propose(ctx, proposal("beta"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reject(ctx, doc.Terms.ID, "too cheap"); err != nil {
		t.Fatal(err)
	}
	if c, _ := a.Contract(doc.Terms.ID); c.Status != StatusRejected || c.Reason != "too cheap" {
		t.Fatalf("alpha: %+v", c)
	}
	if _, err := b.Accept(ctx, doc.Terms.ID); !errors.Is(err, ErrContractState) {
		t.Fatalf("accept after reject: %v", err)
	}
	// A proposal that expires before it is accepted cannot be accepted.
	doc2, err := a.Propose(ctx, proposal("beta"))
	if err != nil {
		t.Fatal(err)
	}
	f.now = f.now.Add(25 * time.Hour)
	if _, err := b.Accept(ctx, doc2.Terms.ID); !errors.Is(err, mpa.ErrBadTerms) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("accept after expiry: %v", err)
	}
	// Rejections write no ledger entries: identity + alpha's pin only.
	if es, _ := a.Entries(); len(es) != 2 {
		t.Fatalf("alpha's ledger has %d entries", len(es))
	}
}

func TestForgedOrMissingSignaturesRefused(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta")
	a, b := f.orgs["alpha"], f.orgs["beta"]
	f.pin(t, "alpha", "beta")
	_, mallory, _ := ed25519.GenerateKey(rand.Reader)

	// A proposal whose signature is not alpha's.
	f.net.tamper = func(to string, m *Message) {
		if m.Kind == MsgPropose {
			m.Signed.Signatures[0] = ledger.Sign(m.Signed.Record, "alpha", mallory)
		}
	}
	if _, err := a.Propose(ctx, proposal("beta")); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "not signed by alpha") {
		t.Fatalf("forged proposal: %v", err)
	}
	// An acceptance without beta's signature.
	f.net.tamper = nil
	doc, err := a.Propose(ctx, proposal("beta"))
	if err != nil {
		t.Fatal(err)
	}
	f.net.tamper = func(to string, m *Message) {
		if m.Kind == MsgAccept {
			m.Signed.Signatures = m.Signed.Signatures[:1]
		}
	}
	if _, err := b.Accept(ctx, doc.Terms.ID); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "carries 1 signatures") {
		t.Fatalf("acceptance without beta's signature: %v", err)
	}
	// An acceptance signed by another key than the one beta presented.
	f.net.tamper = func(to string, m *Message) {
		if m.Kind == MsgAccept {
			m.Signed.Signatures[1] = ledger.Sign(m.Signed.Record, "beta", mallory)
		}
	}
	if _, err := b.Accept(ctx, doc.Terms.ID); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "beta's signature does not verify") {
		t.Fatalf("acceptance with a forged signature: %v", err)
	}
	// A changed term in the acceptance.
	f.net.tamper = func(to string, m *Message) {
		if m.Kind == MsgAccept {
			m.Signed.Record.Fields["max_load"] = "800"
		}
	}
	if _, err := b.Accept(ctx, doc.Terms.ID); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "differs from the one proposed") {
		t.Fatalf("acceptance of other terms: %v", err)
	}
	// Honest acceptance still works after the refused attempts.
	f.net.tamper = nil
	if _, err := b.Accept(ctx, doc.Terms.ID); err != nil {
		t.Fatal(err)
	}
	// A move whose countersignature is forged is not recorded by alpha.
	f.net.tamper = func(to string, m *Message) {
		if m.Kind == MsgCoSign {
			m.Signed.Signatures[0] = ledger.Sign(m.Signed.Record, "alpha", mallory)
		}
	}
	before, _ := a.Entries()
	if _, err := a.CoSign(ctx, ledger.KindMove, doc.Terms.ID, map[string]string{"tasks": "x"}); !errors.Is(err, ErrRefused) {
		t.Fatalf("forged move: %v", err)
	}
	after, _ := a.Entries()
	if len(after) != len(before) {
		t.Fatalf("alpha recorded a refused move")
	}
	// A proposal from an org presenting another key than the pinned one.
	f.net.tamper = func(to string, m *Message) {
		if m.Kind == MsgPropose {
			m.Key = ledger.EncodePublicKey(mallory.Public().(ed25519.PublicKey))
			m.Signed.Signatures[0] = ledger.Sign(m.Signed.Record, "alpha", mallory)
		}
	}
	if _, err := a.Propose(ctx, proposal("beta")); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "differs from the pinned") {
		t.Fatalf("proposal under a new key: %v", err)
	}
}

// Tampering with either org's stored copy is found by verification,
// which names the entry.
func TestVerifyFindsTamperingInEitherCopy(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta")
	a, b := f.orgs["alpha"], f.orgs["beta"]
	f.pin(t, "alpha", "beta")
	doc, err := a.Propose(ctx, proposal("beta"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Accept(ctx, doc.Terms.ID); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := a.CoSign(ctx, ledger.KindMove, doc.Terms.ID, map[string]string{"tasks": fmt.Sprint("t", i)}); err != nil {
			t.Fatal(err)
		}
	}
	keys := ledger.Keyring{"alpha": a.PublicKey(), "beta": b.PublicKey()}
	for _, o := range []*Org{a, b} {
		es, _ := o.Entries()
		if rep := ledger.Verify(es, keys); !rep.Valid {
			t.Fatalf("%s honest: %+v", o.Name(), rep)
		}
		idx := len(es) - 2 // the second of the three moves
		for name, tamper := range map[string]func([]ledger.Entry){
			"a field": func(bad []ledger.Entry) {
				r := bad[idx].Record
				r.Fields = map[string]string{"tasks": "t1", "price": "0"}
				bad[idx].Record = r
			},
			"a signature": func(bad []ledger.Entry) {
				sigs := append([]ledger.Signature(nil), bad[idx].Signatures...)
				sig := append([]byte(nil), sigs[1].Sig...)
				sig[10] ^= 0x40
				sigs[1].Sig = sig
				bad[idx].Signatures = sigs
			},
			"the order": func(bad []ledger.Entry) { bad[idx], bad[idx+1] = bad[idx+1], bad[idx] },
		} {
			bad := append([]ledger.Entry(nil), es...)
			tamper(bad)
			rep := ledger.Verify(bad, keys)
			if rep.Valid || rep.FirstBad == nil || *rep.FirstBad != uint64(idx+1) {
				t.Fatalf("%s's copy, %s altered at entry %d: %+v", o.Name(), name, idx+1, rep)
			}
		}
	}
}

// Moves are recorded only in the direction the contract allows and only
// while it is in force, whoever asks.
func TestMovesOnlyUnderTheContract(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, "alpha", "beta")
	a, b := f.orgs["alpha"], f.orgs["beta"]
	f.pin(t, "alpha", "beta")
	doc, err := a.Propose(ctx, proposal("beta")) // direction out: alpha's tasks may run at beta
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Accept(ctx, doc.Terms.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CoSign(ctx, ledger.KindMove, doc.Terms.ID, map[string]string{"tasks": "x"}); err != nil {
		t.Fatalf("allowed move: %v", err)
	}
	if _, err := b.CoSign(ctx, ledger.KindMove, doc.Terms.ID, map[string]string{"tasks": "y"}); !errors.Is(err, mpa.ErrOutsideTerms) {
		t.Fatalf("beta moving its tasks under an out-only contract: %v", err)
	}
	// Beta's own check, in case alpha's side were skipped: a forged
	// request from beta's point of view is refused too.
	rec := ledger.Record{Kind: ledger.KindMove, ID: "m-x", Contract: doc.Terms.ID, A: "beta", B: "alpha", Time: f.now}
	ans, err := a.Receive(ctx, Message{Kind: MsgCoSign, From: "beta", Signed: &ledger.Signed{Record: rec, Signatures: []ledger.Signature{ledger.Sign(rec, "beta", b.SigningKey())}}})
	if err != nil || ans.Kind != MsgRefused || !strings.Contains(ans.Reason, "does not let beta's tasks run at alpha") {
		t.Fatalf("alpha countersigning a reverse move: %+v %v", ans, err)
	}
	f.now = f.now.Add(25 * time.Hour)
	if _, err := a.CoSign(ctx, ledger.KindMove, doc.Terms.ID, map[string]string{"tasks": "z"}); !errors.Is(err, mpa.ErrOutsideTerms) {
		t.Fatalf("move after expiry: %v", err)
	}
	// Returning what was moved is still allowed after expiry.
	if _, err := a.CoSign(ctx, ledger.KindReturn, doc.Terms.ID, map[string]string{"tasks": "x"}); err != nil {
		t.Fatalf("return after expiry: %v", err)
	}
}
