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

// TestCatchUpMoveSwitchesOnlyOnceTheNewCopyCaughtUp: a catch-up move
// (PlannedPlacement.CatchUp) does not end when its new copy runs: it ends
// once the new copy runs and its reported output position has reached
// the old copy's latest reported one (reports of either copy may complete
// it), keeping both positions as they were at the switch. SwitchMove ends
// a move that has not caught up, and a plan placing the task again forgets
// the positions.
func TestCatchUpMoveSwitchesOnlyOnceTheNewCopyCaughtUp(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c"} {
		h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: id, Addr: id + ":1", Cores: 1}})
	}
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "a"), task("q", "g", 0, 0, "c")}})
	const id = "q/f/p0/r0"
	move := func(from, to string, gen int) {
		t.Helper()
		plan := ApplyPlanRequest{Source: PlanSourceMove,
			Placements: []PlannedPlacement{{TaskID: id, FromWorker: from, FromGeneration: gen, ToWorker: to, Live: true, CatchUp: true}}}
		if v := plan.Protocol(); v != 5 {
			t.Fatalf("a catch-up move needs protocol %d, want 5", v)
		}
		if r := planResult(t, h.apply(ApplyPlanType, plan)); len(r.Placed) != 1 {
			t.Fatalf("move not placed: %+v", r)
		}
	}
	pos := func(n uint64) *uint64 { return &n }
	report := func(worker string, gen int, state string, p *uint64) {
		t.Helper()
		h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: worker,
			States: []TaskStateUpdate{{TaskID: id, State: state, Generation: gen, MovePosition: p}}})
	}
	get := func() *Task {
		t.Helper()
		tk, err := h.state().Task(nil, id)
		if err != nil || tk == nil {
			t.Fatalf("task: %v %v", tk, err)
		}
		return tk
	}
	move("a", "b", 1)
	if tk := get(); !tk.MoveCatchUp || tk.MovingFrom != "a" {
		t.Fatalf("catch-up move = %+v", tk)
	}
	oldIdx := h.worker("a").AssignIndex
	report("a", 1, states.TaskRunning, pos(100)) // the old copy has produced up to 100
	report("b", 2, states.TaskRunning, pos(40))  // the new copy runs, behind
	if tk := get(); tk.MovingFrom != "a" || tk.MovingFromPosition == nil || *tk.MovingFromPosition != 100 || tk.MovePosition == nil || *tk.MovePosition != 40 {
		t.Fatalf("the move ended (or lost a position) before the new copy caught up: %+v", tk)
	}
	if h.worker("a").AssignIndex != oldIdx {
		t.Fatal("the old worker was told to stop its copy before the new one caught up")
	}
	report("a", 1, states.TaskRunning, pos(130)) // the old copy goes on
	report("b", 2, states.TaskRunning, pos(120))
	if tk := get(); tk.MovingFrom != "a" {
		t.Fatalf("the move ended with the new copy at 120 behind the old one at 130: %+v", tk)
	}
	report("b", 2, states.TaskRunning, pos(130))
	tk := get()
	if tk.MovingFrom != "" || tk.MoveCatchUp || tk.MovePosition == nil || *tk.MovePosition != 130 || *tk.MovingFromPosition != 130 {
		t.Fatalf("the move did not end (with its switch positions) once the new copy caught up: %+v", tk)
	}
	if h.worker("a").AssignIndex == oldIdx || h.worker("c").AssignIndex != h.worker("a").AssignIndex {
		t.Fatal("the old copy's worker and the consumer's worker were not told of the switch")
	}
	// Reports after the switch change nothing.
	report("b", 2, states.TaskRunning, pos(200))
	if tk := get(); *tk.MovePosition != 130 {
		t.Fatalf("a position reported after the switch was recorded: %+v", tk)
	}

	// The old copy's report completes the catch-up too: the new copy
	// is ahead of the old copy's first report.
	move("b", "c", 2)
	if tk := get(); tk.MovePosition != nil || tk.MovingFromPosition != nil {
		t.Fatalf("a new move kept the last one's positions: %+v", tk)
	}
	report("c", 3, states.TaskRunning, pos(300))
	if tk := get(); tk.MovingFrom != "b" {
		t.Fatalf("the move ended before the old copy reported a position: %+v", tk)
	}
	report("b", 2, states.TaskRunning, pos(290))
	if tk := get(); tk.MovingFrom != "" {
		t.Fatalf("the old copy's report did not end a caught-up move: %+v", tk)
	}

	// SwitchMove ends a move that does not catch up; a starting copy is
	// left alone.
	move("c", "a", 3)
	report("c", 3, states.TaskRunning, pos(500))
	report("a", 4, states.TaskStarting, pos(0))
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: id, Generation: 4, SwitchMove: true, State: states.TaskRunning}}})
	if tk := get(); tk.MovingFrom != "c" || tk.State != states.TaskStarting {
		t.Fatalf("SwitchMove ended the move of a copy not running, or changed its state: %+v", tk)
	}
	report("a", 4, states.TaskRunning, pos(10))
	if tk := get(); tk.MovingFrom != "c" {
		t.Fatalf("the move ended behind: %+v", tk)
	}
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: id, Generation: 4, SwitchMove: true, State: states.TaskRunning}}})
	if tk := get(); tk.MovingFrom != "" || tk.State != states.TaskRunning {
		t.Fatalf("SwitchMove did not end the move: %+v", tk)
	}

	// A new copy whose output is blocked (full, no consumer yet), or that
	// stalls, goes no further: the move ends behind.
	move("a", "b", 4)
	report("a", 4, states.TaskRunning, pos(900))
	report("b", 5, states.TaskRunning, pos(700))
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b",
		States: []TaskStateUpdate{{TaskID: id, State: states.TaskRunning, Generation: 5, MovePosition: pos(750), MoveBlocked: true}}})
	if tk := get(); tk.MovingFrom != "" || !tk.MoveBlocked {
		t.Fatalf("a blocked new copy did not end its move: %+v", tk)
	}
	move("b", "c", 5)
	report("b", 5, states.TaskRunning, pos(900))
	report("c", 6, states.TaskRunning, pos(700))
	if tk := get(); tk.MovingFrom != "b" || tk.MoveBlocked {
		t.Fatalf("the move ended behind, or kept the last move's blocked flag: %+v", tk)
	}
	report("c", 6, states.TaskStalled, pos(700))
	if tk := get(); tk.MovingFrom != "" {
		t.Fatalf("a stalled new copy did not end its move: %+v", tk)
	}

	// A running new copy that reports no position (an older worker)
	// cannot be compared: its move ends on running, as before.
	move("c", "a", 6)
	report("c", 6, states.TaskRunning, pos(900))
	report("a", 7, states.TaskRunning, nil)
	if tk := get(); tk.MovingFrom != "" {
		t.Fatalf("a new copy without positions did not end its move on running: %+v", tk)
	}
}

