package dataplane

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// inBand is the DCAA state an output stream advertises to its
// subscribers: stamped on every batch sent, and sent alone (a heartbeat:
// a batch without tuples) when the stream has had nothing to send for a
// heartbeat interval, so that a subscriber which hears nothing at all for
// longer than its detection timeout can take the producer for failed
// (process paused, link held, worker gone). Streams of queries without
// replicas have no heartbeat and send the state unset, as before.
type inBand struct {
	state     atomic.Int32 // fedstreampb.ReplicaState
	tentWM    atomic.Int64
	heartbeat atomic.Int64 // nanoseconds; 0: no heartbeats
	// end is the position of the stream's final boundary (0: not
	// appended yet; see SetEnd).
	end atomic.Uint64
}

// ErrEndedBefore means a data subscription resumed at or after the
// position of its stream's final boundary on the replica read: that
// replica's stream is complete, and nothing it could still send (a
// REC_DONE after the end at most) ends it for the subscriber. A consumer
// that resumes by stable id gets there only when the upstream's
// replicas number their stable streams differently (after a correction
// that could not make every result exact, one has fewer stable results
// than the other): resumed past this replica's end, it waited for ever,
// hearing heartbeats, and its task never ended. It takes the end of the
// stream from this error instead.
var ErrEndedBefore = errors.New("dataplane: the replica's stream ended at or before the position resumed from")

// SetEnd records that the stream's final boundary has position pos (the
// producer calls it before it appends that boundary): a data subscriber
// resuming at or after pos is answered ErrEndedBefore.
func (b *OutputBuffer) SetEnd(pos uint64) { b.inband.end.CompareAndSwap(0, pos) }

// endedBefore reports whether a subscription resuming after id after
// starts at or past the stream's final boundary.
func (b *OutputBuffer) endedBefore(after uint64) bool {
	e := b.inband.end.Load()
	return e > 0 && after >= e
}

