package coordinator

import (
	"context"
	"fmt"
	"slices"
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
	// Meanwhile no task moves while a task it reads from does (see
	// inOrder): the victim runs the source and the aggregate here.
	inputs := o.nodes[0].taskInputs()
	for _, id := range ran {
		for {
			tasks, err := o.nodes[0].State().Tasks(nil)
			if err != nil {
				return err
			}
			moving := map[string]string{} // fragment -> a task of it in a move
			for _, tk := range tasks {
				if tk.Query == query && tk.MovingFrom != "" {
					moving[tk.Fragment] = tk.ID
				}
			}
			var tk *fsm.Task
			for _, x := range tasks {
				if x.ID == id {
					tk = x
				}
				if x.Query != query || x.MovingFrom == "" {
					continue
				}
				for _, in := range inputs(x) {
					if up := moving[in]; up != "" {
						return fmt.Errorf("%s moves while %s, which it reads from, moves too", x.ID, up)
					}
				}
			}
			if tk != nil && tk.Gen() >= 2 && tk.WorkerID != victim && tk.WorkerID != "" && tk.MovingFrom == "" && tk.State == states.TaskRunning {
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

// TestReplaceMovesAProducerBeforeItsConsumer: a producer and its consumer
// leaving one worker declared down move live one after the other, the
// producer first (inOrder): its move's end switches every consumer at
// once, and a consumer with two copies then loses input on the copy
// that reaches the new producer copy last. A move waits while a task it
// reads from moves, and while a task reading from it moves; tasks of
// another stream move at once. (Before, one plan moved all three at
// once.)
func TestReplaceMovesAProducerBeforeItsConsumer(t *testing.T) {
	t.Parallel()
	workers := []*fsm.Worker{worker("down", 4, statusDown, ""), worker("a", 4, statusReady, "")}
	reads := map[string][]string{"counts": {"lines"}, "out": {"counts"}}
	ho := handOver{live: true, catchUp: true, inputs: func(tk *fsm.Task) []string { return reads[tk.Fragment] }}
	lines, counts, out := placedTask("q", "lines", 0, 0, "down"), placedTask("q", "counts", 0, 0, "down"), placedTask("q", "out", 0, 0, "down")
	other := placedTask("q2", "counts", 0, 0, "down") // reads a q2 stream that does not move
	tasks := []*fsm.Task{out, counts, lines, other}
	planned := func() (ids []string) {
		for _, m := range replace(workers, tasks, nil, ho) {
			if !m.Live {
				t.Errorf("%s does not move live: %+v", m.TaskID, m)
			}
			ids = append(ids, m.TaskID)
		}
		slices.Sort(ids)
		return ids
	}
	// moving puts tk's next copy on a while its old copy runs on.
	moving := func(tk *fsm.Task) {
		tk.MovingFrom, tk.MovingFromGeneration, tk.WorkerID, tk.Generation = tk.WorkerID, tk.Gen(), "a", tk.Gen()+1
	}
	ended := func(tk *fsm.Task) { tk.MovingFrom, tk.MovingFromGeneration = "", 0 }
	for _, step := range []struct {
		name string
		want []string
		then func()
	}{
		{"first plan", []string{lines.ID, other.ID}, func() { moving(lines); moving(other) }},
		{"while the producer moves", nil, func() { ended(lines); ended(other) }},
		{"once the producer's move ended", []string{counts.ID}, func() { moving(counts) }},
		{"while the consumer moves", nil, func() { ended(counts) }},
		{"once the consumer's move ended", []string{out.ID}, func() { moving(out) }},
	} {
		if got := planned(); !slices.Equal(got, step.want) {
			t.Fatalf("%s: planned %v, want %v", step.name, got, step.want)
		}
		step.then()
	}
	// A producer left on the down worker whose consumer is in a move
	// (one an operator asked for) waits for it.
	src := placedTask("q3", "lines", 0, 0, "down")
	agg := placedTask("q3", "counts", 0, 0, "a")
	agg.MovingFrom, agg.MovingFromGeneration, agg.Generation = "a2", 1, 2
	tasks = []*fsm.Task{src, agg}
	if got := planned(); len(got) != 0 {
		t.Fatalf("a producer moved while its consumer was moving: planned %v", got)
	}
	ended(agg)
	if got := planned(); !slices.Equal(got, []string{src.ID}) {
		t.Fatalf("once its consumer's move ended: planned %v, want %v", got, []string{src.ID})
	}
	// A move that does not end (its new copy never runs) holds the
	// others back only as long as hold says (moveOrderWait); past it a
	// producer still waits for its consumer's move (no hand-over of it
	// is safe while the consumer runs two copies: before session 20 it
	// went ahead live) ...
	agg.MovingFrom, agg.MovingFromGeneration = "a2", 1
	ho.hold = func(string, bool) bool { return false }
	for _, halt := range []bool{false, true} {
		ho.halt = halt
		if got := replace(workers, tasks, nil, ho); len(got) != 0 {
			t.Fatalf("past the wait (stop-and-copy known: %v), a producer moved while its consumer was moving: %+v", halt, got)
		}
	}
	// ... and a consumer whose producer's move does not end moves
	// stop-and-copy, once every coordinator knows how, and waits on
	// otherwise.
	lines2, counts2 := placedTask("q4", "lines", 0, 0, "a"), placedTask("q4", "counts", 0, 0, "down")
	lines2.MovingFrom, lines2.MovingFromGeneration, lines2.Generation = "a2", 1, 2
	tasks = []*fsm.Task{lines2, counts2}
	ho.halt = false
	if got := replace(workers, tasks, nil, ho); len(got) != 0 {
		t.Fatalf("past the wait without stop-and-copy moves, a consumer moved while its producer was moving: %+v", got)
	}
	ho.halt = true
	if got := replace(workers, tasks, nil, ho); len(got) != 1 || got[0].TaskID != counts2.ID || !got[0].Live || !got[0].Halt {
		t.Fatalf("past the wait, the consumer of a moving producer: planned %+v, want one stop-and-copy live move of %s", got, counts2.ID)
	}
	ho.hold = nil
	if got := replace(workers, tasks, nil, ho); len(got) != 0 {
		t.Fatalf("within the wait, a consumer moved while its producer was moving: %+v", got)
	}
	var o moveOrder
	now := time.Now()
	if !o.hold(src.ID, false, time.Minute, now) || !o.hold(src.ID, false, time.Minute, now.Add(moveOrderWait/2)) || o.hold(src.ID, false, time.Minute, now.Add(moveOrderWait)) {
		t.Fatalf("moveOrder holds a move waiting for copies not running other than for %s", moveOrderWait)
	}
	if !o.hold(agg.ID, true, time.Minute, now) || !o.hold(agg.ID, true, time.Minute, now.Add(moveOrderWait+time.Second)) || o.hold(agg.ID, true, time.Minute, now.Add(moveOrderWait+time.Minute)) {
		t.Fatalf("moveOrder holds a move waiting for running copies other than for %s", moveOrderWait+time.Minute)
	}
}
