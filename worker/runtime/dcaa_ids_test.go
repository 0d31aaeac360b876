package runtime

import (
	"errors"
	"math"
	"testing"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestRenumberStable: a batch's stable tuples and boundaries take stable
// ids (position less the offset of the positions outside the stable
// view), the others keep theirs; the final boundary is found wherever it
// is in the batch; a batch with more stable tuples than its stable ids
// allow is refused.
func TestRenumberStable(t *testing.T) {
	b := &dataplane.Batch{LastID: 20, Offset: 3, Tuples: []tuple.Tuple{
		{Type: tuple.Stable, ID: 15}, {Type: tuple.Tentative, ID: 16}, {Type: tuple.Undo, ID: 17},
		{Type: tuple.Stable, ID: 18}, {Type: tuple.Boundary, ID: 19, STime: math.MaxInt64}, {Type: tuple.RecDone, ID: 20},
	}}
	last, final, err := renumberStable(b)
	if err != nil || last != 17 || !final {
		t.Fatalf("renumberStable = %d, %t, %v; want 17, true, nil", last, final, err)
	}
	want := []uint64{15, 16, 17, 16, 17, 20}
	for k, tp := range b.Tuples {
		if tp.ID != want[k] {
			t.Errorf("tuple %d (%v): id %d, want %d", k, tp.Type, tp.ID, want[k])
		}
	}
	b = &dataplane.Batch{LastID: 5, Offset: 3, Tuples: []tuple.Tuple{{Type: tuple.Stable}, {Type: tuple.Stable}, {Type: tuple.Boundary, STime: 7}}}
	if _, final, err := renumberStable(b); !errors.Is(err, dataplane.ErrProtocol) || final {
		t.Fatalf("three stable tuples ending at stable id 2: %t, %v; want ErrProtocol", final, err)
	}
	b = &dataplane.Batch{LastID: 3, Tuples: []tuple.Tuple{{Type: tuple.Stable}, {Type: tuple.Boundary, STime: 7}}}
	if last, final, err := renumberStable(b); err != nil || final || last != 3 || b.Tuples[1].ID != 3 {
		t.Fatalf("no final boundary: %d, %t, %v, id %d", last, final, err, b.Tuples[1].ID)
	}
}
