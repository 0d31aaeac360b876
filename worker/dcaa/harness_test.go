package dcaa

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/tuple"
)

// The harness simulates a replicated query, one logical millisecond per
// tick: deterministic sources with k replicas, stages of k replicas each
// running a real windowed aggregate from worker/operator behind a
// Machine and an Output, subscriptions that deliver every tick (a
// heartbeat when there is nothing new), and failures injected per link
// (silence) or per producer (refused). Everything is deterministic: a
// run is a function of its script.

const ms = int64(time.Millisecond)

// entry is one tuple of a producer's output log.
type entry struct{ t tuple.Tuple }

// producer is one replica of an upstream partition.
type producer interface {
	name() string
	entries() []entry
	// status is the in-band state sent with every delivery.
	status() (State, int64)
}

// source is one replica of a generated source partition: records are a
// pure function of (partition, time), so replicas are identical.
type source struct {
	part, rep int
	log       *[]entry // shared by the partition's replicas
}

func (s *source) name() string           { return fmt.Sprintf("src%d/r%d", s.part, s.rep) }
func (s *source) entries() []entry       { return *s.log }
func (s *source) status() (State, int64) { return Stable, 0 }

var srcSchema = tuple.NewSchema([]tuple.Field{{Name: "key", Kind: tuple.KindString}, {Name: "v", Kind: tuple.KindInt}})

// mix is splitmix64: the generator's deterministic randomness.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// link is one input's subscription.
type link struct {
	replica  int
	after    uint64
	pos      int
	resolved bool
	failed   bool // the refusal was reported
	// attempt tags a background link's deliveries (0: the main link).
	attempt uint64
}

// stageRep is one replica of one stage partition.
type stageRep struct {
	h     *harness
	stage *stage
	id    int
	m     *Machine
	op    operator.Operator
	out   *Output
	log   []entry
	links []*link
	// bg holds the background links (Config.Background), per input.
	bg     []*link
	ckpt   []byte
	dead   bool
	inbox  []message
	view   View
	states []State // state after each tick
	// progressAt[i]: first clock at which the output covered the
	// reference's i-th boundary (stable boundary or tentative progress).
	progressAt   []int64
	progress     int64
	firstTentAt  int64
	stabilizing  []int64 // ticks spent in STABILIZATION
	tentEmitted  int
	actionsTrace []string
}

func (r *stageRep) name() string     { return fmt.Sprintf("%s/r%d", r.stage.name, r.id) }
func (r *stageRep) entries() []entry { return r.log }
func (r *stageRep) status() (State, int64) {
	return r.m.State(), r.out.TentWatermark()
}

// message is a peer message, delivered one tick after it was sent (so
// that two replicas can ask at the same time).
type message struct {
	at int64
	ev Event
}

// stage is one fragment with one partition and k replicas reading the
// given upstream groups (one input per upstream partition).
type stage struct {
	name   string
	inputs [][]producer // per input: the upstream partition's replicas
	reps   []*stageRep
}

type harness struct {
	t       *testing.T
	now     int64
	end     int64 // sources stop after this
	sources [][]*source
	logs    []*[]entry
	stages  []*stage
	// cut[consumer+"<"+producer]: deliveries silently stop.
	cut map[string]bool
	// dead[producer]: subscriptions to it fail at once.
	dead  map[string]bool
	hooks []func(h *harness)
	// reports: every reportEvery, each stage replica hears the states of
	// its inputs' upstream replicas, as the coordinator reports them.
	reports bool
	refB    []int64 // boundaries of the reference output (for latency)
	rate    int
}

// newHarness builds parts source partitions with k replicas each,
// records until end (ms), one or two per millisecond per partition, a
// boundary every 5 ms.
func newHarness(t *testing.T, parts, k int, endMs int64) *harness {
	h := &harness{t: t, end: endMs * ms, cut: map[string]bool{}, dead: map[string]bool{}}
	for p := range parts {
		l := &[]entry{}
		h.logs = append(h.logs, l)
		var reps []*source
		for r := range k {
			reps = append(reps, &source{part: p, rep: r, log: l})
		}
		h.sources = append(h.sources, reps)
	}
	return h
}

