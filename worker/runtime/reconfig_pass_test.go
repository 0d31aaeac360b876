package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// A pass-through sink takes its upstream's marker of a plan from inside
// a batch: the upstream's boundary carrying level 1 is followed, in the
// one batch the sink reads, by a result (a backlog read in full batches
// ends anywhere). Before, the sink looked at the batch's last tuple
// only, stayed at level 0, and the plan did not complete until a later
// batch happened to end with a boundary (bench reconfig's side-by-side
// overhead under load: "timed out waiting for plan 1 complete", the sink
// the only task below the plan's level, nothing queued).
func TestReconfigPassThroughSinkTakesAMarkerInsideABatch(t *testing.T) {
	q := mustParse(t, `name: plv
sources:
  - {name: lines, generator: {kind: words, rate: 1000, seed: 1, limit: 10}}
sinks:
  - {name: out, input: lines}
`)
	spec, err := q.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	rc := &fsm.QueryReconfig{Tracking: fsm.TrackingStatic, Plans: []fsm.ReconfigPlan{{
		Epoch: 1, SpecJSON: spec, Phase: fsm.ReconfigSwitched, Cut: int64(10 * time.Millisecond)}}}
	fake, c, w := fakeUpstreamCluster(t, q, func(n *queryspec.Node) bool { return n.Kind != queryspec.KindSource })
	ts := fakeTuples(fakeTuple{"s", 5}, fakeTuple{"b", 10}, fakeTuple{"s", 11})
	ts[1].Version = 1 // the source's marker: its first boundary at the cut
	ts[2].Version = 1
	// Written before the sink subscribes: it reads the three in one batch.
	fake.put(t, queryspec.TaskID(q.Name, "lines", 0, 0), dataplane.BufferOptions{}, 0, ts...)
	sink := queryspec.TaskID(q.Name, "out", 0, 0)
	for i := range c.specs[w] {
		c.specs[w][i].Reconfig, c.specs[w][i].MarkersExpected = rc, 1
	}
	c.apply()
	waitUntil(t, "the sink passing the three tuples on", func() bool {
		tk := w.rt.task(sink)
		return tk != nil && tk.outs[0].buf.Stats().LastID >= 3
	})
	// The batch was adopted under the task's processing lock, its level
	// taken before the lock was let go.
	tk := w.rt.task(sink)
	if err := tk.lockProc(context.Background()); err != nil {
		t.Fatal(err)
	}
	level := tk.rc.level
	tk.unlockProc()
	if level != 1 {
		t.Fatalf("sink at level %d after a batch holding its upstream's marker of plan 1, want 1", level)
	}
	if tk.spec.Fragment != "out" || !tk.passThrough {
		t.Fatalf("task %s is not a pass-through sink", sink)
	}
}
