package fsm

import (
	"strings"
	"testing"
)

// TestRescalePhases walks a slot map through a rescale's plans: prepare
// (Next set, tasks of added partitions created and placed in the same
// plan), go (the cut), finish (the map becomes Next, removed tasks
// deleted), refusing steps out of order; and an abort that drops Next.
// Task reports carry the rescale progress.
func TestRescalePhases(t *testing.T) {
	h := planFixture(t)
	const def = 7
	plan := func(r ApplyPlanRequest) *PlanResult {
		t.Helper()
		r.Source = PlanSourceRescale
		return planResult(t, h.apply(ApplyPlanType, r))
	}
	one := SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, Partitions: 1, Ranges: ContiguousSlotMap(1)}
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{one}}); len(r.SlotMaps) != 1 {
		t.Fatalf("create: %+v", r)
	}
	step := func(phase string, cut int64) SlotMapUpdate {
		return SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, ExpectedEpoch: 1, Partitions: 2, Ranges: ContiguousSlotMap(2), Phase: phase, Cut: cut}
	}
	for _, phase := range []string{RescaleGo, RescaleFinish, RescaleAbort} {
		if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{step(phase, 5)}}); len(r.Refused) != 1 {
			t.Fatalf("%s before prepare: %+v", phase, r)
		}
	}
	added := PlannedTask{Query: "q", Fragment: "f", Partition: 1, Replica: 0, ScaleEpoch: 2}
	r := plan(ApplyPlanRequest{NewTasks: []PlannedTask{added}, SlotMaps: []SlotMapUpdate{step(RescalePrepare, 0)},
		Placements: []PlannedPlacement{{TaskID: TaskID("q", "f", 1, 0), FromGeneration: 2, ToWorker: "b"}}})
	if len(r.Refused) != 0 || len(r.Created) != 1 || len(r.Placed) != 1 {
		t.Fatalf("prepare: %+v", r)
	}
	m, _ := h.state().SlotMap(nil, "q", "f")
	if m.Epoch != 1 || m.Partitions != 1 || m.Next == nil || m.Next.Epoch != 2 || m.Next.Partitions != 2 || m.Next.Go {
		t.Fatalf("after prepare: %+v next %+v", m, m.Next)
	}
	tk, _ := h.state().Task(nil, TaskID("q", "f", 1, 0))
	if tk == nil || tk.WorkerID != "b" || tk.Gen() != 2 || tk.ScaleEpoch != 2 {
		t.Fatalf("added task %+v", tk)
	}
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{step(RescalePrepare, 0)}}); len(r.Refused) != 1 || !strings.Contains(r.Refused[0].Reason, "already under way") {
		t.Fatalf("second prepare: %+v", r)
	}
	if r := plan(ApplyPlanRequest{NewTasks: []PlannedTask{added}}); len(r.Refused) != 1 || !strings.Contains(r.Refused[0].Reason, "already exists") {
		t.Fatalf("task created twice: %+v", r)
	}
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b", States: []TaskStateUpdate{{TaskID: tk.ID, State: "running", Generation: 2, Prepared: 2, Frontier: -9}}})
	if tk, _ = h.state().Task(nil, tk.ID); tk.Prepared != 2 || tk.Frontier != -9 {
		t.Fatalf("report not recorded: %+v", tk)
	}
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{step(RescaleFinish, 0)}}); len(r.Refused) != 1 {
		t.Fatalf("finish before go: %+v", r)
	}
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{step(RescaleGo, 1234)}}); len(r.Refused) != 0 {
		t.Fatalf("go: %+v", r)
	}
	if m, _ = h.state().SlotMap(nil, "q", "f"); !m.Next.Go || m.Next.Cut != 1234 || m.Epoch != 1 {
		t.Fatalf("after go: %+v next %+v", m, m.Next)
	}
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{step(RescaleAbort, 0)}}); len(r.Refused) != 1 {
		t.Fatalf("abort after go: %+v", r)
	}
	roundTrip(t, h.fsm)
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{step(RescaleFinish, 0)}}); len(r.Refused) != 0 {
		t.Fatalf("finish: %+v", r)
	}
	if m, _ = h.state().SlotMap(nil, "q", "f"); m.Epoch != 2 || m.Partitions != 2 || m.Next != nil || m.Ranges[len(m.Ranges)-1].Partition != 1 {
		t.Fatalf("after finish: %+v", m)
	}

	// 2 -> 1, aborted at prepare, then finished with the task removed.
	down := SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, ExpectedEpoch: 2, Partitions: 1, Ranges: ContiguousSlotMap(1), Phase: RescalePrepare}
	plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{down}})
	down.Phase = RescaleAbort
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{down}}); len(r.Refused) != 0 {
		t.Fatalf("abort: %+v", r)
	}
	if m, _ = h.state().SlotMap(nil, "q", "f"); m.Epoch != 2 || m.Next != nil {
		t.Fatalf("after abort: %+v", m)
	}
	for _, ph := range []string{RescalePrepare, RescaleGo} {
		down.Phase = ph
		plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{down}})
	}
	down.Phase = RescaleFinish
	if r := plan(ApplyPlanRequest{SlotMaps: []SlotMapUpdate{down}, RemoveTasks: []string{tk.ID}}); len(r.Removed) != 1 {
		t.Fatalf("finish 2 -> 1: %+v", r)
	}
	if tk, _ = h.state().Task(nil, tk.ID); tk != nil {
		t.Fatalf("removed task still there: %+v", tk)
	}
	if m, _ = h.state().SlotMap(nil, "q", "f"); m.Epoch != 3 || m.Partitions != 1 {
		t.Fatalf("after 2 -> 1: %+v", m)
	}
}

// TestPlanProtocol: plans using fields an older build would ignore need
// protocol 4; others keep needing 3.
func TestPlanProtocol(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    ApplyPlanRequest
		want int
	}{
		{"placement", ApplyPlanRequest{Placements: []PlannedPlacement{{TaskID: "t"}}}, 3},
		{"slot map", ApplyPlanRequest{SlotMaps: []SlotMapUpdate{{Fragment: "f"}}}, 3},
		{"live move", ApplyPlanRequest{Placements: []PlannedPlacement{{TaskID: "t", Live: true}}}, 4},
		{"rescale step", ApplyPlanRequest{SlotMaps: []SlotMapUpdate{{Fragment: "f", Phase: RescaleGo}}}, 4},
		{"new task", ApplyPlanRequest{NewTasks: []PlannedTask{{Fragment: "f"}}}, 4},
		{"removed task", ApplyPlanRequest{RemoveTasks: []string{"t"}}, 4},
	} {
		if got := tc.r.Protocol(); got != tc.want {
			t.Errorf("%s: protocol %d, want %d", tc.name, got, tc.want)
		}
	}
}
