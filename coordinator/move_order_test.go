package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	fsworker "github.com/fedstream/fedstream/worker"
)

// TestPlanCheckRefusesNeighbourMoves is the plan applier's table of the
// stream-order rule (streamMoves): against the state it commits on, a
// live move next to a live move in its stream is refused with a reason
// naming that move, unless the consumer's move is stop-and-copy; moves
// accepted earlier in the same plan count. A producer placed again not
// live counts as moving (session 21: it was not checked). (Before
// session 20 only the planners checked it, on the state they read: two
// plans computed at once both passed.)
func TestPlanCheckRefusesNeighbourMoves(t *testing.T) {
	t.Parallel()
	reads := map[string][]string{"counts": {"lines"}, "out": {"counts"}}
	inputs := func(tk *fsm.Task) []string { return reads[tk.Fragment] }
	workers := []*fsm.Worker{worker("a", 4, statusReady, ""), worker("b", 4, statusReady, ""), worker("c", 4, statusReady, "")}
	live := func(task, from string, gen int, to string) fsm.PlannedPlacement {
		return fsm.PlannedPlacement{TaskID: task, FromWorker: from, FromGeneration: gen, ToWorker: to, Live: true, CatchUp: true}
	}
	halted := func(p fsm.PlannedPlacement) fsm.PlannedPlacement { p.Halt = true; return p }
	plain := func(p fsm.PlannedPlacement) fsm.PlannedPlacement { p.Live, p.CatchUp = false, false; return p }
	// movingTask is a task of q in a live move from a to b.
	movingTask := func(fragment string, halt bool) *fsm.Task {
		tk := placedTask("q", fragment, 0, 0, "b")
		tk.MovingFrom, tk.MovingFromGeneration, tk.Generation, tk.MoveHalt = "a", 1, 2, halt
		return tk
	}
	const lines, counts, out = "q/lines/p0/r0", "q/counts/p0/r0", "q/out/p0/r0"
	cases := []struct {
		name  string
		tasks []*fsm.Task
		plan  []fsm.PlannedPlacement
		want  []string // substring of each refusal, "" for accepted
	}{
		{
			name:  "a consumer while its producer moves",
			tasks: []*fsm.Task{movingTask("lines", false), placedTask("q", "counts", 0, 0, "a")},
			plan:  []fsm.PlannedPlacement{live(counts, "a", 1, "c")},
			want:  []string{"task q/counts/p0/r0 reads from task q/lines/p0/r0, which is in a live move from worker a to worker b"},
		},
		{
			name:  "a producer while its consumer moves",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), movingTask("counts", false)},
			plan:  []fsm.PlannedPlacement{live(lines, "a", 1, "c")},
			want:  []string{"task q/counts/p0/r0, which reads from task q/lines/p0/r0, is in a live move from worker a to worker b"},
		},
		{
			name:  "a producer while its consumer moves stop-and-copy",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), movingTask("counts", true)},
			plan:  []fsm.PlannedPlacement{live(lines, "a", 1, "c")},
			want:  []string{""},
		},
		{
			name:  "a consumer stop-and-copy while its producer moves",
			tasks: []*fsm.Task{movingTask("lines", false), placedTask("q", "counts", 0, 0, "a")},
			plan:  []fsm.PlannedPlacement{halted(live(counts, "a", 1, "c"))},
			want:  []string{""},
		},
		{
			name:  "a producer stop-and-copy while its consumer moves",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), movingTask("counts", false)},
			plan:  []fsm.PlannedPlacement{halted(live(lines, "a", 1, "c"))},
			want:  []string{"is in a live move"},
		},
		{
			name:  "two neighbours in one plan: the first wins",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), placedTask("q", "counts", 0, 0, "a"), placedTask("q", "out", 0, 0, "a")},
			plan:  []fsm.PlannedPlacement{live(counts, "a", 1, "b"), live(lines, "a", 1, "b"), live(out, "a", 1, "c")},
			want:  []string{"", "task q/counts/p0/r0, which reads from task q/lines/p0/r0, is in a live move from worker a to worker b", "task q/out/p0/r0 reads from task q/counts/p0/r0"},
		},
		{
			name:  "tasks not next to each other",
			tasks: []*fsm.Task{movingTask("lines", false), placedTask("q", "out", 0, 0, "a"), placedTask("q2", "counts", 0, 0, "a")},
			plan:  []fsm.PlannedPlacement{live(out, "a", 1, "c"), live("q2/counts/p0/r0", "a", 1, "c")},
			want:  []string{"", ""},
		},
		{
			name:  "a placement that is not live",
			tasks: []*fsm.Task{movingTask("lines", false), placedTask("q", "counts", 0, 0, "a")},
			plan:  []fsm.PlannedPlacement{plain(live(counts, "a", 1, "c"))},
			want:  []string{""},
		},
		{
			name:  "a producer placed again while its consumer moves",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), movingTask("counts", false)},
			plan:  []fsm.PlannedPlacement{plain(live(lines, "a", 1, "c"))},
			want:  []string{"task q/counts/p0/r0, which reads from task q/lines/p0/r0, is in a live move from worker a to worker b"},
		},
		{
			name:  "a producer placed again while its consumer moves stop-and-copy",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), movingTask("counts", true)},
			plan:  []fsm.PlannedPlacement{plain(live(lines, "a", 1, "c"))},
			want:  []string{""},
		},
		{
			name:  "a producer placed again, then its consumer moves, in one plan",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), placedTask("q", "counts", 0, 0, "a")},
			plan:  []fsm.PlannedPlacement{plain(live(lines, "a", 1, "b")), live(counts, "a", 1, "c")},
			want:  []string{"", "task q/counts/p0/r0 reads from task q/lines/p0/r0, which is placed again on worker b in this plan"},
		},
		{
			name:  "a producer placed again, then its consumer moves stop-and-copy, in one plan",
			tasks: []*fsm.Task{placedTask("q", "lines", 0, 0, "a"), placedTask("q", "counts", 0, 0, "a")},
			plan:  []fsm.PlannedPlacement{plain(live(lines, "a", 1, "b")), halted(live(counts, "a", 1, "c"))},
			want:  []string{"", ""},
		},
		{
			name:  "two producers of one consumer",
			tasks: []*fsm.Task{movingTask("lines", false), placedTask("q", "lines", 1, 0, "a"), placedTask("q", "counts", 0, 0, "c")},
			plan:  []fsm.PlannedPlacement{live("q/lines/p1/r0", "a", 1, "c")},
			want:  []string{""},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newPlanCheck(workers, tc.tasks, 16)
			c.moves = newStreamMoves(tc.tasks, inputs)
			for i, p := range tc.plan {
				got := c.check(p)
				if (tc.want[i] == "") != (got == "") || !strings.Contains(got, tc.want[i]) {
					t.Fatalf("placement %d (%s -> %s): reason %q, want %q", i, p.TaskID, p.ToWorker, got, tc.want[i])
				}
				if got == "" {
					c.commit(p)
				}
			}
		})
	}
}

