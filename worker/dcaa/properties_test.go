package dcaa

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// scenario is a query built on a harness, run once without failures (the
// reference) and once with its script of failures.
type scenario struct {
	parts, k int
	endMs    int64 // sources stop
	runMs    int64 // the run ends
	// build adds the stages and returns the one whose output is checked.
	build  func(h *harness) *stage
	script func(h *harness, st *stage)
}

// run returns the reference stage and the failure run's stage.
func (sc scenario) run(t *testing.T) (ref, got *stage, h *harness) {
	t.Helper()
	h0 := newHarness(t, sc.parts, sc.k, sc.endMs)
	st0 := sc.build(h0)
	h0.run(sc.runMs)
	refB := boundaries(st0.reps[0].view.Stable)
	if len(refB) < 10 {
		t.Fatalf("reference produced only %d boundaries", len(refB))
	}
	h1 := newHarness(t, sc.parts, sc.k, sc.endMs)
	h1.refB = refB
	ref = sc.build(h1)
	h1.run(sc.runMs)
	h = newHarness(t, sc.parts, sc.k, sc.endMs)
	h.refB = refB
	got = sc.build(h)
	if sc.script != nil {
		sc.script(h, got)
	}
	h.run(sc.runMs)
	for _, r := range ref.reps {
		if r.view.Tentative != 0 || r.view.Undos != 0 {
			t.Fatalf("reference %s: %d tentative, %d undos", r.name(), r.view.Tentative, r.view.Undos)
		}
	}
	return ref, got, h
}

// oneStage: an aggregate over every source partition, k replicas.
func oneStage(share, detect time.Duration, chunk int) func(h *harness) *stage {
	return func(h *harness) *stage {
		return h.addStage(stageOpts{name: "agg", window: "20ms", sum: "v", inSch: srcSchema,
			cfg: Config{Share: share, Detect: detect, ReplayChunk: chunk}}, h.srcGroups())
	}
}

// checkStable: every live replica's stable output equals the reference's.
func checkStable(t *testing.T, ref, got *stage) {
	t.Helper()
	want := ref.reps[0].view.Stable
	for _, r := range ref.reps[1:] {
		sameTuples(t, "reference "+r.name(), r.view.Stable, want)
	}
	for _, r := range got.reps {
		if r.dead {
			continue
		}
		sameTuples(t, r.name()+" stable output", r.view.Stable, want)
		if r.m.State() != Stable {
			t.Fatalf("%s ends in %v", r.name(), r.m.State())
		}
	}
}

func tentatives(st *stage) int {
	n := 0
	for _, r := range st.reps {
		n += r.view.Tentative
	}
	return n
}

const (
	detect = 30 * time.Millisecond
	xBound = 100 * time.Millisecond
	slack  = 3 * ms // tick granularity and same-tick ordering
)

// P1: one replica of an upstream killed (refused) or paused (silent):
// the downstream switches to the other replica, never emits a tentative
// tuple, and its output is never delayed by more than X.
func TestP1OneReplicaFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script func(h *harness, st *stage)
	}{
		{"killed", func(h *harness, st *stage) {
			h.at(300, func(h *harness) { h.dead["src0/r0"] = true })
		}},
		{"paused", func(h *harness, st *stage) {
			h.at(300, func(h *harness) {
				for _, r := range st.reps {
					h.cut[r.name()+"<src0/r0"] = true
				}
			})
		}},
		{"downstream replica killed", func(h *harness, st *stage) {
			h.at(300, func(h *harness) { st.reps[0].dead = true })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := scenario{parts: 2, k: 2, endMs: 800, runMs: 1000, build: oneStage(xBound, detect, 0), script: tc.script}
			ref, got, _ := sc.run(t)
			if n := tentatives(got); n != 0 {
				t.Fatalf("%d tentative tuples, want none", n)
			}
			checkStable(t, ref, got)
			if lat := addedLatency(got, ref); lat > int64(xBound) {
				t.Fatalf("added latency %v, bound X = %v", time.Duration(lat), xBound)
			}
			if tc.name != "downstream replica killed" && got.reps[0].m.Subscribed(0) != 1 {
				t.Fatalf("replica 0 still reads upstream replica %d of input 0", got.reps[0].m.Subscribed(0))
			}
		})
	}
}

