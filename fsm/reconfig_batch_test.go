package fsm

import (
	"testing"

	"github.com/fedstream/fedstream/rpc/states"
)

// TestReconfigBatchedReportsSwitchInOneEntry: the reports of two workers
// acknowledging a plan, written as one UpdateTaskStatesBatch entry,
// switch the plan in that entry exactly as two entries would; a report
// of an unknown worker in the batch is refused alone.
func TestReconfigBatchedReportsSwitchInOneEntry(t *testing.T) {
	h := newHarness(t)
	reconfigQuery(t, h)
	h.mustApply(ReconfigureQueryType, ReconfigureQueryRequest{Query: "q", Plan: ReconfigPlan{Epoch: 1,
		Changes: []OperatorChange{{Operator: "f", Version: 2, SpecJSON: []byte(`{}`)}}, SwitchMargin: 100}})
	ack := func(worker, id string, frontier int64) UpdateTaskStatesRequest {
		return UpdateTaskStatesRequest{WorkerID: worker, States: []TaskStateUpdate{{
			TaskID: id, State: states.TaskRunning, Reconfig: true, ReconfigAcked: 1, ReconfigFrontier: frontier}}}
	}
	res := h.mustApply(UpdateTaskStatesBatchType, UpdateTaskStatesBatchRequest{Reports: []UpdateTaskStatesRequest{
		ack("a", "q/src/p0/r0", 5000), ack("nobody", "q/f/p0/r0", 9000), ack("b", "q/f/p0/r0", 4000)}})
	out, ok := res.Value.(*UpdateTaskStatesBatchResult)
	if !ok || len(out.Errs) != 3 || out.Errs[0] != "" || out.Errs[1] == "" || out.Errs[2] != "" || out.Results[0].Updated != 1 || out.Results[2].Updated != 1 {
		t.Fatalf("batch result %+v", res.Value)
	}
	if p := plans(t, h).Plans[0]; p.Phase != ReconfigSwitched || p.Cut != 5100 || p.SwitchIndex != h.index {
		t.Fatalf("plan after the batch (index %d): %+v", h.index, p)
	}
	if res := h.apply(UpdateTaskStatesBatchType, UpdateTaskStatesBatchRequest{}); res.Err == nil {
		t.Fatal("an empty batch was accepted")
	}
}
