package operator

import (
	"reflect"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// chainDefs: filter -> map -> windowed aggregate, so the chain carries state
// and emits on Advance too.
func chainOps(t *testing.T) []Operator {
	t.Helper()
	defs := []*queryspec.Operator{
		{Name: "f", Type: "filter", Where: "port > 10"},
		{Name: "m", Type: "map", Fields: queryspec.Exprs{{Name: "src", Expr: "src"}, {Name: "p2", Expr: "port * 2"}}},
		{Name: "a", Type: "aggregate", Window: &queryspec.Window{Size: "10ns"}, GroupBy: []string{"src"},
			Aggregates: queryspec.Exprs{{Name: "n", Expr: "count()"}, {Name: "s", Expr: "sum(p2)"}}},
	}
	schema := connSchema
	var ops []Operator
	for _, d := range defs {
		op, err := New(d, []*tuple.Schema{schema})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
		schema = op.OutputSchema()
	}
	return ops
}

func chainEvents() []event {
	return []event{
		in(0, conn(1, "a", 5, 0, true)), in(0, conn(2, "a", 20, 0, true)), in(0, conn(3, "b", 30, 0, true)),
		adv(5), in(0, conn(9, "a", 11, 0, true)), adv(10), in(0, conn(12, "b", 40, 0, false)), adv(20),
	}
}

// The chain's output equals running the operators one after another.
func TestChainEqualsSeparateOperators(t *testing.T) {
	ops := chainOps(t)
	var want []tuple.Tuple
	stage := chainEvents()
	for _, op := range ops {
		out := run(t, op, stage)
		stage = nil
		for i := range out {
			stage = append(stage, in(0, &out[i]))
		}
		// Stream time reaches every stage: replay the advances at the end.
		for _, ev := range chainEvents() {
			if ev.tup == nil {
				stage = append(stage, ev)
			}
		}
		want = out
	}
	got := run(t, Chain(chainOps(t)...), chainEvents())
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("chain emitted\n%v\nwant\n%v", got, want)
	}
	if len(got) == 0 {
		t.Fatal("test proves nothing: no output")
	}
}

// Snapshot mid-stream, restore into a fresh chain, feed the rest: the output
// equals the uninterrupted run.
func TestChainSnapshotRestore(t *testing.T) {
	events := chainEvents()
	full := run(t, Chain(chainOps(t)...), events)
	for cut := 0; cut <= len(events); cut++ {
		first := Chain(chainOps(t)...)
		got := run(t, first, events[:cut])
		snap, err := first.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		second := Chain(chainOps(t)...)
		if err := second.Restore(snap); err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		got = append(got, run(t, second, events[cut:])...)
		if !reflect.DeepEqual(got, full) {
			t.Fatalf("cut %d: got %v want %v", cut, got, full)
		}
	}
	if err := Chain(chainOps(t)...).Restore([]byte{9}); err == nil {
		t.Fatal("restore of a foreign snapshot succeeded")
	}
}
