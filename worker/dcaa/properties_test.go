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
	// refBuild, when set, builds the reference instead of build.
	refBuild func(h *harness) *stage
}

// run returns the reference stage and the failure run's stage.
func (sc scenario) run(t *testing.T) (ref, got *stage, h *harness) {
	t.Helper()
	refBuild := sc.build
	if sc.refBuild != nil {
		refBuild = sc.refBuild
	}
	h0 := newHarness(t, sc.parts, sc.k, sc.endMs)
	st0 := refBuild(h0)
	h0.run(sc.runMs)
	refB := boundaries(st0.reps[0].view.Stable)
	if len(refB) < 10 {
		t.Fatalf("reference produced only %d boundaries", len(refB))
	}
	h1 := newHarness(t, sc.parts, sc.k, sc.endMs)
	h1.refB = refB
	ref = refBuild(h1)
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
			// Each live replica on its own keeps the bound too: the
			// switch takes at most the detection timeout.
			for _, r := range got.reps {
				if lat := replicaLatency(r, ref); !r.dead && lat > int64(detect)+slack {
					t.Fatalf("%s delayed %v, detection takes %v", r.name(), time.Duration(lat), detect)
				}
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

// P4: two simultaneous failures (every replica of one upstream silent,
// one replica of the other killed), and a second failure that starts
// while a replica is stabilizing: the stable output ends identical to
// the reference.
func TestP4TwoFailures(t *testing.T) {
	t.Run("simultaneous", func(t *testing.T) {
		sc := scenario{parts: 2, k: 2, endMs: 900, runMs: 1200, build: oneStage(xBound, detect, 0),
			script: func(h *harness, st *stage) {
				h.cutSource(st, 0, 300, 600)
				h.at(300, func(h *harness) { h.dead["src1/r0"] = true })
			}}
		ref, got, _ := sc.run(t)
		if tentatives(got) == 0 {
			t.Fatal("no tentative tuple")
		}
		checkStable(t, ref, got)
	})
	t.Run("during stabilization", func(t *testing.T) {
		second := false
		sc := scenario{parts: 2, k: 2, endMs: 1000, runMs: 1400, build: oneStage(xBound, detect, 1),
			script: func(h *harness, st *stage) {
				h.cutSource(st, 0, 300, 550)
				// The moment a replica stabilizes, every replica of the
				// other upstream goes silent for 250 ms.
				h.hooks = append(h.hooks, func(h *harness) {
					if second {
						return
					}
					for _, r := range st.reps {
						if r.m.State() == Stabilization {
							second = true
							h.cutSource(st, 1, h.now/ms+1, h.now/ms+250)
							return
						}
					}
				})
			}}
		ref, got, _ := sc.run(t)
		if !second {
			t.Fatal("no replica stabilized")
		}
		for _, r := range got.reps {
			if r.m.Figures().Recoveries < 2 {
				t.Fatalf("%s recovered %d times, want 2 (one per failure)", r.name(), r.m.Figures().Recoveries)
			}
			checkCorrectionOrder(t, r)
		}
		checkStable(t, ref, got)
		if lat := addedLatency(got, ref); lat > int64(xBound)+slack {
			t.Fatalf("added latency %v > X", time.Duration(lat))
		}
	})
}

// P5: two queries with different X under the same failure each keep
// their own bound: the 300 ms query emits nothing tentative for a 200 ms
// failure, the 50 ms one goes tentative within 50 ms; both end equal to
// their references.
func TestP5TwoQueriesDifferentX(t *testing.T) {
	build := func(h *harness) *stage {
		h.addStage(stageOpts{name: "fast", window: "20ms", sum: "v", inSch: srcSchema,
			cfg: Config{Share: 50 * time.Millisecond, Detect: detect}}, h.srcGroups())
		return h.addStage(stageOpts{name: "patient", window: "20ms", sum: "v", inSch: srcSchema,
			cfg: Config{Share: 300 * time.Millisecond, Detect: detect}}, h.srcGroups())
	}
	sc := scenario{parts: 2, k: 2, endMs: 900, runMs: 1200, build: build,
		script: func(h *harness, st *stage) {
			for _, s := range h.stages {
				h.cutSource(s, 0, 300, 500)
			}
		}}
	ref, got, h := sc.run(t)
	fast := h.stages[0]
	if n := tentatives(got); n != 0 {
		t.Fatalf("X = 300 ms query: %d tentative tuples for a 200 ms failure", n)
	}
	checkStable(t, ref, got)
	if lat := addedLatency(got, ref); lat > int64(300*time.Millisecond)+slack {
		t.Fatalf("X = 300 ms query delayed %v", time.Duration(lat))
	}
	for _, r := range fast.reps {
		if r.firstTentAt < 0 || r.firstTentAt > 300*ms+50*ms+slack {
			t.Fatalf("X = 50 ms query: %s first tentative at %d ms (failure at 300 ms)", r.name(), r.firstTentAt/ms)
		}
		if r.m.State() != Stable || r.view.Recdns == 0 {
			t.Fatalf("X = 50 ms query: %s in %v, %d REC_DONE", r.name(), r.m.State(), r.view.Recdns)
		}
	}
	// The fast query's stable output against its own reference (the
	// first stage of the reference harness is not kept by run: rebuild).
	h0 := newHarness(t, 2, 2, 900)
	build(h0)
	h0.run(1200)
	for _, r := range fast.reps {
		sameTuples(t, r.name()+" stable output", r.view.Stable, h0.stages[0].reps[0].view.Stable)
	}
}

// P6: during stabilization at least one replica of the partition keeps
// producing results: never are both replicas stabilizing, and while one
// is, the other's output moves on.
func TestP6OneReplicaKeepsServing(t *testing.T) {
	sc := scenario{parts: 2, k: 2, endMs: 900, runMs: 1200, build: oneStage(xBound, detect, 1),
		script: func(h *harness, st *stage) { h.cutSource(st, 0, 300, 600) }}
	ref, got, _ := sc.run(t)
	a, b := got.reps[0], got.reps[1]
	if len(a.stabilizing) == 0 || len(b.stabilizing) == 0 {
		t.Fatalf("stabilizing ticks: %d and %d, want both replicas to reconcile in turn", len(a.stabilizing), len(b.stabilizing))
	}
	for i := range a.states {
		if a.states[i] == Stabilization && b.states[i] == Stabilization {
			t.Fatalf("both replicas stabilizing at tick %d", i+1)
		}
	}
	// The lower id reconciles first (tie rule).
	if a.stabilizing[0] > b.stabilizing[0] {
		t.Fatalf("replica 1 reconciled first (at %d ms, replica 0 at %d ms)", b.stabilizing[0]/ms, a.stabilizing[0]/ms)
	}
	checkStable(t, ref, got)
	if lat := addedLatency(got, ref); lat > int64(xBound)+slack {
		t.Fatalf("added latency %v > X: nobody served during stabilization", time.Duration(lat))
	}
}

// Two stages: tentative results, UNDO and corrections propagate; each
// stage gets its share of X (SplitDelay over the chain), so the end to
// end delay stays within X and the final stable output is the
// reference's.
func TestTwoStagesCorrectionsPropagate(t *testing.T) {
	shares, err := SplitDelay(xBound, []GraphNode{{Name: "src"}, {Name: "agg", Inputs: []string{"src"}, Delays: true},
		{Name: "agg2", Inputs: []string{"agg"}, Delays: true}})
	if err != nil {
		t.Fatal(err)
	}
	build := func(h *harness) *stage {
		first := h.addStage(stageOpts{name: "agg", window: "20ms", sum: "v", inSch: srcSchema,
			cfg: Config{Share: shares["agg"], Detect: detect}}, h.srcGroups())
		return h.addStage(stageOpts{name: "agg2", window: "40ms", sum: "n", inSch: h.aggSchema(srcSchema, "v"),
			cfg: Config{Share: shares["agg2"], Detect: detect}}, [][]producer{first.producers()})
	}
	sc := scenario{parts: 2, k: 2, endMs: 900, runMs: 1300, build: build,
		script: func(h *harness, st *stage) { h.cutSource(h.stages[0], 0, 300, 600) }}
	ref, got, _ := sc.run(t)
	for _, r := range got.reps {
		if r.view.Tentative == 0 || r.view.Undos == 0 {
			t.Fatalf("%s: %d tentative, %d UNDO: the failure did not reach the second stage", r.name(), r.view.Tentative, r.view.Undos)
		}
		checkCorrectionOrder(t, r)
	}
	checkStable(t, ref, got)
	if lat := addedLatency(got, ref); lat > int64(xBound)+2*slack {
		t.Fatalf("end-to-end added latency %v > X", time.Duration(lat))
	}
}

// Strict queries never emit tentative results: they block, then catch
// up exactly.
func TestStrictBlocks(t *testing.T) {
	sc := scenario{parts: 2, k: 2, endMs: 800, runMs: 1100, build: oneStage(Strict, detect, 0),
		script: func(h *harness, st *stage) { h.cutSource(st, 0, 300, 600) }}
	ref, got, _ := sc.run(t)
	if n := tentatives(got); n != 0 {
		t.Fatalf("strict query emitted %d tentative tuples", n)
	}
	checkStable(t, ref, got)
	if lat := addedLatency(got, ref); lat < 250*ms {
		t.Fatalf("strict query delayed only %v by a 300 ms failure", time.Duration(lat))
	}
}

// max_delay 0: nothing waits for a failed input. Without a failure
// nothing is tentative (the skew between two live inputs is no failure);
// a failure gives tentative output as soon as it is detected, so the
// added latency is the detection timeout. The stable output is still
// exactly that of a query with X > 0 and no failure.
func TestZeroDelayReleasesAtOnce(t *testing.T) {
	sc := scenario{parts: 2, k: 2, endMs: 800, runMs: 1100, build: oneStage(0, detect, 0), refBuild: oneStage(xBound, detect, 0),
		script: func(h *harness, st *stage) { h.cutSource(st, 0, 300, 400) }}
	ref, got, _ := sc.run(t)
	for _, r := range got.reps {
		if r.firstTentAt < 300*ms {
			t.Fatalf("%s: first tentative tuple at %d ms, before the failure at 300 ms (or none)", r.name(), r.firstTentAt/ms)
		}
	}
	checkStable(t, ref, got)
	if lat := addedLatency(got, ref); lat > int64(detect)+slack {
		t.Fatalf("added latency %v with max_delay 0 (detection %v)", time.Duration(lat), detect)
	}
	// No failure: nothing tentative at all.
	sc.script = nil
	_, got, _ = sc.run(t)
	if n := tentatives(got); n != 0 {
		t.Fatalf("no failure, max_delay 0: %d tentative tuples, want none", n)
	}
	checkStable(t, ref, got)
}
