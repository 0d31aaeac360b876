package runtime

import (
	"fmt"
	"math"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
)

// A rescale whose prepare reaches the keyed fragment's tasks before the
// end of a finite stream and whose source learns of it only after it
// ended: the tasks hold with the whole rest of their input (final
// boundary included) received and not released, and nothing more will
// ever be delivered to them. These tests play the coordinator's phases in
// that order (deterministically: the fragment's tasks hold from their
// start, the source runs to its end before it is told) and check that
// the go's cut, or the abort, still lets every task finish its stream
// with exact results.

// endRig is a three-partition "counts" fragment whose slot map the test
// sets per fragment, the source ("lines") told of a rescale separately.
type endRig struct {
	c          *cluster
	old, prep  *SlotMap
	next       *SlotMapNext
	ownTasks   []string // counts and out
	sourceTask string
}

const endRate = 20000

func newEndRig(t *testing.T) *endRig {
	t.Helper()
	yaml := replaceOnce(t, wordsQuery, "parallelism: 2", "parallelism: 3")
	c := newCluster(t, 1, fmt.Sprintf(yaml, 1, endRate), func(string, int, int) int { return 0 })
	// A rebalance: the partition count stays, half of partition 0's slots
	// go to partition 1, partition 2 neither gains nor loses any.
	owner := contiguous(3)
	nextOwner := append([]int32(nil), owner...)
	for s := range nextOwner {
		if owner[s] == 0 && s%2 == 0 {
			nextOwner[s] = 1
		}
	}
	g := &endRig{c: c,
		old:        &SlotMap{Epoch: 1, Partitions: 3, Owner: owner},
		next:       &SlotMapNext{Epoch: 2, Partitions: 3, Owner: nextOwner},
		sourceTask: queryspec.TaskID("wc", "lines", 0, 0)}
	g.prep = &SlotMap{Epoch: 1, Partitions: 3, Owner: owner, Next: g.next}
	for p := range 3 {
		g.ownTasks = append(g.ownTasks, queryspec.TaskID("wc", "counts", p, 0))
	}
	g.ownTasks = append(g.ownTasks, queryspec.TaskID("wc", "out", 0, 0))
	return g
}

// set gives the source the map src and every other task the map rest.
func (g *endRig) set(src, rest *SlotMap) {
	for _, w := range g.c.workers {
		for i := range g.c.specs[w] {
			m := rest
			if g.c.specs[w][i].TaskID == g.sourceTask {
				m = src
			}
			g.c.specs[w][i].SlotMaps = map[string]*SlotMap{"counts": m}
		}
	}
	g.c.apply()
}

func (g *endRig) state(id string) TaskState {
	for _, st := range g.c.states() {
		if st.TaskID == id {
			return st
		}
	}
	return TaskState{}
}

// holdPastTheEnd starts the query with every counts and out task holding
// for the rescale, lets the source run to its end, then prepares the
// source too; it returns the cut the coordinator would set.
func (g *endRig) holdPastTheEnd(t *testing.T) int64 {
	t.Helper()
	g.set(g.old, g.prep)
	rt := g.c.workers[0].rt
	waitUntil(t, "every counts task holds with its whole input received", func() bool {
		for p := range 3 {
			tk := rt.task(queryspec.TaskID("wc", "counts", p, 0))
			if tk == nil || g.state(tk.spec.TaskID).Prepared != g.next.Epoch || tk.merge.inputBoundary(0) != finalBoundary {
				return false
			}
		}
		return true
	})
	for p := range 3 {
		if r := rt.task(queryspec.TaskID("wc", "counts", p, 0)).merge.releasedAt(); r == finalBoundary {
			t.Fatalf("counts partition %d released the end of its stream while it held", p)
		}
	}
	g.set(g.prep, g.prep)
	cut := int64(math.MinInt64)
	waitUntil(t, "every task holds for the rescale", func() bool {
		cut = math.MinInt64
		for _, id := range append([]string{g.sourceTask}, g.ownTasks...) {
			st := g.state(id)
			if st.Prepared != g.next.Epoch {
				return false
			}
			cut = max(cut, st.Frontier)
		}
		return true
	})
	if cut == math.MaxInt64 {
		t.Fatalf("a task reported the end of its stream released while it held")
	}
	if cut < math.MaxInt64-1 { // as the coordinator sets it
		cut++
	}
	return cut
}

// checkResults reads the sink to its end and compares with the reference.
func (g *endRig) checkResults(t *testing.T) {
	t.Helper()
	got := g.c.tail(t, queryspec.TaskID("wc", "out", 0, 0))
	sameResults(t, results(t, got, sinkSchema(t, g.c.query)), reference(t, endRate))
	for _, st := range g.c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

// TestRescaleCutAfterTheEnd: the go comes after the source ended, with a
// cut at the end of the stream. Every task of the fragment (the one that
// neither gains nor loses slots too) passes the cut when it releases its
// received input, and the results are exact.
func TestRescaleCutAfterTheEnd(t *testing.T) {
	g := newEndRig(t)
	defer g.c.close(t)
	cut := g.holdPastTheEnd(t)
	if cut != math.MaxInt64-1 {
		t.Fatalf("cut %d: the source did not report the end of its generator", cut)
	}
	nx := *g.next
	nx.Go, nx.Cut = true, cut
	gone := *g.old
	gone.Next = &nx
	g.set(&gone, &gone)
	waitUntil(t, "every counts and out task passed the cut", func() bool {
		for _, id := range g.ownTasks {
			if st := g.state(id); st.CutDone != g.next.Epoch {
				if st.State == StateFailed {
					t.Fatalf("task %s failed: %s", id, st.Message)
				}
				return false
			}
		}
		return true
	})
	done := &SlotMap{Epoch: g.next.Epoch, Partitions: 3, Owner: g.next.Owner}
	g.set(done, done)
	g.checkResults(t)
}

// TestRescaleAbortAfterTheEnd: the prepare is aborted after the source
// ended, while the fragment's tasks hold their whole backlog. Lifting the
// holds lets every task work it off to the end of its stream.
func TestRescaleAbortAfterTheEnd(t *testing.T) {
	g := newEndRig(t)
	defer g.c.close(t)
	g.holdPastTheEnd(t)
	g.set(g.old, g.old)
	g.checkResults(t)
}