// TestRacingMovesOfAProducerAndItsConsumer: two task move calls, one of
// a producer and one of its consumer, made at once while the query runs
// on real workers. Both pass task move's own check (held there until
// both have: hooks.moveChecked), so only the plan applier, re-checking
// each plan against the state it commits on, can keep them apart:
// exactly one move starts, the other is refused naming it, and the sink's
// results equal, window by window and word by word, those of a run left
// alone. (Without the applier's check both moves started.)
func TestRacingMovesOfAProducerAndItsConsumer(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	var arrived atomic.Int32
	both := make(chan struct{})
	o := newXorgOrg(t, "alpha", nil, calmFailureDetection, func(c *Config) {
		c.hooks.moveChecked = func(string) {
			if arrived.Add(1) == 2 {
				close(both)
			}
			select { // both calls checked, or a deadline
			case <-both:
			case <-time.After(30 * time.Second):
			}
		}
	})
	const limit = 100000
	want := xorgReference(t, limit)
	o.submit(t, "rm", 1, limit)
	consumer := o.task(t, "rm/counts/p0/r0")
	var producer *fsm.Task
	inputs := o.nodes[0].taskInputs()
	tasks, err := o.nodes[0].State().TasksByQuery(nil, "rm")
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range tasks {
		if tk.Partition == 0 && slices.Contains(inputs(consumer), tk.Fragment) {
			producer = tk
		}
	}
	if producer == nil {
		t.Fatalf("no task of rm feeds %s (it reads %v)", consumer.ID, inputs(consumer))
	}
	other := func(worker string) string { return workerOtherThan(t, o.workers, worker) }

	type outcome struct {
		task string
		err  error
	}
	var started bool
	done := make(chan outcome, 2)
	got := o.results(t, "rm", func(n int) {
		if n < len(want)/3 || started {
			return
		}
		started = true
		for _, tk := range []*fsm.Task{producer, consumer} {
			go func() {
				_, err := o.admin(0).MoveTask(ctxT(t, 60*time.Second), &pb.MoveTaskRequest{TaskId: tk.ID, ToWorker: other(tk.WorkerID)})
				done <- outcome{tk.ID, err}
			}()
		}
	})
	if !started {
		t.Fatal("the query ended before the moves: the test would prove nothing")
	}
	var moved, refused []outcome
	for range 2 {
		r := <-done
		if r.err == nil {
			moved = append(moved, r)
		} else {
			refused = append(refused, r)
		}
	}
	if len(moved) != 1 {
		t.Fatalf("moves of %s and %s, which reads from it, made at once: %d started (%v), want exactly one", producer.ID, consumer.ID, len(moved), append(moved, refused...))
	}
	if err := refused[0].err; status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is in a live move") || !strings.Contains(err.Error(), moved[0].task) {
		t.Fatalf("the move of %s: %v; want it refused naming the move of %s", refused[0].task, err, moved[0].task)
	}
	sameResults(t, got, want)
	// The move that started ends (its new copy caught up).
	waitFor(t, 60*time.Second, "the move of "+moved[0].task+" ends", func() bool {
		tk, err := o.nodes[0].State().Task(nil, moved[0].task)
		return err == nil && tk != nil && tk.Gen() == 2 && tk.MovingFrom == ""
	})
}

