package operator

import (
	"encoding/binary"
	"runtime"
	"slices"
	"sync"
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
	if f, ok := op.(Freezer); ok {
		return f.Freeze()
	}
	data, err := op.Snapshot()
	return func() ([]byte, error) { return data, err }
}

// Freeze freezes each member (see FreezeOf).
func (c *chain) Freeze() func() ([]byte, error) {
	parts := make([]func() ([]byte, error), len(c.ops))
	for i, op := range c.ops {
		parts[i] = FreezeOf(op)
	}
	return func() ([]byte, error) {
		var buf []byte
		buf = binary.AppendUvarint(buf, uint64(len(parts)))
		for _, part := range parts {
			s, err := part()
			if err != nil {
				return nil, err
			}
			buf = binary.AppendUvarint(buf, uint64(len(s)))
			buf = append(buf, s...)
		}
		return buf, nil
	}
}

// Freeze copies the open windows' groups into lists (accumulators by
// value, count_distinct member sets as new maps of the same strings; no
// map of groups is rebuilt); the lists are sorted and encoded later.
func (a *aggregate) Freeze() func() ([]byte, error) {
	watermark, late, views := a.watermark, a.late, a.views(true)
	return func() ([]byte, error) { return a.encodeViews(watermark, late, views), nil }
}

// encodeParallel runs encode(i, e) for i in 0..n-1, each into an encoder
// of its own, on up to GOMAXPROCS goroutines, and appends the results to
// out in index order: the bytes a sequential loop would write.
func encodeParallel(out *encoder, n int, encode func(i int, e *encoder)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range n {
			encode(i, out)
		}
		return
	}
	parts := make([]encoder, n)
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				mine := i
				i++
				next.Unlock()
				if mine >= n {
					return
				}
				encode(mine, &parts[mine])
			}
		}()
	}
	wg.Wait()
	size := len(out.b)
	for _, p := range parts {
		size += len(p.b)
	}
	out.b = slices.Grow(out.b, size-len(out.b))
	for _, p := range parts {
		out.b = append(out.b, p.b...)
	}
}
