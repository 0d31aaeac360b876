package fsm

import (
	"reflect"
	"testing"

	"github.com/fedstream/fedstream/rpc/states"
)

func reconfigQuery(t *testing.T, h *harness) {
	t.Helper()
	for _, id := range []string{"a", "b"} {
		h.registerWorker(id, id+":1")
	}
	h.mustApply(SubmitQueryType, SubmitQueryRequest{Query: Query{Name: "q", Status: QueryStatusRunning},
		Tasks: []Task{task("q", "src", 0, 0, "a"), task("q", "f", 0, 0, "b")}})
}

func report(t *testing.T, h *harness, worker, id string, acked, level uint64, frontier int64) {
	t.Helper()
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: worker, States: []TaskStateUpdate{{
		TaskID: id, State: states.TaskRunning, Reconfig: true, ReconfigAcked: acked, ReconfigLevel: level, ReconfigFrontier: frontier}}})
}

func plans(t *testing.T, h *harness) *QueryReconfig {
	t.Helper()
	q, err := h.state().Query(nil, "q")
	if err != nil || q == nil {
		t.Fatalf("query: %v %v", q, err)
	}
	return q.Reconfig
}

// TestReconfigPlanPhases: a plan loads until every task acknowledged,
// switches at a cut above every reported frontier, and completes only once
// every task has all its markers; a task that is not placed (disconnected)
// holds completion until it is back. A second plan switches after the
// first and at a later cut.
func TestReconfigPlanPhases(t *testing.T) {
	h := newHarness(t)
	reconfigQuery(t, h)
	idx := h.worker("a").AssignIndex
	change := func(op string, v int) []OperatorChange {
		return []OperatorChange{{Operator: op, Version: v, SpecJSON: []byte(`{}`)}}
	}
	h.mustApply(ReconfigureQueryType, ReconfigureQueryRequest{Query: "q", Plan: ReconfigPlan{Epoch: 1, Changes: change("f", 2), SwitchMargin: 100}})
	if h.worker("a").AssignIndex == idx {
		t.Fatal("the plan did not wake the query's workers")
	}
	rc := plans(t, h)
	if rc.Tracking != TrackingStatic || len(rc.Plans) != 1 || rc.Plans[0].Phase != ReconfigLoading {
		t.Fatalf("after commit: %+v", rc)
	}
	if got := rc.ActiveVersions("f"); !reflect.DeepEqual(got, []int{1, 2}) {
		t.Fatalf("active versions of f = %v", got)
	}
	report(t, h, "a", "q/src/p0/r0", 1, 0, 5000)
	if plans(t, h).Plans[0].Phase != ReconfigLoading {
		t.Fatal("switched before every task acknowledged")
	}
	// A second plan may start before the first finishes.
	h.mustApply(ReconfigureQueryType, ReconfigureQueryRequest{Query: "q", Plan: ReconfigPlan{Epoch: 2, Changes: change("f", 3), SwitchMargin: 100}})
	report(t, h, "b", "q/f/p0/r0", 1, 0, 4000)
	rc = plans(t, h)
	if p := rc.Plans[0]; p.Phase != ReconfigSwitched || p.Cut != 5100 {
		t.Fatalf("plan 1 after all acks: %+v", p)
	}
	if got := rc.ActiveVersions("f"); !reflect.DeepEqual(got, []int{1, 2, 3}) {
		t.Fatalf("three versions should coexist, active = %v", got)
	}
	report(t, h, "a", "q/src/p0/r0", 2, 1, 6000)
	report(t, h, "b", "q/f/p0/r0", 2, 0, 6000)
	rc = plans(t, h)
	if rc.Plans[0].Phase != ReconfigSwitched || rc.Plans[1].Phase != ReconfigSwitched || rc.Plans[1].Cut != 6100 {
		t.Fatalf("plans: %+v", rc.Plans)
	}
	// The downstream task's worker is lost: it is unplaced, and its
	// markers cannot arrive; the plan stays open.
	h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q/f/p0/r0", WorkerID: ""}}})
	report(t, h, "a", "q/src/p0/r0", 2, 2, 7000)
	if plans(t, h).Completed() != 0 {
		t.Fatal("completed while a task was disconnected")
	}
	// Back, with its markers: both plans complete, version 3 only.
	h.mustApply(PlaceTasksType, PlaceTasksRequest{Placements: []Placement{{TaskID: "q/f/p0/r0", WorkerID: "b"}}})
	report(t, h, "b", "q/f/p0/r0", 2, 2, 7000)
	rc = plans(t, h)
	if rc.Completed() != 2 || !reflect.DeepEqual(rc.ActiveVersions("f"), []int{3}) {
		t.Fatalf("after reconnect: %+v active %v", rc.Plans, rc.ActiveVersions("f"))
	}
	if back := roundTrip(t, h.fsm).State(); true {
		q, _ := back.Query(nil, "q")
		if q.Reconfig == nil || q.Reconfig.Completed() != 2 {
			t.Fatalf("reconfiguration lost in a snapshot: %+v", q.Reconfig)
		}
	}
}

