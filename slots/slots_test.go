package slots

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
)

func TestCountMatchesQueryspec(t *testing.T) {
	if Count != queryspec.NumSlots {
		t.Fatalf("slots.Count = %d, queryspec.NumSlots = %d", Count, queryspec.NumSlots)
	}
}

func TestSetOperations(t *testing.T) {
	a := Range(0, 100)
	b := Range(50, 150)
	if got := a.Union(b); got != Range(0, 150) {
		t.Fatalf("union = %s", got)
	}
	if got := a.Intersect(b); got != Range(50, 100) {
		t.Fatalf("intersect = %s", got)
	}
	if got := a.Minus(b); got != Range(0, 50) {
		t.Fatalf("minus = %s", got)
	}
	if !a.Overlaps(b) || a.Overlaps(Range(100, 200)) {
		t.Fatal("overlaps wrong")
	}
	if !All().Contains(a) || a.Contains(b) {
		t.Fatal("contains wrong")
	}
	if All().Len() != Count || (Set{}).Len() != 0 || !(Set{}).IsEmpty() || a.Len() != 100 {
		t.Fatal("len wrong")
	}
	s := Of(3, 64, 4095)
	if got := slices.Collect(s.Slots()); !slices.Equal(got, []int{3, 64, 4095}) {
		t.Fatalf("slots = %v", got)
	}
	s.Remove(64)
	if s.Has(64) || !s.Has(3) || s.Has(-1) || s.Has(Count) {
		t.Fatal("has/remove wrong")
	}
}

// OfPartition agrees with queryspec.PartitionOfSlot for every slot and
// partition count, and the partitions' sets tile the slots.
func TestOfPartitionMatchesRouting(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7, 100, 4096, 5000} {
		var union Set
		for p := range n {
			s := OfPartition(p, n)
			if union.Overlaps(s) {
				t.Fatalf("n=%d: partition %d overlaps another", n, p)
			}
			union = union.Union(s)
			for x := range s.Slots() {
				if got := queryspec.PartitionOfSlot(x, n); got != p {
					t.Fatalf("n=%d: slot %d in partition %d's set but routed to %d", n, x, p, got)
				}
			}
		}
		if union != All() {
			t.Fatalf("n=%d: partitions cover %d slots", n, union.Len())
		}
	}
}

func TestStringParseAndBinaryRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sets := []Set{{}, All(), Range(0, 1024), Of(0, 2, 4, 4095)}
	for range 50 {
		var s Set
		for range r.IntN(200) {
			lo := r.IntN(Count)
			s = s.Union(Range(lo, lo+r.IntN(40)))
		}
		sets = append(sets, s)
	}
	for _, s := range sets {
		got, err := Parse(s.String())
		if err != nil || got != s {
			t.Fatalf("parse(%q) = %s, %v", s.String(), got, err)
		}
		b, _ := s.MarshalBinary()
		var back Set
		if err := back.UnmarshalBinary(b); err != nil || back != s {
			t.Fatalf("binary round trip of %s: %s, %v", s, back, err)
		}
	}
	if got := Of(1, 2, 3, 7).String(); got != "1-3,7" {
		t.Fatalf("string = %q", got)
	}
}

func TestBadInput(t *testing.T) {
	for _, text := range []string{"x", "1-", "5-2", "-1", "4096", "0-4096", "1,,2"} {
		if _, err := Parse(text); !errors.Is(err, ErrBadSlot) {
			t.Errorf("Parse(%q): %v, want ErrBadSlot", text, err)
		}
	}
	for _, b := range [][]byte{{}, {1}, {1, 0}, {1, 0, 0}, {2, 0, 2, 1, 1}, {1, 0xff, 0x7f, 1}, {1, 0xff, 0x1f, 2}} {
		var s Set
		if err := s.UnmarshalBinary(b); !errors.Is(err, ErrBadEncoding) {
			t.Errorf("UnmarshalBinary(%v): %v, want ErrBadEncoding", b, err)
		}
	}
}
