package coordinator

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// A worker down longer than RemoveDownWorkersAfter is removed from the
// state; its tasks were placed on the survivor when it went down.
func TestDownWorkersRemoved(t *testing.T) {
	t.Parallel()
	tm := testTimings()
	tm.RemoveDownWorkersAfter = time.Second
	c := newTestClusterWith(t, 3, "", "", tm)
	l := c.leader()
	w1 := c.startWorker(t, l, "w1")
	w2 := c.startWorker(t, l, "w2")
	waitReady(t, c, l, 2)
	submit(t, c.admin(l), "gc", 1)
	w1.stop()
	waitFor(t, 10*time.Second, "w1 down", func() bool {
		w := workerStatus(t, c.admin(l))[w1.id]
		return w == nil || w.Status == "down"
	})
	waitFor(t, 10*time.Second, "w1 removed on every node", func() bool {
		for i := range c.nodes {
			if workerStatus(t, c.admin(i))[w1.id] != nil {
				return false
			}
		}
		return true
	})
	q, err := c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "gc"})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range q.Tasks {
		if task.WorkerId != w2.id {
			t.Fatalf("task %s on %q, want the survivor %s", task.TaskId, task.WorkerId, w2.id)
		}
	}
}

// A worker that registers again at its old address (a restarted process,
// with a new id) replaces its old record: no duplicate rows, and the old
// record's tasks are placed again.
func TestRestartedWorkerReplacesItsRecord(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	const addr = "127.0.0.1:29999"
	var ids []string
	for i := range 20 {
		resp, err := c.workers(l).Register(ctxT(t, 10*time.Second), &pb.RegisterRequest{Addr: addr, Cores: 4, Name: "w", IdempotencyKey: fmt.Sprintf("boot-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.WorkerId)
		if i == 0 {
			submit(t, c.admin(l), "moves", 1)
		}
	}
	ws := workerStatus(t, c.admin(l))
	last := ids[len(ids)-1]
	if len(ws) != 1 || ws[last] == nil {
		t.Fatalf("workers after 20 registrations at one address: %v; want only the latest, %s", ws, last)
	}
	waitFor(t, 10*time.Second, "tasks placed on the new record", func() bool {
		q, err := c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "moves"})
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range q.Tasks {
			if task.WorkerId != last {
				return false
			}
		}
		return true
	})
}

// After every coordinator restarts, workers that were ready show unknown,
// and their tasks unknown rather than running, until they are heard from;
// dead ones then go down and their tasks lost or re-placed.
func TestFullRestartDoesNotClaimDeadWorkersRun(t *testing.T) {
	t.Parallel()
	tm := testTimings()
	tm.HeartbeatTTL, tm.LeaderGrace = 2*time.Second, 2*time.Second // room to look
	c := newTestClusterWith(t, 1, "", "", tm)
	l := c.leader()
	w := c.startWorker(t, l, "w1")
	waitReady(t, c, l, 1)
	submit(t, c.admin(l), "ghost", 1)
	q, _ := c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "ghost"})
	var states []*pb.TaskState
	for _, task := range q.Tasks {
		states = append(states, &pb.TaskState{TaskId: task.TaskId, State: "running"})
	}
	if _, err := c.workers(l).ReportTasks(ctxT(t, 5*time.Second), &pb.ReportTasksRequest{WorkerId: w.id, Tasks: states}); err != nil {
		t.Fatal(err)
	}
	w.stop() // the worker dies with the org
	c.stop(l)
	c.start(l)
	nl := c.leader()
	saw := false
	waitFor(t, 15*time.Second, "the dead worker down", func() bool {
		// The query first: a worker unknown in the later read was
		// unknown in the earlier one too (unknown only leads to ready or
		// down).
		q, err := c.admin(nl).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "ghost"})
		if status.Code(err) == codes.NotFound {
			return false // the restarted node has not applied its log yet
		}
		if err != nil {
			t.Fatal(err)
		}
		ws := workerStatus(t, c.admin(nl))
		switch ws[w.id].GetStatus() {
		case "ready":
			t.Fatalf("dead worker shown ready after the restart")
		case "unknown":
			saw = true
			for _, task := range q.Tasks {
				if task.State != "unknown" {
					t.Fatalf("task %s shown %s on a worker not heard from", task.TaskId, task.State)
				}
			}
		}
		for _, task := range q.Tasks {
			if task.State == "running" {
				t.Fatalf("task %s shown running on a dead worker", task.TaskId)
			}
		}
		return ws[w.id].GetStatus() == "down"
	})
	if !saw {
		t.Fatal("the worker was never shown unknown during the leader's grace")
	}
}
