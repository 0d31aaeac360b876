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

// partsFreezer is a Freezer whose encoding comes in consecutive parts
// (their concatenation is the Snapshot encoding), so that a large state
// is written once, straight into the pieces that are sent, instead of
// being gathered into one buffer (one more copy of every byte, and a
// buffer re-grown several times on the way).
type partsFreezer interface {
	freezeParts() func() ([][]byte, error)
}

// FreezePartsOf is FreezeOf with the encoding in consecutive parts
// (concatenated, byte for byte Snapshot's encoding at the freeze): what a
// live snapshot sends without joining it first. The parts are never
// modified afterwards.
func FreezePartsOf(op Operator) func() ([][]byte, error) {
	switch f := op.(type) {
	case partsFreezer:
		return f.freezeParts()
	case Freezer:
		enc := f.Freeze()
		return func() ([][]byte, error) {
			b, err := enc()
			return [][]byte{b}, err
		}
	}
	data, err := op.Snapshot()
	return func() ([][]byte, error) { return [][]byte{data}, err }
}

// Freeze freezes each member (see FreezeOf).
func (c *chain) Freeze() func() ([]byte, error) { return FreezeOf(c) }

// freezeParts freezes each member; the encoding is the members' parts,
// each preceded by a small part holding its length prefix (and, first,
// the member count): no member's bytes are copied.
func (c *chain) freezeParts() func() ([][]byte, error) {
	members := make([]func() ([][]byte, error), len(c.ops))
	for i, op := range c.ops {
		members[i] = FreezePartsOf(op)
	}
	return func() ([][]byte, error) {
		prefix := binary.AppendUvarint(nil, uint64(len(members)))
		var out [][]byte
		for _, member := range members {
			p, err := member()
			if err != nil {
				return nil, err
			}
			size := 0
			for _, b := range p {
				size += len(b)
			}
			out = append(out, binary.AppendUvarint(prefix, uint64(size)))
			out = append(out, p...)
			prefix = nil
		}
		return out, nil
	}
}

// Freeze copies the open windows' groups into lists (accumulators by
// value, count_distinct member sets as new maps of the same strings; no
// map of groups is rebuilt); the lists are sorted and encoded later.
func (a *aggregate) Freeze() func() ([]byte, error) { return FreezeOf(a) }

// freezeParts is Freeze with the encoding in parts: the header, then one
// part per open window.
func (a *aggregate) freezeParts() func() ([][]byte, error) {
	watermark, late, views := a.watermark, a.late, a.views(true)
	return func() ([][]byte, error) { return a.encodeViews(watermark, late, views), nil }
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
			}
		}()
	}
	wg.Wait()
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