// TestHeldMoveGoesAheadStopAndCopy: tasks leave a worker declared down
// while a task of their stream is in a live move that does not end (its
// new copy never runs: these workers run nothing). The aggregate's
// consumer, past the wait (moveOrderWait), moves stop-and-copy: its new
// copy's snapshot halts the old copy (the assignment says so), so its
// producer's switch, whenever it comes, finds one copy taking input. The
// aggregate's producer keeps waiting for as long as the aggregate moves:
// no hand-over of a producer is safe while its consumer runs two copies.
// At no time does a task move live (not stop-and-copy) next to a moving
// task. (Before session 20 both went ahead live past the wait.)
func TestHeldMoveGoesAheadStopAndCopy(t *testing.T) {
	t.Parallel()
	tm := testTimings()
	tm.MoveCatchUpBound = time.Minute
	c := newTestClusterWith(t, 1, "", "", tm)
	l := c.leader()
	s := c.nodes[l]
	w1 := c.startWorker(t, l, "w1")
	if _, err := c.admin(l).SubmitQuery(ctxT(t, 20*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(xorgQuery, "hq", 1, 0)), Filename: "hq.yaml"}); err != nil {
		t.Fatal(err)
	}
	const lines, counts, out = "hq/lines/p0/r0", "hq/counts/p0/r0", "hq/out/p0/r0"
	task := func(id string) *fsm.Task {
		t.Helper()
		tk, err := s.State().Task(nil, id)
		if err != nil || tk == nil {
			t.Fatalf("task %s: %v", id, err)
		}
		return tk
	}
	waitFor(t, 30*time.Second, "the query placed on w1", func() bool {
		tasks, err := s.State().TasksByQuery(nil, "hq")
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, tk := range tasks {
			if tk.WorkerID != w1.id {
				return false
			}
		}
		return true
	})
	w2 := c.startWorker(t, l, "w2")
	if _, err := c.admin(l).MoveTask(ctxT(t, 10*time.Second), &pb.MoveTaskRequest{TaskId: counts, ToWorker: w2.id}); err != nil {
		t.Fatal(err)
	}
	w1.stop() // declared down once its heartbeats are missed

	inputs := s.taskInputs()
	// overlap names a producer and a consumer in live moves at once, the
	// consumer's not stop-and-copy ("" if none).
	overlap := func() string {
		tasks, err := s.State().TasksByQuery(nil, "hq")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range tasks {
			if c.MovingFrom == "" || c.MoveHalt {
				continue
			}
			for _, p := range tasks {
				if p.MovingFrom != "" && slices.Contains(inputs(c), p.Fragment) {
					return fmt.Sprintf("%s moves live (from %s) while %s, which it reads from, moves (from %s)", c.ID, c.MovingFrom, p.ID, p.MovingFrom)
				}
			}
		}
		return ""
	}
	waitFor(t, 90*time.Second, "the consumer of the moving aggregate placed again", func() bool {
		if o := overlap(); o != "" {
			t.Fatal(o)
		}
		return task(out).WorkerID != w1.id
	})
	o := task(out)
	if !o.MoveHalt || o.MovingFrom != w1.id {
		t.Fatalf("the consumer of a task whose move does not end left the down worker as %+v; want a stop-and-copy move from %s", o, w1.id)
	}
	if tk := task(counts); tk.MovingFrom != w1.id {
		t.Fatalf("the aggregate's move ended: %+v", tk)
	}
	if p := task(lines); p.WorkerID != w1.id || p.MovingFrom != "" || p.Gen() != 1 {
		t.Fatalf("the producer of the moving aggregate moved: %+v", p)
	}
	if o := overlap(); o != "" {
		t.Fatal(o)
	}
	// The new copy's assignment halts the old copy.
	resp, err := c.workers(l).WatchAssignments(ctxT(t, 10*time.Second), &pb.WatchAssignmentsRequest{WorkerId: o.WorkerID})
	if err != nil {
		t.Fatal(err)
	}
	var halt *bool
	for _, a := range resp.Assignments {
		if a.TaskId == out && a.Generation == int32(o.Gen()) && a.Bootstrap != nil {
			halt = &a.Bootstrap.Halt
		}
	}
	if halt == nil || !*halt {
		t.Fatalf("the new copy of %s is not told to halt the old one at its snapshot (halt %v)", out, halt)
	}
}

