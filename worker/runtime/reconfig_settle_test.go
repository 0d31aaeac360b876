package runtime

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestReconfigSettlingUntilEveryTaskAcked: a worker reports when its
// runtime signals reconfiguration progress, and every report is a Raft
// write that the worker's next report waits for. The first task to
// install a plan used to be reported alone, while the others had not
// been handed the plan yet or installed it later (a busy task at its next
// release, a source before its next record): two sequential Raft writes
// on the path of every plan. ReconfigSettling holds the report while a
// running task of the runtime holds a plan it has not acknowledged: here
// a task whose producer is busy (its processing token held) when the
// plan is handed over.
func TestReconfigSettlingUntilEveryTaskAcked(t *testing.T) {
	const limit = 3000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), "static")
	done := r.tail()
	waitUntil(t, "results flowing", func() bool { return r.received() > 200 })
	var busy *task
	var rt *Runtime
	for _, w := range r.c.workers {
		if tk := w.rt.task("rc/out/p0/r0"); tk != nil {
			busy, rt = tk, w.rt
		}
	}
	if busy == nil {
		t.Fatal("no task rc/out/p0/r0")
	}
	if rt.ReconfigSettling() {
		t.Fatal("settling before any plan")
	}
	if err := busy.lockProc(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := r.addPlan(2)
	settling := rt.ReconfigSettling()
	acked := busy.rc.acked.Load()
	busy.unlockProc()
	if acked >= p.Epoch {
		t.Fatalf("the busy task acknowledged epoch %d while its producer was held", acked)
	}
	if !settling {
		t.Error("the runtime was settled while a task held a plan it had not installed")
	}
	waitUntil(t, "the runtime settled", func() bool { return !rt.ReconfigSettling() })
	for _, tk := range rt.tasksByID() {
		if tk.rc.acked.Load() < p.Epoch {
			t.Errorf("settled, but task %s has not acknowledged epoch %d", tk.spec.TaskID, p.Epoch)
		}
	}
	r.switchAll(100 * time.Millisecond)
	r.waitLevel(1)
	r.complete()
	<-done
	r.check(limit, true)
}
