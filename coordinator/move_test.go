package coordinator

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// TestCatchUpMoveEndsAfterItsBound: a live move waits for its new copy
// to catch up with the old one (MoveTask plans it with CatchUp when every
// coordinator speaks protocol 5); a new copy that runs but stays behind
// is switched to anyway once Timings.MoveCatchUpBound has passed, and the
// positions at the switch show it had not caught up.
func TestCatchUpMoveEndsAfterItsBound(t *testing.T) {
	t.Parallel()
	tm := testTimings()
	tm.MoveCatchUpBound = time.Second
	c := newTestClusterWith(t, 1, "", "", tm)
	l := c.leader()
	w1 := c.startWorker(t, l, "w1")
	submit(t, c.admin(l), "mb", 1)
	tasks := placedStatus(t, c.admin(l), w1.id)[w1.id].Tasks
	if len(tasks) == 0 {
		t.Fatal("no task placed on w1")
	}
	task := tasks[0]
	w2 := c.startWorker(t, l, "w2")
	if _, err := c.admin(l).MoveTask(ctxT(t, 10*time.Second), &pb.MoveTaskRequest{TaskId: task, ToWorker: w2.id}); err != nil {
		t.Fatal(err)
	}
	st := c.nodes[l].State()
	if tk, err := st.Task(nil, task); err != nil || tk == nil || !tk.MoveCatchUp || tk.MovingFrom != w1.id {
		t.Fatalf("the live move is not a catch-up move: %+v %v", tk, err)
	}
	report := func(worker string, gen int32, pos uint64) {
		t.Helper()
		if _, err := c.workers(l).ReportTasks(ctxT(t, 5*time.Second), &pb.ReportTasksRequest{WorkerId: worker,
			Tasks: []*pb.TaskState{{TaskId: task, State: states.TaskRunning, Generation: gen, MovePosition: &pos}}}); err != nil {
			t.Fatal(err)
		}
	}
	report(w1.id, 1, 100) // the old copy is at 100
	report(w2.id, 2, 10)  // the new copy runs, far behind, and stays so
	if tk, _ := st.Task(nil, task); tk.MovingFrom != w1.id {
		t.Fatalf("the move ended before the new copy caught up: %+v", tk)
	}
	waitFor(t, minWait, "the bound ends the move", func() bool {
		tk, err := st.Task(nil, task)
		return err == nil && tk != nil && tk.MovingFrom == ""
	})
	tk, _ := st.Task(nil, task)
	if tk.MovePosition == nil || tk.MovingFromPosition == nil || *tk.MovePosition != 10 || *tk.MovingFromPosition != 100 || tk.State != states.TaskRunning {
		t.Fatalf("after the bound: %+v", tk)
	}
}

// TestQueryStatusShowsAMoveInProgress: while a live move is under way,
// query status says so on the moving task (the old copy serves meanwhile)
// instead of showing the new copy as merely placed and not yet running,
// which reads as if the task had stopped. Meanwhile a task next to it in
// the stream cannot be moved.
func TestQueryStatusShowsAMoveInProgress(t *testing.T) {
	t.Parallel()
	tm := testTimings()
	tm.MoveCatchUpBound = time.Minute
	c := newTestClusterWith(t, 1, "", "", tm)
	l := c.leader()
	w1 := c.startWorker(t, l, "w1")
	submit(t, c.admin(l), "ms", 1)
	tasks := placedStatus(t, c.admin(l), w1.id)[w1.id].Tasks
	if len(tasks) == 0 {
		t.Fatal("no task placed on w1")
	}
	task := tasks[0]
	w2 := c.startWorker(t, l, "w2")
	if _, err := c.admin(l).MoveTask(ctxT(t, 10*time.Second), &pb.MoveTaskRequest{TaskId: task, ToWorker: w2.id}); err != nil {
		t.Fatal(err)
	}
	shown := func() *pb.TaskInfo {
		t.Helper()
		q, err := c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "ms"})
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range q.Tasks {
			if ti.TaskId == task {
				return ti
			}
		}
		t.Fatalf("no task %s in query status", task)
		return nil
	}
	// A task it reads from, or one reading from it, does not move while
	// it does (inOrder): refused, naming why.
	moving, err := c.nodes[l].State().Task(nil, task)
	if err != nil || moving == nil {
		t.Fatalf("task %s: %v", task, err)
	}
	inputs := c.nodes[l].taskInputs()
	neighbours := 0
	for _, other := range tasks {
		o, err := c.nodes[l].State().Task(nil, other)
		if err != nil || o == nil || o.ID == task || (!slices.Contains(inputs(o), moving.Fragment) && !slices.Contains(inputs(moving), o.Fragment)) {
			continue
		}
		neighbours++
		_, err = c.admin(l).MoveTask(ctxT(t, 10*time.Second), &pb.MoveTaskRequest{TaskId: other, ToWorker: w2.id})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "live move") {
			t.Fatalf("moving %s while %s, next to it in the stream, moves: %v, want it refused", other, task, err)
		}
	}
	if neighbours == 0 {
		t.Fatalf("no task of the query reads from or feeds %s (tasks %v)", task, tasks)
	}
	want := "moving from worker " + w1.id
	if ti := shown(); ti.MovingFrom != w1.id || !strings.Contains(ti.Message, want) || !strings.Contains(ti.Message, "old copy serves") {
		t.Fatalf("query status during the move: state %s, message %q; want it to say %q and that the old copy serves", ti.State, ti.Message, want)
	}
	pos := func(p uint64) *uint64 { return &p }
	for _, r := range []struct {
		w   string
		gen int32
		pos uint64
	}{{w1.id, 1, 100}, {w2.id, 2, 10}} {
		if _, err := c.workers(l).ReportTasks(ctxT(t, 5*time.Second), &pb.ReportTasksRequest{WorkerId: r.w,
			Tasks: []*pb.TaskState{{TaskId: task, State: states.TaskRunning, Generation: r.gen, MovePosition: pos(r.pos)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if ti := shown(); ti.State != states.TaskRunning || !strings.Contains(ti.Message, want) || !strings.Contains(ti.Message, "catches up") {
		t.Fatalf("query status while the new copy catches up: state %s, message %q", ti.State, ti.Message)
	}
}
