package dataplane

import (
	"slices"
	"testing"
)

// Positions outside the stable view: offsets count them up to a position,
// an open range counts everything appended since it opened, and a copy
// continuing the stream from a position gets the same offsets from there.
func TestPositionOffsets(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	if got := b.PositionOffset(100); got != 0 {
		t.Fatalf("a stream never tentative: offset %d", got)
	}
	b.BeginNonStable(11) // tentative tuples from 11 on
	if got := b.PositionOffset(13); got != 3 {
		t.Fatalf("open range at 13: offset %d, want 3", got)
	}
	b.EndNonStable(14)      // UNDO at 14
	b.MarkNonStable(20, 20) // REC_DONE at 20
	b.MarkNonStable(20, 20) // marked twice: once
	b.MarkNonStable(21, 21) // an UNDO right after: merged
	want := map[uint64]uint64{10: 0, 11: 1, 14: 4, 19: 4, 20: 5, 21: 6, 100: 6}
	for p, w := range want {
		if got := b.PositionOffset(p); got != w {
			t.Errorf("offset at %d: %d, want %d", p, got, w)
		}
	}
	base, ranges := b.NonStableFrom(13)
	if base != 2 || !slices.Equal(ranges, []PosRange{{13, 14}, {20, 21}}) {
		t.Fatalf("from 13: base %d ranges %v", base, ranges)
	}
	c := NewOutputBuffer(BufferOptions{})
	c.RestoreNonStable(base, ranges)
	for p, w := range want {
		if p < 12 {
			continue
		}
		if got := c.PositionOffset(p); got != w {
			t.Errorf("copy: offset at %d: %d, want %d", p, got, w)
		}
	}
	b.EndNonStable(30) // nothing open: no effect
	if got := b.PositionOffset(100); got != 6 {
		t.Fatalf("after a stray end: offset %d, want 6", got)
	}
}

// A stream's lineage: 0 until its producer diverges, then a nonzero one
// of its own, kept by later divergences, the shared ids ending at the
// lowest stable id any divergence named; readers of two lineages share
// ids up to there.
func TestLineage(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	if lin, since := b.Lineage(); lin != 0 || since != 0 {
		t.Fatalf("a new stream: lineage %d since %d", lin, since)
	}
	b.Diverge(40)
	lin1, since1 := b.Lineage()
	b.Diverge(90) // a later divergence of the same copy: same lineage
	lin2, since2 := b.Lineage()
	if lin1 == 0 || lin2 != lin1 || since1 != 40 || since2 != 40 {
		t.Fatalf("lineages %d (since %d), %d (since %d)", lin1, since1, lin2, since2)
	}
	if c := NewOutputBuffer(BufferOptions{}); func() bool { c.Diverge(40); l, _ := c.Lineage(); return l == lin1 }() {
		t.Fatal("two streams took the same lineage")
	}
	for _, c := range []struct {
		lin, since, lin2, since2, after uint64
		want                            bool
	}{
		{0, 0, 0, 0, 1000, true},
		{lin2, 40, lin2, 40, 1000, true},
		{lin2, 40, 0, 0, 40, true},
		{lin2, 40, 0, 0, 41, false},
		{0, 0, lin1, 40, 41, false},
		{lin1, 40, 99, 30, 35, false},
		{lin1, 40, 99, 30, 30, true},
	} {
		if got := SameStableIDs(c.lin, c.since, c.lin2, c.since2, c.after); got != c.want {
			t.Errorf("SameStableIDs(%d, %d, %d, %d, %d) = %v, want %v", c.lin, c.since, c.lin2, c.since2, c.after, got, c.want)
		}
	}
}