// TestRacingCrossOrgMoveAndItsProducersMove: a move of the aggregate's
// partition to the partner org and a task move of the task it reads
// from, made at once while the query runs. Cross-org moves are live moves
// through the same plan applier, so the stream-order rule holds for them
// too: both pass their own checks (held there until both have), exactly
// one starts, the other is refused naming it, and the sink's results
// equal those of a run left alone. (Without the applier's check both
// started.)
func TestRacingCrossOrgMoveAndItsProducersMove(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	var arrived atomic.Int32
	both := make(chan struct{})
	alpha, _, contract := xorgPair(t, calmFailureDetection, func(c *Config) {
		if c.Org != "alpha" {
			return
		}
		c.hooks.moveChecked = func(string) {
			if arrived.Add(1) == 2 {
				close(both)
			}
			select { // both calls checked, or a deadline
			case <-both:
			case <-time.After(30 * time.Second):
			}
		}
	})
	const limit = 100000
	want := xorgReference(t, limit)
	alpha.submit(t, "rx", 1, limit)
	const consumer, producer = "rx/counts/p0/r0", "rx/lines/p0/r0"
	if in := alpha.nodes[0].taskInputs()(alpha.task(t, consumer)); !slices.Contains(in, "lines") {
		t.Fatalf("%s reads %v, not lines", consumer, in)
	}
	other := func(worker string) string { return workerOtherThan(t, alpha.workers, worker) }
	type outcome struct {
		task string
		err  error
	}
	var started bool
	done := make(chan outcome, 2)
	got := alpha.results(t, "rx", func(n int) {
		if n < len(want)/3 || started {
			return
		}
		started = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// Made again after a rollback (a false death on a loaded
			// machine, see moveOut); a refusal is final.
			_, err := alpha.whileRolledBack(ctx, t, consumer, "beta", func(ctx context.Context) error {
				return alpha.nodes[0].MigrateTaskOut(ctx, consumer, "beta", contract)
			})
			done <- outcome{consumer, err}
		}()
		go func() {
			_, err := alpha.admin(0).MoveTask(ctxT(t, 60*time.Second), &pb.MoveTaskRequest{TaskId: producer, ToWorker: other(alpha.task(t, producer).WorkerID)})
			done <- outcome{producer, err}
		}()
	})
	if !started {
		t.Fatal("the query ended before the moves: the test would prove nothing")
	}
	var moved, refused []outcome
	for range 2 {
		r := <-done
		if r.err == nil {
			moved = append(moved, r)
		} else {
			refused = append(refused, r)
		}
	}
	if len(moved) != 1 {
		t.Fatalf("a move of %s to beta and a move of %s, which it reads from, made at once: %d started (%v), want exactly one", consumer, producer, len(moved), append(moved, refused...))
	}
	t.Logf("%s moved; %s refused: %v", moved[0].task, refused[0].task, refused[0].err)
	if err := refused[0].err; !strings.Contains(err.Error(), "is in a live move") || !strings.Contains(err.Error(), moved[0].task) {
		t.Fatalf("the move of %s: %v; want it refused naming the move of %s", refused[0].task, err, moved[0].task)
	}
	sameResults(t, got, want)
}

