package operator

import (
	"encoding/binary"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// Freezer is implemented by operators whose snapshot can be encoded while
// they go on processing. Freeze, called where Snapshot would be (between
// two calls of Process or Advance), captures the state in a form that
// later processing does not change, sharing what is immutable (strings,
// key values), and returns the encoding of that captured state, to be run
// later and on any goroutine, once. The encoding is byte for byte what
// Snapshot would have returned at the Freeze.
//
// Why: a task is held between two releases while its snapshot is taken,
// so encoding a large state there is a pause in its output; capturing is
// a copy of the state's structure (no re-encoding of its bytes), several
// times cheaper.
type Freezer interface {
	Freeze() func() ([]byte, error)
}

// FreezeOf returns a function encoding op's current state that may run
// later on another goroutine (Freezer), or, for an operator that cannot
// freeze, its Snapshot taken now.
func FreezeOf(op Operator) func() ([]byte, error) {
	parts := FreezePartsOf(op)
	return func() ([]byte, error) {
		p, err := parts()
		if err != nil {
			return nil, err
		}
		if len(p) == 1 {
			return p[0], nil
		}
		return slices.Concat(p...), nil
	}
}

// Encoding is a frozen operator state's encoding, sized before it is
// written: Size is known at once, and Write emits the bytes in
// consecutive parts as they are encoded, so that a live snapshot can be
// sent while it is still being encoded (its total announced first), and
// a large state is written once, straight into the pieces that are
// sent, instead of being gathered into one buffer.
type Encoding struct {
	// Size is the encoding's length: the parts Write emits add up to it.
	Size int
	// write emits the parts; with transient, a part is only valid until
	// emit returns (its buffer may be reused for a later part).
	write func(emit func([]byte) error, transient bool) error
}

// Write calls emit with each consecutive part of the encoding
// (concatenated, byte for byte Snapshot's encoding at the freeze), in
// order, and stops at the first error emit returns. The parts are never
// modified afterwards: emit may keep them. Call it, or WriteTransient,
// once.
func (e *Encoding) Write(emit func([]byte) error) error { return e.write(emit, false) }

// WriteTransient is Write for an emit that keeps no part once it returns
// (it copies or sends it): the encoding may then reuse a few buffers for
// all its parts instead of allocating one per part, so a large state is
// encoded through memory that stays in cache, without allocating (and
// making the garbage collector reclaim) its whole size.
func (e *Encoding) WriteTransient(emit func([]byte) error) error { return e.write(emit, true) }

// BytesEncoding is the Encoding of a state already encoded.
func BytesEncoding(b []byte) *Encoding {
	return &Encoding{Size: len(b), write: func(emit func([]byte) error, _ bool) error { return emit(b) }}
}

// encodingFreezer is a Freezer whose frozen state is encoded as an
// Encoding: prepare (sorting, sizing) runs after the task is released,
// like Freeze's encoding.
type encodingFreezer interface {
	freezeEncoding() (prepare func() (*Encoding, error))
}

// FreezeEncodingOf is FreezeOf with the encoding as an Encoding: prepare
// runs later, on any goroutine, once.
func FreezeEncodingOf(op Operator) (prepare func() (*Encoding, error)) {
	switch f := op.(type) {
	case encodingFreezer:
		return f.freezeEncoding()
	case Freezer:
		enc := f.Freeze()
		return func() (*Encoding, error) {
			b, err := enc()
			if err != nil {
				return nil, err
			}
			return BytesEncoding(b), nil
		}
	}
	data, err := op.Snapshot()
	return func() (*Encoding, error) {
		if err != nil {
			return nil, err
		}
		return BytesEncoding(data), nil
	}
}

// FreezePartsOf is FreezeOf with the encoding in consecutive parts
// (FreezeEncodingOf's, gathered).
func FreezePartsOf(op Operator) func() ([][]byte, error) {
	prepare := FreezeEncodingOf(op)
	return func() ([][]byte, error) {
		enc, err := prepare()
		if err != nil {
			return nil, err
		}
		var parts [][]byte
		err = enc.Write(func(p []byte) error { parts = append(parts, p); return nil })
		return parts, err
	}
}

// Freeze freezes each member (see FreezeOf).
func (c *chain) Freeze() func() ([]byte, error) { return FreezeOf(c) }

// freezeEncoding freezes each member; the encoding is the members'
// parts, each member preceded by a small part holding its length prefix
// (and, first, the member count): no member's bytes are copied.
func (c *chain) freezeEncoding() func() (*Encoding, error) {
	members := make([]func() (*Encoding, error), len(c.ops))
	for i, op := range c.ops {
		members[i] = FreezeEncodingOf(op)
	}
	return func() (*Encoding, error) {
		encs := make([]*Encoding, len(members))
		size := uvarintSize(uint64(len(members)))
		for i, prepare := range members {
			enc, err := prepare()
			if err != nil {
				return nil, err
			}
			encs[i] = enc
			size += uvarintSize(uint64(enc.Size)) + enc.Size
		}
		return &Encoding{Size: size, write: func(emit func([]byte) error, transient bool) error {
			prefix := binary.AppendUvarint(nil, uint64(len(encs)))
			for _, enc := range encs {
				if err := emit(binary.AppendUvarint(prefix, uint64(enc.Size))); err != nil {
					return err
				}
				prefix = nil
				if err := enc.write(emit, transient); err != nil {
					return err
				}
			}
			return nil
		}}, nil
	}
}

// Freeze copies the open windows' groups into lists (accumulators by
// value; count_distinct member sets shared, the task cloning one before
// it next adds to it; no map of groups is rebuilt); the lists are sorted
// and encoded later.
func (a *aggregate) Freeze() func() ([]byte, error) { return FreezeOf(a) }

// freezeEncoding is Freeze with the encoding as an Encoding: the header,
// then one part per open window (prepareViews), count_distinct members in
// their sets' order (not canonical: it restores to the same state as
// Snapshot's bytes, which may differ from them in that order).
func (a *aggregate) freezeEncoding() func() (*Encoding, error) {
	watermark, late, views := a.watermark, a.late, a.views(true)
	return func() (*Encoding, error) { return a.prepareViews(watermark, late, views, false), nil }
}

// encodeParallel runs encode(i) for i in 0..n-1 on up to GOMAXPROCS
// goroutines and returns when all have returned.
func encodeParallel(n int, encode func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range n {
			encode(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mine := int(next.Add(1) - 1)
				if mine >= n {
					return
				}
				encode(mine)
				runtime.Gosched() // as in writeParallel
			}
		}()
	}
	wg.Wait()
}

