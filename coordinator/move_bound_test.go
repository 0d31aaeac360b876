package coordinator

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// TestStuckConsumerMoveRollsBackForItsProducer: the aggregate is in a
// live move whose new copy never runs (its worker is never told of it:
// hooks.withhold) when the worker running it and its producer is
// declared down while it runs on (a false detection). The producer may
// not move live while its consumer runs two copies (streamMoves), and
// the consumer's move never ends by itself: once its new copy has not
// run within Timings.MoveStartBound the move is rolled back to the old
// copy (boundMoves), after which the producer leaves the down worker,
// then the aggregate; the sink's results equal, window by window and
// word by word, those of a run left alone. (Before, the producer stayed
// on the down worker for as long as the move lasted: for ever.)
func TestStuckConsumerMoveRollsBackForItsProducer(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	const query, producer, consumer = "sm", "sm/lines/p0/r0", "sm/counts/p0/r0"
	var held atomic.Value // worker id whose heartbeats are refused
	held.Store("")
	var leader atomic.Pointer[Server]
	o := newXorgOrg(t, "alpha", nil, calmFailureDetection, func(c *Config) {
		c.Timings.MoveStartBound = 3 * time.Second
		c.hooks.heartbeat = func(worker string) error {
			if worker == held.Load().(string) {
				return status.Error(codes.Unavailable, "test: heartbeat held")
			}
			return nil
		}
		// The aggregate's second copy runs only once its producer has
		// moved: the first attempt never runs, the one after its
		// producer's move does.
		c.hooks.withhold = func(_, task string, gen int) bool {
			s := leader.Load()
			if s == nil || task != consumer || gen != 2 {
				return false
			}
			p, err := s.State().Task(nil, producer)
			return err == nil && p != nil && p.Gen() == 1
		}
	})
	leader.Store(o.nodes[0])
	const limit = 100000
	want := xorgReference(t, limit)
	o.submit(t, query, 1, limit)
	if in := o.nodes[0].taskInputs()(o.task(t, consumer)); len(in) != 1 || in[0] != "lines" {
		t.Fatalf("%s reads %v, not lines", consumer, in)
	}

	var started bool
	done := make(chan error, 1)
	got := o.results(t, query, func(n int) {
		if n < len(want)/3 || started {
			return
		}
		started = true
		go func() {
			done <- func() error {
				c, p, sink := o.task(t, consumer), o.task(t, producer), o.task(t, query+"/out/p0/r0")
				if c.WorkerID != p.WorkerID || c.WorkerID == sink.WorkerID {
					return fmt.Errorf("placed as %s on %s, %s on %s, the sink on %s: want the aggregate and its producer on one worker, the sink on the other",
						consumer, c.WorkerID, producer, p.WorkerID, sink.WorkerID)
				}
				victim := c.WorkerID
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				if _, err := o.admin(0).MoveTask(ctx, &pb.MoveTaskRequest{TaskId: consumer, ToWorker: sink.WorkerID}); err != nil {
					return fmt.Errorf("move %s: %w", consumer, err)
				}
				// The producer leaves the worker declared down, never
				// while its consumer moves (falseDeath checks both).
				if err := o.falseDeath(t, query, &held); err != nil {
					return err
				}
				for {
					tk := o.task(t, consumer)
					if tk.Gen() >= 2 && tk.WorkerID != victim && tk.MovingFrom == "" && tk.State == states.TaskRunning {
						return nil
					}
					select {
					case <-ctx.Done():
						return fmt.Errorf("%s did not run again elsewhere: %+v", consumer, tk)
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
		}()
	})
	if !started {
		t.Fatal("the query ended before the move: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
}

// TestStuckMove is the table of boundMoves' rollback (stuckMove): a live
// move that leaves its old copy running is rolled back once its new copy
// has not run within the bound, at once when that copy failed or its
// worker is down or gone; never a move whose snapshot halts the old copy,
// nor one to or from a partner org, nor one whose new copy runs (the
// catch-up bound ends those).
func TestStuckMove(t *testing.T) {
	t.Parallel()
	partner := worker("p", 4, statusReady, "")
	partner.Labels = map[string]string{partnerLabel: "beta"}
	workers := map[string]*fsm.Worker{}
	for _, w := range []*fsm.Worker{worker("a", 4, statusReady, ""), worker("b", 4, statusReady, ""), worker("d", 4, statusDown, ""), partner} {
		workers[w.ID] = w
	}
	const bound = time.Minute
	moving := func(from, to, state string) *fsm.Task {
		tk := placedTask("q", "counts", 0, 0, to)
		tk.MovingFrom, tk.MovingFromGeneration, tk.Generation, tk.State = from, 1, 2, state
		return tk
	}
	cases := []struct {
		name   string
		task   *fsm.Task
		halts  bool
		waited time.Duration
		want   string // substring of the reason; "" for none
	}{
		{"new copy pending within the bound", moving("a", "b", states.TaskPending), false, bound - time.Second, ""},
		{"new copy pending past the bound", moving("a", "b", states.TaskPending), false, bound, "did not run within 1m0s (it is pending)"},
		{"new copy starting past the bound", moving("a", "b", states.TaskStarting), false, 2 * bound, "did not run within"},
		{"new copy running past the bound", moving("a", "b", states.TaskRunning), false, 2 * bound, ""},
		{"new copy stalled past the bound", moving("a", "b", states.TaskStalled), false, 2 * bound, ""},
		{"new copy failed", moving("a", "b", states.TaskFailed), false, 0, "its new copy failed"},
		{"new copy's worker down", moving("a", "d", states.TaskRunning), false, 0, "worker d is down"},
		{"new copy's worker gone", moving("a", "gone", states.TaskPending), false, 0, "no longer registered"},
		{"old copy's worker down too", moving("d", "b", states.TaskPending), false, bound, "did not run within"},
		{"stop-and-copy", moving("a", "b", states.TaskPending), true, 2 * bound, ""},
		{"stop-and-copy on a down worker", moving("a", "d", states.TaskPending), true, 2 * bound, ""},
		{"to a partner org", moving("a", "p", states.TaskPending), false, 2 * bound, ""},
		{"from a partner org", moving("p", "b", states.TaskFailed), false, 2 * bound, ""},
		{"not moving", placedTask("q", "counts", 0, 0, "b"), false, 2 * bound, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := stuckMove(tc.task, workers, tc.halts, tc.waited, bound)
			if (tc.want == "") != (got == "") || (tc.want != "" && !strings.Contains(got, tc.want)) {
				t.Fatalf("reason %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReplaceLeavesAStuckMoveToItsRollback: a task whose live move's new
// copy is on a worker declared down is not placed again by the
// scheduler when boundMoves rolls that move back (handOver.rollBack):
// placed again from the down worker, its next copy would start without
// the old copy's state, although the old copy runs on. (Before, it was
// placed again at once, not live, and replayed from its upstreams'
// buffers, which no longer held what the old copy had acknowledged.)
func TestReplaceLeavesAStuckMoveToItsRollback(t *testing.T) {
	t.Parallel()
	workers := []*fsm.Worker{worker("down", 4, statusDown, ""), worker("a", 4, statusReady, ""), worker("b", 4, statusReady, "")}
	agg := placedTask("q", "counts", 0, 0, "down")
	agg.MovingFrom, agg.MovingFromGeneration, agg.Generation = "a", 1, 2
	tasks := []*fsm.Task{agg, placedTask("q", "other", 0, 0, "down")}
	ids := func(ho handOver) (out []string) {
		for _, m := range replace(workers, tasks, nil, ho) {
			out = append(out, m.TaskID)
		}
		return out
	}
	rollBack := func(tk *fsm.Task) bool { return tk.ID == agg.ID }
	if got := ids(handOver{live: true, catchUp: true, rollBack: rollBack}); len(got) != 1 || got[0] != "q/other/p0/r0" {
		t.Fatalf("planned %v, want only q/other/p0/r0 (the move of %s is rolled back)", got, agg.ID)
	}
	// Without the rollback (a coordinator that cannot apply it), the
	// task is placed again as before.
	if got := ids(handOver{live: true, catchUp: true}); len(got) != 2 {
		t.Fatalf("planned %v, want both tasks", got)
	}
}

// TestReplacePlacesAProducerAfterItsConsumersLiveMove: a producer placed
// again not live (from a peer replica's snapshot) gets a new copy that
// its consumers reach as a live move's at its end, so it waits while a
// consumer of it runs two copies (streamMoves), past any wait (that
// move ends or is rolled back within its bounds); in one plan, the
// producer is placed and its consumer's live move waits for the next.
// A consumer placed again not live moves at once.
func TestReplacePlacesAProducerAfterItsConsumersLiveMove(t *testing.T) {
	t.Parallel()
	workers := []*fsm.Worker{worker("down", 4, statusDown, ""), worker("a", 4, statusReady, ""), worker("b", 4, statusReady, "")}
	reads := map[string][]string{"counts": {"lines"}}
	ho := handOver{live: true, catchUp: true, inputs: func(tk *fsm.Task) []string { return reads[tk.Fragment] },
		hold: func(string, bool) bool { return false }} // past every wait
	running := func(tk *fsm.Task) *fsm.Task { tk.State = states.TaskRunning; return tk }
	src, peer := placedTask("q", "lines", 0, 0, "down"), running(placedTask("q", "lines", 0, 1, "a"))
	agg := placedTask("q", "counts", 0, 0, "a")
	agg.MovingFrom, agg.MovingFromGeneration, agg.Generation = "b", 1, 2
	plan := func(tasks ...*fsm.Task) map[string]fsm.PlannedPlacement {
		out := map[string]fsm.PlannedPlacement{}
		for _, m := range replace(workers, tasks, nil, ho) {
			out[m.TaskID] = m
		}
		return out
	}
	if got := plan(src, peer, agg); len(got) != 0 {
		t.Fatalf("a producer placed again while its consumer moves live: %+v", got)
	}
	agg.MoveHalt = true
	if got := plan(src, peer, agg); len(got) != 1 || got[src.ID].Live || got[src.ID].ToWorker != "b" {
		t.Fatalf("next to a stop-and-copy consumer move: planned %+v, want %s placed again on b, not live", got, src.ID)
	}
	agg.MoveHalt = false
	agg.MovingFrom, agg.MovingFromGeneration = "", 0
	if got := plan(src, peer, agg); len(got) != 1 || got[src.ID].Live {
		t.Fatalf("once the consumer's move ended: planned %+v, want %s placed again, not live", got, src.ID)
	}
	// Both on the down worker: the producer first, the consumer (no peer:
	// a live move) waits.
	agg2 := placedTask("q", "counts", 0, 0, "down")
	if got := plan(src, peer, agg2); len(got) != 1 || got[src.ID].ToWorker == "" {
		t.Fatalf("a producer placed again and its consumer moving live in one plan: planned %+v, want only %s", got, src.ID)
	}
	// Not live (a coordinator behind): the consumer starts one copy, and
	// both go at once.
	ho.live = false
	if got := plan(src, peer, agg2); len(got) != 2 {
		t.Fatalf("placed again not live, both: planned %+v", got)
	}
}