// endDiscardedAfter reports whether a subscription reading after position
// after can never get the stream's final boundary: the boundary lies past
// after but was discarded already (every subscriber holding the buffer
// acknowledged it; an input's ack relay acknowledges by stable id, which
// a replica that ended with fewer stable results clamps to its end).
// Such a subscription got nothing but heartbeats for ever, which no
// failure detector takes for a failure; it is answered ErrEndedBefore
// instead, as one resumed past the end (the tuples between were
// discarded: the subscription's gap warning says so). A consumer
// realigning on the replica from its start (runtime.lineageWatch's blind
// realignment) is told the same when the replica kept nothing.
func (b *OutputBuffer) endDiscardedAfter(after uint64) bool {
	e := b.inband.end.Load()
	if e == 0 || after >= e {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped >= e
}

// SetHeartbeat makes the stream send a heartbeat batch to each
// acknowledging data subscription after every interval every without
// data (0 turns heartbeats off). Tail clients get none.
func (b *OutputBuffer) SetHeartbeat(every time.Duration) { b.inband.heartbeat.Store(int64(every)) }

// Heartbeat is the heartbeat interval (0: none).
func (b *OutputBuffer) Heartbeat() time.Duration { return time.Duration(b.inband.heartbeat.Load()) }

// SetStreamState sets the producer's replica state and tentative
// watermark advertised from now on (see fedstreampb.Batch).
func (b *OutputBuffer) SetStreamState(st fedstreampb.ReplicaState, tentWM int64) {
	b.inband.tentWM.Store(tentWM)
	b.inband.state.Store(int32(st))
}

// StreamState is the advertised replica state and tentative watermark.
func (b *OutputBuffer) StreamState() (fedstreampb.ReplicaState, int64) {
	return fedstreampb.ReplicaState(b.inband.state.Load()), b.inband.tentWM.Load()
}

// stateUpTo is the state to send with the stream's tuples up to position
// last (a heartbeat: up to the subscriber's position). The tentative
// watermark says the subscriber has every tentative tuple below it, so it
// must not cover a tuple after last: a producer appends its tentative
// tuples and then raises the watermark, so a watermark read while tuples
// follow last may cover them (a consumer releasing up to it would then
// take them for late and drop them). Then no watermark is sent (0: no
// news); the message that ends at the buffer's end carries it. The lock
// is only taken while the stream is tentative.
func (b *OutputBuffer) stateUpTo(last uint64) (fedstreampb.ReplicaState, int64) {
	st, wm := b.StreamState()
	if wm == 0 {
		return st, 0
	}
	// Read after the watermark: a tuple the watermark covers was
	// appended before it was set, so it is counted here.
	b.mu.Lock()
	more := b.lastID > last
	b.mu.Unlock()
	if more {
		wm = 0
	}
	return st, wm
}

// StateFunc receives the producer's advertised state with every batch a
// subscription receives, heartbeats included (heartbeat: a message
// without tuples; see OnStreamState).
type StateFunc func(st fedstreampb.ReplicaState, tentWM int64, heartbeat bool)

// OnStreamState makes the subscriber call fn for every message it
// receives (before delivering its tuples), and, on a local stream, once
// per heartbeat interval while it waits for data: the caller learns that
// the producer is alive and what state it advertises. A batch's tentative
// watermark covers that batch's tuples and those before it, never later
// ones (see stateUpTo): a caller must not act on it before the batch is
// delivered. Call it before Run.
func (s *Subscriber) OnStreamState(fn StateFunc) { s.onState = fn }

// heartbeatTimer returns a channel firing after buf's heartbeat interval
// (nil when it has none) and its stop function.
func heartbeatTimer(buf *OutputBuffer) (<-chan time.Time, func() bool) {
	hb := buf.Heartbeat()
	if hb <= 0 {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(hb)
	return t.C, t.Stop
}

// PosRange is the positions From..To of a stream, both included.
type PosRange struct{ From, To uint64 }

// MarkNonStable records that positions from..to (both included) of the
// stream hold tuples outside its stable view: tentative tuples, UNDO,
// REC_DONE (DCAA). Replicas of a producer number their streams alike
// until one of them corrects its output; from then on a position means
// different tuples on different replicas, but the stable id (the count of
// stable tuples and boundaries up to a position: the position minus its
// offset, see PositionOffset) means the same everywhere. Ranges are
// marked in increasing order.
func (b *OutputBuffer) MarkNonStable(from, to uint64) {
	if from == 0 || to < from {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.nonStable); n > 0 {
		last := &b.nonStable[n-1]
		if from <= last.To {
			from = last.To + 1 // marked already
			if to < from {
				return
			}
		}
		if from == last.To+1 {
			last.To = to
			return
		}
	}
	b.nonStable = append(b.nonStable, PosRange{from, to})
}

// PositionOffset is how many positions up to p hold tuples outside the
// stream's stable view (0 on a stream that never went tentative).
func (b *OutputBuffer) PositionOffset(p uint64) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.positionOffsetLocked(p)
}

// positionOffsetLocked is PositionOffset; the caller holds mu.
func (b *OutputBuffer) positionOffsetLocked(p uint64) uint64 {
	off := b.nsBase
	for _, r := range b.nonStable {
		if r.From > p {
			break
		}
		off += min(r.To, p) - r.From + 1
	}
	return off
}

// PositionOfStable is the position of the stable tuple or boundary with
// stable id sid on this stream: sid plus the non-stable positions before
// it (math.MaxUint64 when this stream has not produced it yet).
func (b *OutputBuffer) PositionOfStable(sid uint64) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.positionOfStableLocked(sid)
}

func (b *OutputBuffer) positionOfStableLocked(sid uint64) uint64 {
	if sid > math.MaxUint64-b.nsBase {
		return math.MaxUint64
	}
	p := sid + b.nsBase
	for _, r := range b.nonStable {
		if r.From > p {
			break
		}
		if r.To == math.MaxUint64 || r.To-r.From+1 > math.MaxUint64-p {
			return math.MaxUint64 // in the open tentative tail: beyond
		}
		p += r.To - r.From + 1
	}
	return p
}

