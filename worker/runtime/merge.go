package runtime

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"

	"github.com/fedstream/fedstream/worker/tuple"
)

// merger is the deterministic merge of a task's input streams (SUnion in
// stable mode). It keeps, per input stream, the BOUNDARY stimes received
// and the data tuples not yet released. Data with stime below the minimum
// boundary over all inputs (the watermark) can no longer be preceded by
// anything, so it is released sorted by (stime, port, upstream partition,
// id).
//
// Release happens in steps, one per distinct boundary value any input
// carried up to the watermark, never at whatever the watermark happened to
// be when a batch arrived. Every input has received all its boundaries up
// to the watermark, so the steps depend only on the streams' contents:
// replicas emit the same boundaries, hence the same output ids, whatever
// the arrival interleaving.
type merger struct {
	mu     sync.Mutex
	inputs []*mergeInput
	// released is the watermark of the last release.
	released int64
	// limit is the soft bound on pending tuples per input (see add).
	limit int
	// wake has capacity one: a pending signal for the process goroutine.
	wake chan struct{}
	// space is closed (and replaced) after each release to wake inputs
	// waiting for room.
	space chan struct{}
	out   []mergedTuple
	steps []int64
}

type mergeInput struct {
	port, upPartition int
	// boundary is the latest boundary; steps the boundaries received
	// above the last release, increasing.
	boundary int64
	steps    []int64
	pending  []tuple.Tuple
	// unsorted says pending is not in non-decreasing stime order (then
	// take sorts; otherwise it merges the inputs' queues as they are).
	unsorted bool
}

// appendPending queues a data tuple, keeping the sortedness flag.
func (in *mergeInput) appendPending(tp tuple.Tuple) {
	if n := len(in.pending); n > 0 && tp.STime < in.pending[n-1].STime {
		in.unsorted = true
	}
	in.pending = append(in.pending, tp)
}

// mergedTuple is a released data tuple with its origin.
type mergedTuple struct {
	port, upPartition int
	t                 tuple.Tuple
}

func newMerger(limit int) *merger {
	return &merger{released: math.MinInt64, limit: limit, wake: make(chan struct{}, 1), space: make(chan struct{})}
}

// addInput registers an input stream and returns its index.
func (m *merger) addInput(port, upPartition int) int {
	m.inputs = append(m.inputs, &mergeInput{port: port, upPartition: upPartition, boundary: math.MinInt64})
	return len(m.inputs) - 1
}

func (m *merger) minBoundaryLocked() int64 {
	low := int64(math.MaxInt64)
	for _, in := range m.inputs {
		low = min(low, in.boundary)
	}
	return low
}

