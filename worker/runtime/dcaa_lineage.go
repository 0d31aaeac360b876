package runtime

import (
	"math"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// A task's input after a switch of upstream replicas (DCAA,
// docs/DATAPLANE.md "Lineage of stable ids"). Replicas of an upstream
// share their stable ids until one of them puts an UNCORRECTABLE record
// on its stream: from the stable id it diverged after on, the same id may
// name other results on the two. An input that switches replicas resumes
// by its stable id; past the ids both share, the new replica's stream
// then repeats or skips results around the switch. The input cannot tell
// which ones from ids, but it can bound them by stream time: between the
// last stable stream time it took and the first one it takes from the new
// replica. lineageWatch finds that range, which the task names like an
// upstream's UNCORRECTABLE record (relayed, widened by its window, noted
// in its status, its own output's lineage changed), so a switch onto a
// diverged replica is never silent. Run by the input's delivery only.
type lineageWatch struct {
	// lin, since: the lineage of the stream taken so far (known: a batch
	// came); attempt: the subscription it came on (machine inputs, which
	// have no fresh flag).
	lin, since uint64
	known      bool
	attempt    uint64
	// lastST is the stream time of the last stable tuple or boundary
	// taken (haveST: one was).
	lastST int64
	haveST bool
	// pending: the current subscription reads ids that do not mean what
	// the input took (from: lastST then); the range is known at the
	// first stable tuple it takes from there.
	pending bool
	from    int64
	// lastBoundary: the last taken was a boundary (machine inputs; see
	// realignFrom); re: a realignment in progress (machine inputs).
	lastBoundary bool
	re           realignState
}

// batch is called with every batch before its stable tuples are taken:
// fresh when it is a subscription's first, taken the input's stable id
// before it.
func (w *lineageWatch) batch(fresh bool, lin, since, taken uint64) {
	if fresh && w.known && w.haveST && taken > 0 && !w.pending &&
		!dataplane.SameStableIDs(w.lin, w.since, lin, since, taken) {
		w.pending, w.from = true, w.lastST
	}
	w.lin, w.since, w.known = lin, since, true
}

// took is called with the stream time of each stable tuple or boundary
// taken, in order (at least the batch's first and last). While a switch
// is pending, the first one gives the range [from, to) of stream times
// whose results may be repeated or missing (ok).
func (w *lineageWatch) took(st int64) (from, to int64, ok bool) {
	if w.pending {
		w.pending = false
		from, to = min(st, w.from), max(st, w.from)
		if to < math.MaxInt64 {
			to++
		}
		ok = true
	}
	w.lastST, w.haveST = st, true
	return from, to, ok
}

// An operator task's input (run by its machine) does not only name such a
// switch: it realigns, as `fedstream tail` does on a diverged sink copy.
// On a subscription's first batch whose lineage does not share the stable
// ids up to the one taken (startRealign), the input subscribes again to
// the same replica after the last id both numberings share (resumeAt)
// and takes that replica's stable stream by stream time (realignFrom): a
// stable tuple below the last stream time taken, or a boundary at it
// when the last taken was a boundary, was taken already from the other
// replica; the first one past it is new, and the input follows the new
// replica's numbering from there (dcaa.Deliver.Renumber). Outside the
// ranges upstreams named, the input then neither skips nor repeats; it
// names only what it cannot vouch for: the last stream time taken when
// the first new tuple shares it (how many results of that stream time it
// took cannot be told from ids of another numbering), or, when the
// replica no longer holds the ids after resumeAt, the stream times up to
// the first tuple it sends.

// realignState is the lineage watch's realignment in progress.
type realignState struct {
	// on: realigning; resumeAt: the last stable id both numberings
	// share, which the input resubscribes after.
	on       bool
	resumeAt uint64
	// seen: a stable tuple or boundary came since; gapped: the first
	// one's id was past resumeAt+1 (the replica no longer held the ones
	// between); dropped: one was dropped as taken.
	seen, gapped, dropped bool
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
	w.pending = false
	return true
}

// realignFrom scans a batch (stable ids set) of the realigning
// subscription. cut is the index of the first stable tuple or boundary
// that is new (len(ts): none in this batch, all of it was taken or is
// tentative output before that point); named reports a range [from, to)
// of stream times the input cannot vouch for. keep lists the ranges of
// UNCORRECTABLE records before cut that still concern what the input
// takes from here (ending past the last stream time taken). At cut the
// realignment ends: the watch takes the replica's lineage.
func (w *lineageWatch) realignFrom(ts []tuple.Tuple) (cut int, from, to int64, named bool, keep [][2]int64) {
	for k := range ts {
		tp := &ts[k]
		switch tp.Type {
		case tuple.Uncorrectable:
			if f, e, ok := tuple.UncorrectableRange(tp); ok && e > w.lastST {
				keep = append(keep, [2]int64{f, e})
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
		if tp.STime < w.lastST || w.lastBoundary && tp.Type == tuple.Boundary && tp.STime == w.lastST {
			w.re.dropped = true
			continue
		}
		from = w.lastST
		switch {
		case w.re.gapped && !w.re.dropped:
			// Nothing at or below the last stream time came: results
			// up to this one's may be missing.
			to, named = tp.STime, true
			if to < math.MaxInt64 {
				to++
			}
		case !w.lastBoundary && tp.STime == w.lastST:
			to, named = w.lastST+1, true
		}
		w.lin, w.since, w.re.on = w.re.lin, w.re.since, false
		return k, from, to, named, keep
	}
	return len(ts), 0, 0, false, keep
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
	// records', and named: the ones the input names itself).
	marks, named [][2]int64
}

// align applies the watch to a batch of an operator task's input (stable
// ids set; fresh: the subscription's first; taken: the input's last
// stable id).
func (w *lineageWatch) align(ts []tuple.Tuple, fresh bool, lin, since, taken uint64) aligned {
	if fresh && w.startRealign(lin, since, taken) {
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
		w.batch(fresh, lin, since, taken)
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
	if firstNew >= 0 {
		lastStable := firstNew
		for k := len(ts) - 1; k > firstNew; k-- {
			if tp := ts[k].Type; tp == tuple.Stable || tp == tuple.Boundary {
				lastStable = k
				break
			}
		}
		if from, to, ok := w.took(ts[firstNew].STime); ok {
			a.named = append(a.named, [2]int64{from, to})
		}
		w.took(ts[lastStable].STime)
		w.lastBoundary = ts[lastStable].Type == tuple.Boundary
	}
	a.marks = append(a.marks, a.named...)
	a.marks = append(a.marks, markersOf(ts)...)
	return a
}
