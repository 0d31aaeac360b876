package runtime

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/fedstream/fedstream/fsm"
)

// Push sources placed again with the switch points the leader kept
// (fsm ReconfigKept).
//
// A kafka source placed again without a snapshot (its worker lost, no
// replica) reads its partition again from its start, and its consumers
// resume by id after what they took from the lost copy: the copy must
// produce the lost copy's stream again, the same tuples with the same ids
// and tags. Its records and their boundaries are a function of the
// partition, and it tags them by the kept switch points (cutEpoch), but an
// idle source's early marker (idleSwitch) is a boundary the lost copy
// added where it found itself idle: at the newest stream time it had sent,
// after its records at that time. The copy sends that boundary again at
// the same point of the stream, before the first record or boundary it
// sends above the marker's stream time, or where it is idle at exactly
// that time (the lost copy's records after the marker came after an idle
// interval, so later in the partition), raising its level to the marker's
// epoch there as the lost copy did; and it switches on its own while idle
// only once it has replayed up to every kept switch point of an epoch it
// has not reached (replayBehind). Without that, its ids after the marker
// were one lower than the lost copy's: its consumer, resuming after an id
// it held, skipped one tuple it had not taken (a record, lost), and a copy
// idle for a tick before its first record switched at once and tagged the
// whole replay with the new epoch.
//
// Not reproduced: a record at exactly the marker's stream time that came
// after the marker (after the idle interval, at the same stream time, or
// late and counted at it) goes before the marker in the replay; and a
// marker older than the kept switch points (fsm maxKeptSwitches epochs).
//
// An ingest source placed again without a snapshot does not replay: what
// it produces comes after everything its lost copy produced, so it starts
// at the newest epoch the lost copy switched to (keptLevel), as a moved
// copy starts at its original's early level (TaskSnapshot.SourceLevel).

// replayIdleGrace bounds how long a kafka source placed again holds back
// its own idle switch while it has not replayed up to a kept switch point
// (replayBehind): the partition may no longer hold the records the lost
// copy read (Kafka's retention), and the plan's markers, and the removal
// of its old versions everywhere, wait for the switch.
const replayIdleGrace = 10 * time.Second

// replayMarks are the kept switch points of a kafka source placed again
// (producer only).
type replayMarks struct {
	kept []fsm.ReconfigSwitch
	// marks are the early markers not sent again yet, by stream time,
	// once built (the copy knows the plans' cuts).
	marks []earlyMark
	built bool
	// started is when the copy started; gaveUp: it waited
	// replayIdleGrace for a kept switch point and switched on its own.
	started time.Time
	gaveUp  bool
}

// earlyMark is an earlier copy's early marker: a boundary at stream time
// at, raising its level to epoch.
type earlyMark struct {
	at    int64
	epoch uint64
}

func newReplayMarks(kept []fsm.ReconfigSwitch) *replayMarks {
	if len(kept) == 0 {
		return nil
	}
	return &replayMarks{kept: slices.Clone(kept), started: time.Now()}
}

// build finds the early markers among the kept switch points, those below
// their plan's cut (see cutEpoch), once the copy has its plans; false
// while it has none.
func (m *replayMarks) build(r *reconfigState) bool {
	if m.built {
		return true
	}
	if !r.on {
		return false
	}
	for _, sw := range m.kept {
		i := slices.IndexFunc(r.cuts, func(c epochCut) bool { return c.epoch == sw.Epoch })
		if i < 0 || sw.At >= r.cuts[i].cut {
			continue
		}
		// The epochs a marker skipped (noteSwitch) share its stream time:
		// one boundary, at the newest.
		if j := slices.IndexFunc(m.marks, func(e earlyMark) bool { return e.at == sw.At }); j >= 0 {
			m.marks[j].epoch = max(m.marks[j].epoch, sw.Epoch)
			continue
		}
		m.marks = append(m.marks, earlyMark{sw.At, sw.Epoch})
	}
	slices.SortFunc(m.marks, func(a, b earlyMark) int { return cmp.Compare(a.at, b.at) })
	m.built = true
	return true
}

// sentUpTo records that the copy sent a boundary at stream time at as an
// idle source's marker: the early markers at or below it are sent.
func (m *replayMarks) sentUpTo(at int64) {
	if m == nil {
		return
	}
	n := 0
	for n < len(m.marks) && m.marks[n].at <= at {
		n++
	}
	m.marks = m.marks[n:]
}

// replayMarksBelow runs in a kafka source before it sends a record or a
// boundary at stime: it first sends again, at each earlier copy's early
// marker below stime not sent yet, that copy's boundary, its level raised
// to the marker's epoch. boundary is the last boundary sent; it returns
// the new one (producer only).
func (t *task) replayMarksBelow(ctx context.Context, boundary, stime int64) (int64, error) {
	m := t.rc.replay
	if m == nil {
		return boundary, nil
	}
	if err := t.pollReconfig(); err != nil {
		return boundary, err
	}
	if !m.build(&t.rc) {
		return boundary, nil
	}
	for len(m.marks) > 0 && m.marks[0].at < stime {
		mk := m.marks[0]
		m.marks = m.marks[1:]
		if mk.at < boundary {
			// Passed already (after replayIdleGrace, or a partition that
			// changed): a boundary cannot go back.
			t.log.Warn("reconfiguration: an earlier copy's early marker lies behind this copy's stream; not sent again",
				"epoch", mk.epoch, "at", mk.at, "boundary", boundary)
			continue
		}
		t.raiseLevel(mk.epoch)
		if err := t.emitBoundary(ctx, mk.at); err != nil {
			return boundary, err
		}
		boundary = mk.at
	}
	if len(m.marks) == 0 && !slices.ContainsFunc(m.kept, func(sw fsm.ReconfigSwitch) bool { return sw.At >= stime }) {
		// Past every kept switch point: nothing left to replay or to
		// hold an idle switch back for.
		t.rc.replay = nil
	}
	return boundary, nil
}

// replayBehind reports whether a kafka source placed again has not
// replayed up to a kept switch point of an epoch above its level yet
// (frontier: the newest stream time it sent): an idle switch now would
// put its marker elsewhere than the earlier copy did. After
// replayIdleGrace it stops holding the switch back, and says so.
func (t *task) replayBehind(frontier int64) bool {
	m := t.rc.replay
	if m == nil || m.gaveUp {
		return false
	}
	behind := false
	for _, sw := range m.kept {
		behind = behind || sw.Epoch > t.rc.level && sw.At > frontier
	}
	if behind && time.Since(m.started) > replayIdleGrace {
		m.gaveUp = true
		t.log.Warn("reconfiguration: a kafka source placed again did not replay up to where its earlier copy switched; switching here",
			"frontier", frontier, "kept", m.kept, "waited", replayIdleGrace)
		return false
	}
	return behind
}

// keptLevel is the level an ingest source placed again without a
// snapshot starts at: the newest epoch its earlier copies switched to
// (0 for any other task). It does not replay them: everything it
// produces comes after what they produced, in its consumers' streams
// after their markers.
func (t *task) keptLevel(k *fsm.ReconfigKept) uint64 {
	if k == nil || t.ingest == nil || t.spec.FromSnapshot != nil {
		return 0
	}
	var e uint64
	for _, sw := range k.Switches {
		e = max(e, sw.Epoch)
	}
	return e
}
