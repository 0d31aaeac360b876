package webui

import (
	"testing"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// A query's view shows each replica's DCAA state, and says the query's
// results are tentative while any task's output is.
func TestQueryViewShowsReplicaStates(t *testing.T) {
	q := &pb.QueryInfo{Name: "q", Replicas: 2, Tasks: []*pb.TaskInfo{
		{TaskId: "q/a/p0/r0", ReplicaState: pb.ReplicaState_REPLICA_STABLE},
		{TaskId: "q/a/p0/r1", ReplicaState: pb.ReplicaState_REPLICA_UP_FAILURE},
		{TaskId: "q/b/p0/r0"},
	}}
	v := QueryView(q)
	if v.Tentative {
		t.Fatal("no task is tentative, the view says the results are")
	}
	want := []string{"STABLE", "UP_FAILURE", ""}
	for i, task := range v.Tasks {
		if task.ReplicaState != want[i] {
			t.Errorf("task %s: replica state %q, want %q", task.ID, task.ReplicaState, want[i])
		}
	}
	q.Tasks[1].Tentative = true
	if v := QueryView(q); !v.Tentative || !v.Tasks[1].Tentative {
		t.Fatalf("a tentative task does not make the query's results tentative: %+v", v)
	}
}
