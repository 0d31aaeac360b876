package runtime

import (
	"fmt"
	"slices"
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
	opts, pace := pacedOpts(t, opts)
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
	g.dcaaRig = &dcaaRig{c: c, q: q, pace: pace}
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

// readOther names the inputs of the running tasks ids that read, or
// read at some point, a copy of their upstream other than its replica r:
// one that moved (see input.countSwitch), or one reading another replica
// now (its first choice is not counted as a move).
func (g *faultRig) readOther(r int, ids ...string) []string {
	var out []string
	for _, id := range ids {
		tk := g.task(id)
		if tk == nil {
			continue
		}
		tk.inMu.Lock()
		inputs := slices.Clone(tk.inputs)
		tk.inMu.Unlock()
		for _, in := range inputs {
			in.mu.Lock()
			cur := in.current
			in.mu.Unlock()
			if n := in.switches.Load(); n > 0 || cur.TaskID != "" && cur.Replica != r {
				out = append(out, fmt.Sprintf("%s reading %s (%d moves)", id, cur.TaskID, n))
			}
		}
	}
	return out
}

func mustParse(t *testing.T, yaml string) *queryspec.Query {
	t.Helper()
	q, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// restSpeed is the pace of a rig's generators once a test's failure
// scenario is over (restAtSpeed).
const restSpeed = 8

// pacedOpts gives a rig's workers one generator pace, at 1 (the
// generators' own rates) until restAtSpeed.
func pacedOpts(t *testing.T, opts Options) (Options, *Pace) {
	t.Helper()
	if opts.SourcePace != nil {
		return opts, opts.SourcePace
	}
	pace, err := NewPace(1)
	if err != nil {
		t.Fatal(err)
	}
	opts.SourcePace = pace
	return opts, pace
}

// restAtSpeed runs the rest of the rig's input restSpeed times faster in
// wall time: for a test whose failures are over (healed, and their
// effect seen), the rest of the stream only has to reach its end for the
// sinks' whole outputs to be compared. Stream times, and so every
// result, are unchanged (Pace); only the wait for the end is shorter.
// The streams are long enough for the failures to happen well within
// them on a loaded machine (a loaded 2-core machine has been seen to
// take 2 s of a 4 s stream to get the first failure going); at the
// generators' own rates the rest took most of each test's time.
func (g *dcaaRig) restAtSpeed(t *testing.T) {
	t.Helper()
	if err := g.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
}
