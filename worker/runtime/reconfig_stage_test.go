package runtime

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// TestReconfigStagedPlanBuiltAhead: a plan staged while it commits has
// its versions built in every task before the commit, with no effect;
// the committed plan then installs them without building anything. A
// staged plan that never commits is discarded, and one whose committed
// plan of the same epoch differs is replaced by a build of the committed
// one: every tuple's path names the committed versions only, none is
// lost or duplicated.
func TestReconfigStagedPlanBuiltAhead(t *testing.T) {
	const limit = 3000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), "static")
	done := r.tail()
	waitUntil(t, "results flowing", func() bool { return r.received() > 200 })
	stage := func(v int) {
		for _, w := range r.c.workers {
			w.rt.Stage([]StagedPlan{{Query: "rc", QueryIndex: 1, Plan: r.nextPlan(v)}})
		}
	}
	// built reports the epochs staged and the operators built ahead in
	// the tasks that run a or b, and the operators built at a commit.
	built := func() (staged []uint64, ops, commitBuilds int) {
		for _, w := range r.c.workers {
			for _, tk := range w.rt.tasksByID() {
				p := &tk.rc.pre
				p.mu.Lock()
				for e := range p.staged {
					if !slices.Contains(staged, e) {
						staged = append(staged, e)
					}
				}
				ops += len(p.ops)
				p.mu.Unlock()
				commitBuilds += int(p.commitBuilds.Load())
			}
		}
		return staged, ops, commitBuilds
	}

	// Staged, then withdrawn without committing: discarded.
	stage(5)
	if staged, ops, _ := built(); !slices.Equal(staged, []uint64{1}) || ops != 3 {
		t.Fatalf("after staging epoch 1: staged %v, %d operators built (want [1], 3: a in two tasks, b)", staged, ops)
	}
	for _, st := range r.states() {
		if st.ReconfigAcked != 0 {
			t.Fatalf("task %s acknowledged a staged plan", st.TaskID)
		}
	}
	for _, w := range r.c.workers {
		w.rt.Stage(nil)
	}
	if staged, ops, _ := built(); len(staged) != 0 || ops != 0 {
		t.Fatalf("a staged plan withdrawn: still staged %v, %d operators built", staged, ops)
	}

	// Staged as version 5, committed as version 2: rebuilt at the commit.
	stage(5)
	r.commit(2)
	if staged, ops, n := built(); len(staged) != 0 || ops != 0 || n != 3 {
		t.Fatalf("committed plan unlike the staged one: staged %v, %d operators left, %d built at the commit (want 3)", staged, ops, n)
	}

	// Staged as committed: nothing built at the commit.
	stage(3)
	r.commit(3)
	if staged, ops, n := built(); len(staged) != 0 || ops != 0 || n != 3 {
		t.Fatalf("committed plan as staged: staged %v, %d operators left, %d built at the commits (want the 3 of epoch 1)", staged, ops, n)
	}
	for _, w := range r.c.workers {
		if w.rt.ReconfigStaged("rc", 2).IsZero() {
			t.Errorf("a runtime did not record its build of staged epoch 2")
		}
	}
	r.switchAll(100 * time.Millisecond)
	r.waitLevel(2)
	r.complete()
	<-done
	paths := r.check(limit, true)
	if paths["v5"] != 0 {
		t.Fatalf("tuples processed by the staged plan that never committed: %v", paths)
	}
}

// TestReconfigHandedToAFailedTask: a task that could not be built (here
// a fragment its query does not have) is handed a reconfiguration, staged
// and then committed, like any task of the query: nothing is built for it
// and the worker goes on (it dereferenced the task's missing node).
func TestReconfigHandedToAFailedTask(t *testing.T) {
	q, err := queryspec.Parse("rc.yaml", []byte(fmt.Sprintf(reconfigYAML, 10, 10)))
	if err != nil {
		t.Fatal(err)
	}
	pool := dataplane.NewPool()
	t.Cleanup(func() { pool.Close() })
	w := startWorkerOpts(t, pool, Options{BoundaryInterval: 5 * time.Millisecond})
	t.Cleanup(func() { w.close(t) })
	spec := TaskSpec{TaskID: "rc/nope/p0/r0", Query: "rc", Fragment: "nope", QueryIndex: 1, Spec: q}
	w.rt.Apply(context.Background(), []TaskSpec{spec})
	r := &reconfigRun{t: t, version: func(v int) string { return versionYAML(fmt.Sprintf(reconfigYAML, 10, 10), v) }, changed: []string{"a", "b"}}
	plan := r.nextPlan(2)
	w.rt.Stage([]StagedPlan{{Query: "rc", QueryIndex: 1, Plan: plan}})
	spec.Reconfig = &fsm.QueryReconfig{Plans: []fsm.ReconfigPlan{plan}}
	w.rt.Apply(context.Background(), []TaskSpec{spec})
	if sts := w.rt.States(); len(sts) != 1 || sts[0].State != StateFailed {
		t.Fatalf("states %+v, want the one failed task", sts)
	}
}
