package fsm

import (
	"slices"
	"testing"

	"github.com/fedstream/fedstream/rpc/states"
)

// keptReport is report with KeepReconfig (protocol 11) and a source's
// switch points; gen 0 is the placed copy's.
func keptReport(t *testing.T, h *harness, keep bool, worker, id string, gen int, acked, level uint64, frontier int64, switches ...ReconfigSwitch) {
	t.Helper()
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: worker, KeepReconfig: keep, States: []TaskStateUpdate{{
		TaskID: id, State: states.TaskRunning, Generation: gen, Reconfig: true, ReconfigAcked: acked, ReconfigLevel: level,
		ReconfigFrontier: frontier, ReconfigSwitches: switches}}})
}

func liveMoveSource(t *testing.T, h *harness) {
	t.Helper()
	r := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove,
		Placements: []PlannedPlacement{{TaskID: "q/src/p0/r0", FromWorker: "a", FromGeneration: 1, ToWorker: "b", Live: true, CatchUp: true}}}))
	if len(r.Placed) != 1 {
		t.Fatalf("move not placed: %+v", r)
	}
}

// TestReconfigCutAboveAMovedOutCopysFrontier: the old copy of a live
// move learns a plan its new copy's snapshot did not have, acknowledges
// it with its frontier and holds at the floor that gives; its report
// counts only for its position, so before protocol 11 the cut came from
// the new copy's frontier (behind the old copy's) and fell below records
// the old copy had emitted under the old epoch. With KeepReconfig the
// old copy's frontier is kept and the cut goes above it; without it (an
// entry an older leader wrote) the state is as before.
func TestReconfigCutAboveAMovedOutCopysFrontier(t *testing.T) {
	for _, keep := range []bool{true, false} {
		h := newHarness(t)
		reconfigQuery(t, h)
		liveMoveSource(t, h)
		h.mustApply(ReconfigureQueryType, ReconfigureQueryRequest{Query: "q", Plan: ReconfigPlan{Epoch: 1, SwitchMargin: 100,
			Changes: []OperatorChange{{Operator: "f", Version: 2}}}})
		keptReport(t, h, keep, "a", "q/src/p0/r0", 1, 1, 0, 9000) // the old copy
		keptReport(t, h, keep, "b", "q/src/p0/r0", 2, 1, 0, 3000) // the new copy, catching up
		keptReport(t, h, keep, "b", "q/f/p0/r0", 0, 1, 0, 2000)
		p := plans(t, h).Plans[0]
		want := int64(3100)
		if keep {
			want = 9100
		}
		if p.Phase != ReconfigSwitched || p.Cut != want {
			t.Fatalf("keep %v: plan %+v, want switched at %d", keep, p, want)
		}
		tk, _ := h.state().Task(nil, "q/src/p0/r0")
		if keep != (tk.ReconfigKept != nil && tk.ReconfigKept.Frontier == 9000) {
			t.Fatalf("keep %v: kept %+v", keep, tk.ReconfigKept)
		}
	}
}

// TestReconfigKeptAcrossALostWorker: a source copy acknowledged a plan
// and switched; its worker is deleted and the task placed again. The
// new copy's own progress starts from nothing (resetReconfig), but the
// frontier and switch points of the lost copy stay in ReconfigKept for
// the assignment of the next copy, and a second plan's cut goes above
// the lost copy's frontier although the new copy reports a lower one.
func TestReconfigKeptAcrossALostWorker(t *testing.T) {
	h := newHarness(t)
	reconfigQuery(t, h)
	h.registerWorker("c", "c:1")
	change := func(v int) []OperatorChange { return []OperatorChange{{Operator: "f", Version: v}} }
	h.mustApply(ReconfigureQueryType, ReconfigureQueryRequest{Query: "q", Plan: ReconfigPlan{Epoch: 1, SwitchMargin: 100, Changes: change(2)}})
	keptReport(t, h, true, "a", "q/src/p0/r0", 0, 1, 0, 5000)
	keptReport(t, h, true, "b", "q/f/p0/r0", 0, 1, 0, 4000)
	if p := plans(t, h).Plans[0]; p.Cut != 5100 {
		t.Fatalf("plan 1: %+v", p)
	}
	sw := ReconfigSwitch{Epoch: 1, At: 5105}
	keptReport(t, h, true, "a", "q/src/p0/r0", 0, 1, 1, 0, sw)
	h.mustApply(ReconfigureQueryType, ReconfigureQueryRequest{Query: "q", Plan: ReconfigPlan{Epoch: 2, SwitchMargin: 100, Changes: change(3)}})
	keptReport(t, h, true, "a", "q/src/p0/r0", 0, 2, 1, 8000)
	h.mustApply(DeleteWorkerType, DeleteWorkerRequest{WorkerID: "a"})
	h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q/src/p0/r0", WorkerID: "c"}}})
	tk, _ := h.state().Task(nil, "q/src/p0/r0")
	if tk.ReconfigAcked != 0 || tk.ReconfigKept == nil || tk.ReconfigKept.Frontier != 8000 || !slices.Equal(tk.ReconfigKept.Switches, []ReconfigSwitch{sw}) {
		t.Fatalf("the re-placed task: acked %d kept %+v", tk.ReconfigAcked, tk.ReconfigKept)
	}
	// A later copy's switch point for a kept epoch does not replace it.
	keptReport(t, h, true, "c", "q/src/p0/r0", 0, 2, 1, 1000, ReconfigSwitch{Epoch: 1, At: 6000})
	keptReport(t, h, true, "b", "q/f/p0/r0", 0, 2, 1, 1000)
	p := plans(t, h).Plans[1]
	if p.Phase != ReconfigSwitched || p.Cut != 8100 {
		t.Fatalf("plan 2 after the new copy acknowledged with frontier 1000: %+v, want its cut at 8100", p)
	}
	if tk, _ := h.state().Task(nil, "q/src/p0/r0"); !slices.Equal(tk.ReconfigKept.Switches, []ReconfigSwitch{sw}) {
		t.Fatalf("kept switches %+v", tk.ReconfigKept.Switches)
	}
	if back := roundTrip(t, h.fsm).State(); true {
		tk, _ := back.Task(nil, "q/src/p0/r0")
		if tk.ReconfigKept == nil || tk.ReconfigKept.Frontier != 8000 {
			t.Fatalf("kept frontier lost in a snapshot: %+v", tk.ReconfigKept)
		}
	}
}