// ResumePosition is the position a data subscription that resumes after
// its last stable id sid (SubscribeRequest.resume_stable: a DCAA input
// or sink moving between replicas, fedstream tail moving between sink
// copies) reads after.
//
// When this stream's last positions are outside its stable view (a
// tentative tail: the open range of a producer in UP_FAILURE, or a
// sink's tentative results, each marked on its own) and that tail begins
// at or before sid, the replica went tentative before the subscriber's
// last stable tuple (it has fewer stable tuples than the replica read
// before): the subscriber reads the whole tail (the last position
// before it), keeps what lies past the stream time it took, and takes
// the replica's corrections, when they come, by stable id: those ids
// mean the same on every replica up to a divergence. Read from sid as a
// position, the tail's tuples before position sid+1 were skipped and,
// while the tail held no more than sid positions, the subscriber heard
// only heartbeats and showed no tentative result for the failure. A
// closed tail may end with its producer's UNDO (its corrections not
// appended yet): the subscriber then gets tentative tuples taken back at
// once, which it handles as any UNDO.
//
// Otherwise it reads after the position of stable id sid, when this
// stream holds it and numbers it as its peers do (no divergence before
// it): what lies between sid as a position and that one is stable ids
// it has and tentative tuples this replica took back since. Else (this
// replica has not produced sid yet, or its ids diverged) sid taken as a
// position, as always (never past the position of stable id sid).
func (b *OutputBuffer) ResumePosition(sid uint64) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sid == 0 {
		return 0
	}
	if n := len(b.nonStable); n > 0 {
		if r := b.nonStable[n-1]; (r.To == math.MaxUint64 || r.To >= b.lastID) && r.From <= sid {
			// What is left of the tail, if its start was discarded
			// (RelayedPosition gave it up): resumed before that, the
			// subscriber heard heartbeats stating this stream's state
			// there, stable, and never saw the replica's failure.
			return max(r.From-1, min(b.dropped, sid))
		}
	}
	if b.lineage != 0 && sid > b.lineageSince {
		return sid
	}
	if p := b.positionOfStableLocked(sid); p <= b.lastID {
		return p
	}
	return sid
}

// CoveredByStable reports whether a tentative tuple at stream time st
// stands for results a reader took stable already, lastST being the
// stream time of the last stable tuple or boundary it took (boundary:
// that one was a boundary, which covers only earlier stream times). It
// applies to the tentative tuples a replica produced before it had as
// many stable tuples as the reader took (a resumption by stable id into
// that replica's tentative tail, ResumePosition): shown or released with
// the stable ones, those results counted twice. (A tuple at lastST
// after a stable tuple there is taken as covered: stream times do not
// tell it apart from one the reader has.)
func CoveredByStable(st, lastST int64, boundary bool) bool {
	return st < lastST || st == lastST && !boundary
}

// RelayedPosition is the position a relayed acknowledgement of stable id
// sid (a DCAA consumer reading another replica) takes this stream up to:
// the position of sid, while sid is within the numbering this stream
// shares with its peer replicas. Past a divergence (Diverge) sid means
// other results here, and a consumer that switches to this replica
// realigns by stream time, possibly to lower stable ids: there sid
// counts as a position, as it always did (never more than the position
// of sid). Not into an open tentative tail that begins at or below the
// position of sid (this replica went tentative before sid): a consumer
// switching here reads that whole tail (ResumePosition), so it is kept
// while it fits; acknowledged up to sid's position (past the tail: not
// produced yet), it was discarded before the switch, and the tentative
// results missed this replica's tuples
// (TestDCAAResumeIntoEarlierTentativeTail under load: the relay had
// acknowledged before the switch). A producer never waits on a relay
// for it: once the buffer is full (an Append waits for room), the next
// relayed acknowledgement gives the tail up, as before.
func (b *OutputBuffer) RelayedPosition(sid uint64) uint64 {
	return b.relayedPositionIn(sid, false)
}