// writeParallel encodes parts 0..n-1 with encode on up to GOMAXPROCS
// goroutines and emits them in index order, each as soon as it and all
// before it are encoded, so that emitting (sending) overlaps encoding. It
// stops encoding at the first error of emit, and returns once every
// goroutine it started has returned. encode(i, buf) appends part i to
// buf[:0] (nil: a buffer of its own). With reuse, the parts are encoded
// into a few buffers that go round: a part's buffer is encoded into again
// once emit has returned (transient parts, Encoding.WriteTransient).
func writeParallel(n int, reuse bool, encode func(i int, buf []byte) []byte, emit func([]byte) error) error {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		var buf []byte
		for i := range n {
			p := encode(i, buf)
			if err := emit(p); err != nil {
				return err
			}
			if reuse {
				buf = p
			}
		}
		return nil
	}
	parts := make([][]byte, n)
	done := make([]chan struct{}, n)
	for i := range done {
		done[i] = make(chan struct{})
	}
	// free holds the buffers an encoder may take (reuse): one per
	// encoder and one more, so that an encoder can go on while the part
	// before is emitted.
	var free chan []byte
	if reuse {
		free = make(chan []byte, workers+1)
		for range workers + 1 {
			free <- nil
		}
	}
	var next atomic.Int64
	var stop atomic.Bool
	quit := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(quit)
	defer stop.Store(true)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				var buf []byte
				if reuse {
					// Taken before the part: parts are handed out in
					// order, so the buffers go to the earliest parts and
					// the emitter never waits for one.
					select {
					case buf = <-free:
					case <-quit:
						return
					}
				}
				mine := int(next.Add(1) - 1)
				if mine >= n {
					return
				}
				parts[mine] = encode(mine, buf)
				close(done[mine])
				// A live snapshot is encoded while its task goes on: let
				// the task's goroutines, woken by new input, run between
				// two parts instead of waiting for the scheduler to
				// preempt an encoder (up to 10 ms, a pause in the task's
				// output where both cores encode).
				runtime.Gosched()
			}
		}()
	}
	for i := range n {
		<-done[i]
		if err := emit(parts[i]); err != nil {
			return err
		}
		if reuse {
			free <- parts[i]
		}
		parts[i] = nil
	}
	return nil
}

// ownedRestorer is implemented by operators that can restore from a
// snapshot without copying it (RestoreOwned).
type ownedRestorer interface {
	restoreOwned(state []byte) error
}

// RestoreOwned is op.Restore(state) for a snapshot handed over to the
// operator: the caller never modifies state again (a snapshot received
// from another worker into a buffer of its own). The restored state may
// then keep substrings of state itself, where Restore copies the
// snapshot once first (64 MB of count_distinct members cost a copy of
// 64 MB and as much more memory while both are held).
func RestoreOwned(op Operator, state []byte) error {
	if r, ok := op.(ownedRestorer); ok {
		return r.restoreOwned(state)
	}
	return op.Restore(state)
}
