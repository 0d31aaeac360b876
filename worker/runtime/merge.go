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
			in.pending = append(in.pending, tp)
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
	for _, in := range m.inputs {
		keep := in.pending[:0]
		for _, tp := range in.pending {
			if tp.STime < wm {
				out = append(out, mergedTuple{port: in.port, upPartition: in.upPartition, t: tp})
			} else {
				keep = append(keep, tp)
			}
		}
		clear(in.pending[len(keep):]) // drop references to released batches
		in.pending = keep
	}
	slices.SortFunc(out, func(a, b mergedTuple) int {
		return cmp.Or(
			cmp.Compare(a.t.STime, b.t.STime),
			cmp.Compare(a.port, b.port),
			cmp.Compare(a.upPartition, b.upPartition),
			cmp.Compare(a.t.ID, b.t.ID),
		)
	})
	m.released = wm
	m.out = out
	close(m.space)
	m.space = make(chan struct{})
	return out, steps, true
}
