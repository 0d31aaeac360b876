package tuple

import (
	"math"
	"testing"
)

// A marker's range reads back from its decoded values and from a tuple
// whose values were left packed (DecodeHeader: how sinks read their
// input); other tuples have none.
func TestUncorrectableRange(t *testing.T) {
	mk := UncorrectableMarker(math.MinInt64, 42)
	enc := AppendTuple(nil, &mk)
	var full, hdr Tuple
	if _, err := DecodeTuple(enc, &full); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeHeader(enc, &hdr); err != nil {
		t.Fatal(err)
	}
	if !hdr.Packed() {
		t.Fatal("DecodeHeader left no packed values: the test does not test the packed case")
	}
	for name, tp := range map[string]*Tuple{"decoded": &full, "packed": &hdr} {
		if from, to, ok := UncorrectableRange(tp); !ok || from != math.MinInt64 || to != 42 || tp.Type != Uncorrectable {
			t.Errorf("%s: range %d..%d ok %v type %v", name, from, to, ok, tp.Type)
		}
	}
	st := Tuple{Type: Stable, Values: []Value{Timestamp(1), Timestamp(2)}}
	if _, _, ok := UncorrectableRange(&st); ok {
		t.Error("a stable tuple read as a marker")
	}
}
