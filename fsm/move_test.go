package fsm

import (
	"testing"

	"github.com/fedstream/fedstream/rpc/states"
)

// TestLiveMoveKeepsTheOldCopyUntilTheNewRuns: a live move places the next
// generation on the target and keeps the old copy in its worker's
// assignments (moving out, at its generation) and in the snapshot; a
// report of the old generation changes nothing; the new copy's "running"
// ends the move, and the old worker's assignments no longer hold the task.
func TestLiveMoveKeepsTheOldCopyUntilTheNewRuns(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c"} {
		h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: id, Addr: id + ":1", Cores: 1}})
	}
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "a"), task("q", "g", 0, 0, "c")}})
	r := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove,
		Placements: []PlannedPlacement{{TaskID: "q/f/p0/r0", FromWorker: "a", FromGeneration: 1, ToWorker: "b", Live: true}}}))
	if len(r.Placed) != 1 {
		t.Fatalf("move not placed: %+v", r)
	}
	tk, _ := h.state().Task(nil, "q/f/p0/r0")
	if tk.WorkerID != "b" || tk.Gen() != 2 || tk.MovingFrom != "a" || tk.MovingFromGeneration != 1 {
		t.Fatalf("moved task = %+v", tk)
	}
	oldIdx := h.worker("a").AssignIndex
	_, tasks, views, err := h.state().WorkerAssignments(nil, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 1 || !tasks[0].IsMovingOut() || tasks[0].Gen() != 1 || len(views) != 1 || views[0].WorkerAddrs["a"] != "a:1" {
		t.Fatalf("old worker's assignments during the move: %+v, views %d", tasks, len(views))
	}
	if _, tasks, _, _ := h.state().WorkerAssignments(nil, "b"); len(tasks) != 1 || tasks[0].IsMovingOut() || tasks[0].Gen() != 2 {
		t.Fatalf("new worker's assignments: %+v", tasks)
	}
	// The move survives a snapshot and restore of the state machine.
	if back, _ := roundTrip(t, h.fsm).State().Task(nil, "q/f/p0/r0"); back.MovingFrom != "a" || back.MovingFromGeneration != 1 {
		t.Fatalf("after restore: %+v", back)
	}
	// The old copy's reports are not the task's.
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: "q/f/p0/r0", State: states.TaskRunning, Generation: 1}}})
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b", States: []TaskStateUpdate{{TaskID: "q/f/p0/r0", State: states.TaskStarting, Generation: 2}}})
	if tk, _ := h.state().Task(nil, "q/f/p0/r0"); tk.MovingFrom != "a" {
		t.Fatalf("the move ended before the new copy ran: %+v", tk)
	}
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b", States: []TaskStateUpdate{{TaskID: "q/f/p0/r0", State: states.TaskRunning, Generation: 2}}})
	if tk, _ := h.state().Task(nil, "q/f/p0/r0"); tk.MovingFrom != "" || tk.MovingFromGeneration != 0 {
		t.Fatalf("the move did not end when the new copy ran: %+v", tk)
	}
	if h.worker("a").AssignIndex == oldIdx {
		t.Fatal("the old worker was not woken to stop its copy")
	}
	if h.worker("c").AssignIndex != h.worker("a").AssignIndex {
		t.Fatal("a consumer's worker (c) was not woken to switch to the new copy")
	}
	if _, tasks, _, _ := h.state().WorkerAssignments(nil, "a"); len(tasks) != 0 {
		t.Fatalf("old worker still assigned %+v", tasks)
	}
}
