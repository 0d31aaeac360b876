package runtime

import (
	"fmt"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// TestReconfigVersionsBuiltOffTheProducer: a running task handed a plan
// gets its new versions built on the goroutine that hands it the plan
// (Apply), not on its own producer, where parsing the configuration and
// compiling the expressions paused the task's stream (a source's pause
// holds up every task merging it): once every task acknowledged, no
// task's producer built an operator, and each took every prebuilt one.
// The tasks of a runtime share one parse of the epoch's configuration.
// The upgrade still completes with no mixed, lost or duplicated tuple.
// Each runtime records when its Apply handed the tasks the epoch
// (ReconfigApplies), once.
func TestReconfigVersionsBuiltOffTheProducer(t *testing.T) {
	const limit = 3000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), "static")
	done := r.tail()
	waitUntil(t, "results flowing", func() bool { return r.received() > 200 })
	r.commit(2)
	for _, w := range r.c.workers {
		// The epoch's plan was parsed once for all the tasks here.
		var shared *queryspec.Plan
		for _, tk := range w.rt.tasksByID() {
			p := tk.rc.pre.plan(1)
			if p == nil {
				t.Fatalf("task %s: no prebuilt plan of epoch 1", tk.spec.TaskID)
			}
			if shared == nil {
				shared = p
			} else if p != shared {
				t.Errorf("task %s parsed epoch 1's plan again", tk.spec.TaskID)
			}
		}
		for _, tk := range w.rt.tasksByID() {
			if n := tk.rc.pre.producerBuilds.Load(); n != 0 {
				t.Errorf("task %s: its producer built %d operators", tk.spec.TaskID, n)
			}
			tk.rc.pre.mu.Lock()
			left := len(tk.rc.pre.ops)
			tk.rc.pre.mu.Unlock()
			if left != 0 {
				t.Errorf("task %s: %d prebuilt operators not installed", tk.spec.TaskID, left)
			}
		}
	}
	r.switchAll(100 * time.Millisecond)
	// Each runtime timed the one Apply that handed its tasks epoch 1,
	// and none of the later ones (the switch, a phase of the same epoch).
	for i, w := range r.c.workers {
		as := w.rt.ReconfigApplies()
		if len(as) != 1 || as[0].Query != "rc" || as[0].Epoch != 1 || as[0].Began.IsZero() || as[0].Done.Before(as[0].Began) {
			t.Errorf("worker %d: reconfiguration applies %+v, want one of epoch 1 of rc", i, as)
		}
	}
	r.waitLevel(1)
	r.complete()
	<-done
	r.check(limit, true)
}