// TestStopAndCopyMoveIsRecorded: a live placement with Halt records a
// stop-and-copy move (Task.MoveHalt), which survives a snapshot and
// ends with the move; a plan carrying one needs protocol 12 (an older
// build would apply it as a live move whose old copy runs on).
func TestStopAndCopyMoveIsRecorded(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b"} {
		h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: id, Addr: id + ":1", Cores: 1}})
	}
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "a")}})
	const id = "q/f/p0/r0"
	plan := ApplyPlanRequest{Source: PlanSourceReplace,
		Placements: []PlannedPlacement{{TaskID: id, FromWorker: "a", FromGeneration: 1, ToWorker: "b", Live: true, CatchUp: true, Halt: true}}}
	if v := plan.Protocol(); v != HaltMoveProtocol || HaltMoveProtocol > ProtocolVersion {
		t.Fatalf("a plan with a stop-and-copy move needs protocol %d, want %d (this build speaks %d)", v, HaltMoveProtocol, ProtocolVersion)
	}
	if r := planResult(t, h.apply(ApplyPlanType, plan)); len(r.Placed) != 1 {
		t.Fatalf("move not placed: %+v", r)
	}
	if tk, _ := h.state().Task(nil, id); !tk.MoveHalt || tk.MovingFrom != "a" || !tk.MoveCatchUp {
		t.Fatalf("stop-and-copy move = %+v", tk)
	}
	if back, _ := roundTrip(t, h.fsm).State().Task(nil, id); !back.MoveHalt {
		t.Fatalf("after restore: %+v", back)
	}
	pos := func(p uint64) *uint64 { return &p }
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{TaskID: id, State: states.TaskRunning, Generation: 1, MovePosition: pos(5)}}})
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b", States: []TaskStateUpdate{{TaskID: id, State: states.TaskRunning, Generation: 2, MovePosition: pos(5)}}})
	if tk, _ := h.state().Task(nil, id); tk.MovingFrom != "" || tk.MoveHalt {
		t.Fatalf("after the move ended: %+v", tk)
	}
	// A live move without Halt is not stop-and-copy.
	if r := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove,
		Placements: []PlannedPlacement{{TaskID: id, FromWorker: "b", FromGeneration: 2, ToWorker: "a", Live: true, CatchUp: true}}})); len(r.Placed) != 1 {
		t.Fatalf("move back not placed: %+v", r)
	}
	if tk, _ := h.state().Task(nil, id); tk.MoveHalt || tk.MovingFrom != "b" {
		t.Fatalf("live move = %+v", tk)
	}
}
