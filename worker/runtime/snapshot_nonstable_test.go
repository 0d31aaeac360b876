package runtime

import (
	"reflect"
	"testing"

	"github.com/fedstream/fedstream/worker/dataplane"
)

// An output's positions outside its stable view travel in a task
// snapshot (format version 3), so a moved producer that corrected its
// output gives its consumers the same stable ids.
func TestSnapshotKeepsNonStableRanges(t *testing.T) {
	s := &TaskSnapshot{TaskID: "q/f/p0/r0", Query: "q", Fragment: "f", Outputs: []OutputPosition{
		{Consumer: "g", Partition: 1, LastID: 40, NSBase: 3, NonStable: []dataplane.PosRange{{From: 20, To: 22}, {From: 30, To: 30}}},
		{Consumer: "g", Partition: 0, LastID: 7},
	}}
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got TaskSnapshot
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	for i := range s.Outputs {
		w, g := s.Outputs[i], got.Outputs[i]
		if g.NSBase != w.NSBase || !reflect.DeepEqual(g.NonStable, w.NonStable) || g.LastID != w.LastID {
			t.Fatalf("output %d: got base %d ranges %v last %d, want %d %v %d", i, g.NSBase, g.NonStable, g.LastID, w.NSBase, w.NonStable, w.LastID)
		}
	}
}
