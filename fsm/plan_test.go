package fsm

import (
	"strings"
	"testing"
)

// planFixture: workers a, b (ready, 1 core each), c (down), d (unknown);
// query q (definition at index 5) with q/f/p0/r0 on a, q/f/p0/r1 on b,
// and q/g/p0/r0 unplaced.
func planFixture(t *testing.T) *harness {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: id, Addr: id + ":1", Cores: 1}})
	}
	h.mustApply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "c", Status: WorkerStatusDown})
	h.mustApply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "d", Status: WorkerStatusUnknown})
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{
		task("q", "f", 0, 0, "a"), task("q", "f", 0, 1, "b"), task("q", "g", 0, 0, ""),
	}})
	return h
}

func planResult(t *testing.T, res *ApplyResult) *PlanResult {
	t.Helper()
	if res.Err != nil {
		t.Fatalf("apply plan: %v", res.Err)
	}
	r, ok := res.Value.(*PlanResult)
	if !ok {
		t.Fatalf("value %T", res.Value)
	}
	return r
}

// TestApplyPlanRefusesWhatBreaksInvariants: the FSM re-checks every
// placement of a committed plan, whatever the applier let through.
func TestApplyPlanRefusesWhatBreaksInvariants(t *testing.T) {
	cases := []struct {
		name         string
		p            PlannedPlacement
		tasksPerCore int
		want         string
	}{
		{"missing task", PlannedPlacement{TaskID: "q/x/p0/r0", FromGeneration: 1, ToWorker: "a"}, 0, "does not exist"},
		{"no expected generation", PlannedPlacement{TaskID: "q/g/p0/r0", ToWorker: "a"}, 0, "does not say which generation"},
		{"stale worker", PlannedPlacement{TaskID: "q/f/p0/r0", FromWorker: "b", FromGeneration: 1, ToWorker: "d"}, 0, "stale plan: the task is on worker a"},
		{"stale generation", PlannedPlacement{TaskID: "q/f/p0/r0", FromWorker: "a", FromGeneration: 2, ToWorker: "d"}, 0, "at generation 1, the plan expected it on worker a at generation 2"},
		{"down worker", PlannedPlacement{TaskID: "q/g/p0/r0", FromGeneration: 1, ToWorker: "c"}, 0, "worker c is down, not ready"},
		{"unknown worker", PlannedPlacement{TaskID: "q/g/p0/r0", FromGeneration: 1, ToWorker: "d"}, 0, "worker d is unknown, not ready"},
		{"unregistered worker", PlannedPlacement{TaskID: "q/g/p0/r0", FromGeneration: 1, ToWorker: "zz"}, 0, "worker zz is not registered"},
		{"two replicas on one worker", PlannedPlacement{TaskID: "q/f/p0/r1", FromWorker: "b", FromGeneration: 1, ToWorker: "a"}, 0, "worker a already runs q/f/p0/r0"},
		{"capacity in cores", PlannedPlacement{TaskID: "q/g/p0/r0", FromGeneration: 1, ToWorker: "a"}, 1, "worker a is at capacity: 1 tasks on 1 cores (1 tasks per core)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := planFixture(t)
			before := dump(t, h.state())
			r := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove, Placements: []PlannedPlacement{tc.p}, TasksPerCore: tc.tasksPerCore}))
			if len(r.Placed) != 0 || len(r.Refused) != 1 || !strings.Contains(r.Refused[0].Reason, tc.want) {
				t.Fatalf("result %+v, want one refusal containing %q", r, tc.want)
			}
			after := dump(t, h.state())
			// Only the waiting task's reason may change.
			g, _ := h.state().Task(nil, "q/g/p0/r0")
			if tc.p.TaskID == "q/g/p0/r0" {
				if g.WorkerID != "" || g.Message != r.Refused[0].Reason {
					t.Fatalf("waiting task = %+v, want its reason to be the refusal", g)
				}
				return
			}
			delete(before, tableIndexes)
			delete(after, tableIndexes)
			requireSameState(t, before, after)
		})
	}
}