// add takes a batch of input i (in stream order). To bound memory it
// waits while input i already holds limit pending tuples and is ahead of
// the slowest input; the slowest input is never held back, so the merge
// always makes progress.
func (m *merger) add(ctx context.Context, i int, batch []tuple.Tuple) error {
	m.mu.Lock()
	in := m.inputs[i]
	for len(in.pending) >= m.limit && in.boundary > m.minBoundaryLocked() {
		ch := m.space
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		m.mu.Lock()
	}
	advanced := false
	for _, tp := range batch {
		switch {
		case tp.Type.IsData():
			in.appendPending(tp)
		case tp.Type == tuple.Boundary:
			if tp.STime > in.boundary {
				in.boundary = tp.STime
				in.steps = append(in.steps, tp.STime)
				advanced = true
			}
		}
		// UNDO and REC_DONE belong to DCAA corrections, not stable mode.
	}
	m.mu.Unlock()
	if advanced {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// take releases what the minimum boundary allows: the sorted data tuples
// with stime below it and the release steps (increasing, the last one the
// new watermark); the caller processes, for each step, the tuples below it
// and then advances to it. ok is false when the watermark has not moved.
// The returned slices are reused by the next take.
func (m *merger) take() (out []mergedTuple, steps []int64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	wm := m.minBoundaryLocked()
	if wm <= m.released {
		return nil, nil, false
	}
	steps = m.steps[:0]
	for _, in := range m.inputs {
		n := 0
		for n < len(in.steps) && in.steps[n] <= wm {
			n++
		}
		steps = append(steps, in.steps[:n]...)
		in.steps = append(in.steps[:0], in.steps[n:]...)
	}
	slices.Sort(steps)
	steps = slices.Compact(steps)
	m.steps = steps
	out = m.out[:0]
	sorted := true
	for _, in := range m.inputs {
		sorted = sorted && !in.unsorted
	}
	if sorted {
		out = m.mergeSortedLocked(out, wm)
	} else {
		out = m.collectAndSortLocked(out, wm)
	}
	m.released = wm
	m.out = out
	close(m.space)
	m.space = make(chan struct{})
	return out, steps, true
}

// mergeOrder is the release order: (stime, port, upstream partition, id).
func mergeOrder(a, b *mergedTuple) int {
	return cmp.Or(
		cmp.Compare(a.t.STime, b.t.STime),
		cmp.Compare(a.port, b.port),
		cmp.Compare(a.upPartition, b.upPartition),
		cmp.Compare(a.t.ID, b.t.ID),
	)
}

// collectAndSortLocked releases the pending tuples below wm of every input
// and sorts them into the release order.
func (m *merger) collectAndSortLocked(out []mergedTuple, wm int64) []mergedTuple {
	for _, in := range m.inputs {
		keep := in.pending[:0]
		in.unsorted = false
		for _, tp := range in.pending {
			if tp.STime < wm {
				out = append(out, mergedTuple{port: in.port, upPartition: in.upPartition, t: tp})
			} else {
				if n := len(keep); n > 0 && tp.STime < keep[n-1].STime {
					in.unsorted = true
				}
				keep = append(keep, tp)
			}
		}
		clear(in.pending[len(keep):]) // drop references to released batches
		in.pending = keep
	}
	slices.SortFunc(out, func(a, b mergedTuple) int { return mergeOrder(&a, &b) })
	return out
}

// mergeSortedLocked releases the pending tuples below wm when every
// input's queue is in stime order: each input's released tuples are then a
// prefix of its queue, already in release order (ids increase along a
// stream), so a k-way merge of the prefixes gives the order a sort would.
func (m *merger) mergeSortedLocked(out []mergedTuple, wm int64) []mergedTuple {
	// Released prefix length per input; heads advance during the merge.
	var heads, ends [8]int
	n := len(m.inputs)
	hs, es := heads[:0], ends[:0]
	if n > len(heads) {
		hs, es = make([]int, 0, n), make([]int, 0, n)
	}
	active := 0
	for _, in := range m.inputs {
		k, _ := slices.BinarySearchFunc(in.pending, wm, func(tp tuple.Tuple, wm int64) int { return cmp.Compare(tp.STime, wm) })
		hs = append(hs, 0)
		es = append(es, k)
		if k > 0 {
			active++
		}
	}
	if active == 1 || n == 1 {
		// One input releases: its prefix is the order.
		for i, in := range m.inputs {
			for _, tp := range in.pending[:es[i]] {
				out = append(out, mergedTuple{port: in.port, upPartition: in.upPartition, t: tp})
			}
		}
	} else {
		for {
			best := -1
			for i, in := range m.inputs {
				if hs[i] == es[i] {
					continue
				}
				if best < 0 {
					best = i
					continue
				}
				a, b := &in.pending[hs[i]], &m.inputs[best].pending[hs[best]]
				// Inputs are in (port, upstream partition) order of
				// registration only by convention: compare fully.
				if c := cmp.Compare(a.STime, b.STime); c < 0 || c == 0 && cmp.Or(
					cmp.Compare(in.port, m.inputs[best].port),
					cmp.Compare(in.upPartition, m.inputs[best].upPartition),
					cmp.Compare(a.ID, b.ID)) < 0 {
					best = i
				}
			}
			if best < 0 {
				break
			}
			in := m.inputs[best]
			out = append(out, mergedTuple{port: in.port, upPartition: in.upPartition, t: in.pending[hs[best]]})
			hs[best]++
		}
	}
	for i, in := range m.inputs {
		k := es[i]
		if k == 0 {
			continue
		}
		rest := copy(in.pending, in.pending[k:])
		clear(in.pending[rest:]) // drop references to released batches
		in.pending = in.pending[:rest]
	}
	return out
}
