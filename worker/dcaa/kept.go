package dcaa

import (
	"slices"
	"sort"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Releaser is what a delivered batch's memory goes back to once the
// machine no longer needs any of its tuples (dataplane.Batch implements
// it: its arrays return to the decoder's pool). See Deliver.Owner.
type Releaser interface{ Release() }

// heldBatch counts the segments of kept stable data that alias one
// delivered batch. When the count falls to zero the batch's owner is
// handed back (at the start of the next Step, when no run of the Step
// that dropped them is read any more). owner is nil once the batch is
// pinned: some of its tuples (or their values) are referenced from
// somewhere the count does not track (tentative data, a tuple kept out
// of stime order), so its memory is never reused; the garbage collector
// takes it when nothing refers to it.
type heldBatch struct {
	owner Releaser
	segs  int
}

// keptSeg is a run of kept stable tuples. ts is either a slice of a
// delivered batch's own tuples (held set: no copy) or memory the machine
// owns (held nil: a copy of tuples delivered without an owner, tuples
// taken one by one, a Resume's). start is the absolute index of ts[0] in
// the input's kept sequence.
type keptSeg struct {
	ts    []tuple.Tuple
	start int
	held  *heldBatch
}

// keptStore is an input's stable data above the drop point, in (stime,
// arrival) order: the concatenation of its segments. Indexes handed out
// (from, slices) are logical, 0 being the first kept tuple; segments
// carry absolute indexes (base is the first kept tuple's), so dropping
// from the head renumbers nothing.
//
// The all-stable path keeps each delivered run of stable tuples as a
// segment of the delivered batch itself, so a stable tuple is never
// copied between its decoding and the operator, and the batch's arrays
// go back to the decoder's pool once its last tuple is released. A
// segment's memory is only read and, in a stable release, handed to the
// operators (which may change the tuples: a stable release is never
// released again); tuples are inserted only by splitting segments, never
// by moving a batch's tuples.
type keptStore struct {
	segs      []keptSeg
	base, end int
}

func (k *keptStore) len() int { return k.end - k.base }

// lastSTime is the stime of the last kept tuple (ok false: none kept).
func (k *keptStore) lastSTime() (int64, bool) {
	if len(k.segs) == 0 {
		return 0, false
	}
	ts := k.segs[len(k.segs)-1].ts
	return ts[len(ts)-1].STime, true
}

// appendSeg keeps ts, in order after everything kept, as a segment (held:
// ts aliases that batch; nil: ts is the machine's).
func (k *keptStore) appendSeg(ts []tuple.Tuple, held *heldBatch) {
	if len(ts) == 0 {
		return
	}
	if held != nil {
		held.segs++
	} else {
		// No spare capacity: appending to this segment (add) must not
		// write over memory another segment may alias.
		ts = ts[:len(ts):len(ts)]
	}
	k.segs = append(k.segs, keptSeg{ts: ts, start: k.end, held: held})
	k.end += len(ts)
}

// add keeps one tuple (a copy, in memory the machine owns) in (stime,
// arrival) order: after the last kept tuple with the same or a lower
// stime. Appended at the end, it goes into the last segment when that is
// the machine's own memory; otherwise the segment it falls into is split
// around it. Rare (a tuple out of stime order, a Resume), so the
// renumbering of the segments after it is fine.
func (k *keptStore) add(t tuple.Tuple) {
	n := len(k.segs)
	if last, ok := k.lastSTime(); !ok || last <= t.STime {
		if n > 0 && k.segs[n-1].held == nil {
			k.segs[n-1].ts = append(k.segs[n-1].ts, t)
			k.end++
			return
		}
		k.appendSeg([]tuple.Tuple{t}, nil)
		return
	}
	at := k.base + k.from(t.STime+1) // absolute insertion point, < k.end
	s := k.segAt(at)
	seg := k.segs[s]
	off := at - seg.start
	switch {
	case off == 0 && s > 0 && k.segs[s-1].held == nil:
		// At the end of the previous segment, which is ours.
		k.segs[s-1].ts = append(k.segs[s-1].ts, t)
	case off == 0:
		k.segs = slices.Insert(k.segs, s, keptSeg{ts: []tuple.Tuple{t}})
	default:
		// Split seg around the new tuple. The head keeps no spare
		// capacity, so that appending to it never writes over the tail.
		head, tail := seg.ts[:off:off], seg.ts[off:]
		if seg.held != nil {
			seg.held.segs++
		}
		k.segs[s].ts = head
		k.segs = slices.Insert(k.segs, s+1, keptSeg{ts: []tuple.Tuple{t}}, keptSeg{ts: tail, held: seg.held})
	}
	k.end++
	k.renumber(s)
}

// renumber recomputes the segments' starts from segment s on.
func (k *keptStore) renumber(s int) {
	if s >= len(k.segs) {
		return
	}
	at := k.base
	if s > 0 {
		at = k.segs[s-1].start + len(k.segs[s-1].ts)
	}
	for ; s < len(k.segs); s++ {
		k.segs[s].start = at
		at += len(k.segs[s].ts)
	}
	k.end = at
}

// segAt is the index of the segment holding absolute index at (base <=
// at < end).
func (k *keptStore) segAt(at int) int {
	return sort.Search(len(k.segs), func(s int) bool { return k.segs[s].start+len(k.segs[s].ts) > at })
}

// from is the logical index of the first kept tuple with stime >= st.
func (k *keptStore) from(st int64) int {
	s := sort.Search(len(k.segs), func(s int) bool {
		ts := k.segs[s].ts
		return ts[len(ts)-1].STime >= st
	})
	if s == len(k.segs) {
		return k.len()
	}
	seg := k.segs[s]
	i, _ := slices.BinarySearchFunc(seg.ts, st, func(t tuple.Tuple, st int64) int {
		if t.STime < st {
			return -1
		}
		return 1
	})
	return seg.start + i - k.base
}

// appendRange appends to dst the kept tuples [i, j) (logical), as slices
// of the segments' memory in order.
func (k *keptStore) appendRange(dst [][]tuple.Tuple, i, j int) [][]tuple.Tuple {
	if i >= j {
		return dst
	}
	lo, hi := k.base+i, k.base+j
	for s := k.segAt(lo); s < len(k.segs) && k.segs[s].start < hi; s++ {
		seg := k.segs[s]
		a, b := max(lo, seg.start)-seg.start, min(hi, seg.start+len(seg.ts))-seg.start
		dst = append(dst, seg.ts[a:b:b])
	}
	return dst
}

// drop forgets the first n kept tuples (released for good, or shed).
// Batches none of whose tuples stay kept go to done (their owners), to
// be handed back once the current Step's runs, which may read them, are
// processed.
func (k *keptStore) drop(n int, done []Releaser) []Releaser {
	if n <= 0 {
		return done
	}
	to := k.base + n
	gone := 0
	for gone < len(k.segs) && k.segs[gone].start+len(k.segs[gone].ts) <= to {
		if h := k.segs[gone].held; h != nil {
			h.segs--
			if h.segs == 0 && h.owner != nil {
				done = append(done, h.owner)
			}
		}
		gone++
	}
	if gone > 0 {
		rest := copy(k.segs, k.segs[gone:])
		clear(k.segs[rest:])
		k.segs = k.segs[:rest]
	}
	if len(k.segs) > 0 {
		seg := &k.segs[0]
		if off := to - seg.start; off > 0 {
			seg.ts, seg.start = seg.ts[off:], to
		}
	}
	k.base = to
	return done
}

// each calls f for every kept tuple in order.
func (k *keptStore) each(f func(*tuple.Tuple)) {
	for _, seg := range k.segs {
		for i := range seg.ts {
			f(&seg.ts[i])
		}
	}
}
