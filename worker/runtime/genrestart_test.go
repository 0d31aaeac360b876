package runtime

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestRestartedGeneratorCatchesUp: a paced generator source whose worker
// is lost is placed again without a snapshot (generation 2, no peer
// replica to bootstrap from). Its stream starts again at record 0 while
// its consumers resume after the ids they already hold. The new copy
// draws those records without pacing and paces again from the first one
// the consumers lack, so they go on at once instead of waiting as long as
// the lost copy had run; the results are those of a run without the loss,
// tuple for tuple.
//
// The new copy's worker paces its sources at 10 records a second
// (SourcePace 0.1 of rate 100): paced from record 0 it would need more
// than 100 s to bring the consumers past the lost copy's position (1000
// records or more), far beyond the wait's deadline (60 s). Once they are
// past it, the pace goes up so that the rest of the stream takes about a
// second.
func TestRestartedGeneratorCatchesUp(t *testing.T) {
	const rate = 100
	yaml := fmt.Sprintf(wordsQuery, 1, rate)
	q := mustParse(t, yaml)
	place := func(node string, _, _ int) int {
		if node == "lines" {
			return 0
		}
		return 1
	}
	const sink = "wc/out/p0/r0"

	alone := newClusterOpts(t, 2, q, place, Options{BoundaryInterval: time.Millisecond, SourceSpeedup: 200})
	alone.apply()
	want := alone.tail(t, sink)
	alone.close(t)

	// The new copy on its consumers' worker (they read its buffers
	// directly), and on a worker of its own (over the data plane).
	for _, to := range []int{1, 2} {
		t.Run(fmt.Sprintf("to worker %d", to), func(t *testing.T) {
			restartGenerator(t, q, place, to, want)
		})
	}
}

// restartGenerator is TestRestartedGeneratorCatchesUp's run: the source
// starts on worker 0, its consumers on worker 1, and its next copy starts
// on worker to.
func restartGenerator(t *testing.T, q *queryspec.Query, place func(string, int, int) int, to int, want []tuple.Tuple) {
	const rate = 100
	const source, sink = "wc/lines/p0/r0", "wc/out/p0/r0"
	slow, err := NewPace(0.1)
	if err != nil {
		t.Fatal(err)
	}
	each := []Options{
		{BoundaryInterval: time.Millisecond, SourceSpeedup: 20}, // the first copy: 2000 records a second
		{BoundaryInterval: time.Millisecond, SourcePace: slow},
	}
	if to == 2 {
		each = append(each, Options{BoundaryInterval: time.Millisecond, SourcePace: slow})
	}
	c := newClusterEach(t, q, place, each...)
	defer c.close(t)
	c.apply()
	lost, next := c.workers[0], c.workers[to]
	first := lost.rt.task(source)
	if first == nil {
		t.Fatal("the source did not start")
	}
	waitUntil(t, "the first copy produced a while", func() bool { return first.outs[0].buf.Stats().LastID > 3000 })

	// The first copy stops drawing (held between two records) and its
	// consumers take everything it appended: that is where they resume.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hold := make(chan struct{})
	defer close(hold)
	var drawn int64
	if !first.onGenerator(ctx, func() { drawn = first.genRecords }, hold) {
		t.Fatal("the first copy ended before it could be held: the machine is too slow for this test's timing")
	}
	if drawn < 1000 || drawn >= 20000 {
		t.Fatalf("the first copy was held after %d records, want 1000 to 19999", drawn)
	}
	var olds []*dataplane.OutputBuffer
	for _, o := range first.outs {
		olds = append(olds, o.buf)
	}
	waitUntil(t, "the consumers took what the first copy appended", func() bool {
		for _, b := range olds {
			if st := b.Stats(); st.LaggardAck != st.LastID {
				return false
			}
		}
		return true
	})

	// Its worker is lost: the copy stops, and the next generation starts on
	// another worker from nothing.
	spec := c.loseWorker(lost, source)
	held := make([]uint64, len(olds))
	for i, b := range olds {
		held[i] = b.Stats().LastID
	}
	again := c.placeAgainFromNothing(t, lost, spec, next)
	if len(again.outs) != len(olds) {
		t.Fatalf("the new copy has %d outputs, the first had %d", len(again.outs), len(olds))
	}
	waitUntilOr(t, fmt.Sprintf("the consumers went past where they were (ids %v, %d records) at 10 records a second", held, drawn), func() bool {
		for i, o := range again.outs {
			if o.buf.Stats().LaggardAck <= held[i] {
				return false
			}
		}
		return true
	}, func() { t.Logf("new copy's outputs: %v", again.outs[0].buf.Stats()) })

	if err := slow.Set(200); err != nil {
		t.Fatal(err)
	}
	got := c.tail(t, sink)
	sameResults(t, results(t, got, sinkSchema(t, c.query)), reference(t, rate))
	if !sameTuples(got, want) {
		t.Fatalf("the sink's stream differs from the run without the loss (%d vs %d tuples)", len(got), len(want))
	}
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

// loseWorker stops every task of worker lost, as if the worker were
// gone, and returns the spec task id had there.
func (c *cluster) loseWorker(lost *worker, id string) TaskSpec {
	var spec TaskSpec
	for _, s := range c.specs[lost] {
		if s.TaskID == id {
			spec = s
		}
	}
	c.specs[lost] = nil
	lost.rt.Apply(context.Background(), nil)
	return spec
}

// placeAgainFromNothing places the next generation of spec's task on
// worker next without a snapshot, tells every worker but lost where it
// runs, and returns the new copy, which must not have been restored.
func (c *cluster) placeAgainFromNothing(t *testing.T, lost *worker, spec TaskSpec, next *worker) *task {
	t.Helper()
	var pls []Placement
	for _, pl := range spec.Placements {
		if pl.TaskID == spec.TaskID {
			pl.WorkerAddr, pl.Generation = next.addr, 2
		}
		pls = append(pls, pl)
	}
	spec.Generation, spec.Placements = 2, pls
	c.specs[next] = append(c.specs[next], spec)
	for _, w := range c.workers {
		if w == lost {
			continue
		}
		for i := range c.specs[w] {
			c.specs[w][i].Placements = pls
		}
		w.rt.Apply(context.Background(), c.specs[w])
	}
	again := next.rt.task(spec.TaskID)
	if again == nil || again.restored {
		t.Fatalf("the new copy did not start from nothing (states %v)", c.states())
	}
	return again
}
