package coordinator

import (
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// TestSilentWorkerTasksShownUnreachable: once a worker has missed its
// heartbeats (killed with kill -9, paused), query status shows its tasks
// unreachable, with why, instead of the state it last reported, before
// the heartbeat TTL runs out and it is declared down. Fails without silentWorker: the tasks
// stay as last reported until the worker is down.
func TestSilentWorkerTasksShownUnreachable(t *testing.T) {
	t.Parallel()
	tm := FastTimings()
	// Half of it is the window between unreachable and down: wide enough
	// that a loaded machine's pauses do not skip it.
	tm.HeartbeatTTL = 4 * time.Second
	c := newTestClusterWith(t, 1, "", "", tm)
	l := c.leader()
	w1 := c.startWorker(t, l, "w1")
	w2 := c.startWorker(t, l, "w2")
	submit(t, c.admin(l), "silent", 1)
	victim := w1
	if len(workerStatus(t, c.admin(l))[w1.id].Tasks) == 0 {
		victim = w2
	}
	victim.stop()
	var q *pb.QueryInfo
	waitFor(t, 10*time.Second, "the silent worker's tasks shown unreachable", func() bool {
		var err error
		q, err = c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "silent"})
		if err != nil {
			return false
		}
		for _, ti := range q.Tasks {
			if ti.WorkerId != victim.id {
				continue
			}
			if ti.State == states.TaskLost {
				t.Fatalf("task %s shown %s before it was shown unreachable", ti.TaskId, ti.State)
			}
			if ti.State != states.TaskUnreachable {
				return false
			}
		}
		return true
	})
	for _, ti := range q.Tasks {
		if ti.WorkerId == victim.id && !strings.Contains(ti.Message, "unreachable: no heartbeat for") {
			t.Errorf("task %s: message %q does not say why it is unreachable", ti.TaskId, ti.Message)
		}
	}
	// The workers list says the same of the worker itself, while the
	// table still holds it ready (the TTL has not run out): it may
	// already be declared down by now, which it shows as such.
	ws, err := c.admin(l).ListWorkers(ctxT(t, 5*time.Second), &pb.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Workers {
		switch {
		case w.Id != victim.id:
			if w.Status != states.WorkerReady || w.StatusNote != "" {
				t.Errorf("live worker %s shown %s (%q)", w.Id, w.Status, w.StatusNote)
			}
		case w.Status == states.WorkerDown:
		case w.Status != states.WorkerUnreachable || !strings.Contains(w.StatusNote, "no heartbeat for"):
			t.Errorf("silent worker %s shown %s (%q), want unreachable with why", w.Id, w.Status, w.StatusNote)
		}
	}
}
