package runtime

import (
	"context"
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
	over []atomic.Bool
	gate waitGate
	// max is the most tuples any input had waiting after a step,
	// batchMax the largest batch taken, held whether an input was ever
	// held back (figures for tests).
	max, batchMax atomic.Uint64
	held          atomic.Bool
}

// noteWaiting records, after a step (the caller holds proc, in the run
// goroutine), which inputs are at their bound, and wakes those that no
// longer are.
func (d *dcaaRun) noteWaiting() {
	w := &d.wait
	if len(w.over) != len(d.t.inputs) {
		return // set up by newDCAARun; inputs never change in machine mode
	}
	limit := d.t.r.opts.InputPendingTuples
	opened := false
	for i := range w.over {
		n := d.m.Waiting(i)
		if uint64(n) > w.max.Load() {
			w.max.Store(uint64(n))
		}
		over := n >= limit
		if w.over[i].Swap(over) && !over {
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
	if i >= len(w.over) {
		return nil
	}
	for w.over[i].Load() {
		w.held.Store(true)
		ch := w.gate.wait()
		if !w.over[i].Load() {
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
