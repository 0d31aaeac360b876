package coordinator

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/states"
)

// A worker of a query without replicas is declared down while it runs
// (its heartbeats do not arrive, as under CPU starvation, but its tasks
// and data plane run on): its tasks are placed again on the other worker
// and take over from the copies still running there, so the sink's
// results equal, window by window and word by word, those of a run left
// alone. (Placed again without the old copies' state, they replayed
// from upstream buffers that no longer held what the old copies had
// acknowledged, and results were lost: 14 of 69,557 in a coordinator
// package run at load 20.)
func TestFalselyDownWorkerHandsOverWithoutReplicas(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	var held atomic.Value // worker id whose heartbeats are refused
	held.Store("")
	o := newXorgOrg(t, "alpha", nil, calmFailureDetection, func(c *Config) {
		c.hooks.heartbeat = func(worker string) error {
			if worker == held.Load().(string) {
				return status.Error(codes.Unavailable, "test: heartbeat held")
			}
			return nil
		}
	})
	const limit = 100000
	want := xorgReference(t, limit)
	o.submit(t, "fd", 1, limit)

	var started bool
	done := make(chan error, 1)
	got := o.results(t, "fd", func(n int) {
		// A third of the way through the stream.
		if n < len(want)/3 || started {
			return
		}
		started = true
		go func() { done <- o.falseDeath(t, "fd", &held) }()
	})
	if !started {
		t.Fatal("the query ended before the false detection: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
}

// falseDeath declares down, while it runs on, the worker that runs tasks
// of query but not its sink, refusing its heartbeats (held) until every
// task it ran runs again elsewhere; then it lets it come back.
func (o *xorgOrg) falseDeath(t *testing.T, query string, held *atomic.Value) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sink := o.task(t, query+"/out/p0/r0")
	var victim string
	var ran []string
	tasks, err := o.nodes[0].State().Tasks(nil)
	if err != nil {
		return err
	}
	for _, w := range o.workers {
		if w.ID() == sink.WorkerID {
			continue
		}
		victim = w.ID()
		for _, tk := range tasks {
			if tk.Query == query && tk.WorkerID == victim {
				ran = append(ran, tk.ID)
			}
		}
	}
	if len(ran) == 0 {
		return fmt.Errorf("no worker runs tasks of %s but not its sink", query)
	}
	t.Logf("declaring worker %s down while it runs %v", victim, ran)
	held.Store(victim)
	defer held.Store("")
	res, err := o.nodes[0].apply(ctx, fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerID: victim, Status: statusDown, At: time.Now().UnixNano()})
	if err == nil {
		err = res.Err
	}
	if err != nil {
		return fmt.Errorf("mark %s down: %w", victim, err)
	}
	for _, id := range ran {
		for {
			tk, err := o.nodes[0].State().Task(nil, id)
			if err != nil {
				return err
			}
			if tk.Gen() >= 2 && tk.WorkerID != victim && tk.WorkerID != "" && tk.MovingFrom == "" && tk.State == states.TaskRunning {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s did not run again elsewhere: %+v", id, tk)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// TestReplaceHandsOverFromDownWorkers: a task leaves a down worker as a
// live move (its old copy may run on: a false detection) only when no
// peer replica can give its next copy its state, and only when every
// coordinator knows how (handOver); a lossy copy is never copied.
func TestReplaceHandsOverFromDownWorkers(t *testing.T) {
	t.Parallel()
	workers := []*fsm.Worker{worker("down", 4, statusDown, ""), worker("a", 4, statusReady, ""), worker("b", 4, statusReady, "")}
	running := func(tk *fsm.Task) *fsm.Task { tk.State = states.TaskRunning; return tk }
	lossy := placedTask("q", "l", 0, 0, "down")
	lossy.Lossy = true
	tasks := []*fsm.Task{
		placedTask("q", "alone", 0, 0, "down"), // no replicas
		placedTask("q", "peer", 0, 0, "down"), running(placedTask("q", "peer", 0, 1, "a")),
		placedTask("q", "deadpeer", 0, 0, "down"), running(placedTask("q", "deadpeer", 0, 1, "down")),
		lossy,
	}
	live := func(ho handOver) map[string]fsm.PlannedPlacement {
		out := map[string]fsm.PlannedPlacement{}
		for _, m := range replace(workers, tasks, nil, ho) {
			out[m.TaskID] = m
		}
		return out
	}
	got := live(handOver{live: true, catchUp: true})
	for id, want := range map[string]bool{"q/alone/p0/r0": true, "q/peer/p0/r0": false, "q/deadpeer/p0/r0": true, "q/deadpeer/p0/r1": true, "q/l/p0/r0": false} {
		m, ok := got[id]
		if !ok || m.ToWorker == "" {
			t.Fatalf("%s not placed again: %+v", id, got)
		}
		if m.Live != want || m.CatchUp != want {
			t.Errorf("%s: live %v catch-up %v, want %v", id, m.Live, m.CatchUp, want)
		}
	}
	if m := live(handOver{live: true})["q/alone/p0/r0"]; !m.Live || m.CatchUp {
		t.Errorf("without catch-up known everywhere: %+v", m)
	}
	for id, m := range live(handOver{}) {
		if m.Live {
			t.Errorf("%s moves live although a coordinator could not apply it", id)
		}
	}
}
