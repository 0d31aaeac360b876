package runtime

import (
	"fmt"
	"slices"
	"testing"
	"time"
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