// TestRacingMovesOneWins: two moves of one task computed from the same
// state. The legacy PlaceTasks command applied both (the last one won
// silently); ApplyPlan applies the first and refuses the second.
func TestRacingMovesOneWins(t *testing.T) {
	h := planFixture(t)
	h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "e", Addr: "e:1", Cores: 1}})
	h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "f", Addr: "f:1", Cores: 1}})

	legacy := planFixture(t)
	legacy.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "e", Addr: "e:1", Cores: 1}})
	legacy.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: "f", Addr: "f:1", Cores: 1}})
	for _, to := range []string{"e", "f"} {
		res := legacy.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q/f/p0/r0", WorkerID: to}}})
		if res.Value.(*PlaceTasksResult).Moved != 1 {
			t.Fatalf("legacy move to %s not applied", to)
		}
	}

	first := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove,
		Placements: []PlannedPlacement{{TaskID: "q/f/p0/r0", FromWorker: "a", FromGeneration: 1, ToWorker: "e"}}}))
	second := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceHealth,
		Placements: []PlannedPlacement{{TaskID: "q/f/p0/r0", FromWorker: "a", FromGeneration: 1, ToWorker: "f"}}}))
	if len(first.Placed) != 1 || len(second.Placed) != 0 || len(second.Refused) != 1 ||
		!strings.Contains(second.Refused[0].Reason, "the task is on worker e at generation 2, the plan expected it on worker a at generation 1") {
		t.Fatalf("first %+v second %+v", first, second)
	}
	if tk, _ := h.state().Task(nil, "q/f/p0/r0"); tk.WorkerID != "e" || tk.Generation != 2 {
		t.Fatalf("task = %+v", tk)
	}
}

// TestGenerations: a task starts at 1; every copy that ends (moved away,
// unplaced, its worker deleted) makes the next copy one more; placing a
// waiting task does not.
func TestGenerations(t *testing.T) {
	h := planFixture(t)
	gen := func(id string) int {
		tk, _ := h.state().Task(nil, id)
		return tk.Generation
	}
	if gen("q/f/p0/r0") != 1 || gen("q/g/p0/r0") != 1 {
		t.Fatal("submitted tasks do not start at generation 1")
	}
	place := func(id, from string, g int, to string) {
		t.Helper()
		r := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove,
			Placements: []PlannedPlacement{{TaskID: id, FromWorker: from, FromGeneration: g, ToWorker: to}}}))
		if len(r.Refused) != 0 {
			t.Fatalf("refused: %s", r.RefusedText())
		}
	}
	place("q/g/p0/r0", "", 1, "b") // first copy
	if gen("q/g/p0/r0") != 1 {
		t.Fatalf("first placement changed the generation to %d", gen("q/g/p0/r0"))
	}
	place("q/g/p0/r0", "b", 1, "a") // moved: a new copy
	if gen("q/g/p0/r0") != 2 {
		t.Fatalf("after a move generation %d, want 2", gen("q/g/p0/r0"))
	}
	place("q/g/p0/r0", "a", 2, "") // unplaced: that copy ended
	place("q/g/p0/r0", "", 3, "b") // placed again: the copy it waited as
	if gen("q/g/p0/r0") != 3 {
		t.Fatalf("after unplace and place generation %d, want 3", gen("q/g/p0/r0"))
	}
	h.mustApply(DeleteWorkerType, DeleteWorkerRequest{WorkerID: "a"})
	if gen("q/f/p0/r0") != 2 {
		t.Fatalf("after its worker was deleted generation %d, want 2", gen("q/f/p0/r0"))
	}
	// A report from an older copy is skipped.
	res := h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b", States: []TaskStateUpdate{
		{TaskID: "q/g/p0/r0", State: "running", Generation: 2},
	}})
	if r := res.Value.(*UpdateTaskStatesResult); r.Updated != 0 || len(r.Skipped) != 1 {
		t.Fatalf("stale generation report: %+v", r)
	}
	res = h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b", States: []TaskStateUpdate{
		{TaskID: "q/g/p0/r0", State: "running", Generation: 3},
	}})
	if r := res.Value.(*UpdateTaskStatesResult); r.Updated != 1 {
		t.Fatalf("current generation report: %+v", r)
	}
	roundTrip(t, h.fsm)
}

