package runtime

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestOldCopyDoesNotProcessPastAGap: tasks leaving a worker declared
// down move one stream stage after the other (coordinator inOrder), and
// the consumer's move may begin before its old copy has subscribed to
// the producer's new copy. The consumer's new copy registered there
// before its snapshot and acknowledges as it goes, so the old copy,
// subscribing later, resumes after tuples already discarded. It
// processes nothing past that gap, its new copy having that input: the
// sink's stream equals an unmoved run's, tuple for tuple. (Before, the
// old copy named the loss and processed on, and the sink took its
// results missing that input until it switched: the coordinator test
// TestFalselyDownWorkerHandsOverWithoutReplicas lost a result, or its
// sink never ended, about one run in three at load 20.)
func TestOldCopyDoesNotProcessPastAGap(t *testing.T) {
	g := startGapAfterSnapshot(t)
	defer g.c.close(t)
	// Whatever the old copy puts on its output after the gap (before: a
	// record of the loss, then results missing that input) the sink
	// takes before it switches.
	out, err := g.old.output("out", 0)
	if err != nil {
		t.Fatal(err)
	}
	sink := g.from.rt.task(moveSink)
	waitUntil(t, "the sink took the old copy's output", func() bool {
		for _, in := range sink.inputs {
			if in.upPartition == 0 {
				return in.sub.LastID() >= out.Stats().LastID
			}
		}
		return false
	})
	if len(g.old.unc.list()) > 0 {
		t.Errorf("the consumer's old copy named a loss: %s", g.old.State().Message)
	}
	g.c.switchTo(g.m)
	got := g.c.tail(t, moveSink)
	if !sameTuples(got, g.want) {
		t.Fatalf("the sink's stream differs from the unmoved run's (%d vs %d tuples)", len(got), len(g.want))
	}
	g.c.noTaskFailed(t, "")
}

// TestOldCopyPlacedAgainNamesItsGap: the old copy waiting out a gap
// (TestOldCopyDoesNotProcessPastAGap) whose move is rolled back (its new
// copy stopped, assignments newer than the one that placed the new copy
// place it again as it is) is the task's only copy again: it resumes
// after the gap, names the loss as any input gap, and the stream goes on
// to its end rather than wait for a switch that never comes.
func TestOldCopyPlacedAgainNamesItsGap(t *testing.T) {
	g := startGapAfterSnapshot(t)
	defer g.c.close(t)
	g.c.specs[g.to] = slices.DeleteFunc(g.c.specs[g.to], func(s TaskSpec) bool { return s.TaskID == gapConsumer })
	g.to.rt.Apply(context.Background(), g.c.specs[g.to])
	g.c.specs[g.from] = append(g.c.specs[g.from], g.oldSpec)
	for i := range g.c.specs[g.from] {
		g.c.specs[g.from][i].AssignIndex = 7 // newer than the new copy's (0: not known)
	}
	g.from.rt.Apply(context.Background(), g.c.specs[g.from])
	got := g.c.tail(t, moveSink)
	if len(g.old.unc.list()) == 0 {
		t.Errorf("the old copy placed again did not name the loss after its gap: %q", g.old.State().Message)
	}
	if !slices.ContainsFunc(got, func(tp tuple.Tuple) bool { return tp.Type == tuple.Boundary && tp.STime == math.MaxInt64 }) {
		t.Fatalf("the sink's stream did not reach its end (%d tuples)", len(got))
	}
}

const gapProducer, gapConsumer = "wc/lines/p0/r0", "wc/counts/p0/r0"

// gapAfterSnapshot is a run in which the consumer's old copy (old, on
// from) resumed its input after a gap once its new copy (the pending
// move m, on to) had started from its snapshot. oldSpec is the old
// copy's spec (taken off from's specs by the move); want the sink's
// stream of an unmoved run.
type gapAfterSnapshot struct {
	c        *cluster
	from, to *worker
	m        pendingMove
	old      *task
	oldSpec  TaskSpec
	want     []tuple.Tuple
}

// startGapAfterSnapshot moves the producer of the words query, then,
// while the consumer's old copy has not yet subscribed to the producer's
// new copy, starts the consumer's new copy; once that has made the
// producer discard input the old copy has not taken, the old copy
// subscribes.
func startGapAfterSnapshot(t *testing.T) *gapAfterSnapshot {
	t.Helper()
	// 20000 lines over 5 s: the moves land mid-stream on a loaded machine.
	yaml := fmt.Sprintf(wordsQuery, 1, 4000)
	unmoved := newCluster(t, 2, yaml, onWorker0)
	unmoved.apply()
	g := &gapAfterSnapshot{want: unmoved.tail(t, moveSink)}
	unmoved.close(t)

	g.c = newCluster(t, 2, yaml, onWorker0)
	g.from, g.to = g.c.workers[0], g.c.workers[1]
	// The consumer's old copy subscribes to the producer's new copy only
	// once released (late, as on a starved worker).
	release := make(chan struct{})
	var held atomic.Bool
	g.from.rt.beforeAttempt = func(copyID string, pl Placement) {
		if copyID == gapConsumer && pl.TaskID == gapProducer && pl.Generation == 2 {
			held.Store(true)
			<-release
		}
	}
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})
	g.c.apply()
	waitUntil(t, "the consumer took input", func() bool {
		tk := g.from.rt.task(gapConsumer)
		return tk != nil && tk.inputs[0].sub.LastID() > 300
	})
	g.c.move(t, gapProducer, g.from, g.to, false)
	waitUntil(t, "the consumer's old copy holds before subscribing to the producer's new copy", held.Load)

	for _, s := range g.c.specs[g.from] {
		if s.TaskID == gapConsumer {
			g.oldSpec = s
		}
	}
	g.m = g.c.startCopy(t, gapConsumer, g.from, g.to, false)
	g.old = g.from.rt.task(gapConsumer)
	after := g.old.inputs[0].sub.LastID()
	up, err := g.to.rt.task(gapProducer).output("counts", 0)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the producer's new copy discarded input the consumer's old copy has not taken", func() bool {
		return up.Stats().OldestID > after+1
	})
	released = true
	close(release)
	waitUntil(t, "the consumer's old copy resumed after the gap", func() bool {
		return len(g.old.unc.list()) > 0 || strings.Contains(g.old.State().Message, "old copy of a live move")
	})
	return g
}

