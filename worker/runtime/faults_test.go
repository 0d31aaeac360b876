package runtime

import (
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// A data-plane link cut under a running replicated query (fault
// injection, mode Reset): the downstream replica whose upstream replica
// sits behind the cut moves to the other upstream replica by the
// existing switch-over, and its results are the other replica's, tuple
// for tuple. (A silently held link is not noticed by the switch-over: it
// has no timeout. DCAA's failure detection covers that once wired.)
func TestCutLinkSwitchesUpstreamReplica(t *testing.T) {
	q, err := queryspec.Parse("cut.yaml", []byte(`name: cut
replicas: 2
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 3, limit: 6000}}
sinks:
  - {name: out, input: lines}
`))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{BoundaryInterval: 10 * time.Millisecond, StallAfter: 5 * time.Second}
	shared := dataplane.NewPool()
	faults := dataplane.NewFaults()
	faulty := dataplane.NewPool(faults.DialOption())
	defer faulty.Close()
	// Source replica r on worker r; the sink's replica 0 on worker 2,
	// which dials through the faults; its replica 1 beside source 1.
	c := &cluster{pool: shared, query: q, specs: map[*worker][]TaskSpec{}}
	c.workers = []*worker{startWorkerOpts(t, shared, opts), startWorkerOpts(t, shared, opts), startWorkerOpts(t, faulty, opts)}
	defer c.close(t)
	at := map[string]*worker{}
	var placements []Placement
	for _, node := range plan.Nodes {
		for r := range q.Replicas {
			w := c.workers[r]
			if node.Kind == queryspec.KindSink && r == 0 {
				w = c.workers[2]
			}
			id := queryspec.TaskID(q.Name, node.Name, 0, r)
			placements = append(placements, Placement{TaskID: id, Fragment: node.Name, Replica: r, WorkerAddr: w.addr})
			at[id] = w
		}
	}
	for _, pl := range placements {
		c.specs[at[pl.TaskID]] = append(c.specs[at[pl.TaskID]], TaskSpec{TaskID: pl.TaskID, Query: q.Name,
			Fragment: pl.Fragment, Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements})
	}
	c.apply()
	up0, up1 := c.workers[0].addr, c.workers[1].addr
	waitUntil(t, "sink replica 0 reading source replica 0", func() bool { return faults.BytesFrom(up0) > 16<<10 })
	before := faults.BytesFrom(up1)
	faults.CutOutgoing(up0, dataplane.Reset)

	got := c.tail(t, queryspec.TaskID(q.Name, "out", 0, 0))
	want := c.tail(t, queryspec.TaskID(q.Name, "out", 0, 1))
	if moved := faults.BytesFrom(up1) - before; moved < 16<<10 {
		t.Fatalf("only %d bytes came from source replica 1 after the cut: the sink did not switch (or the cut came too late)", moved)
	}
	if len(got) != len(want) || len(want) < 6000 {
		t.Fatalf("sink replica 0 has %d tuples, replica 1 %d (want >= 6000)", len(got), len(want))
	}
	for i := range want {
		g, w := &got[i], &want[i]
		if g.ID != w.ID || g.Type != w.Type || g.STime != w.STime || !slices.Equal(g.Values, w.Values) {
			t.Fatalf("tuple %d: replica 0 has %+v, replica 1 %+v", i, *g, *w)
		}
	}
}
