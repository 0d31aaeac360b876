package coordinator

import (
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestStalledTaskShowsInWorkersAndQuery: a task a worker reports stalled,
// with its reason, shows so in ListWorkers (task_states) and GetQuery, and
// running again once reported so.
func TestStalledTaskShowsInWorkersAndQuery(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	w := c.startWorker(t, l, "w1")
	submit(t, c.admin(l), "st", 1)
	ws := placedStatus(t, c.admin(l), w.id)
	if len(ws[w.id].Tasks) == 0 {
		t.Fatal("no task placed on the worker")
	}
	task := ws[w.id].Tasks[0]
	const reason = "output blocked 30s on consumer out partition 0: subscriber x (connected) has not acknowledged since id 7"
	report := func(state, msg string) {
		t.Helper()
		if _, err := c.workers(l).ReportTasks(ctxT(t, 5*time.Second), &pb.ReportTasksRequest{WorkerId: w.id,
			Tasks: []*pb.TaskState{{TaskId: task, State: state, Message: msg}}}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(state, msg string) {
		t.Helper()
		var found bool
		for _, st := range workerStatus(t, c.admin(l))[w.id].TaskStates {
			if st.TaskId == task {
				found = true
				if st.State != state || st.Message != msg {
					t.Fatalf("workers: %s is %s %q, want %s %q", task, st.State, st.Message, state, msg)
				}
			}
		}
		if !found {
			t.Fatalf("workers: no state for %s", task)
		}
		q, err := c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "st"})
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range q.Tasks {
			if ti.TaskId == task && (ti.State != state || ti.Message != msg) {
				t.Fatalf("query status: %s is %s %q, want %s %q", task, ti.State, ti.Message, state, msg)
			}
		}
	}
	report("stalled", reason)
	check("stalled", reason)
	report("running", "")
	check("running", "")
}
