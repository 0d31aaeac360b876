package operator

import (
	"errors"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestVersionedJoin: two versions of a join with different predicates
// share its buffers. A pair is judged by the version of the newer of its
// tuples' configurations and tagged with it; the buffered tuples'
// configurations survive a snapshot; a version with another window is
// refused and nothing changes.
func TestVersionedJoin(t *testing.T) {
	def1 := joinDef("10ns", "src")
	def2 := joinDef("10ns", "src")
	def2.Where = "ports > 5" // version 2 keeps only pairs with many ports
	build := func() *VersionedJoin {
		op, err := New(def1, []*tuple.Schema{busySchema, probeSchema})
		if err != nil {
			t.Fatal(err)
		}
		v, err := NewVersionedJoin("both", op, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.AddEpoch(2, func() (Operator, error) { return New(def2, []*tuple.Schema{busySchema, probeSchema}) }); err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := build()
	var out []string
	em := EmitFunc(func(tp *tuple.Tuple) {
		out = append(out, row(*tp)+"#"+string(rune('0'+tp.Version)))
	})
	tagged := func(tp *tuple.Tuple, tag uint64) *tuple.Tuple { tp.Version = tag; return tp }
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(v.Process(0, tagged(busy(1, "a", 10), 0), em))    // old, buffered
	must(v.Process(1, tagged(probe(2, "a", 1, 3), 0), em)) // old+old: v1, every pair
	must(v.Process(1, tagged(probe(3, "a", 2, 4), 1), em)) // old+new: v2, 4 ports: dropped
	b, err := v.Snapshot()                                 // the epochs travel with the buffers
	must(err)
	v = build()
	must(v.Restore(b))
	must(v.Process(0, tagged(busy(4, "a", 11), 0), em))    // meets 3 (new, v2: 4 ports dropped) and 2 (old: v1)
	must(v.Process(1, tagged(probe(5, "a", 3, 9), 1), em)) // new: v2 with both lefts, 9 ports kept
	want := []string{
		`STABLE@2["a" 10 1 3]#0`,
		`STABLE@4["a" 11 1 3]#0`,
		`STABLE@5["a" 10 3 9]#1`,
		`STABLE@5["a" 11 3 9]#1`,
	}
	if !slices.Equal(out, want) {
		t.Fatalf("pairs\n%v\nwant\n%v", out, want)
	}
	v.SetFloor(1)
	if got := v.Versions(); !slices.Equal(got, []int{2}) {
		t.Fatalf("versions after the floor: %v", got)
	}
	other := joinDef("20ns", "src")
	err = v.AddEpoch(3, func() (Operator, error) { return New(other, []*tuple.Schema{busySchema, probeSchema}) })
	if !errors.Is(err, ErrNotMigratable) || v.Latest() != 1 {
		t.Fatalf("another window: %v (latest %d)", err, v.Latest())
	}
}
