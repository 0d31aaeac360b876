package operator

import (
	"slices"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestVersionedSelectsByTag: a tuple is processed by the version of its
// tag's configuration and keeps the tag; a tag below the floor means the
// floor; raising the floor removes versions no remaining epoch uses.
func TestVersionedSelectsByTag(t *testing.T) {
	mk := func(where string) func() (Operator, error) {
		return func() (Operator, error) {
			return New(&queryspec.Operator{Name: "f", Type: "filter", Where: where}, []*tuple.Schema{connSchema})
		}
	}
	v1, err := mk("port > 100")()
	if err != nil {
		t.Fatal(err)
	}
	v := NewVersioned("f", v1, 1, 0)
	if err := v.AddEpoch(2, mk("port > 1000")); err != nil {
		t.Fatal(err)
	}
	if err := v.AddEpoch(3, mk("port > 10000")); err != nil {
		t.Fatal(err)
	}
	if got := v.Versions(); !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("versions %v", got)
	}
	var tags []uint64
	out := EmitFunc(func(tp *tuple.Tuple) { tags = append(tags, tp.Version) })
	for tag := range uint64(3) {
		tp := conn(1, "10.0.0.1", 500, 0, true)
		tp.Version = tag
		if err := v.Process(0, tp, out); err != nil {
			t.Fatal(err)
		}
	}
	// port 500 passes v1 only.
	if !slices.Equal(tags, []uint64{0}) {
		t.Fatalf("emitted tags %v, want [0] (only version 1 passes port 500)", tags)
	}
	v.SetFloor(1)
	if got := v.Versions(); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("after floor 1: versions %v", got)
	}
	if v.Select(0) != 2 {
		t.Fatalf("tag 0 below the floor selects version %d, want 2", v.Select(0))
	}
}

// BenchmarkVersionedFilter is BenchmarkFilter through the select step of
// a Versioned with two versions loaded (the cost of static tracking per
// tuple and operator).
func BenchmarkVersionedFilter(b *testing.B) {
	def := &queryspec.Operator{Name: "f", Type: "filter", Where: "port > 100 && ok"}
	op, err := New(def, []*tuple.Schema{connSchema})
	if err != nil {
		b.Fatal(err)
	}
	v := NewVersioned("f", op, 1, 0)
	if err := v.AddEpoch(2, func() (Operator, error) { return New(def, []*tuple.Schema{connSchema}) }); err != nil {
		b.Fatal(err)
	}
	inputs := benchTuples()
	var out discard
	var cur tuple.Tuple
	cur.Values = make([]tuple.Value, connSchema.Len())
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		src := inputs[i%len(inputs)]
		cur.Type = src.Type
		cur.STime = int64(i)
		cur.Version = uint64(i & 1)
		copy(cur.Values, src.Values)
		cur.Values[0] = tuple.Timestamp(int64(i))
		if err := v.Process(0, &cur, &out); err != nil {
			b.Fatal(err)
		}
	}
}
