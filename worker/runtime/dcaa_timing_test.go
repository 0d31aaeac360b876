package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// max_delay 0 processes at once through a join of two DCAA tasks: with
// every replica of one source partition unreachable, the aggregate and
// the two filters behind it release tentatively at once, and the join
// reading both filters matches them at once too, so its tentative results
// keep coming during the failure. Before, the join's machine released a
// bucket as soon as one side's tentative data covered it, and dropped the
// other side's tuples, arriving a moment later (a filter passes a window
// result on in the release step after its stream time), as late: the
// join produced next to nothing until the failure was over (bench dcaa:
// max_delay 0 stalled for about the failure's length).
func TestDCAAImmediateDownstreamKeepsProducing(t *testing.T) {
	q := mustParse(t, `name: imm
replicas: 2
availability: {max_delay: 0s}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: 24000}, parallelism: 2}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 100ms}, aggregates: {n: "count()"}}
  - {name: left, type: filter, input: counts, where: "n >= 0"}
  - {name: right, type: filter, input: counts, where: "n >= 0"}
  - {name: both, type: join, left: left, right: right, on: [window_end], window: {size: 100ms}}
sinks:
  - {name: out, input: both}
`)
	// Source partition 0's replicas on workers 0 and 1, partition 1's on
	// worker 3; the aggregate's replicas on workers 2 and 5 (both can be
	// cut from partition 0); the filters', join's and sink's replica 0 on
	// worker 4, replica 1 on worker 1.
	g := newFaultRig(t, q, 6, []int{2, 5}, dcaaOpts, func(node string, p, r int) int {
		switch {
		case node == "lines" && p == 1:
			return 3
		case node == "lines":
			return r
		case node == "counts" && r == 0:
			return 2
		case node == "counts":
			return 5
		case r == 0:
			return 4
		}
		return 1
	})
	g.c.apply()
	last0 := queryspec.TaskID(q.Name, "both", 0, 0)
	waitUntil(t, "the aggregate's replicas reading partition 0", func() bool {
		return g.faults[2].BytesFrom(g.c.workers[0].addr) > 8<<10 && g.faults[5].BytesFrom(g.c.workers[1].addr) > 8<<10
	})
	g.cut(2, dataplane.Hold, 0, 1)
	g.cut(5, dataplane.Hold, 0, 1)
	tk := g.task(last0)
	out := tk.outs[0].buf
	// Let the join's tentative progress cover a second of stream time
	// (ten windows, one result each) while the links are held.
	var from int64
	waitUntil(t, "the join's tentative progress covering a second", func() bool {
		_, wm := out.StreamState()
		if wm == 0 {
			return false
		}
		if from == 0 {
			from = wm
		}
		return wm >= from+int64(time.Second)
	})
	// Positions outside the stable view: its tentative results (no UNDO
	// can come while the links are held).
	if n := out.PositionOffset(out.Stats().LastID); n < 6 {
		t.Fatalf("%d tentative results for ten windows while the links were held", n)
	}
	g.faults[2].HealAll()
	g.faults[5].HealAll()
	waitUntil(t, last0+" STABLE again", func() bool {
		st := g.taskState(last0)
		return st.Replica == fedstreampb.ReplicaState_REPLICA_STABLE && !st.Tentative
	})
	g.restAtSpeed(t)
	got := viewOf(g.c.tail(t, queryspec.TaskID(q.Name, "out", 0, 0)))
	want := viewOf(g.c.tail(t, queryspec.TaskID(q.Name, "out", 0, 1)))
	t.Logf("sink replica 0: %d stable, %d tentative, %d UNDO; replica 1: %d stable, %d tentative", len(got.stable), got.tentative, got.undos, len(want.stable), want.tentative)
	if got.tentative == 0 {
		t.Fatal("no tentative result reached the sink during the failure")
	}
	sameStable(t, got.stable, want.stable, 20)
}
