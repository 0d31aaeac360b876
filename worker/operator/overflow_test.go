package operator

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestAggregateIntSumOverflow: a tuple that would take an int sum (or the
// sum behind an int avg) past the int64 range is refused with
// ErrSumOverflow (an ErrEval: the task drops, counts and reports it) and
// not counted in any aggregate of its row, in every window it belongs to;
// other groups and later tuples go on. Before, the sum wrapped around to
// a negative number silently.
func TestAggregateIntSumOverflow(t *testing.T) {
	op := mustNew(t, aggDef("10ns", "5ns", []string{"src"}, "n=count()", "s=sum(port)", "a=avg(port)"), connSchema)
	c := Collect()
	for _, tp := range []struct {
		stime int64
		src   string
		port  int64
	}{{1, "a", math.MaxInt64 - 1}, {2, "b", 5}, {6, "a", 1}} {
		if err := op.Process(0, conn(tp.stime, tp.src, tp.port, 0, true), c); err != nil {
			t.Fatal(err)
		}
	}
	// Sums to MaxInt64 in both windows of a; one more overflows in the
	// window [0,10) only: the tuple is dropped from both.
	err := op.Process(0, conn(7, "a", 1, 0, true), c)
	if !errors.Is(err, ErrSumOverflow) || !errors.Is(err, ErrEval) || !strings.Contains(err.Error(), "aggregate agg: s = sum(port) in the window ending") {
		t.Fatalf("overflowing tuple: %v", err)
	}
	if err := op.Process(0, conn(7, "b", -5, 0, true), c); err != nil {
		t.Fatal(err)
	}
	// Going below the range is refused too.
	if err := op.Process(0, conn(8, "b", math.MinInt64, 0, true), c); !errors.Is(err, ErrSumOverflow) {
		t.Fatalf("underflowing tuple: %v", err)
	}
	if err := op.Advance(20, c); err != nil {
		t.Fatal(err)
	}
	equalRows(t, c.Tuples, []string{
		`STABLE@5["a" 1 9223372036854775806 9.223372036854776e+18 t5]`,
		`STABLE@5["b" 1 5 5 t5]`,
		`STABLE@10["a" 2 9223372036854775807 4.611686018427388e+18 t10]`,
		`STABLE@10["b" 2 0 0 t10]`,
		`STABLE@15["a" 1 1 1 t15]`,
		`STABLE@15["b" 1 -5 -5 t15]`,
	})
}

// TestAggregateIntSumOverflowAfterRestore: a copy restored from a
// snapshot knows how large its sums are, so it refuses the same tuple.
func TestAggregateIntSumOverflowAfterRestore(t *testing.T) {
	def := aggDef("10ns", "", []string{"src"}, "s=sum(port)")
	op := mustNew(t, def, connSchema)
	c := Collect()
	if err := op.Process(0, conn(1, "a", math.MaxInt64-1, 0, true), c); err != nil {
		t.Fatal(err)
	}
	snap, err := op.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	copied := mustNew(t, def, connSchema)
	if err := copied.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if err := copied.Process(0, conn(2, "a", 2, 0, true), c); !errors.Is(err, ErrSumOverflow) {
		t.Fatalf("restored copy: %v", err)
	}
	if err := copied.Process(0, conn(2, "a", 1, 0, true), c); err != nil {
		t.Fatal(err)
	}
	if err := copied.Advance(10, c); err != nil {
		t.Fatal(err)
	}
	equalRows(t, c.Tuples, []string{`STABLE@10["a" 9223372036854775807 t10]`})
}
