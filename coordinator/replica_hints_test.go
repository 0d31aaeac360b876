package coordinator

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// TestHeartbeatCarriesUpstreamReplicaStates: the DCAA states the workers
// report reach, in the heartbeat answer, the worker whose tasks read
// those replicas (HeartbeatResponse.replica_states), each with its
// generation and an age no older than the report.
func TestHeartbeatCarriesUpstreamReplicaStates(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	w1 := c.startWorker(t, l, "w1")
	w2 := c.startWorker(t, l, "w2")
	submit(t, c.admin(l), "hints", 2)
	var q *pb.QueryInfo
	waitFor(t, 15*time.Second, "every task of the query placed", func() bool {
		var err error
		q, err = c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "hints"})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range q.Tasks {
			if tk.WorkerId == "" {
				return false
			}
		}
		return len(q.Tasks) > 0
	})
	var sink *pb.TaskInfo
	for _, tk := range q.Tasks {
		if tk.Fragment == "out" && tk.Replica == 0 {
			sink = tk
		}
	}
	if sink == nil || (sink.WorkerId != w1.id && sink.WorkerId != w2.id) {
		t.Fatalf("sink replica 0 not placed on a test worker: %+v", q.Tasks)
	}
	// Every upstream task reports a state from its worker: replica 0
	// UP_FAILURE, replica 1 STABILIZATION.
	want := map[string]pb.ReplicaState{}
	before := time.Now()
	for _, tk := range q.Tasks {
		if tk.Fragment == "out" {
			continue
		}
		st := []pb.ReplicaState{pb.ReplicaState_REPLICA_UP_FAILURE, pb.ReplicaState_REPLICA_STABILIZATION}[tk.Replica]
		want[tk.TaskId] = st
		if _, err := c.workers(l).ReportTasks(ctxT(t, 5*time.Second), &pb.ReportTasksRequest{WorkerId: tk.WorkerId,
			Tasks: []*pb.TaskState{{TaskId: tk.TaskId, State: states.TaskRunning, Generation: tk.Generation, ReplicaState: st}}}); err != nil {
			t.Fatal(err)
		}
	}
	if len(want) == 0 {
		t.Fatalf("no upstream task: %+v", q.Tasks)
	}
	var got *pb.HeartbeatResponse
	waitFor(t, 15*time.Second, "the sink's worker told every upstream replica's state", func() bool {
		var err error
		got, err = c.workers(l).Heartbeat(ctxT(t, 5*time.Second), &pb.HeartbeatRequest{WorkerId: sink.WorkerId})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, h := range got.ReplicaStates {
			if want[h.TaskId] == h.State {
				n++
			}
		}
		return n == len(want)
	})
	for _, h := range got.ReplicaStates {
		if _, up := want[h.TaskId]; !up {
			continue
		}
		if h.Generation < 1 || h.AgeMs < 0 || h.AgeMs > time.Since(before).Milliseconds() {
			t.Fatalf("hint %+v: want generation >= 1 and an age within the %v since the report", h, time.Since(before))
		}
	}
}

// TestStateNewsPrunesGoneTasks: the leader's notes of when it learned
// replica states drop the tasks no longer in the state once they doubled
// since the last sweep, and keep every note of a live task.
func TestStateNewsPrunesGoneTasks(t *testing.T) {
	now := time.Now()
	n := newStateNews(now)
	live := map[string]bool{}
	exists := func(id string) bool { return live[id] }
	// Queries come and go: each round notes minSweep tasks, the round's
	// tasks alone stay live.
	for round := 0; round < 5; round++ {
		clear(live)
		for i := 0; i < minSweep; i++ {
			id := fmt.Sprintf("q%d/f/p%d/r0", round, i)
			live[id] = true
			n.note(id, 1, pb.ReplicaState_REPLICA_STABLE, now)
			n.prune(exists)
		}
		if len(n.m) > 2*minSweep+1 {
			t.Fatalf("round %d: %d notes kept for %d live tasks", round, len(n.m), len(live))
		}
	}
	for id := range live {
		if n.age(id, 1, pb.ReplicaState_REPLICA_STABLE, now.Add(time.Second)) != time.Second {
			t.Fatalf("the note of live task %s was dropped", id)
		}
	}
}
