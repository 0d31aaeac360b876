package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// TestFailedAlignedSnapshotAfterTheEnd: an aligned snapshot sets its cut
// on a task that processes inline (a single input) and, before it checks
// the cut, the task receives the rest of its stream, final boundary
// included: the cut holds all of it unreleased, and no delivery follows.
// The snapshot then fails (the task had already passed the cut) and lifts
// its cut. The task must still work off the rest of its stream: before
// the lift released it itself, it only poked a wake channel that no
// goroutine of an inline task reads, and the partition never ended.
//
// The test plays that order deterministically: the source is paused
// while the cut is set at a stream time the task already released
// (waitCut's first step), resumed, and the snapshot asked once the task
// holds its whole input.
func TestFailedAlignedSnapshotAfterTheEnd(t *testing.T) {
	const rate = 10000
	c := newCluster(t, 1, fmt.Sprintf(wordsQuery, 1, rate), func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	rt := c.workers[0].rt
	id := queryspec.TaskID("wc", "counts", 0, 0)
	var tk *task
	waitUntil(t, "counts partition 0 released a first step", func() bool {
		tk = rt.task(id)
		return tk != nil && tk.merge != nil && tk.merge.releasedAt() > math.MinInt64
	})
	if tk.inlineEmit == nil {
		t.Fatalf("%s does not process inline: the test needs a single-input task", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, high, resume := rt.PauseSources(ctx, "wc")
	if high == math.MinInt64 {
		t.Fatal("the source ended before it could be paused")
	}
	at := tk.merge.releasedAt() - 1
	tk.merge.setCut(at) // as waitCut does first
	resume()
	waitUntil(t, "counts partition 0 received its whole input", func() bool {
		return tk.merge.inputBoundary(0) == finalBoundary
	})
	if tk.merge.releasedAt() == finalBoundary {
		t.Fatal("counts partition 0 released the end of its stream through the cut")
	}
	_, err := rt.SnapshotTask(ctx, id, SnapshotOptions{Halt: true, Aligned: true, At: at})
	if !errors.Is(err, ErrCutPassed) {
		t.Fatalf("aligned snapshot at %d of a task past it: %v, want ErrCutPassed", at, err)
	}
	got := c.tail(t, queryspec.TaskID("wc", "out", 0, 0))
	sameResults(t, results(t, got, sinkSchema(t, c.query)), reference(t, rate))
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

// TestPausedSourceFlushed: a source held by PauseSources has sent what it
// produced. A source behind its schedule (here an unpaced one) flushes
// only full batches; held between two records, it used to keep a partial
// batch staged, so downstream never received the records (and
// boundaries) up to the stream time PauseSources reported, and waited
// for as long as the hold lasted.
func TestPausedSourceFlushed(t *testing.T) {
	yaml := replaceOnce(t, fmt.Sprintf(wordsQuery, 1, 0), "limit: 20000", "limit: 100000000")
	c := newCluster(t, 1, yaml, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	rt := c.workers[0].rt
	src := queryspec.TaskID("wc", "lines", 0, 0)
	waitUntil(t, "the source produced something", func() bool {
		tk := rt.task(src)
		return tk != nil && len(tk.outs) > 0 && tk.outs[0].buf.Stats().LastID > 1000
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 20 { // a pause can fall on a full batch: try a few
		_, high, resume := rt.PauseSources(ctx, "wc")
		if high == math.MinInt64 {
			t.Fatal("the source was not held")
		}
		// The generator is held (PauseSources returned once it ran the
		// hold's function): its writers are not touched until resume.
		for _, o := range rt.task(src).outs {
			if n := o.w.Staged(); n > 0 {
				resume()
				t.Fatalf("held at stream time %d with %d bytes staged for %q partition %d", high, n, o.consumer, o.partition)
			}
		}
		resume()
	}
}