// generate appends the records of millisecond now to every partition.
func (h *harness) generate() {
	for p, l := range h.logs {
		add := func(t tuple.Tuple) {
			t.ID = uint64(len(*l)) + 1
			*l = append(*l, entry{t: t})
		}
		switch {
		case h.now > h.end+ms:
			continue
		case h.now > h.end:
			add(tuple.Tuple{Type: tuple.Boundary, STime: math.MaxInt64 / 2})
			continue
		}
		if h.now%(5*ms) == 0 {
			add(tuple.Tuple{Type: tuple.Boundary, STime: h.now})
		}
		x := mix(uint64(p)<<40 ^ uint64(h.now))
		for n := range 1 + int(x%2) {
			y := mix(x + uint64(n))
			add(tuple.Tuple{Type: tuple.Stable, STime: h.now, Values: []tuple.Value{
				tuple.Str(fmt.Sprintf("k%d", y%4)), tuple.Int(int64(y % 100)),
			}})
		}
	}
}

// stageOpts configure a stage.
type stageOpts struct {
	name   string
	window string // aggregate window
	sum    string // summed field of the input
	cfg    Config // Share, Detect, StrictMode, ReplayChunk, ...
	inSch  *tuple.Schema
}

// addStage adds a stage of k replicas over the given upstream groups.
func (h *harness) addStage(o stageOpts, inputs [][]producer) *stage {
	st := &stage{name: o.name, inputs: inputs}
	def := &queryspec.Operator{Name: o.name, Type: "aggregate", Window: &queryspec.Window{Size: o.window},
		GroupBy: []string{"key"}, Aggregates: queryspec.Exprs{{Name: "n", Expr: "count()"}, {Name: "s", Expr: "sum(" + o.sum + ")"}}}
	k := len(inputs[0])
	for id := range k {
		op, err := operator.New(def, []*tuple.Schema{o.inSch})
		if err != nil {
			h.t.Fatal(err)
		}
		cfg := o.cfg
		cfg.ID, cfg.Replicas = id, k
		cfg.Inputs = nil
		for _, in := range inputs {
			cfg.Inputs = append(cfg.Inputs, len(in))
		}
		m, err := New(cfg)
		if err != nil {
			h.t.Fatal(err)
		}
		r := &stageRep{h: h, stage: st, id: id, m: m, op: op, firstTentAt: -1}
		r.out = NewOutput(0, func(t *tuple.Tuple) {
			r.log = append(r.log, entry{t: *t.Clone()})
			r.view.Apply(t)
			if t.Type == tuple.Tentative {
				r.tentEmitted++
				if r.firstTentAt < 0 {
					r.firstTentAt = h.now
				}
			}
		})
		r.links = make([]*link, len(inputs))
		r.bg = make([]*link, len(inputs))
		st.reps = append(st.reps, r)
	}
	h.stages = append(h.stages, st)
	return st
}

func (h *harness) aggSchema(inSch *tuple.Schema, sum string) *tuple.Schema {
	op, err := operator.New(&queryspec.Operator{Name: "x", Type: "aggregate", Window: &queryspec.Window{Size: "1s"},
		GroupBy: []string{"key"}, Aggregates: queryspec.Exprs{{Name: "n", Expr: "count()"}, {Name: "s", Expr: "sum(" + sum + ")"}}}, []*tuple.Schema{inSch})
	if err != nil {
		h.t.Fatal(err)
	}
	return op.OutputSchema()
}

func (st *stage) producers() []producer {
	var ps []producer
	for _, r := range st.reps {
		ps = append(ps, r)
	}
	return ps
}

func (h *harness) srcGroups() [][]producer {
	var g [][]producer
	for _, reps := range h.sources {
		var ps []producer
		for _, s := range reps {
			ps = append(ps, s)
		}
		g = append(g, ps)
	}
	return g
}