// P2: every replica of an upstream unreachable for less than X: no
// tentative tuple, output identical to the reference, delay within X.
func TestP2ShortFailure(t *testing.T) {
	for _, d := range []int64{40, 60, 85} { // ms, X = 100 ms
		sc := scenario{parts: 2, k: 2, endMs: 800, runMs: 1000, build: oneStage(xBound, detect, 0),
			script: func(h *harness, st *stage) { h.cutSource(st, 0, 300, 300+d) }}
		ref, got, _ := sc.run(t)
		if n := tentatives(got); n != 0 {
			t.Fatalf("failure of %d ms: %d tentative tuples, want none", d, n)
		}
		checkStable(t, ref, got)
		if lat := addedLatency(got, ref); lat > int64(xBound)+slack {
			t.Fatalf("failure of %d ms: added latency %v > X", d, time.Duration(lat))
		}
	}
}

// P3: unreachable longer than X: tentative tuples within X of the
// failure, then UNDO, corrections and REC_DONE; the stable output is the
// reference's, tuple for tuple, and no result waited more than X.
func TestP3LongFailure(t *testing.T) {
	for _, d := range []int64{150, 400} {
		sc := scenario{parts: 2, k: 2, endMs: 900, runMs: 1200, build: oneStage(xBound, detect, 0),
			script: func(h *harness, st *stage) { h.cutSource(st, 0, 300, 300+d) }}
		ref, got, _ := sc.run(t)
		for _, r := range got.reps {
			if r.view.Tentative == 0 {
				t.Fatalf("failure of %d ms: %s emitted no tentative tuple", d, r.name())
			}
			if r.firstTentAt > 300*ms+int64(xBound)+slack {
				t.Fatalf("failure of %d ms: %s first tentative at %d ms, failure at 300 ms, X = %v", d, r.name(), r.firstTentAt/ms, xBound)
			}
			if r.view.Undos == 0 || r.view.Recdns == 0 {
				t.Fatalf("failure of %d ms: %s: %d UNDO, %d REC_DONE", d, r.name(), r.view.Undos, r.view.Recdns)
			}
			checkCorrectionOrder(t, r)
		}
		checkStable(t, ref, got)
		if lat := addedLatency(got, ref); lat > int64(xBound)+slack {
			t.Fatalf("failure of %d ms: added latency %v > X", d, time.Duration(lat))
		}
		// After the corrections, the current view (UNDOs applied) is the
		// stable one.
		for _, r := range got.reps {
			sameTuples(t, r.name()+" current view", r.view.Current, r.view.Stable)
		}
	}
}

// checkCorrectionOrder: every UNDO is followed by stable tuples only, then
// a REC_DONE, and names the last stable id before it.
func checkCorrectionOrder(t *testing.T, r *stageRep) {
	t.Helper()
	var lastStable uint64
	correcting := false
	for i, e := range r.log {
		switch e.t.Type {
		case tuple.Undo:
			if e.t.ID != lastStable {
				t.Fatalf("%s: UNDO at %d names id %d, last stable id is %d", r.name(), i, e.t.ID, lastStable)
			}
			correcting = true
		case tuple.RecDone:
			if !correcting {
				t.Fatalf("%s: REC_DONE at %d without UNDO", r.name(), i)
			}
			correcting = false
		case tuple.Tentative:
			if correcting {
				t.Fatalf("%s: tentative tuple at %d inside a correction", r.name(), i)
			}
		default:
			if e.t.ID != lastStable+1 {
				t.Fatalf("%s: stable tuple at %d has id %d after %d", r.name(), i, e.t.ID, lastStable)
			}
			lastStable = e.t.ID
		}
	}
	if correcting {
		t.Fatalf("%s: UNDO without REC_DONE", r.name())
	}
}
