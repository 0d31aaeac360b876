package dataplane

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// An acknowledgement by stable id tagged with its lineage (StableTag): in
// the stream's own numbering it is taken by id as always; in another
// (the stream diverged, or the consumer's did), past the ids both share
// it is taken by stream time only, keeping the last stable tuple or
// boundary below the consumer's stream time; untagged (an older build)
// by id, as before.
func TestTaggedPositionTakesAnotherLineageByStreamTime(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	// Positions: 1 a record (outside the stable view), then stable
	// tuples and boundaries at 40, 45, 50, 55, 60 ms (stable ids 1-5).
	b := NewOutputBuffer(BufferOptions{})
	b.MarkNonStable(1, 1)
	ts := []tuple.Tuple{tuple.UncorrectableMarker(math.MinInt64, ms(55)),
		{Type: tuple.Stable, STime: ms(40), Values: []tuple.Value{tuple.Int(1)}}, {Type: tuple.Boundary, STime: ms(45)},
		{Type: tuple.Stable, STime: ms(50), Values: []tuple.Value{tuple.Int(2)}}, {Type: tuple.Boundary, STime: ms(55)},
		{Type: tuple.Stable, STime: ms(60), Values: []tuple.Value{tuple.Int(3)}}}
	for i := range ts {
		ts[i].ID = uint64(i + 1)
		if err := b.Append(context.Background(), &ts[i]); err != nil {
			t.Fatal(err)
		}
	}
	b.Diverge(0)
	lin, since := b.Lineage()
	for _, c := range []struct {
		what string
		g    StableTag
		pos  uint64
		same bool
	}{
		{"untagged (an older build): by id", StableTag{ID: 3}, 3, true},
		{"this lineage: by id", StableTag{Known: true, ID: 3, Lineage: lin, Since: since, STime: ms(45)}, 4, true},
		{"the shared numbering at 55 ms: up to the last one below it, kept", StableTag{Known: true, ID: 20, STime: ms(55)}, 3, false},
		{"the shared numbering at 45 ms: keeps the result at 40 ms", StableTag{Known: true, ID: 9, STime: ms(45)}, 1, false},
		{"the shared numbering at 35 ms: nothing", StableTag{Known: true, ID: 6, STime: ms(35)}, 0, false},
		{"nothing taken yet", StableTag{Known: true, ID: 0, STime: NoSTime}, 0, true},
		{"past everything: keeps the last", StableTag{Known: true, ID: 99, STime: ms(99)}, 5, false},
	} {
		if pos, same := b.TaggedPosition(c.g); pos != c.pos || same != c.same {
			t.Errorf("%s: TaggedPosition(%+v) = %d, %v; want %d, %v", c.what, c.g, pos, same, c.pos, c.same)
		}
	}
	// Applied by a relay: the record and the copy's first result stay
	// for a reader that took less.
	b.Connect("relay")
	g := StableTag{Known: true, ID: 20, STime: ms(55)}
	b.Ack("relay", b.relayedPosition(true, 20, g))
	if st := b.Stats(); st.OldestID != 4 {
		t.Fatalf("after a relayed acknowledgement of another lineage at 55 ms: oldest retained %d, want 4 (the result at 50 ms, the last one below 55 ms)", st.OldestID)
	}
}
