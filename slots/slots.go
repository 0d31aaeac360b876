// Package slots is the set of hash slots keyed state is split into, and
// the set type (Set) that names which slots a partition owns, which slots
// a snapshot holds and which move in a rescale. It is a leaf package: the
// coordinator (slot ownership maps) and the worker (operator state, the
// runtime) both use it and it uses neither.
//
// A key's slot is computed by queryspec.Slot; Count must equal
// queryspec.NumSlots (a test checks it).
package slots

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math/bits"
	"strconv"
	"strings"
)

// Count is the number of hash slots: slots are 0 .. Count-1.
const Count = 4096

const words = Count / 64

// ErrBadSlot means a slot number outside 0 .. Count-1, or a malformed slot
// list (Parse).
var ErrBadSlot = errors.New("slots: bad slot")

// ErrBadEncoding means UnmarshalBinary was given bytes MarshalBinary did
// not produce (truncated, overlapping or out-of-range ranges).
var ErrBadEncoding = errors.New("slots: bad set encoding")

// Set is a set of slots: a 4096-bit bitset (512 bytes), a value type. The
// zero Set is empty; Sets compare with ==.
type Set struct {
	w [words]uint64
}

// All returns the set of every slot.
func All() Set {
	var s Set
	for i := range s.w {
		s.w[i] = ^uint64(0)
	}
	return s
}

// Of returns the set of the given slots. It panics on a slot out of range
// (a programming error; use Parse for input).
func Of(slots ...int) Set {
	var s Set
	for _, x := range slots {
		s.Add(x)
	}
	return s
}

// Range returns the slots lo .. hi-1, clamped to 0 .. Count.
func Range(lo, hi int) Set {
	lo, hi = max(lo, 0), min(hi, Count)
	var s Set
	for x := lo; x < hi; x++ {
		s.w[x/64] |= 1 << (x % 64)
	}
	return s
}

// OfPartition returns the slots partition p of n owns under the default
// assignment (queryspec.PartitionOfSlot: slot*n/Count == p), a contiguous
// range. n < 1 is treated as 1.
func OfPartition(p, n int) Set {
	n = max(n, 1)
	if p < 0 || p >= n {
		return Set{}
	}
	// The first slot x with x*n/Count >= p is ceil(p*Count/n).
	lo := (p*Count + n - 1) / n
	hi := ((p+1)*Count + n - 1) / n
	return Range(lo, hi)
}

func check(x int) {
	if x < 0 || x >= Count {
		panic(fmt.Sprintf("slots: slot %d out of range 0..%d", x, Count-1))
	}
}

// Add puts slot x in the set. It panics when x is out of range.
func (s *Set) Add(x int) {
	check(x)
	s.w[x/64] |= 1 << (x % 64)
}

// Remove takes slot x out of the set. It panics when x is out of range.
func (s *Set) Remove(x int) {
	check(x)
	s.w[x/64] &^= 1 << (x % 64)
}

// Has reports whether slot x is in the set (false when out of range).
func (s Set) Has(x int) bool {
	if x < 0 || x >= Count {
		return false
	}
	return s.w[x/64]&(1<<(x%64)) != 0
}

// Len returns the number of slots in the set.
func (s Set) Len() int {
	n := 0
	for _, w := range s.w {
		n += bits.OnesCount64(w)
	}
	return n
}

// IsEmpty reports whether the set has no slot.
func (s Set) IsEmpty() bool { return s == Set{} }

// Union returns s ∪ o.
func (s Set) Union(o Set) Set {
	for i := range s.w {
		s.w[i] |= o.w[i]
	}
	return s
}

// Intersect returns s ∩ o.
func (s Set) Intersect(o Set) Set {
	for i := range s.w {
		s.w[i] &= o.w[i]
	}
	return s
}

// Minus returns s \ o.
func (s Set) Minus(o Set) Set {
	for i := range s.w {
		s.w[i] &^= o.w[i]
	}
	return s
}

// Overlaps reports whether s and o share a slot.
func (s Set) Overlaps(o Set) bool {
	for i := range s.w {
		if s.w[i]&o.w[i] != 0 {
			return true
		}
	}
	return false
}

// Contains reports whether every slot of o is in s.
func (s Set) Contains(o Set) bool { return o.Minus(s).IsEmpty() }

