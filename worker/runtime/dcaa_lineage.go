package runtime

import (
	"math"

	"github.com/fedstream/fedstream/worker/dataplane"
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