// TestReconfigRefusedPlanChangesNothing: a plan with a stale epoch, a
// wrong version, no change or for an unknown query is refused and leaves
// the state as it was.
func TestReconfigRefusedPlanChangesNothing(t *testing.T) {
	h := newHarness(t)
	reconfigQuery(t, h)
	before := dump(t, h.state())
	for name, req := range map[string]ReconfigureQueryRequest{
		"stale epoch":   {Query: "q", Plan: ReconfigPlan{Epoch: 2, Changes: []OperatorChange{{Operator: "f", Version: 2}}}},
		"wrong version": {Query: "q", Plan: ReconfigPlan{Epoch: 1, Changes: []OperatorChange{{Operator: "f", Version: 3}}}},
		"no change":     {Query: "q", Plan: ReconfigPlan{Epoch: 1}},
		"twice":         {Query: "q", Plan: ReconfigPlan{Epoch: 1, Changes: []OperatorChange{{Operator: "f", Version: 2}, {Operator: "f", Version: 2}}}},
		"bad tracking":  {Query: "q", Tracking: "sometimes", Plan: ReconfigPlan{Epoch: 1, Changes: []OperatorChange{{Operator: "f", Version: 2}}}},
		"no query":      {Query: "nope", Plan: ReconfigPlan{Epoch: 1, Changes: []OperatorChange{{Operator: "f", Version: 2}}}},
	} {
		if res := h.apply(ReconfigureQueryType, req); res.Err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	after := dump(t, h.state())
	delete(before, "index") // the applied index moves with every entry
	delete(after, "index")
	requireSameState(t, before, after)
}

// TestReconfigNewCopyReportsItsOwnProgress: a task placed elsewhere (a new
// copy) forgets the progress its previous copy reported, so a plan cannot
// complete on the old copy's level while the new one still catches up.
func TestReconfigNewCopyReportsItsOwnProgress(t *testing.T) {
	h := newHarness(t)
	reconfigQuery(t, h)
	h.mustApply(ReconfigureQueryType, ReconfigureQueryRequest{Query: "q", Plan: ReconfigPlan{Epoch: 1, SwitchMargin: 1,
		Changes: []OperatorChange{{Operator: "f", Version: 2}}}})
	report(t, h, "a", "q/src/p0/r0", 1, 0, 10)
	report(t, h, "b", "q/f/p0/r0", 1, 0, 10)
	report(t, h, "a", "q/src/p0/r0", 1, 1, 20)
	report(t, h, "b", "q/f/p0/r0", 1, 0, 20)
	r := planResult(t, h.apply(ApplyPlanType, ApplyPlanRequest{Source: PlanSourceMove,
		Placements: []PlannedPlacement{{TaskID: "q/f/p0/r0", FromWorker: "b", FromGeneration: 1, ToWorker: "a"}}}))
	if len(r.Placed) != 1 {
		t.Fatalf("move not placed: %+v", r)
	}
	if tk, _ := h.state().Task(nil, "q/f/p0/r0"); tk.ReconfigAcked != 0 || tk.ReconfigLevel != 0 {
		t.Fatalf("the new copy kept the old copy's progress: %+v", tk)
	}
	// The old copy's late report of its level is not the task's.
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "b", States: []TaskStateUpdate{{
		TaskID: "q/f/p0/r0", State: states.TaskRunning, Generation: 1, Reconfig: true, ReconfigAcked: 1, ReconfigLevel: 1}}})
	if plans(t, h).Completed() != 0 {
		t.Fatal("completed on the old copy's report")
	}
	h.mustApply(UpdateTaskStatesType, UpdateTaskStatesRequest{WorkerID: "a", States: []TaskStateUpdate{{
		TaskID: "q/f/p0/r0", State: states.TaskRunning, Generation: 2, Reconfig: true, ReconfigAcked: 1, ReconfigLevel: 1}}})
	if plans(t, h).Completed() != 1 {
		t.Fatal("not completed once the new copy reported its level")
	}
}