// relayedPositionIn is RelayedPosition; sameLineage: the consumer states
// that its stable ids are this stream's (a StableTag of its lineage),
// so that past a divergence too sid is taken by id.
func (b *OutputBuffer) relayedPositionIn(sid uint64, sameLineage bool) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !sameLineage && b.lineage != 0 && sid > b.lineageSince {
		return sid
	}
	p := b.positionOfStableLocked(sid)
	if n := len(b.nonStable); n > 0 && b.blocked == 0 {
		// Once its start is discarded (given up), the tail is not held
		// again: a producer would wait on the relay for every bufferful.
		if r := b.nonStable[n-1]; r.To == math.MaxUint64 && p >= r.From && b.dropped < r.From {
			return r.From - 1
		}
	}
	return p
}

// AckStable is Ack for a subscriber that relays stable ids: see
// RelayedPosition (clamped, as Ack, to the last position appended).
func (b *OutputBuffer) AckStable(name string, sid uint64) {
	b.Ack(name, b.RelayedPosition(sid))
}

// DiscardedStableAfter reports whether the buffer discarded a stable tuple
// or boundary with a stable id above after (the stable id of a position is
// the position less its offset): a subscriber resuming after that stable id
// misses results. A DCAA subscriber resumes after its last stable id used
// as a position; here that position can lie below positions it received
// and acknowledged itself before it switched away (tentative tuples, UNDO
// and REC_DONE of this replica take positions the stable id does not
// count), so Read's gap (a position after afterID discarded) alone would
// report a loss where the subscriber holds every result. Without
// positions outside the stable view the two agree.
func (b *OutputBuffer) DiscardedStableAfter(after uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped <= after {
		return false
	}
	return b.dropped-b.positionOffsetLocked(b.dropped) > after
}

// NonStableFrom returns the offset at position p-1 and the ranges at or
// after p: what a copy of the stream continuing from p needs (a task
// snapshot's output tail).
func (b *OutputBuffer) NonStableFrom(p uint64) (base uint64, ranges []PosRange) {
	base = b.PositionOffset(p - min(p, 1))
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.nonStable {
		if r.To >= p {
			r.From = max(r.From, p)
			ranges = append(ranges, r)
		}
	}
	return base, ranges
}

// RestoreNonStable sets what NonStableFrom returned on a new copy of the
// stream (before anything is appended to it): base positions before the
// first range are non-stable, and ranges.
func (b *OutputBuffer) RestoreNonStable(base uint64, ranges []PosRange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.nsBase = base
	b.nonStable = slices.Clone(ranges)
}

// BeginNonStable marks every position from from on as outside the stable
// view until EndNonStable: a producer going tentative does so before it
// appends its first tentative tuple, so no batch is ever sent with an
// offset that does not count it yet.
func (b *OutputBuffer) BeginNonStable(from uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.nonStable); n > 0 && b.nonStable[n-1].To == math.MaxUint64 {
		return // open already
	}
	b.nonStable = append(b.nonStable, PosRange{from, math.MaxUint64})
}

// EndNonStable closes the range BeginNonStable opened at position to
// (included).
func (b *OutputBuffer) EndNonStable(to uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.nonStable)
	if n == 0 || b.nonStable[n-1].To != math.MaxUint64 {
		return
	}
	if to < b.nonStable[n-1].From {
		b.nonStable = b.nonStable[:n-1]
		return
	}
	b.nonStable[n-1].To = to
}

