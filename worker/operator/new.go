package operator

import (
	"fmt"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// LateCounter is implemented by windowed operators (aggregate, join). A
// tuple whose STime is below the last watermark passed to Advance breaks
// the Advance promise; such a tuple is dropped and counted, not an error,
// because the window it belongs to has already been emitted or discarded.
type LateCounter interface {
	// LateTuples is the number of tuples dropped for arriving late.
	LateTuples() uint64
}

// New builds a running operator instance from its definition. inputs[i] is
// the schema of input port i: one for filter, map, split and aggregate, two
// (left, right) for join, one per entry of def.Inputs for union. Expressions are
// compiled here, once; every error names the operator and what is wrong.
func New(def *queryspec.Operator, inputs []*tuple.Schema) (Operator, error) {
	if def == nil {
		return nil, fmt.Errorf("%w: nil definition", ErrBadDefinition)
	}
	for i, s := range inputs {
		if s == nil {
			return nil, defErr(def, ErrBadDefinition, "input schema %d is nil", i)
		}
	}
	switch def.Type {
	case "filter":
		if err := wantInputs(def, inputs, 1); err != nil {
			return nil, err
		}
		return newFilter(def, inputs[0])
	case "map":
		if err := wantInputs(def, inputs, 1); err != nil {
			return nil, err
		}
		return newMap(def, inputs[0])
	case "split":
		if err := wantInputs(def, inputs, 1); err != nil {
			return nil, err
		}
		return newSplit(def, inputs[0])
	case "union":
		return newUnion(def, inputs)
	case "aggregate":
		if err := wantInputs(def, inputs, 1); err != nil {
			return nil, err
		}
		return newAggregate(def, inputs[0])
	case "join":
		if err := wantInputs(def, inputs, 2); err != nil {
			return nil, err
		}
		return newJoin(def, inputs[0], inputs[1])
	}
	return nil, defErr(def, ErrUnknownOperator, "type %q (want filter, map, split, union, aggregate or join)", def.Type)
}

// defErr builds an error naming the operator: `operator "x" (filter): ...`.
func defErr(def *queryspec.Operator, sentinel error, format string, args ...any) error {
	return fmt.Errorf("operator %q (%s): %w: %s", def.Name, def.Type, sentinel, fmt.Sprintf(format, args...))
}

func wantInputs(def *queryspec.Operator, inputs []*tuple.Schema, n int) error {
	if len(inputs) != n {
		return defErr(def, ErrBadDefinition, "got %d input schemas, want %d", len(inputs), n)
	}
	return nil
}

// parseWindow reads a window definition; slide is size for tumbling
// windows. Sliding windows need slide to divide size so that every tuple is
// in exactly size/slide windows.
func parseWindow(def *queryspec.Operator, allowSlide bool) (size, slide int64, err error) {
	if def.Window == nil || def.Window.Size == "" {
		return 0, 0, defErr(def, ErrBadDefinition, "window.size is required")
	}
	d, perr := time.ParseDuration(def.Window.Size)
	if perr != nil || d <= 0 {
		return 0, 0, defErr(def, ErrBadDefinition, "window.size %q is not a positive duration", def.Window.Size)
	}
	size, slide = int64(d), int64(d)
	if def.Window.Slide == "" {
		return size, slide, nil
	}
	s, perr := time.ParseDuration(def.Window.Slide)
	if perr != nil || s <= 0 {
		return 0, 0, defErr(def, ErrBadDefinition, "window.slide %q is not a positive duration", def.Window.Slide)
	}
	slide = int64(s)
	if slide == size {
		return size, slide, nil
	}
	if !allowSlide {
		return 0, 0, defErr(def, ErrBadDefinition, "window.slide is not supported here (tumbling windows only)")
	}
	if slide > size || size%slide != 0 {
		return 0, 0, defErr(def, ErrBadDefinition, "window.slide %s must divide window.size %s", def.Window.Slide, def.Window.Size)
	}
	return size, slide, nil
}

// floorDiv is a/b rounded towards negative infinity (b > 0), so windows
// align to the epoch for negative stimes too.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// checkData rejects tuples operators must not see and tuples too short for
// the schema they claim.
func checkData(t *tuple.Tuple, s *tuple.Schema) error {
	if !t.Type.IsData() {
		return fmt.Errorf("%w: %s", ErrNotData, t.Type)
	}
	if len(t.Values) < s.Len() {
		return fmt.Errorf("%w: tuple has %d values, schema has %d", ErrTypeMismatch, len(t.Values), s.Len())
	}
	return nil
}

// stateless is embedded by operators without state: their snapshot is only
// the header, and Restore checks it was taken from the same kind of operator.
type stateless struct{ signature string }

func (s stateless) Advance(int64, Emitter) error { return nil }

func (s stateless) Snapshot() ([]byte, error) { return newEncoder(s.signature).b, nil }

func (s stateless) Restore(state []byte) error {
	d, err := newDecoder(state, s.signature)
	if err != nil {
		return err
	}
	return d.finish()
}

// checkKinds verifies every value's kind against the schema (operators that
// store or forward whole tuples without reading them).
func checkKinds(t *tuple.Tuple, s *tuple.Schema) error {
	for i, f := range s.Fields {
		if k := t.Values[i].Kind; k != f.Kind {
			return fmt.Errorf("%w: field %q is %s, schema says %s", ErrTypeMismatch, f.Name, k, f.Kind)
		}
	}
	return nil
}
