package coordinator

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// TestHostedReportsCarrySwitchPoints: the progress a hosted copy's
// worker reports to its host's leader reaches the owner's update of the
// task with the copy's switch points, through the sync answer's JSON, as
// a report of one of the owner's own workers does (the owner keeps them
// for the task's next copies, fsm ReconfigKept). A host of an older
// build sends none: the owner keeps the frontier alone, as before.
// Before session 20 the host passed the frontier and markers but
// dropped the switch points.
func TestHostedReportsCarrySwitchPoints(t *testing.T) {
	progress := &pb.ReconfigProgress{Acked: 2, Level: 1, Frontier: 9000,
		Markers:  []*pb.ReconfigMarkers{{Epoch: 2, Seen: 1, Expected: 2}},
		Switches: []*pb.ReconfigSwitch{{Epoch: 1, At: 8100}, {}, {}, {}}}
	for _, tc := range []struct {
		name string
		// answer is the sync answer's JSON as the host sends it.
		answer func(t *testing.T) []byte
		want   []fsm.ReconfigSwitch
	}{
		{"a host of this build", func(t *testing.T) []byte {
			b, err := json.Marshal(syncAnswer{Reports: []hostedReport{{TaskID: "q/src/p0/r0", Generation: 2, State: states.TaskRunning,
				Reconfig: hostedReconfigOf(progress)}}})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}, []fsm.ReconfigSwitch{{Epoch: 1, At: 8100}}},
		{"a host of an older build", func(*testing.T) []byte {
			return []byte(`{"reports": [{"task_id": "q/src/p0/r0", "generation": 2, "state": "running",
				"reconfig": {"acked": 2, "level": 1, "frontier": 9000, "markers": [{"epoch": 2, "seen": 1, "expected": 2}]}}]}`)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ans syncAnswer
			if err := json.Unmarshal(tc.answer(t), &ans); err != nil {
				t.Fatal(err)
			}
			var u fsm.TaskStateUpdate
			ans.Reports[0].Reconfig.fill(&u)
			if !u.Reconfig || u.ReconfigAcked != 2 || u.ReconfigLevel != 1 || u.ReconfigFrontier != 9000 ||
				!slices.Equal(u.ReconfigMarkers, []fsm.ReconfigMarkers{{Epoch: 2, Seen: 1, Expected: 2}}) {
				t.Fatalf("update %+v", u)
			}
			if !slices.Equal(u.ReconfigSwitches, tc.want) {
				t.Fatalf("switch points %v, want %v", u.ReconfigSwitches, tc.want)
			}
		})
	}
	var none fsm.TaskStateUpdate
	if hostedReconfigOf(nil) != nil || (func() bool { (*hostedReconfig)(nil).fill(&none); return none.Reconfig })() {
		t.Fatal("a copy that reported no reconfiguration progress has some")
	}
}

// TestHostedSwitchPointsKept: the owner's update built from a host's
// report (fill) is kept by the state machine like a report of its own
// worker's: the frontier and the switch point survive the task's next
// placement, for its next copy's assignment.
func TestHostedSwitchPointsKept(t *testing.T) {
	t.Parallel()
	s, p := ackPlanNode(t)
	if !s.keepReconfig() {
		t.Fatal("a one-node org of this build does not keep reconfiguration progress")
	}
	rp := hostedReconfigOf(&pb.ReconfigProgress{Acked: 1, Frontier: 9000, Switches: []*pb.ReconfigSwitch{{Epoch: 1, At: 9105}}})
	u := fsm.TaskStateUpdate{TaskID: p.src, State: states.TaskRunning}
	rp.fill(&u)
	p.must(fsm.UpdateTaskStatesType, fsm.UpdateTaskStatesRequest{WorkerID: "wa", KeepReconfig: true, States: []fsm.TaskStateUpdate{u}})
	p.must(fsm.PlaceTasksType, fsm.PlaceTasksRequest{Placements: []fsm.Placement{{TaskID: p.src, WorkerID: "wb"}}})
	tk, err := s.State().Task(nil, p.src)
	if err != nil || tk == nil {
		t.Fatal(tk, err)
	}
	if k := tk.ReconfigKept; k == nil || k.Frontier != 9000 || !slices.Equal(k.Switches, []fsm.ReconfigSwitch{{Epoch: 1, At: 9105}}) {
		t.Fatalf("kept %+v after the task was placed again", k)
	}
}