// Slots iterates over the set's slots in increasing order.
func (s Set) Slots() iter.Seq[int] {
	return func(yield func(int) bool) {
		for i, w := range s.w {
			for w != 0 {
				b := bits.TrailingZeros64(w)
				if !yield(i*64 + b) {
					return
				}
				w &^= 1 << b
			}
		}
	}
}

// ranges calls f with each maximal run lo .. hi-1 of slots, in order.
func (s Set) ranges(f func(lo, hi int)) {
	lo := -1
	for x := 0; x <= Count; x++ {
		in := x < Count && s.w[x/64]&(1<<(x%64)) != 0
		switch {
		case in && lo < 0:
			lo = x
		case !in && lo >= 0:
			f(lo, x)
			lo = -1
		}
	}
}

// String lists the set as ranges, e.g. "0-1023,2048,3000-3001"; the empty
// set is "". Parse reads it back.
func (s Set) String() string {
	var b strings.Builder
	s.ranges(func(lo, hi int) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(lo))
		if hi-1 > lo {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(hi - 1))
		}
	})
	return b.String()
}

// Parse reads a slot list as String writes it: comma-separated slots or
// inclusive ranges "lo-hi", in any order, overlaps allowed; "" is empty.
func Parse(text string) (Set, error) {
	var s Set
	if strings.TrimSpace(text) == "" {
		return s, nil
	}
	for _, part := range strings.Split(text, ",") {
		part = strings.TrimSpace(part)
		loText, hiText, isRange := strings.Cut(part, "-")
		lo, err := strconv.Atoi(strings.TrimSpace(loText))
		if err != nil {
			return Set{}, fmt.Errorf("%w: %q in %q is not a slot or range", ErrBadSlot, part, text)
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(strings.TrimSpace(hiText)); err != nil {
				return Set{}, fmt.Errorf("%w: %q in %q is not a slot or range", ErrBadSlot, part, text)
			}
		}
		if lo < 0 || hi >= Count || lo > hi {
			return Set{}, fmt.Errorf("%w: %q in %q: slots are 0..%d, low before high", ErrBadSlot, part, text, Count-1)
		}
		s = s.Union(Range(lo, hi+1))
	}
	return s, nil
}

// AppendBinary appends the set's encoding: the number of runs, then each
// run as (start, length), all uvarints. A partition's contiguous range
// takes a few bytes; the worst case (every other slot) about 6 KB.
func (s Set) AppendBinary(b []byte) ([]byte, error) {
	var runs [][2]int
	s.ranges(func(lo, hi int) { runs = append(runs, [2]int{lo, hi - lo}) })
	b = binary.AppendUvarint(b, uint64(len(runs)))
	for _, r := range runs {
		b = binary.AppendUvarint(b, uint64(r[0]))
		b = binary.AppendUvarint(b, uint64(r[1]))
	}
	return b, nil
}

// MarshalBinary encodes the set (see AppendBinary).
func (s Set) MarshalBinary() ([]byte, error) { return s.AppendBinary(nil) }

// UnmarshalBinary decodes exactly one encoded set.
func (s *Set) UnmarshalBinary(data []byte) error {
	got, n, err := Decode(data)
	if err != nil {
		return err
	}
	if n != len(data) {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadEncoding, len(data)-n)
	}
	*s = got
	return nil
}

// Decode reads an encoded set from the start of data and returns it with
// the number of bytes it took. Runs must be increasing, non-empty,
// non-adjacent and within range, so every set has one encoding.
func Decode(data []byte) (Set, int, error) {
	var s Set
	off := 0
	next := func() (int, error) {
		v, k := binary.Uvarint(data[off:])
		if k <= 0 || v > Count {
			return 0, fmt.Errorf("%w: truncated or out of range", ErrBadEncoding)
		}
		off += k
		return int(v), nil
	}
	n, err := next()
	if err != nil {
		return Set{}, 0, err
	}
	end := -1 // end of the previous run
	for range n {
		lo, err := next()
		if err != nil {
			return Set{}, 0, err
		}
		length, err := next()
		if err != nil {
			return Set{}, 0, err
		}
		if length == 0 || lo <= end || lo+length > Count {
			return Set{}, 0, fmt.Errorf("%w: run %d+%d after %d", ErrBadEncoding, lo, length, end)
		}
		s = s.Union(Range(lo, lo+length))
		end = lo + length
	}
	return s, off, nil
}