// apply carries out a machine's actions.
func (r *stageRep) apply(acts []Action) {
	h := r.h
	for _, a := range acts {
		switch a := a.(type) {
		case Subscribe:
			r.links[a.Input] = &link{replica: a.Replica, after: a.AfterID}
		case SubscribeBackground:
			r.bg[a.Input] = &link{replica: a.Replica, after: a.AfterID, attempt: a.Attempt}
		case StopBackground:
			r.bg[a.Input] = nil
		case Checkpoint:
			b, err := r.op.Snapshot()
			if err != nil {
				h.t.Fatal(err)
			}
			r.ckpt = b
		case Release:
			r.out.SetTentative(a.Tentative)
			for _, s := range a.Steps {
				for _, run := range s.Runs {
					for k := range run.Tuples {
						if err := r.op.Process(0, &run.Tuples[k], r.out); err != nil {
							h.t.Fatalf("%s: process: %v", r.name(), err)
						}
					}
				}
				if err := r.op.Advance(s.Advance, r.out); err != nil {
					h.t.Fatal(err)
				}
				r.out.Boundary(s.Advance)
			}
		case Restore:
			if r.ckpt == nil {
				h.t.Fatalf("%s: restore without checkpoint", r.name())
			}
			if err := r.op.Restore(r.ckpt); err != nil {
				h.t.Fatal(err)
			}
			r.out.Undo()
		case RecDone:
			r.out.RecDone()
		case AskPermission:
			for _, p := range a.Peers {
				r.send(p, PermissionRequest{From: r.id})
			}
		case ReplyPermission:
			r.send(a.To, PermissionReply{From: r.id, Granted: a.Granted})
		case NotifyDone:
			for _, p := range a.Peers {
				r.send(p, PeerDone{From: r.id})
			}
		case StateChange:
		}
		r.actionsTrace = append(r.actionsTrace, fmt.Sprintf("%d:%T", h.now/ms, a))
	}
}

func (r *stageRep) send(to int, ev Event) {
	peer := r.stage.reps[to]
	if !peer.dead && !r.h.cut[peer.name()+"<"+r.name()] {
		peer.inbox = append(peer.inbox, message{at: r.h.now + ms, ev: ev})
	}
}

// resolve finds where link l resumes in log: after the last occurrence of
// the stable tuple with id l.after (the corrected one, after an UNDO).
func (l *link) resolve(log []entry) bool {
	if l.resolved {
		return true
	}
	if l.after == 0 {
		l.pos, l.resolved = 0, true
		return true
	}
	for i := len(log) - 1; i >= 0; i-- {
		t := &log[i].t
		if t.ID == l.after && (t.Type == tuple.Stable || t.Type == tuple.Boundary) {
			l.pos, l.resolved = i+1, true
			return true
		}
	}
	return false
}

// tick runs one millisecond.
func (h *harness) tick() {
	h.now += ms
	h.generate()
	for _, hook := range h.hooks {
		hook(h)
	}
	for _, st := range h.stages {
		for _, r := range st.reps {
			if r.dead {
				continue
			}
			if r.m.now == 0 && len(r.actionsTrace) == 0 {
				r.apply(r.m.Start(h.now))
			}
			for len(r.inbox) > 0 && r.inbox[0].at <= h.now {
				ev := r.inbox[0].ev
				r.inbox = r.inbox[1:]
				r.apply(r.m.Step(h.now, ev))
			}
			if h.reports && h.now%reportEvery == 0 {
				for i, ps := range st.inputs {
					ev := UpstreamStates{Input: i}
					for _, p := range ps {
						s, _ := p.status()
						ev.States = append(ev.States, s)
					}
					r.apply(r.m.Step(h.now, ev))
				}
			}
			for i := range st.inputs {
				r.read(i, r.links[i])
				if l := r.bg[i]; l != nil {
					r.read(i, l)
				}
			}
			r.apply(r.m.Step(h.now, Tick{}))
			r.states = append(r.states, r.m.State())
			if r.m.State() == Stabilization {
				r.stabilizing = append(r.stabilizing, h.now)
			}
			r.trackProgress()
		}
	}
}

// reportEvery is how often the harness's coordinator reports the
// upstream replicas' states (harness.reports).
const reportEvery = 5 * ms

// read delivers what link l of input i has not delivered yet (or reports
// its replica's refusal).
func (r *stageRep) read(i int, l *link) {
	h := r.h
	p := r.stage.inputs[i][l.replica]
	if h.dead[p.name()] {
		if !l.failed {
			l.failed = true
			r.apply(r.m.Step(h.now, SubscriptionFailed{Input: i, Attempt: l.attempt}))
		}
		return
	}
	if h.cut[r.name()+"<"+p.name()] || !l.resolve(p.entries()) {
		return
	}
	log := p.entries()
	var batch []tuple.Tuple
	for _, e := range log[l.pos:] {
		batch = append(batch, *e.t.Clone())
	}
	l.pos = len(log)
	state, twm := p.status()
	r.apply(r.m.Step(h.now, Deliver{Input: i, Tuples: batch, Upstream: state, TentWatermark: twm, Attempt: l.attempt, Owner: &poisonBatch{t: h.t, ts: batch}}))
}

