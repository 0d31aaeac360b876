package dcaa

import "github.com/fedstream/fedstream/worker/tuple"

// Output is a task's output stage (SOutput): it numbers what the
// operators emit, marks it stable or tentative, and produces the
// correction sequence.
//
// Ids number the stable stream: a stable tuple or boundary gets the next
// id after the last stable one. Tentative tuples get the ids the stable
// stream would continue with, speculatively; UNDO carries, as its ID, the
// last stable id (everything after it is taken back) and resets the
// numbering there, so the corrected stable tuples that follow get exactly
// the ids of a failure-free run. REC_DONE's ID is the last stable id at
// the end of the corrections. Boundaries are stable punctuation only:
// while the output is tentative none is emitted (a boundary promises
// the stable stream, and corrections may go below a tentative one);
// the tentative progress is advertised instead (TentWatermark).
type Output struct {
	emit       func(*tuple.Tuple)
	lastStable uint64
	next       uint64
	tentative  bool
	tentWM     int64
	scratch    tuple.Tuple
}

// NewOutput starts numbering after afterID; emit receives every output
// tuple (valid during the call only).
func NewOutput(afterID uint64, emit func(*tuple.Tuple)) *Output {
	return &Output{emit: emit, lastStable: afterID, next: afterID + 1}
}

// SetTentative sets the mode of what follows (Release.Tentative).
func (o *Output) SetTentative(tentative bool) { o.tentative = tentative }

// Emit implements operator.Emitter.
func (o *Output) Emit(t *tuple.Tuple) {
	typ := tuple.Stable
	if o.tentative {
		typ = tuple.Tentative
	}
	o.put(t, typ)
}

func (o *Output) put(t *tuple.Tuple, typ tuple.Type) {
	save := *t
	t.Type, t.ID = typ, o.next
	o.next++
	if typ != tuple.Tentative {
		o.lastStable = t.ID
	}
	o.emit(t)
	*t = save
}

// Boundary ends a release step at stime: a BOUNDARY tuple when the output
// is stable, otherwise only the advertised tentative progress moves.
func (o *Output) Boundary(stime int64) {
	if o.tentative {
		o.tentWM = max(o.tentWM, stime)
		return
	}
	o.scratch = tuple.Tuple{STime: stime}
	o.put(&o.scratch, tuple.Boundary)
}

// Undo takes back everything after the last stable tuple (Restore).
func (o *Output) Undo() {
	o.scratch = tuple.Tuple{Type: tuple.Undo, ID: o.lastStable}
	o.emit(&o.scratch)
	o.next, o.tentative, o.tentWM = o.lastStable+1, false, 0
}

// RecDone ends the corrections.
func (o *Output) RecDone() {
	o.scratch = tuple.Tuple{Type: tuple.RecDone, ID: o.lastStable}
	o.emit(&o.scratch)
}

// LastStable is the id of the last stable tuple emitted.
func (o *Output) LastStable() uint64 { return o.lastStable }

// TentWatermark is the tentative progress to advertise in-band: the
// output released tentatively everything below it; 0 while the output
// is stable.
func (o *Output) TentWatermark() int64 {
	if !o.tentative {
		return 0
	}
	return o.tentWM
}

// View is what a consumer of an output stream makes of it: Stable, the
// stable tuples and boundaries in order (what `tail --stable-only`
// prints; equal to a failure-free run's stream once corrections are
// in), and Current, the stream with UNDOs applied (stable prefix plus
// the tentative tuples not taken back).
type View struct {
	Stable, Current          []tuple.Tuple
	Tentative, Undos, Recdns int
	// Uncorrectable holds the UNCORRECTABLE records (copies): outside
	// both views, never taken back.
	Uncorrectable []tuple.Tuple
}

// Apply adds one tuple of the stream (copied).
func (v *View) Apply(t *tuple.Tuple) {
	switch t.Type {
	case tuple.Undo:
		v.Undos++
		n := len(v.Current)
		for n > 0 && v.Current[n-1].ID > t.ID {
			n--
		}
		v.Current = v.Current[:n]
		return
	case tuple.RecDone:
		v.Recdns++
		return
	case tuple.Uncorrectable:
		v.Uncorrectable = append(v.Uncorrectable, *t.Clone())
		return
	case tuple.Tentative:
		v.Tentative++
	default:
		v.Stable = append(v.Stable, *t.Clone())
	}
	v.Current = append(v.Current, *t.Clone())
}
