package runtime

import (
	"math"
	"slices"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// A task's input after a switch of upstream replicas (DCAA,
// docs/DATAPLANE.md "Lineage of stable ids"). Replicas of an upstream
// share their stable ids until one of them puts an UNCORRECTABLE record
// on its stream: from the stable id it diverged after on, the same id may
// name other results on the two. An input that resumed by its stable id on
// a replica that numbers the ids after it otherwise would repeat or skip
// results around the switch. lineageWatch follows the lineage of the
// stream taken and where it was taken to (the stream time of the last
// stable tuple or boundary), so that the input realigns instead (below).
// Every DCAA input has one: an operator task's (run by its machine, see
// align) and a sink's (pass-through: passBatchDCAA; merging: filterDCAA).
// Run by the input's delivery only (and by its run loop between two
// subscriptions).
type lineageWatch struct {
	// lin, since: the lineage of the stream taken so far (known: a batch
	// came); attempt: the subscription it came on (machine inputs, which
	// have no fresh flag).
	lin, since uint64
	known      bool
	attempt    uint64
	// lastST is the stream time of the last stable tuple or boundary
	// taken (haveST: one was); lastBoundary: that one was a boundary;
	// atST: how many stable tuples (not boundaries) of stream time
	// lastST were taken, the ones a realignment drops at it.
	lastST       int64
	haveST       bool
	lastBoundary bool
	atST         int
	// re: a realignment in progress.
	re realignState
	// carried: the ranges of the UNCORRECTABLE records the producer
	// put on the stream read now, as its first batch carried them
	// (dataplane.Batch.Named): some records may lie among the positions
	// discarded before this input read them.
	carried [][2]int64
}

// subscribed records the ranges a subscription's first batch carried.
func (w *lineageWatch) subscribed(named [][2]int64) { w.carried = named }

// concerning returns the carried ranges that concern what the input
// takes from here: ending past the last stream time taken, cut to start
// there (what it took below came from where it read before, as exact as
// that stream's own records said). The input names them when it may
// have skipped their records: realigning onto the stream, or resuming
// over ids it no longer holds. A range it named already comes out within
// that one, and is not named twice (uncorrectableSeen).
func (w *lineageWatch) concerning() [][2]int64 {
	var out [][2]int64
	for _, r := range w.carried {
		if !w.haveST {
			out = append(out, r)
		} else if r[1] > w.lastST {
			out = append(out, [2]int64{max(r[0], w.lastST), r[1]})
		}
	}
	return out
}

// batch records the lineage of a batch taken by id (not realigning).
func (w *lineageWatch) batch(lin, since uint64) {
	w.lin, w.since, w.known = lin, since, true
}

// tag is stable id sid of the stream taken so far, stated with its
// lineage and the last stream time taken (dataplane.StableTag; unknown
// before a batch came).
func (w *lineageWatch) tag(sid uint64) dataplane.StableTag {
	if !w.known {
		return dataplane.StableTag{ID: sid}
	}
	st := int64(dataplane.NoSTime)
	if w.haveST {
		st = w.lastST
	}
	return dataplane.StableTag{Known: true, ID: sid, Lineage: w.lin, Since: w.since, STime: st}
}

// took records a stable tuple or boundary taken (its stream time and
// whether it is a boundary), called for each in order, or at least for
// the ones of the last stream time taken (tookTail).
func (w *lineageWatch) took(st int64, boundary bool) {
	if !w.haveST || st != w.lastST {
		w.atST = 0
	}
	if !boundary {
		w.atST++
	}
	w.lastST, w.haveST, w.lastBoundary = st, true, boundary
}

// tookTail records the stable tuples and boundaries of ts (taken, in
// order; other tuples are passed over): only the ones of its last stream
// time count (took), found from the end, so that a batch taken whole
// costs a few steps.
func (w *lineageWatch) tookTail(ts []tuple.Tuple) {
	from := len(ts)
	for k := len(ts) - 1; k >= 0; k-- {
		if tp := ts[k].Type; tp != tuple.Stable && tp != tuple.Boundary {
			continue
		}
		if from < len(ts) && ts[k].STime != ts[from].STime {
			break
		}
		from = k
	}
	for k := from; k < len(ts); k++ {
		if tp := ts[k].Type; tp == tuple.Stable || tp == tuple.Boundary {
			w.took(ts[k].STime, tp == tuple.Boundary)
		}
	}
}

// tookTailEncoded is tookTail for an encoded batch taken whole (the
// tuples at offs in data): a pass-through sink's all-stable path, which
// decodes nothing else.
func (w *lineageWatch) tookTailEncoded(offs []int, data []byte) error {
	var h tuple.Tuple
	from, st := len(offs), int64(0)
	for k := len(offs) - 1; k >= 0; k-- {
		if _, err := tuple.DecodeHeader(data[offs[k]:], &h); err != nil {
			return err
		}
		if h.Type != tuple.Stable && h.Type != tuple.Boundary {
			continue
		}
		if from < len(offs) && h.STime != st {
			break
		}
		from, st = k, h.STime
	}
	for k := from; k < len(offs); k++ {
		if tp := tuple.PeekType(data[offs[k]:]); tp == tuple.Stable || tp == tuple.Boundary {
			w.took(st, tp == tuple.Boundary)
		}
	}
	return nil
}

// covers reports whether a tentative tuple at stream time st, read
// where the replica had fewer stable tuples than the input took (see
// dataplane.CoveredByStable), stands for results the input took stable.
func (w *lineageWatch) covers(st int64) bool {
	return w.haveST && dataplane.CoveredByStable(st, w.lastST, w.lastBoundary)
}

// An input realigns as `fedstream tail` does on a diverged sink copy.
// On a subscription's first batch whose lineage does not share the stable
// ids up to the one taken (startRealign), the input subscribes again to
// the same replica after the last id both numberings share (resumeAt)
// and takes that replica's stable stream by stream time (realignFrom): a
// stable tuple below the last stream time taken was taken already from
// the other replica; so were, at that stream time, as many stable tuples
// as the input took there (atST) and the boundaries among and before
// them, and a boundary after them when the last taken was one. The
// first one past those is new, and the input follows the new replica's
// numbering from there (an operator's machine: dcaa.Deliver.Renumber; a
// sink: its stable id for the input becomes the one before, see
// sinkRealign).
//
// Invariant: outside the ranges upstreams named, replicas put the same
// stable tuples and boundaries in the same order, whatever they number
// them; so the input, having taken a prefix of one replica's stable
// stream, drops the same prefix of the other's, counted at its last
// stream time, and then neither skips nor repeats. (Dropping a boundary
// at the last stream time, and taking the stable tuples there as new,
// took an aggregate's results twice, unnamed: it puts them at the
// window's end and its boundary there after them. Session 18's extra
// results of TestDCAABothReplicasLostNamesTheLoss.) The input names only
// what it cannot vouch for: when the replica no longer holds the ids
// after resumeAt and sent nothing below the last stream time taken, the
// stream times up to the first tuple it sends (it cannot count what it
// missed there).

// realignState is the lineage watch's realignment in progress.
type realignState struct {
	// on: realigning; resumeAt: the last stable id both numberings
	// share, which the input resubscribes after.
	on       bool
	resumeAt uint64
	// seen: a stable tuple or boundary came since; gapped: the first
	// one's id was past resumeAt+1 (the replica no longer held the ones
	// between); dropped: one was dropped as taken; below: one below the
	// last stream time taken came (what the replica sends from the last
	// stream time on is whole, and is counted).
	seen, gapped, dropped, below bool
	// atST counts the stable tuples of the last stream time taken that
	// were dropped (up to lineageWatch.atST).
	atST int
	// lin, since: the lineage of the replica realigned onto, adopted
	// once a new tuple is taken.
	lin, since uint64
}

// startRealign is called with a subscription's first batch (lineage lin,
// since; taken the input's last stable id): it reports whether the
// replica numbers the ids after taken otherwise than the stream taken so
// far, and then starts a realignment (the caller resubscribes after
// w.re.resumeAt).
func (w *lineageWatch) startRealign(lin, since, taken uint64) bool {
	w.re.on = false
	if !w.known || !w.haveST || taken == 0 || dataplane.SameStableIDs(w.lin, w.since, lin, since, taken) {
		return false
	}
	common := dataplane.SharedStableIDs(w.lin, w.since, lin, since)
	w.re = realignState{on: true, resumeAt: min(common, taken), lin: lin, since: since}
	return true
}

// realignFrom scans a batch (stable ids set) of the realigning
// subscription. cut is the index of the first stable tuple or boundary
// that is new (len(ts): none in this batch, all of it was taken or is
// tentative output before that point); named reports a range [from, to)
// of stream times the input cannot vouch for. keep lists the ranges of
// UNCORRECTABLE records before cut that still concern what the input
// takes from here (ending past the last stream time taken), cut to start
// at the last stream time taken: the input took the results before it
// from the other lineage, as exact as that lineage's own records said,
// and takes none of this replica's below it. (A copy started without
// state after its replicas were lost names [start, its first input]
// (lostBeforeStart): its consumers took the lost copies' results up to
// where each left off, and name only the rest; from the start, they named
// results they had, exact.) At cut the realignment ends: the watch takes
// the replica's lineage.
func (w *lineageWatch) realignFrom(ts []tuple.Tuple) (cut int, from, to int64, named bool, keep [][2]int64) {
	for k := range ts {
		tp := &ts[k]
		switch tp.Type {
		case tuple.Uncorrectable:
			if f, e, ok := tuple.UncorrectableRange(tp); ok && e > w.lastST {
				keep = append(keep, [2]int64{max(f, w.lastST), e})
			}
			continue
		case tuple.Stable, tuple.Boundary:
		default:
			continue // tentative output before the realigned point
		}
		if !w.re.seen && !w.re.dropped {
			w.re.gapped = tp.ID > w.re.resumeAt+1
		}
		w.re.seen = true
		if tp.STime < w.lastST {
			w.re.dropped, w.re.below = true, true
			continue
		}
		if tp.STime == w.lastST && (!w.re.gapped || w.re.below) {
			// Counted: see realignState.atST.
			if w.re.atST < w.atST {
				if tp.Type == tuple.Stable {
					w.re.atST++
				}
				w.re.dropped = true
				continue
			}
			if w.lastBoundary && tp.Type == tuple.Boundary {
				w.re.dropped = true
				continue
			}
		}
		from = w.lastST
		if w.re.gapped && !w.re.below {
			// Nothing below the last stream time came: results up to
			// this one's may be missing.
			to, named = tp.STime, true
			if to < math.MaxInt64 {
				to++
			}
		}
		for _, r := range w.concerning() {
			if !slices.Contains(keep, r) {
				keep = append(keep, r)
			}
		}
		w.lin, w.since, w.re.on = w.re.lin, w.re.since, false
		return k, from, to, named, keep
	}
	return len(ts), 0, 0, false, keep
}

// start is called with every batch of an input before anything of it
// is taken (fresh: the subscription's first; taken: the input's last
// stable id): true when the input must subscribe again to realign
// (errRealign; its run loop resubscribes after w.re.resumeAt). While it
// realigns, the batch's lineage is the one it takes at the cut (a
// realignment started blind learns it here); the realigning
// subscription's own first batch is not checked again.
func (w *lineageWatch) start(fresh bool, lin, since, taken uint64) bool {
	if w.re.on {
		w.re.lin, w.re.since = lin, since
		return false
	}
	return fresh && w.startRealign(lin, since, taken)
}

// realignBlind starts a realignment on a replica that answered that its
// stream ended at or before the input's stable id
// (dataplane.ErrEndedBefore): it numbers its stable ids otherwise (or
// holds nothing the input lacks), and the answer carries no lineage, so
// the input reads it again from its start and takes it by stream time,
// as any realignment does. false: the input took nothing yet, or this
// was such a realignment already (then the replica's end is the
// input's).
func (w *lineageWatch) realignBlind() bool {
	if !w.known || !w.haveST || w.re.on && w.re.resumeAt == 0 {
		return false
	}
	w.re = realignState{on: true}
	return true
}

// sinkRealign is realignFrom for a sink's input (ts: a batch of the
// realigning subscription, stable ids set): cut is the index of the first
// new stable tuple or boundary (len(ts): none, nothing of the batch is
// taken); taken, when cut < len(ts), the input's stable id in the
// replica's numbering before it (what the sink renumbers to); marks the
// ranges the sink names: the replica's records that still concern what
// it takes, and what it cannot vouch for itself.
func (w *lineageWatch) sinkRealign(ts []tuple.Tuple) (cut int, taken uint64, marks [][2]int64) {
	cut, from, to, named, marks := w.realignFrom(ts)
	if named {
		marks = append(marks, [2]int64{from, to})
	}
	if cut < len(ts) {
		taken = ts[cut].ID - 1
	}
	return cut, taken, marks
}

// aligned is what an operator task's input does with a batch (align).
type aligned struct {
	// ts: the tuples to deliver to the machine (a tail of the batch);
	// skip: none, the batch was taken already from the other replica
	// (it is acknowledged, nothing delivered).
	ts   []tuple.Tuple
	skip bool
	// resubscribe: realign (errRealign): subscribe again to the same
	// replica after re.resumeAt; nothing of the batch is taken.
	resubscribe bool
	// renumber: the machine follows ts's numbering from its first stable
	// tuple or boundary (dcaa.Deliver.Renumber).
	renumber bool
	// marks: the UNCORRECTABLE ranges the task takes with the batch (its
	// records', and the ones the input names itself: named, what a
	// realignment cannot vouch for; gap, what a resumption over
	// discarded ids skipped, see gapAfter).
	marks, named, gap [][2]int64
}

// gapAfter is the range an input names when it resumed by stable id on
// a replica of the same numbering (not realigning: the caller checks)
// that no longer holds the ids after the input's, taken: the first
// stable tuple or boundary past taken that it sends (id, stream time st)
// is not taken+1. The ids between were discarded (acknowledged by other
// consumers, or past the replica's buffer bound) and the results needing
// them are lost for good: from the last stream time taken to st
// (included: results of that stream time may be gone too), named as an
// upstream's record would be (outside DCAA, noteInputGap does so).
func (w *lineageWatch) gapAfter(id, taken uint64, st int64) ([2]int64, bool) {
	if taken == 0 || id <= taken+1 || !w.haveST {
		return [2]int64{}, false
	}
	if st < math.MaxInt64 {
		st++
	}
	return [2]int64{w.lastST, st}, true
}

// align applies the watch to a batch of an operator task's input (stable
// ids set; fresh: the subscription's first, named the ranges it carried;
// taken: the input's last stable id).
func (w *lineageWatch) align(ts []tuple.Tuple, fresh bool, lin, since, taken uint64, named [][2]int64) aligned {
	if fresh {
		w.subscribed(named)
	}
	if w.start(fresh, lin, since, taken) {
		return aligned{resubscribe: true}
	}
	var a aligned
	firstNew := -1
	if w.re.on {
		cut, from, to, named, keep := w.realignFrom(ts)
		a.marks = keep
		if cut == len(ts) {
			a.skip = true
			return a
		}
		if named {
			a.named = append(a.named, [2]int64{from, to})
		}
		ts, firstNew, a.renumber = ts[cut:], 0, true
	} else {
		w.batch(lin, since)
		// Two short scans (usually one step each), not a pass over the
		// batch.
		for k := range ts {
			if tp := ts[k].Type; (tp == tuple.Stable || tp == tuple.Boundary) && ts[k].ID > taken {
				firstNew = k
				break
			}
		}
	}
	a.ts = ts
	if firstNew >= 0 && !a.renumber {
		if r, ok := w.gapAfter(ts[firstNew].ID, taken, ts[firstNew].STime); ok {
			a.gap = append(a.gap, r)
			a.marks = append(a.marks, w.concerning()...) // records maybe among the ids skipped
		}
	}
	if firstNew >= 0 {
		w.tookTail(ts[firstNew:])
	}
	a.marks = append(a.marks, a.named...)
	a.marks = append(a.marks, a.gap...)
	a.marks = append(a.marks, markersOf(ts)...)
	return a
}
