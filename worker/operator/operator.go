// Package operator implements the stream operators a task runs: filter, map,
// split (tokenise), union, windowed aggregate and windowed equi-join.
// Operators are driven by a single goroutine (the task's), see only data
// tuples in a deterministic order, and learn of stream-time progress through
// Advance. Every operator can snapshot its state and be restored from it into
// a fresh instance.
package operator

import "github.com/fedstream/fedstream/worker/tuple"

// Emitter receives an operator's output. The tuple and its Values slice are
// only valid during the call: an emitter that keeps them must copy.
// The operator sets Type (Stable or Tentative, inherited from its inputs),
// STime and Values; the task assigns the output id.
type Emitter interface {
	Emit(t *tuple.Tuple)
}

// EmitFunc adapts a function to Emitter.
type EmitFunc func(t *tuple.Tuple)

// Emit calls f(t).
func (f EmitFunc) Emit(t *tuple.Tuple) { f(t) }

// Operator is one running instance of an operator (one task's copy).
type Operator interface {
	// Process consumes one data tuple arriving on input port `port` (0 for
	// single-input operators; 0 = left and 1 = right for joins; the index in
	// Inputs for union). Tuples reach Process in non-decreasing STime order
	// across all ports.
	Process(port int, t *tuple.Tuple, out Emitter) error
	// Advance promises that no tuple with STime < watermark will be passed to
	// Process again; windowed operators emit the windows that closed.
	Advance(watermark int64, out Emitter) error
	// Snapshot serialises the operator's state.
	Snapshot() ([]byte, error)
	// Restore replaces the operator's state with a snapshot taken from an
	// instance built from the same definition.
	Restore(state []byte) error
	// OutputSchema is the schema of the tuples this operator emits.
	OutputSchema() *tuple.Schema
}