// Diverge records that the stream's stable ids may, from stable id since
// on (exclusive), mean other results than on the producer's peer
// replicas: the producer is about to put an UNCORRECTABLE record on it
// (a correction could not make every result exact, or it relays an
// upstream's). The first time, the stream takes a lineage of its own, a
// random nonzero number no other stream has; later divergences keep it
// (one copy never renumbers the stable ids it sent, so its readers
// resume on it by id whatever happened since) and only lower since to
// the earliest. Its stable ids up to since stay those every replica
// shares. Every batch carries the lineage (Lineage), so a reader moving
// to another replica knows whether its last stable id means the same
// result there.
func (b *OutputBuffer) Diverge(since uint64) {
	tag := rand.Uint64() | 1
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lineage != 0 {
		b.lineageSince = min(since, b.lineageSince)
		return
	}
	b.lineage, b.lineageSince = tag, since
}

// maxNamedRanges bounds the ranges a stream remembers (NamedRanges);
// past it the oldest is forgotten (its record may still be read).
const maxNamedRanges = 16

// NoteUncorrectable records that the producer puts (or put, before a
// copy of the stream started from a snapshot) an UNCORRECTABLE record of
// [from, to) on the stream. A subscription's first batch carries the
// ranges (NamedRanges): a reader that realigns onto the stream, or
// resumes over ids it no longer holds, names them even when the records
// were among the positions discarded before it came (acknowledged by
// other readers: a copy started without state puts its record first,
// and a reader of another lineage relays acknowledgements that discard
// it; the unnamed loss of TestDCAABothReplicasLostNamesTheLoss).
func (b *OutputBuffer) NoteUncorrectable(from, to int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := [2]int64{from, to}
	if slices.Contains(b.named, r) {
		return
	}
	if len(b.named) == maxNamedRanges {
		b.named = append(b.named[:0], b.named[1:]...)
	}
	b.named = append(b.named, r)
}

// NamedRanges returns a copy of the ranges NoteUncorrectable recorded
// (nil: none).
func (b *OutputBuffer) NamedRanges() [][2]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.named)
}

// flattenRanges and RangePairs convert named ranges to and from the
// wire's list of pairs (Batch.named_ranges; RangePairs for readers of the
// raw message, fedstream tail); an odd last value is dropped.
func flattenRanges(rs [][2]int64) []int64 {
	if len(rs) == 0 {
		return nil
	}
	out := make([]int64, 0, 2*len(rs))
	for _, r := range rs {
		out = append(out, r[0], r[1])
	}
	return out
}

func RangePairs(vs []int64) [][2]int64 {
	if len(vs) < 2 {
		return nil
	}
	out := make([][2]int64, 0, len(vs)/2)
	for i := 0; i+1 < len(vs); i += 2 {
		out = append(out, [2]int64{vs[i], vs[i+1]})
	}
	return out
}

// SetLineage gives a copy of a stream (started from a task snapshot,
// before anything is appended to it) the lineage lin, diverged after
// stable id since, of the stream it continues: it numbers its stable
// results as that stream did.
func (b *OutputBuffer) SetLineage(lin, since uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lineage, b.lineageSince = lin, since
}

// Lineage returns the stream's lineage and the stable id up to which its
// numbering is the shared one (0, 0: it never diverged).
func (b *OutputBuffer) Lineage() (lineage, since uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lineage, b.lineageSince
}

// SameStableIDs reports whether a reader whose stable ids follow lineage
// lin (diverged after since; 0, 0: the shared numbering) may resume after
// stable id after on a stream of lineage lin2 (since2) by id: both number
// their stable tuples alike up to after. Otherwise the reader's stable id
// means another result there.
func SameStableIDs(lin, since, lin2, since2, after uint64) bool {
	return after <= SharedStableIDs(lin, since, lin2, since2)
}

// SharedStableIDs is the last stable id that lineages lin (diverged after
// since) and lin2 (since2) number alike (math.MaxUint64: the same
// lineage, every id): a reader realigning from one onto the other resumes
// by id after it and by stream time from there.
func SharedStableIDs(lin, since, lin2, since2 uint64) uint64 {
	if lin == lin2 {
		return math.MaxUint64
	}
	common := uint64(math.MaxUint64)
	if lin != 0 {
		common = since
	}
	if lin2 != 0 {
		common = min(common, since2)
	}
	return common
}
