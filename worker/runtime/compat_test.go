package runtime

import (
	"testing"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestSnapshotForOlderWorkerHoldsNoUncorrectable: a snapshot fetched by a
// worker stating no data-plane level (an older build, which would serve
// the retained output again and cannot decode tuple type 6) retains a
// REC_DONE in place of each UNCORRECTABLE record, at the same position,
// with its index rebuilt; the snapshot served to this build, and the
// original (served again when halted), keep the record.
func TestSnapshotForOlderWorkerHoldsNoUncorrectable(t *testing.T) {
	var tail []byte
	var offs []int
	mk := tuple.UncorrectableMarker(10, 50)
	for _, tp := range []*tuple.Tuple{
		{Type: tuple.Stable, STime: 1, Values: []tuple.Value{tuple.Str("a")}},
		{Type: tuple.Undo, STime: 2},
		&mk,
		{Type: tuple.Stable, STime: 60, Values: []tuple.Value{tuple.Str("b")}},
	} {
		offs = append(offs, len(tail))
		tail = tuple.AppendTuple(tail, tp)
	}
	orig := &TaskSnapshot{Outputs: []OutputPosition{
		{Consumer: "c", TailFirst: 7, TailOffs: offs, Tail: tail, LastID: 10},
		{Consumer: "d"},
	}}
	if got, err := snapshotForLevel(orig, rpc.DataPlaneLevel); err != nil || got != orig {
		t.Fatalf("this build's level: %v, copied %v", err, got != orig)
	}
	old, err := snapshotForLevel(orig, 0)
	if err != nil {
		t.Fatal(err)
	}
	if old == orig || &old.Outputs[0] == &orig.Outputs[0] {
		t.Fatal("the original snapshot was changed in place")
	}
	if tuple.PeekType(orig.Outputs[0].Tail[orig.Outputs[0].TailOffs[2]:]) != tuple.Uncorrectable {
		t.Fatal("the original snapshot lost its UNCORRECTABLE record")
	}
	o := old.Outputs[0]
	if len(o.TailOffs) != 4 || o.TailFirst != 7 || o.LastID != 10 {
		t.Fatalf("downgraded output: %d tuples from %d to %d", len(o.TailOffs), o.TailFirst, o.LastID)
	}
	want := []tuple.Type{tuple.Stable, tuple.Undo, tuple.RecDone, tuple.Stable}
	for i, off := range o.TailOffs {
		var tp tuple.Tuple
		if _, err := tuple.DecodeTuple(o.Tail[off:], &tp); err != nil || tp.Type != want[i] {
			t.Fatalf("retained tuple %d: %v %v, want %v", i, tp.Type, err, want[i])
		}
		if i == 3 && tp.Values[0].S != "b" {
			t.Fatalf("the tuple after the record reads %q", tp.Values[0].S)
		}
	}
}