// TestSupersededUntilPlacedAgain: a copy whose live snapshot a later copy
// took stays superseded until assignments newer than the ones that placed
// that copy place it again as it is; older ones (a watch that lagged) and
// ones naming it the old copy of a move do not count. Replicated copies
// are never superseded (peer replicas take live snapshots of them).
func TestSupersededUntilPlacedAgain(t *testing.T) {
	type placed struct {
		index     uint64
		movingOut bool
	}
	for _, tc := range []struct {
		name     string
		replicas int
		taken    uint64 // index that placed the copy taking the snapshot
		then     []placed
		want     bool
	}{
		{"taken, nothing since", 1, 12, nil, true},
		{"an older assignment arrives late", 1, 12, []placed{{11, false}}, true},
		{"moving out", 1, 12, []placed{{12, true}, {15, true}}, true},
		{"placed again after a roll-back", 1, 12, []placed{{12, true}, {16, false}}, false},
		// A caller of an older build does not say: the copy names its gap
		// and goes on, as it did before.
		{"index not known", 1, 0, nil, false},
		{"replicated", 2, 12, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := &task{plan: &queryspec.Plan{Query: &queryspec.Query{Replicas: tc.replicas}}}
			tk.notePlaced(TaskSpec{AssignIndex: 10})
			tk.supersede(tc.taken)
			for _, p := range tc.then {
				tk.notePlaced(TaskSpec{AssignIndex: p.index, MovingOut: p.movingOut})
			}
			if got := tk.superseded(); got != tc.want {
				t.Fatalf("superseded %v, want %v", got, tc.want)
			}
		})
	}
}

// TestHaltedCopyPlacedAgainGoesOn: the old copy of a stop-and-copy move,
// halted by its new copy's snapshot, is placed again as it is once the
// move is rolled back (a cross-org move whose new copy did not take over
// in time; the coordinator's AbortMove). It starts again from the
// snapshot that halted it, and the sink's stream equals an unmoved run's.
// (Before, it stayed halted: it processed nothing more, and the query
// stalled for good.)
func TestHaltedCopyPlacedAgainGoesOn(t *testing.T) {
	yaml := fmt.Sprintf(wordsQuery, 1, 4000) // 5 s of input
	unmoved := newCluster(t, 2, yaml, onWorker0)
	unmoved.apply()
	want := unmoved.tail(t, moveSink)
	unmoved.close(t)

	c := newCluster(t, 2, yaml, onWorker0)
	defer c.close(t)
	from, to := c.workers[0], c.workers[1]
	c.apply()
	waitUntil(t, "the consumer took input", func() bool {
		tk := from.rt.task(gapConsumer)
		return tk != nil && tk.inputs[0].sub.LastID() > 300
	})
	// The move's assignments: the old copy moving out, the new copy
	// starting on to from its stop-and-copy snapshot.
	var oldSpec TaskSpec
	for i, s := range c.specs[from] {
		if s.TaskID == gapConsumer {
			c.specs[from][i].MovingOut = true
			oldSpec = c.specs[from][i]
		}
	}
	from.rt.Apply(context.Background(), c.specs[from])
	old := from.rt.task(gapConsumer)
	c.startCopy(t, gapConsumer, from, to, true)
	waitUntil(t, "the old copy halted", old.halted.Load)
	// Rolled back: the new copy stops, the old one is placed again.
	c.specs[to] = slices.DeleteFunc(c.specs[to], func(s TaskSpec) bool { return s.TaskID == gapConsumer })
	to.rt.Apply(context.Background(), c.specs[to])
	oldSpec.MovingOut = false
	c.specs[from] = append(c.specs[from], oldSpec)
	from.rt.Apply(context.Background(), c.specs[from])
	if from.rt.task(gapConsumer) == old {
		t.Fatal("the halted copy placed again was not started again")
	}
	got := c.tail(t, moveSink)
	if !sameTuples(got, want) {
		t.Fatalf("the sink's stream differs from the unmoved run's (%d vs %d tuples)", len(got), len(want))
	}
	c.noTaskFailed(t, "")
}