// TestStopAndCopyConsumerNextToAMovingProducer: a consumer in a
// stop-and-copy move may switch producers at any time, because its
// halted old copy acknowledges nothing past the new copy's starting
// positions. The consumer moves stop-and-copy; once its new copy runs,
// its producer moves live (the applier accepts it next to a stop-and-copy
// consumer), and the producer's move ends while the consumer's has not
// (the new copy's reports are held back until then: hooks.command), the
// case at stake. The sink's results equal, window by window and word by
// word, those of a run left alone. This is the hand-over the scheduler
// falls back to for a move held back past its wait (inOrder).
func TestStopAndCopyConsumerNextToAMovingProducer(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	type copyID struct {
		task string
		gen  int
	}
	var held atomic.Pointer[copyID] // a copy whose reports are not written
	o := newXorgOrg(t, "alpha", nil, calmFailureDetection, func(c *Config) {
		c.hooks.command = func(typ fsm.MessageType, body any) any {
			h := held.Load()
			if h == nil {
				return body
			}
			drop := func(r fsm.UpdateTaskStatesRequest) fsm.UpdateTaskStatesRequest {
				var kept []fsm.TaskStateUpdate
				for _, u := range r.States {
					if u.TaskID != h.task || u.Generation != h.gen {
						kept = append(kept, u)
					}
				}
				r.States = kept
				return r
			}
			switch b := body.(type) {
			case fsm.UpdateTaskStatesRequest:
				return drop(b)
			case fsm.UpdateTaskStatesBatchRequest:
				out := fsm.UpdateTaskStatesBatchRequest{}
				for _, r := range b.Reports {
					out.Reports = append(out.Reports, drop(r))
				}
				return out
			}
			return body
		}
	})
	const limit = 100000
	want := xorgReference(t, limit)
	o.submit(t, "sc", 1, limit)
	const producer, consumer = "sc/lines/p0/r0", "sc/counts/p0/r0"
	if in := o.nodes[0].taskInputs()(o.task(t, consumer)); !slices.Contains(in, "lines") {
		t.Fatalf("%s reads %v, not lines", consumer, in)
	}
	other := func(worker string) string { return workerOtherThan(t, o.workers, worker) }
	runs := func(task string, gen int) bool {
		for _, w := range o.workers {
			for _, st := range w.Runtime().States() {
				if st.TaskID == task && st.Generation == gen && st.State == states.TaskRunning {
					return true
				}
			}
		}
		return false
	}
	move := func(ctx context.Context, tk *fsm.Task, halt bool) error {
		out, err := o.nodes[0].submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, StateIndex: o.nodes[0].State().LatestIndex(), Placements: []fsm.PlannedPlacement{
			{TaskID: tk.ID, FromWorker: tk.WorkerID, FromGeneration: tk.Gen(), ToWorker: other(tk.WorkerID), Live: true, CatchUp: true, Halt: halt}}})
		if err == nil && (len(out.Result.Refused) > 0 || len(out.Result.Placed) != 1) {
			err = fmt.Errorf("move %s: placed %v, refused %s", tk.ID, out.Result.Placed, out.Result.RefusedText())
		}
		return err
	}
	// until polls cond every 5 ms until it holds or ctx ends.
	until := func(ctx context.Context, what string, cond func() bool) error {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for !cond() {
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
			case <-tick.C:
			}
		}
		return nil
	}
	var started bool
	done := make(chan error, 1)
	got := o.results(t, "sc", func(n int) {
		if n < len(want)/3 || started {
			return
		}
		started = true
		go func() {
			done <- func() error {
				defer held.Store(nil)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				c := o.task(t, consumer)
				held.Store(&copyID{consumer, c.Gen() + 1})
				if err := move(ctx, c, true); err != nil {
					return err
				}
				if err := until(ctx, "the consumer's new copy running", func() bool { return runs(consumer, c.Gen()+1) }); err != nil {
					return err
				}
				if err := move(ctx, o.task(t, producer), false); err != nil {
					return err
				}
				if err := until(ctx, "the producer's move ended", func() bool { return o.task(t, producer).MovingFrom == "" }); err != nil {
					return err
				}
				if tk := o.task(t, consumer); tk.MovingFrom == "" {
					return fmt.Errorf("the consumer's move ended before the producer's: %+v", tk)
				}
				return nil
			}()
		}()
	})
	if !started {
		t.Fatal("the query ended before the moves: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
	for _, id := range []string{producer, consumer} {
		waitFor(t, 60*time.Second, "the move of "+id+" ends", func() bool {
			tk, err := o.nodes[0].State().Task(nil, id)
			return err == nil && tk != nil && tk.Gen() == 2 && tk.MovingFrom == ""
		})
	}
}

// workerOtherThan is the ID of a worker of workers other than worker.
func workerOtherThan(t *testing.T, workers []*fsworker.Worker, worker string) string {
	t.Helper()
	for _, w := range workers {
		if w.ID() != worker {
			return w.ID()
		}
	}
	t.Fatalf("no worker but %s", worker)
	return ""
}
