package dataplane

import (
	"math"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// StableTag says how far a DCAA consumer took a stream, in which
// numbering (docs/DATAPLANE.md, "Lineage of stable ids"): it took the
// stable ids up to ID of lineage Lineage (diverged after Since; 0, 0: the
// numbering every replica shares), the last of them at stream time STime
// (math.MinInt64: none yet). A consumer's relayed acknowledgements and
// its resumption by stable id carry it (SubscribeRequest.stable_taken and
// the fields after it), so that an upstream replica numbering its stable
// ids otherwise does not take the id for one of its own.
//
// The zero value (Known false) is an untagged acknowledgement, as an
// older build sends: taken by id (RelayedPosition).
type StableTag struct {
	Known          bool
	ID             uint64
	Lineage, Since uint64
	STime          int64
}

// NoSTime is StableTag.STime of a consumer that took no stable tuple or
// boundary yet.
const NoSTime = math.MinInt64

// setOn writes the tag into a SubscribeRequest (nothing when unknown).
func (g StableTag) setOn(req *fedstreampb.SubscribeRequest) {
	if !g.Known {
		return
	}
	id := g.ID
	req.StableTaken = &id
	req.TakenLineage, req.TakenLineageSince, req.TakenStime = g.Lineage, g.Since, g.STime
}

// tagOf reads the tag a SubscribeRequest carries (unknown: none, an
// older build).
func tagOf(req *fedstreampb.SubscribeRequest) StableTag {
	if req.StableTaken == nil {
		return StableTag{}
	}
	return StableTag{Known: true, ID: *req.StableTaken, Lineage: req.TakenLineage, Since: req.TakenLineageSince, STime: req.TakenStime}
}

// TaggedPosition is the position up to which an acknowledgement tagged
// g takes this stream; same reports that g's lineage numbers this
// stream's stable ids alike up to g.ID (then it is the position of
// stable id g.ID, as RelayedPosition takes an untagged one, but by id past
// a divergence too).
//
// Otherwise g.ID means other results here (a copy started without state
// after every replica of its partition was lost, a replica whose
// correction could not make every result exact, or a consumer that
// realigned onto one), and it discards nothing by it: the position of the
// last stable id both numberings share, or, further, what the consumer
// would drop as taken if it realigned onto this stream (by stream time,
// lineageWatch.realignFrom in worker/runtime): everything before the last
// stable tuple or boundary whose stream time is below g.STime, with
// nothing at or past g.STime before it. That last one is kept: a reader
// realigning finds one result it took, and knows it joined where it left
// off (a first tuple past its stream time with none before it reads as a
// gap, and is named). Taken by id, such an acknowledgement (clamped to
// the stream's last position) discarded a restarted copy's record and
// first results before the sink that needed them realigned onto it: that
// sink named a gap although nothing was lost upstream (session 18).
func (b *OutputBuffer) TaggedPosition(g StableTag) (pos uint64, same bool) {
	if !g.Known {
		return b.RelayedPosition(g.ID), true
	}
	lin, since := b.Lineage()
	if SameStableIDs(g.Lineage, g.Since, lin, since, g.ID) {
		return b.relayedPositionIn(g.ID, true), true
	}
	shared := min(g.ID, SharedStableIDs(g.Lineage, g.Since, lin, since))
	pos = 0
	if shared > 0 {
		pos = b.RelayedPosition(shared)
	}
	return max(pos, b.positionBelowSTime(g.STime)), false
}

// relayedPosition is the position a relayed acknowledgement takes the
// stream to: id as a position, or, stable, the stable id id (untagged:
// RelayedPosition) or the tag g (TaggedPosition).
func (b *OutputBuffer) relayedPosition(stable bool, id uint64, g StableTag) uint64 {
	switch {
	case stable && g.Known:
		p, _ := b.TaggedPosition(g)
		return p
	case stable:
		return b.RelayedPosition(id)
	}
	return id
}

// positionBelowSTime is the position before the last stable tuple or
// boundary with a stream time below st that follows only such ones among
// the retained tuples (0: none, or nothing retained is below st; a
// tuple outside the stable view does not stop the scan, as a realigning
// reader passes over those too). See TaggedPosition.
//
// The scan goes on from where the previous one stopped when st did not go
// back (stScan): a relay repeats its acknowledgement every few
// milliseconds, and while another subscriber holds the buffer the prefix
// below st is not discarded, so scanning it from the oldest tuple every
// time cost a pass over the buffer per acknowledgement.
func (b *OutputBuffer) positionBelowSTime(st int64) uint64 {
	if st == NoSTime {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	sc := &b.stScan
	oldest := b.oldestLocked()
	if st < sc.st || sc.next < oldest {
		*sc = stScan{next: oldest}
	}
	sc.st = st
	var h tuple.Tuple
	for ci, c := range b.chunks {
		if b.count == 0 || c.last() < sc.next {
			continue
		}
		from := int(sc.next - c.first)
		if ci == 0 {
			from = max(from, b.head)
		}
		for i := from; i < len(c.offs); i++ {
			if _, err := tuple.DecodeHeader(c.data[c.offs[i]:c.end(i)], &h); err != nil {
				return max(sc.last, 1) - 1
			}
			if (h.Type == tuple.Stable || h.Type == tuple.Boundary) && h.STime >= st {
				return max(sc.last, 1) - 1
			}
			if h.Type == tuple.Stable || h.Type == tuple.Boundary {
				sc.last = c.first + uint64(i)
			}
			sc.next = c.first + uint64(i) + 1
		}
	}
	return max(sc.last, 1) - 1
}

// stScan is where positionBelowSTime stopped: the positions before next
// were scanned for stream time st, the last of them below st at last.
type stScan struct {
	st         int64
	next, last uint64
}
