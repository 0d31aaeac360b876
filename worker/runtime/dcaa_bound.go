package runtime

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// Bounds on what the DCAA path holds (issue 10, docs/DATAPLANE.md
// "Bounds"). Every buffer on the path is bounded by configuration, and
// what happens past the bound is stated where it is kept:
//
//   - output buffers (stable output kept until every downstream replica
//     acknowledged it, tentative output, markers): BufferOptions' tuple
//     and byte bounds; past them a connected slow consumer blocks the
//     producer, a missing one loses its oldest tuples after the overrun
//     grace (dataplane.OutputBuffer);
//   - the stable input an operator task keeps for its replay while its
//     results are tentative, the stable steps among it counted as tuples:
//     Options.DCAAKeepTuples; past it the oldest release steps go and the
//     results that depended on them are named as uncorrectable (status
//     and an UNCORRECTABLE record, dcaa_uncorrectable.go);
//   - the checkpoint: one operator snapshot, the operator's state (not
//     its input), replaced at each failure;
//   - the input waiting in the machine for release (buckets held during
//     UP_FAILURE, a strict query's or a rescale hold's blocked buckets,
//     tentative input not released yet): Options.InputPendingTuples per
//     input, as the stable merge; past it the input stops taking batches
//     (waitRoom) and the upstream is held back by flow control;
//   - a merging sink's current tentative results: InputPendingTuples per
//     input; past it later tentative results of that input are not shown
//     (the stable results replace them; dcaa_sink.go);
//   - a sink's result stream: a ring of SinkBufferTuples (the Kafka
//     writer's: a bounded buffer that blocks);
//   - tail keeps counters and at most 16 UNCORRECTABLE ranges.

// waitGate wakes inputs waiting for room in their machine.
type waitGate struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next open.
func (g *waitGate) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	return g.ch
}

// open wakes every waiter.
func (g *waitGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

// waitState is an operator task's view of its machine's waiting input,
// written by the run goroutine after every step and read by the inputs.
type waitState struct {
	// over says, per input, that the input is at its bound. A rescale
	// adds inputs while the others read it: the slice is replaced, never
	// changed (grow).
	over atomic.Pointer[[]*atomic.Bool]
	gate waitGate
	// max is the most tuples any input had waiting after a step,
	// batchMax the largest batch taken, held whether an input was ever
	// held back (figures for tests).
	max, batchMax atomic.Uint64
	held          atomic.Bool
}

// flags returns the inputs' at-bound flags.
func (w *waitState) flags() []*atomic.Bool {
	if p := w.over.Load(); p != nil {
		return *p
	}
	return nil
}

// grow makes room for the flags of n inputs (a rescale added some).
func (w *waitState) grow(n int) {
	cur := w.flags()
	if len(cur) >= n {
		return
	}
	next := slices.Clone(cur)
	for len(next) < n {
		next = append(next, new(atomic.Bool))
	}
	w.over.Store(&next)
}

// noteWaiting records, after a step (the caller holds proc, in the run
// goroutine), which inputs are at their bound, and wakes those that no
// longer are.
func (d *dcaaRun) noteWaiting() {
	w := &d.wait
	over := w.flags()
	limit := d.t.r.opts.InputPendingTuples
	opened := false
	for i := range min(len(over), d.m.Inputs()) {
		n := d.m.Waiting(i)
		if uint64(n) > w.max.Load() {
			w.max.Store(uint64(n))
		}
		at := n >= limit
		if over[i].Swap(at) && !at {
			opened = true
		}
	}
	if opened {
		w.gate.open()
	}
}

// waitRoom makes input i wait while its machine holds its bound of its
// tuples waiting for release. The input counts as busy meanwhile (not
// silent: it is held by flow control, see inputHealth).
func (d *dcaaRun) waitRoom(ctx context.Context, i int) error {
	w := &d.wait
	over := w.flags()
	if i >= len(over) {
		return nil
	}
	for over[i].Load() {
		w.held.Store(true)
		ch := w.gate.wait()
		if !over[i].Load() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-d.t.ctx.Done():
			return d.t.ctx.Err()
		}
	}
	return nil
}