// poisonBatch owns a delivered batch as a decoder's pool does: on
// Release it overwrites the batch's tuples and their values, as the next
// batch decoded into the same arrays would. A machine that reads a batch
// after handing it back (or hands it back twice) thus changes the results
// that every property test compares with its reference.
type poisonBatch struct {
	t        *testing.T
	ts       []tuple.Tuple
	released bool
}

func (b *poisonBatch) Release() {
	if b.released {
		b.t.Errorf("a delivered batch was handed back twice")
	}
	b.released = true
	for k := range b.ts {
		for j := range b.ts[k].Values {
			b.ts[k].Values[j] = tuple.Value{Kind: tuple.KindString, I: math.MaxInt32, S: "poisoned"}
		}
		b.ts[k].ID, b.ts[k].STime = math.MaxUint32, math.MinInt32
	}
}

func (r *stageRep) trackProgress() {
	p := r.out.TentWatermark()
	for i := len(r.log) - 1; i >= 0; i-- {
		if t := &r.log[i].t; t.Type == tuple.Boundary {
			p = max(p, t.STime)
			break
		}
	}
	r.progress = max(r.progress, p)
	for len(r.progressAt) < len(r.h.refB) && r.h.refB[len(r.progressAt)] <= r.progress {
		r.progressAt = append(r.progressAt, r.h.now)
	}
}

// run ticks until clock untilMs.
func (h *harness) run(untilMs int64) {
	for h.now < untilMs*ms {
		h.tick()
	}
}

// at runs f once at clock atMs.
func (h *harness) at(atMs int64, f func(h *harness)) {
	h.hooks = append(h.hooks, func(h *harness) {
		if h.now == atMs*ms {
			f(h)
		}
	})
}

// cutAll silences every replica of source partition p towards every
// replica of st, between fromMs and toMs.
func (h *harness) cutSource(st *stage, p int, fromMs, toMs int64) {
	set := func(v bool) func(h *harness) {
		return func(h *harness) {
			for _, r := range st.reps {
				for _, s := range h.sources[p] {
					h.cut[r.name()+"<"+s.name()] = v
				}
			}
		}
	}
	h.at(fromMs, set(true))
	h.at(toMs, set(false))
}

// sameTuples compares two streams tuple for tuple (type, id, stime,
// values).
func sameTuples(t *testing.T, what string, got, want []tuple.Tuple) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tuples, reference has %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := &got[i], &want[i]
		if g.Type != w.Type || g.ID != w.ID || g.STime != w.STime || !slices.Equal(g.Values, w.Values) {
			t.Fatalf("%s: tuple %d is %v id %d stime %d %v, reference %v id %d stime %d %v",
				what, i, g.Type, g.ID, g.STime, g.Values, w.Type, w.ID, w.STime, w.Values)
		}
	}
}

// boundaries lists the stimes of a stream's boundaries.
func boundaries(ts []tuple.Tuple) []int64 {
	var b []int64
	for _, t := range ts {
		if t.Type == tuple.Boundary {
			b = append(b, t.STime)
		}
	}
	return b
}

// addedLatency is the largest delay, over the reference's boundaries, of
// the first replica of st to cover it against the reference run's first
// (what a consumer that switches replicas sees).
func addedLatency(st, ref *stage) int64 {
	worst := int64(0)
	for i := range ref.reps[0].progressAt {
		best := int64(math.MaxInt64)
		for _, r := range st.reps {
			if i < len(r.progressAt) {
				best = min(best, r.progressAt[i])
			}
		}
		refAt := int64(math.MaxInt64)
		for _, r := range ref.reps {
			if i < len(r.progressAt) {
				refAt = min(refAt, r.progressAt[i])
			}
		}
		worst = max(worst, best-refAt)
	}
	return worst
}

// replicaLatency is addedLatency for one replica of st on its own.
func replicaLatency(r *stageRep, ref *stage) int64 {
	worst := int64(0)
	for i, refAt := range ref.reps[0].progressAt {
		if i >= len(r.progressAt) {
			return math.MaxInt64
		}
		worst = max(worst, r.progressAt[i]-refAt)
	}
	return worst
}
