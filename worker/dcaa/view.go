package dcaa

import (
	"errors"
	"fmt"

	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrStableRetracted means an UNDO took back a stable tuple or boundary:
// the stream broke the promise that stable output is final.
var ErrStableRetracted = errors.New("dcaa: an UNDO took back a stable tuple")

// InStableView reports whether a tuple of this type is part of a
// stream's stable view: stable results and boundaries. Tentative
// results, UNDO and REC_DONE are not (an UNDO only ever takes back
// tentative tuples, so what is stable stays). A consumer printing only
// final results while it reads (`tail --stable-only`) keeps exactly
// these.
func InStableView(typ tuple.Type) bool { return typ == tuple.Stable || typ == tuple.Boundary }

// StableView reads one output stream of a replicated query as a consumer
// does, tuple by tuple in stream order with their positions (tuple ids:
// output buffers number every tuple of a stream, see docs/DATAPLANE.md
// "Ids"), and applies each UNDO to what it read: the UNDO's STime is the
// position of the last tuple it keeps, everything after that position is
// taken back. What is left of the stable results and boundaries is the
// stream's stable view, which for a correct stream equals a failure-free
// run's output tuple for tuple (ids aside).
//
// Unlike InStableView, which trusts the protocol, StableView checks it:
// an UNDO taking back a stable tuple is an error (ErrStableRetracted), so
// a comparison built on it cannot pass by ignoring a wrong UNDO. It keeps
// every tuple it is given (for tests and benchmarks, not for endless
// streams).
type StableView struct {
	kept []viewEntry
	n    int
	// Tentative, Undos, RecDones and Uncorrectable count what the stream
	// carried.
	Tentative, Undos, RecDones, Uncorrectable int
}

type viewEntry struct {
	pos    uint64
	seq    int // the how-many-th Add (from 0)
	stable bool
	typ    tuple.Type
}

// Add reads the next tuple of the stream (t.ID its position). It
// returns ErrStableRetracted when t is an UNDO that takes back a stable
// tuple or boundary (the view then keeps them).
func (v *StableView) Add(t *tuple.Tuple) error {
	seq := v.n
	v.n++
	switch t.Type {
	case tuple.Tentative:
		v.Tentative++
	case tuple.RecDone:
		v.RecDones++
	case tuple.Uncorrectable:
		v.Uncorrectable++
	case tuple.Undo:
		v.Undos++
		to := uint64(t.STime)
		cut := len(v.kept)
		for cut > 0 && v.kept[cut-1].pos > to {
			cut--
		}
		for _, e := range v.kept[cut:] {
			if e.stable {
				return fmt.Errorf("%w: the UNDO at position %d goes back to %d, after the %v at position %d", ErrStableRetracted, t.ID, to, e.typ, e.pos)
			}
		}
		v.kept = v.kept[:cut]
		return nil
	}
	v.kept = append(v.kept, viewEntry{pos: t.ID, seq: seq, stable: InStableView(t.Type), typ: t.Type})
	return nil
}

// Stable returns the stable view: the sequence numbers (0 for the first
// tuple given to Add) of the stable results and boundaries still kept,
// in stream order.
func (v *StableView) Stable() []int {
	var out []int
	for _, e := range v.kept {
		if e.stable {
			out = append(out, e.seq)
		}
	}
	return out
}
