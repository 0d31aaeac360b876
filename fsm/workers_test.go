package fsm

import (
	"errors"
	"strings"
	"testing"
)

// A worker that registers again at the address of an older record (a
// restarted process) replaces it: the old row goes, and its tasks become
// unplaced with a message saying why, so the scheduler places them again.
func TestRegisterReplacesWorkerAtSameAddr(t *testing.T) {
	h := newHarness(t)
	h.registerWorker("old", "10.0.0.1:7000")
	h.registerWorker("other", "10.0.0.2:7000")
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "old"), task("q", "f", 0, 1, "other")}})
	h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "new", Addr: "10.0.0.1:7000", Cores: 4}, ReplaceSameAddr: true, At: 42})
	if w, _ := h.state().Worker(nil, "old"); w != nil {
		t.Fatalf("old record still present: %+v", w)
	}
	if w := h.worker("new"); w.Status != WorkerStatusReady || w.StatusSince != 42 {
		t.Fatalf("new worker %+v", w)
	}
	h.worker("other") // another address is untouched
	tk, _ := h.state().Task(nil, TaskID("q", "f", 0, 0))
	if tk.WorkerID != "" || tk.State != TaskStatePending || !strings.Contains(tk.Message, "replaced by new") {
		t.Fatalf("task of the replaced worker: %+v", tk)
	}
	// Without the flag two records may share an address (tests, tools).
	h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "twin", Addr: "10.0.0.2:7000"}})
	h.worker("other")
}

// SetWorkerStatus stamps StatusSince on a change (and on a record never
// stamped), and sets many workers at once, skipping unknown ids.
func TestSetWorkerStatusSinceAndBatch(t *testing.T) {
	h := newHarness(t)
	h.registerWorker("a", "a:1")
	h.registerWorker("b", "b:1")
	h.mustApply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerIDs: []string{"a", "b", "gone"}, Status: WorkerStatusUnknown, At: 100})
	for _, id := range []string{"a", "b"} {
		if w := h.worker(id); w.Status != WorkerStatusUnknown || w.StatusSince != 100 {
			t.Fatalf("worker %s: %+v", id, w)
		}
	}
	h.mustApply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "a", Status: WorkerStatusUnknown, At: 200})
	if w := h.worker("a"); w.StatusSince != 100 {
		t.Fatalf("unchanged status restamped: %+v", w)
	}
	h.mustApply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "a", Status: WorkerStatusDown, At: 300})
	if w := h.worker("a"); w.Status != WorkerStatusDown || w.StatusSince != 300 {
		t.Fatalf("worker a: %+v", w)
	}
	if res := h.apply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "gone", Status: WorkerStatusDown}); !errors.Is(res.Err, ErrWorkerNotFound) {
		t.Fatalf("unknown worker: %v", res.Err)
	}
}

// An unplaced task's message follows the scheduler's latest reason.
func TestPlaceTasksUpdatesPendingMessage(t *testing.T) {
	h := newHarness(t)
	h.registerWorker("a", "a:1")
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "")}})
	before := h.worker("a").AssignIndex
	h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: TaskID("q", "f", 0, 0), Message: "no ready worker"}}})
	tk, _ := h.state().Task(nil, TaskID("q", "f", 0, 0))
	if tk.WorkerID != "" || tk.Message != "no ready worker" {
		t.Fatalf("task %+v", tk)
	}
	if h.worker("a").AssignIndex != before {
		t.Fatal("a message change moved a worker's view")
	}
	h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: TaskID("q", "f", 0, 0), WorkerID: "a"}}})
	if tk, _ := h.state().Task(nil, TaskID("q", "f", 0, 0)); tk.WorkerID != "a" || tk.Message != "" {
		t.Fatalf("placed task %+v", tk)
	}
}
