package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dataplane"
)

// A downstream replica whose input reads a failed upstream replica (one
// releasing tentative results) takes no stable tuple of that input until
// the replica corrects itself, so the acknowledgements it relays to the
// upstream's other replicas stand still. Those relays counted as
// connected subscribers: the exact replica kept its stable output for
// that downstream replica and, its buffer full, stopped, and with it the
// upstreams it shares with the failed replica, which needs their stable
// input to correct itself (the replay-bound test's merging variant
// stalled for good under load). A relay of a failed input now pauses:
// the downstream replica counts as a missing subscriber (its lease, then
// the overrun grace), never as a slow one.
//
// The aggregate's replica 0 loses partition 0 (its links to both source
// replicas reset) and releases tentative results; the merging sink's
// replica 0 reads it. The aggregate's replica 1 must keep producing:
// more than twice its buffer's bound beyond what sink replica 0 took
// stably, which that sink's relay, holding it by flow control, made
// impossible.
func TestDCAARelayOfAFailedInputHoldsNothing(t *testing.T) {
	const bufTuples = 200
	opts := dcaaOpts
	opts.Buffer.MaxTuples = bufTuples
	opts.Buffer.OverrunGrace = 100 * time.Millisecond
	q := mustParse(t, keyedAggYAML)
	g := newFaultRig(t, q, 6, []int{2}, opts, propPlace(false))
	g.c.apply()
	const agg0, agg1, sink0 = "kagg/counts/p0/r0", "kagg/counts/p0/r1", "kagg/out/p0/r0"
	// Before the failure: aggregate replica 0 reads partition 0, and
	// both sink replicas subscribed to aggregate replica 1 (a buffer
	// discards nothing for a replica that never subscribed, for a lease
	// after its start).
	waitUntil(t, "aggregate replica 0 reading partition 0, both sinks subscribed to replica 1", func() bool {
		tk := g.task(agg1)
		if tk == nil || g.faults[2].BytesFrom(g.c.workers[0].addr) < 8<<10 {
			return false
		}
		st := tk.outs[0].buf.Stats()
		return st.Connected == 2 && st.Missing == 0
	})
	g.cut(2, dataplane.Reset, 0, 1)
	waitUntil(t, "aggregate replica 0 releasing tentative results", func() bool { return g.taskState(agg0).Tentative })
	in := g.task(sink0).inputs[0]
	exact := g.task(agg1).outs[0].buf
	var last, taken uint64
	waitUntilOr(t, "aggregate replica 1 producing past sink replica 0's stable progress", func() bool {
		in.mu.Lock()
		reads := in.current.TaskID
		in.mu.Unlock()
		if reads == agg1 {
			// Sink replica 0 took replica 0 for silent (a loaded
			// machine) and reads replica 1 itself: nothing to show.
			t.Logf("sink replica 0 moved to aggregate replica 1")
			return true
		}
		last, taken = exact.Stats().LastID, in.stableTaken.Load()
		return last > taken+2*bufTuples
	}, func() {
		t.Logf("aggregate replica 1 at id %d; sink replica 0 took stable id %d; buffer %+v", last, taken, exact.Stats())
	})
	t.Logf("aggregate replica 1 at id %d; sink replica 0 took stable id %d", last, taken)
	g.faults[2].HealAll()
}
