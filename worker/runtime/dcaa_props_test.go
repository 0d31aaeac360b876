package runtime

import (
	"strconv"

	"github.com/fedstream/fedstream/config/queryspec"
	"testing"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// propRig runs a two-partition source into a replicated windowed
// aggregate (one partition) and a pass-through sink, on five workers:
// source partition 0's replicas on workers 0 and 1, partition 1's on
// worker 3, the aggregate's replica 0 on worker 2 (its links can be cut:
// cutting them to workers 0 and 1 takes every replica of source partition
// 0 from it while partition 1 stays live), the sink's replica 0 on worker
// 4 (its links can be cut too), every other replica 1 on worker 1.
// Replica 1 runs without failures: its sink is the reference.
func newPropRig(t *testing.T, maxDelay string, limit int) *faultRig {
	t.Helper()
	g := newFaultRig(t, propQuery(t, "agg", maxDelay, limit), 6, []int{2, 4, 5}, dcaaOpts, propPlace(false))
	g.c.apply()
	return g
}

// propQuery is the query of propRig.
func propQuery(t *testing.T, name, maxDelay string, limit int) *queryspec.Query {
	return mustParse(t, `name: `+name+`
replicas: 2
availability: {max_delay: `+maxDelay+`}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: `+strconv.Itoa(limit)+`}, parallelism: 2}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 100ms}, aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`)
}

// propPlace places propRig's tasks; with bothFaulty the aggregate's
// replica 1 runs on worker 5, whose links can be cut too.
func propPlace(bothFaulty bool) func(node string, p, r int) int {
	return func(node string, p, r int) int {
		switch {
		case node == "lines" && p == 1:
			return 3
		case node == "lines":
			return r
		case node == "counts" && r == 1 && bothFaulty:
			return 5
		case r == 1:
			return 1
		case node == "counts":
			return 2
		}
		return 4
	}
}

const (
	propAgg0  = "agg/counts/p0/r0"
	propAgg1  = "agg/counts/p0/r1"
	propSink0 = "agg/out/p0/r0"
	propSink1 = "agg/out/p0/r1"
)

// stableAgain waits until the task reports STABLE with nothing tentative.
func (g *faultRig) stableAgain(t *testing.T, id string) {
	t.Helper()
	waitUntilOr(t, id+" STABLE again", func() bool {
		st := g.taskState(id)
		return st.Replica == fedstreampb.ReplicaState_REPLICA_STABLE && !st.Tentative
	}, func() { g.logStates(t) })
}

// logStates logs every task's state: what a test that gave up waited on.
func (g *dcaaRig) logStates(t *testing.T) {
	t.Helper()
	for _, st := range g.c.states() {
		t.Logf("%s: %s %v tentative %v lossy %v: %s", st.TaskID, st.State, st.Replica, st.Tentative, st.Lossy, st.Message)
	}
}

// readingStable waits until the aggregate's replica 0 reads source
// partition 0 and is stable.
func (g *faultRig) readingStable(t *testing.T) {
	t.Helper()
	waitUntil(t, "aggregate replica 0 reading partition 0, stable", func() bool {
		return g.faults[2].BytesFrom(g.c.workers[0].addr) > 8<<10 && g.taskState(propAgg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
}

// compare fails unless sink replica 0's stable output equals replica
// 1's (which is cut from nothing), tuple for tuple, and returns replica
// 0's view.
func (g *faultRig) compare(t *testing.T) view {
	t.Helper()
	got := viewOf(g.c.tail(t, propSink0))
	want := viewOf(g.c.tail(t, propSink1))
	t.Logf("sink replica 0: %d stable, %d tentative, %d UNDO, %d REC_DONE; reference %d stable", len(got.stable), got.tentative, got.undos, got.recDones, len(want.stable))
	if want.tentative+want.undos+want.recDones != 0 {
		// Replica 1 is cut from nothing, but a starved process may miss
		// its detection timeout, and max_delay 0 releases on any skew:
		// it corrected itself, and its stable view must still match.
		t.Logf("replica 1's output holds %d tentative, %d UNDO, %d REC_DONE", want.tentative, want.undos, want.recDones)
	}
	sameStable(t, got.stable, want.stable, 40)
	return got
}

// A pass-through sink switching replicas of an upstream that corrected
// its output resumes by stable id: the aggregate's replica 0 goes
// tentative and corrects itself (its stream then numbers positions
// otherwise than replica 1's), the sink's replica 0 reads it past the
// correction and then loses it (link reset) and moves to replica 1. Its
// stable output equals the failure-free replica's. Resuming by position,
// the sink skipped or repeated windows.
func TestDCAAPassSinkSwitchAfterCorrection(t *testing.T) {
	g := newPropRig(t, "300ms", 16000)
	g.readingStable(t)
	g.cut(2, dataplane.Hold, 0, 1)
	waitUntil(t, "aggregate replica 0 releasing tentative results", func() bool { return g.taskState(propAgg0).Tentative })
	g.faults[2].HealAll()
	g.stableAgain(t, propAgg0)
	agg := g.task(propAgg0).outs[0].buf
	if agg.PositionOffset(agg.Stats().LastID) == 0 {
		t.Fatal("the aggregate's replica 0 corrected nothing")
	}
	sink := g.task(propSink0)
	waitUntil(t, "the sink reading past the correction", func() bool {
		return sink.inputs[0].stableTaken.Load() > 30 && !sink.tentative.Load()
	})
	out := sink.outs[0].buf
	if out.PositionOffset(out.Stats().LastID) == 0 {
		// A process starved past the detection timeout made the sink
		// leave replica 0 before its correction: the switch below is
		// then an ordinary one (the stable output is still checked).
		t.Log("the sink did not pass replica 0's correction (it left it early)")
	}
	g.cut(4, dataplane.Reset, 2)
	g.restAtSpeed(t)
	g.compare(t)
}

// A pass-through sink that loses its upstream replica while that one's
// results are tentative takes them back itself (UNDO) and goes on from
// the other replica by stable id.
func TestDCAAPassSinkSwitchWhileTentative(t *testing.T) {
	g := newPropRig(t, "300ms", 16000)
	g.readingStable(t)
	g.cut(2, dataplane.Hold, 0, 1)
	sink := g.task(propSink0)
	readsReplica0 := func() bool {
		in := sink.inputs[0]
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.current.Replica == 0
	}
	aggDone := func() bool { return g.taskState(propAgg0).Message == "input exhausted" }
	waitUntil(t, "the sink's results tentative (or the sink reading replica 1, or the aggregate done)", func() bool {
		return sink.tentative.Load() || !readsReplica0() || aggDone()
	})
	if !sink.tentative.Load() {
		// Under load the failure this test is about did not happen, and
		// waiting for tentative results timed out: a process starved
		// past the detection timeout made the sink leave aggregate
		// replica 0 before it went tentative ("upstream replica silent
		// past the detection timeout (replica 0)" before the cut), and
		// it does not go back; or a slow start (15 s to get here) let
		// the 4 s of input end and the aggregate take all of it before
		// the cut. The switch below is then an ordinary one: the stable
		// output is still checked.
		t.Logf("the sink's results never went tentative (reads replica 0: %v, aggregate done: %v)", readsReplica0(), aggDone())
		g.cut(4, dataplane.Reset, 2)
		g.faults[2].HealAll()
		g.restAtSpeed(t)
		g.compare(t)
		return
	}
	g.cut(4, dataplane.Reset, 2)
	waitUntil(t, "the sink's tentative results taken back", func() bool { return !sink.tentative.Load() })
	g.faults[2].HealAll()
	g.restAtSpeed(t)
	got := g.compare(t)
	if got.undos == 0 || got.recDones == 0 {
		t.Fatalf("sink replica 0: %d UNDO, %d REC_DONE: its tentative results were not taken back", got.undos, got.recDones)
	}
}
