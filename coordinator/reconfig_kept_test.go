package coordinator

import (
	"strconv"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// TestReconfigKeptOnlyWhenEveryCoordinatorSpeaks11: a task's reported
// frontier and switch points are kept across its copies (fsm
// ReconfigKept) only when every coordinator applies protocol 11: while
// one advertises 10 the leader writes the report as before (an older
// build would ignore KeepReconfig and compute another cut from the same
// entry), once all speak 11 the report is kept and the task's next
// assignment carries it.
func TestReconfigKeptOnlyWhenEveryCoordinatorSpeaks11(t *testing.T) {
	t.Parallel()
	s, p := ackPlanNode(t)
	setProto := func(v int) {
		t.Helper()
		nt := map[string]string{}
		for k, val := range s.serf.LocalMember().Tags {
			nt[k] = val
		}
		nt[tagProto] = strconv.Itoa(v)
		if err := s.serf.SetTags(nt); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "the tag to spread", func() bool {
			got, err := s.coordinatorProtocols()
			return err == nil && got[s.cfg.NodeID] == v
		})
	}
	report := func(frontier int64) {
		t.Helper()
		req := &pb.ReportTasksRequest{WorkerId: "wa", Tasks: []*pb.TaskState{{TaskId: p.src, State: states.TaskRunning, Generation: 1,
			Reconfig: &pb.ReconfigProgress{Acked: 1, Frontier: frontier, Switches: []*pb.ReconfigSwitch{{Epoch: 1, At: frontier + 5}}}}}}
		if _, err := (&workerService{s: s}).ReportTasks(p.ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() *fsm.ReconfigKept {
		t.Helper()
		tk, err := s.State().Task(nil, p.src)
		if err != nil || tk == nil {
			t.Fatal(tk, err)
		}
		return tk.ReconfigKept
	}
	setProto(fsm.KeepReconfigProtocol - 1)
	report(7000)
	if k := kept(); k != nil {
		t.Fatalf("kept %+v while a coordinator speaks protocol %d", k, fsm.KeepReconfigProtocol-1)
	}
	setProto(fsm.ProtocolVersion)
	report(9000)
	if k := kept(); k == nil || k.Frontier != 9000 || len(k.Switches) != 1 || k.Switches[0] != (fsm.ReconfigSwitch{Epoch: 1, At: 9005}) {
		t.Fatalf("kept %+v once every coordinator speaks %d", k, fsm.ProtocolVersion)
	}
	resp, err := (&workerService{s: s}).WatchAssignments(p.ctx, &pb.WatchAssignmentsRequest{WorkerId: "wa"})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range resp.Assignments {
		if a.TaskId == p.src && (a.ReconfigKeptFrontier != 9000 || len(a.ReconfigKeptSwitches) != 1 || a.ReconfigKeptSwitches[0].At != 9005) {
			t.Fatalf("assignment of %s: kept frontier %d switches %v", a.TaskId, a.ReconfigKeptFrontier, a.ReconfigKeptSwitches)
		}
	}
}