// TestSlotMapsInPlans: maps are checked (cover every slot, partitions that
// exist, the running definition, the expected epoch), epochs grow by one,
// a map change reaches the views of the query's workers, and stopping the
// query deletes its maps.
func TestSlotMapsInPlans(t *testing.T) {
	h := planFixture(t)
	const def = 7 // the submit's index: 4 registrations, 2 status changes
	if q, _ := h.state().Query(nil, "q"); q.CreateIndex != def {
		t.Fatalf("fixture: query definition at %d", q.CreateIndex)
	}
	apply := func(u SlotMapUpdate) *PlanResult {
		t.Helper()
		return planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceRescale, SlotMaps: []SlotMapUpdate{u}}))
	}
	good := SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, Partitions: 2, Ranges: ContiguousSlotMap(2)}
	for _, tc := range []struct {
		name string
		u    SlotMapUpdate
		want string
	}{
		{"gap", SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, Partitions: 1, Ranges: []SlotRange{{0, 10, 0}, {12, NumSlots - 1, 0}}}, "without gaps or overlaps"},
		{"short", SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, Partitions: 1, Ranges: []SlotRange{{0, 10, 0}}}, "cover 0..10, want 0..4095"},
		{"partition out of range", SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, Partitions: 1, Ranges: ContiguousSlotMap(2)}, "names partition 1 of 1"},
		{"old definition", SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: 3, Partitions: 2, Ranges: ContiguousSlotMap(2)}, "definition 3 of query q, which now runs definition 7"},
		{"unknown query", SlotMapUpdate{Query: "nope", Fragment: "f", QueryIndex: def, Partitions: 2, Ranges: ContiguousSlotMap(2)}, "query nope is not running"},
		{"stale epoch", SlotMapUpdate{Query: "q", Fragment: "f", QueryIndex: def, ExpectedEpoch: 4, Partitions: 2, Ranges: ContiguousSlotMap(2)}, "at epoch 0, the plan expected epoch 4"},
	} {
		if r := apply(tc.u); len(r.Refused) != 1 || !strings.Contains(r.Refused[0].Reason, tc.want) {
			t.Fatalf("%s: result %+v, want refusal %q", tc.name, r, tc.want)
		}
	}
	if m, _ := h.state().SlotMap(nil, "q", "f"); m != nil {
		t.Fatalf("refused maps stored: %+v", m)
	}
	aBefore := h.worker("a").AssignIndex
	if r := apply(good); len(r.SlotMaps) != 1 || r.SlotMaps[0] != "q/f@1" {
		t.Fatalf("create: %+v", r)
	}
	if h.worker("a").AssignIndex == aBefore {
		t.Fatal("a new slot map did not change the view of the query's workers")
	}
	good.ExpectedEpoch = 1
	good.Ranges = RangesOf(make([]int, NumSlots)) // all to partition 0
	if r := apply(good); len(r.SlotMaps) != 1 || r.SlotMaps[0] != "q/f@2" {
		t.Fatalf("reassign: %+v", r)
	}
	if r := apply(good); len(r.Refused) != 1 || !strings.Contains(r.Refused[0].Reason, "at epoch 2, the plan expected epoch 1") {
		t.Fatalf("stale reassign: %+v", r)
	}
	_, _, views, err := h.state().WorkerAssignments(nil, "a")
	if err != nil || len(views) != 1 || len(views[0].SlotMaps) != 1 || views[0].SlotMaps[0].Epoch != 2 {
		t.Fatalf("views %+v, %v", views, err)
	}
	roundTrip(t, h.fsm)
	h.mustApply(StopQueryType, StopQueryRequest{Name: "q"})
	if maps, _ := h.state().SlotMaps(nil, ""); len(maps) != 0 {
		t.Fatalf("slot maps after stop: %+v", maps)
	}
}

// TestApplyPlanZoneSpread: with a zone label, the FSM refuses a replica in
// a zone that already runs one of its partition while a ready worker in
// another zone could take it, and allows it when none can.
func TestApplyPlanZoneSpread(t *testing.T) {
	for _, tc := range []struct {
		name      string
		zoneLabel string
		z2Status  string
		want      string
	}{
		{"another zone has a ready worker", "zone", WorkerStatusReady, "zone spread: zone z1 already runs a replica of partition 0 of f, while worker z2a in zone z2 could run it"},
		{"the other zone's worker is down", "zone", WorkerStatusDown, ""},
		{"zone spread not asked for", "", WorkerStatusReady, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			for id, zone := range map[string]string{"z1a": "z1", "z1b": "z1", "z2a": "z2"} {
				h.mustApply(RegisterWorkerType, RegisterWorkerRequest{Worker: Worker{ID: id, Addr: id + ":1", Cores: 1, Labels: map[string]string{"zone": zone}}})
			}
			h.mustApply(SetWorkerStatusType, SetWorkerStatusRequest{WorkerID: "z2a", Status: tc.z2Status})
			h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q"}, Tasks: []Task{task("q", "f", 0, 0, "z1a"), task("q", "f", 0, 1, "")}})
			r := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove, ZoneLabel: tc.zoneLabel, TasksPerCore: 4,
				Placements: []PlannedPlacement{{TaskID: "q/f/p0/r1", FromGeneration: 1, ToWorker: "z1b"}}}))
			if tc.want == "" {
				if len(r.Placed) != 1 {
					t.Fatalf("refused: %s", r.RefusedText())
				}
				return
			}
			if len(r.Refused) != 1 || r.Refused[0].Reason != tc.want {
				t.Fatalf("result %+v, want refusal %q", r, tc.want)
			}
		})
	}
}
