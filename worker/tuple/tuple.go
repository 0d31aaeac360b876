// Package tuple defines the unit of data that flows between operators: a
// header (type, per-stream id, stime, version tag) and values typed by the
// stream's schema, plus the compact binary encoding used inside data-plane
// batches.
package tuple

import "fmt"

// Type says what a tuple means to the consumer (Borealis DPC tuple types).
type Type uint8

const (
	// Stable tuples are final: they will never be undone.
	Stable Type = 1
	// Tentative tuples result from incomplete input and may be undone later.
	Tentative Type = 2
	// Boundary is punctuation and heartbeat: every later tuple on the stream
	// has stime >= this tuple's stime. It carries no values.
	Boundary Type = 3
	// Undo rolls the stream back to just after the tuple whose id is in the
	// Undo tuple's ID field.
	Undo Type = 4
	// RecDone marks the end of a correction sequence.
	RecDone Type = 5
	// Uncorrectable says that some results of the stream could not be
	// corrected (DCAA: a failure outlasted what was kept for the replay).
	// It is outside the stable view like UNDO and REC_DONE, but never
	// taken back: a consumer showing only final results shows it too. Its
	// values are two timestamps, the stream-time range [from, to) of the
	// results concerned (see UncorrectableRange); its STime is from.
	Uncorrectable Type = 6
)

// lastType is the highest type byte this build knows.
const lastType = Uncorrectable

func (t Type) String() string {
	switch t {
	case Stable:
		return "STABLE"
	case Tentative:
		return "TENTATIVE"
	case Boundary:
		return "BOUNDARY"
	case Undo:
		return "UNDO"
	case RecDone:
		return "REC_DONE"
	case Uncorrectable:
		return "UNCORRECTABLE"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// IsData reports whether tuples of this type carry values for operators.
func (t Type) IsData() bool { return t == Stable || t == Tentative }

// Kind is the type of one value.
type Kind uint8

const (
	KindInvalid   Kind = 0
	KindInt       Kind = 1
	KindFloat     Kind = 2
	KindString    Kind = 3
	KindBool      Kind = 4
	KindTimestamp Kind = 5 // nanoseconds since the Unix epoch, in I
	KindBytes     Kind = 6 // raw bytes, in S
)

// ParseKind maps a schema type name to its Kind.
func ParseKind(name string) (Kind, bool) {
	switch name {
	case "int", "int64", "integer":
		return KindInt, true
	case "float", "float64", "double":
		return KindFloat, true
	case "string":
		return KindString, true
	case "bool", "boolean":
		return KindBool, true
	case "timestamp", "time":
		return KindTimestamp, true
	case "bytes":
		return KindBytes, true
	}
	return KindInvalid, false
}

func (k Kind) String() string {
	switch k {
	case KindInt:
		return "int"
	case KindFloat:
		return "float"
	case KindString:
		return "string"
	case KindBool:
		return "bool"
	case KindTimestamp:
		return "timestamp"
	case KindBytes:
		return "bytes"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Value is one typed field. It is a plain struct rather than an interface so
// that decoding a batch does not allocate a box per field.
type Value struct {
	Kind Kind
	I    int64   // KindInt, KindTimestamp, KindBool (0 or 1)
	F    float64 // KindFloat
	S    string  // KindString, KindBytes
}

// Int, Float, Str, Bool, Timestamp and Bytes build values.
func Int(v int64) Value        { return Value{Kind: KindInt, I: v} }
func Float(v float64) Value    { return Value{Kind: KindFloat, F: v} }
func Str(v string) Value       { return Value{Kind: KindString, S: v} }
func Timestamp(ns int64) Value { return Value{Kind: KindTimestamp, I: ns} }
func Bytes(b []byte) Value     { return Value{Kind: KindBytes, S: string(b)} }
func Bool(v bool) Value {
	if v {
		return Value{Kind: KindBool, I: 1}
	}
	return Value{Kind: KindBool}
}

// Tuple is one record of a stream.
type Tuple struct {
	Type Type
	// ID is unique and increasing per stream, and deterministic: replicas
	// doing identical work assign identical ids.
	ID uint64
	// STime is the tuple's stream time in nanoseconds since the Unix epoch.
	STime int64
	// Version tags the set of operator versions that processed the tuple
	// (live reconfiguration); 0 is the initial configuration.
	Version uint64
	Values  []Value

	// packed is the encoding of the values (their count first) of a tuple
	// decoded by DecodeHeader, aliasing the batch it came from; nil for
	// every other tuple. While Values is empty, AppendTuple copies packed
	// verbatim instead of encoding Values: a tuple that only passes
	// through (a sink's input) is never decoded and re-encoded field by
	// field.
	packed []byte
}

// Packed reports whether t's values are still in their encoding (t came
// from DecodeHeader and nobody set Values since): Values is then empty
// even if the tuple has values.
func (t *Tuple) Packed() bool { return t.packed != nil && len(t.Values) == 0 }

// Field is one named, typed column of a schema.
type Field struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
}

// Schema is the ordered list of a stream's fields.
type Schema struct {
	Fields []Field
	index  map[string]int
}

// NewSchema builds a schema; field names must be unique (validated earlier).
func NewSchema(fields []Field) *Schema {
	s := &Schema{Fields: fields, index: make(map[string]int, len(fields))}
	for i, f := range fields {
		s.index[f.Name] = i
	}
	return s
}

// Index returns the position of the named field, or -1.
func (s *Schema) Index(name string) int {
	if i, ok := s.index[name]; ok {
		return i
	}
	return -1
}

// Len is the number of fields.
func (s *Schema) Len() int { return len(s.Fields) }
