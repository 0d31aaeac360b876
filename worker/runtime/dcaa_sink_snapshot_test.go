package runtime

import (
	"fmt"
	"testing"

	"github.com/fedstream/fedstream/worker/dataplane"
)

// A merging sink of a replicated query filters each delivered batch (its
// stable tuples, renumbered by stable id) before its merger takes it, and
// the merger's add may wait for room while another input lags. A
// snapshot taken during that wait must put the input's position where
// the merger's state is, not where the filter got to: the copy started
// from it would otherwise resume after the waiting batch, which the old
// copy never processed, and lose its rows.
//
// Sink replica 0 runs alone on worker 3, which dials through faults; its
// links to worker 2 (both replicas of counts partition 1) are held, so
// partition 1's input lags and partition 0's input, a few tuples of room
// per input, waits in add. The sink is then moved by stop-and-copy, as
// TestRescaleKeyedAggregate moves it, and its output must equal the
// reference and the other replica's.
func TestMergingSinkSnapshotWhileAddWaits(t *testing.T) {
	for _, halt := range []bool{true, false} {
		t.Run(fmt.Sprintf("halt=%v", halt), func(t *testing.T) {
			testMergingSinkSnapshotWhileAddWaits(t, halt)
		})
	}
}

func testMergingSinkSnapshotWhileAddWaits(t *testing.T, halt bool) {
	// The 20000 lines in five seconds: the cut, the wait in add and the
	// move happen while partition 0 still sends (in two seconds, a
	// loaded machine had sent it all before the cut: add never waited);
	// the rest runs at the rig's rest speed once the links healed.
	const rate = 4000
	q := mustParse(t, fmt.Sprintf(wordsQuery, 2, rate))
	opts := dcaaOpts
	opts.InputPendingTuples = 8
	g := newFaultRig(t, q, 5, []int{3}, opts, func(node string, p, r int) int {
		switch {
		case node == "counts":
			return 1 + p // partition p's replicas on worker 1+p
		case node == "out" && r == 0:
			return 3
		default:
			return 0 // the source, sink replica 1
		}
	})
	c := g.c
	c.apply()
	const sink = "wc/out/p0/r0"
	tk := g.task(sink)
	if tk == nil || tk.mv == nil {
		t.Fatalf("%s is not a merging sink of a replicated query", sink)
	}
	var in0 *input
	for _, in := range tk.inputs {
		if in.upPartition == 0 {
			in0 = in
		}
	}
	if in0 == nil || len(tk.inputs) != 2 {
		t.Fatalf("%s has %d inputs, want counts partitions 0 and 1", sink, len(tk.inputs))
	}
	waitUntil(t, "the sink took stable results of both inputs", func() bool {
		for _, in := range tk.inputs {
			if in.stableTaken.Load() < 20 {
				return false
			}
		}
		return true
	})
	g.cut(3, dataplane.Hold, 2)
	waitUntil(t, "partition 0's input waiting for room in the merge", func() bool {
		return tk.merge.addsWaiting() > 0
	})
	c.move(t, sink, c.workers[3], c.workers[4], halt)
	g.faults[3].HealAll()
	g.restAtSpeed(t)
	got := c.tail(t, sink)
	sameResults(t, results(t, got, sinkSchema(t, c.query)), reference(t, rate))
	if other := c.tail(t, "wc/out/p0/r1"); !sameTuples(got, other) {
		t.Fatalf("the sink's replicas differ (%d vs %d tuples)", len(got), len(other))
	}
}
