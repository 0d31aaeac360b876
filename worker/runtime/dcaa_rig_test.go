package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// dcaaOpts are the runtime options of the property tests: a 10ms
// boundary interval and a 400ms detection timeout (long enough that a
// loaded 2-core machine rarely starves a process past it; a live replica
// taken for failed only costs a needless correction, but it may keep a
// test's scenario from happening).
var dcaaOpts = Options{BoundaryInterval: 10 * time.Millisecond, StallAfter: 5 * time.Second, DetectTimeout: 400 * time.Millisecond}

// faultRig runs q on n workers; the workers named in faulty dial the data
// plane through their own faults (faults[i]), so their links to other
// workers can be cut. place picks each task's worker.
type faultRig struct {
	*dcaaRig
	faults map[int]*dataplane.Faults
}

func newFaultRig(t *testing.T, q *queryspec.Query, n int, faulty []int, opts Options, place func(node string, p, r int) int) *faultRig {
	t.Helper()
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	shared := dataplane.NewPool()
	c := &cluster{pool: shared, query: q, specs: map[*worker][]TaskSpec{}}
	g := &faultRig{faults: map[int]*dataplane.Faults{}}
	for i := range n {
		pool := shared
		for _, f := range faulty {
			if f == i {
				g.faults[i] = dataplane.NewFaults()
				pool = dataplane.NewPool(g.faults[i].DialOption())
				t.Cleanup(func() { pool.Close() })
			}
		}
		c.workers = append(c.workers, startWorkerOpts(t, pool, opts))
	}
	t.Cleanup(func() { c.close(t) })
	g.dcaaRig = &dcaaRig{c: c, q: q}
	g.place(t, q, plan, place)
	return g
}

// place adds q's tasks to the rig's workers (another query sharing them,
// too; the caller applies).
func (g *faultRig) place(t *testing.T, q *queryspec.Query, plan *queryspec.Plan, place func(node string, p, r int) int) {
	t.Helper()
	c := g.c
	at := map[string]*worker{}
	var placements []Placement
	for _, node := range plan.Nodes {
		for p := range max(1, node.Partitions) {
			for r := range max(1, q.Replicas) {
				w := c.workers[place(node.Name, p, r)]
				id := queryspec.TaskID(q.Name, node.Name, p, r)
				placements = append(placements, Placement{TaskID: id, Fragment: node.Name, Partition: p, Replica: r, WorkerAddr: w.addr})
				at[id] = w
			}
		}
	}
	for _, pl := range placements {
		c.specs[at[pl.TaskID]] = append(c.specs[at[pl.TaskID]], TaskSpec{TaskID: pl.TaskID, Query: q.Name,
			Fragment: pl.Fragment, Partition: pl.Partition, Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements})
	}
}

// cut holds (or resets) every link from worker from to the workers to.
func (g *faultRig) cut(from int, mode dataplane.CutMode, to ...int) {
	for _, w := range to {
		g.faults[from].CutOutgoing(g.c.workers[w].addr, mode)
	}
}

// task is the running task id on whichever worker runs it.
func (g *faultRig) task(id string) *task {
	for _, w := range g.c.workers {
		if tk := w.rt.task(id); tk != nil {
			return tk
		}
	}
	return nil
}

func mustParse(t *testing.T, yaml string) *queryspec.Query {
	t.Helper()
	q, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return q
}
