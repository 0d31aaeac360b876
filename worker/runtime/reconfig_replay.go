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
// epoch there as the lost copy did. Without that, its ids after the
// marker were one lower than the lost copy's: its consumer, resuming
// after an id it held, skipped one tuple it had not taken (a record,
// lost).
//
// Nor does such a copy switch on its own while idle before it has read
// its partition up to where the partition ended when the copy started
// (kafkaReplay): everything the lost copy read lies below that offset, and
// an idle switch in the middle of the replay adds a marker the lost copy
// did not send there, numbering everything after it one higher than the
// lost copy did (and a copy idle for a tick before its first record
// switched at once and tagged its whole replay with the new epoch).
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
// its own idle switch before it has read its partition up to where the
// partition ended when it started (kafkaReplay): the last offsets below
// that end may be no records at all (a transaction's commit marker), or
// the brokers unreachable, and the plan's markers, and the removal of its
// old versions everywhere, wait for the switch.
const replayIdleGrace = 10 * time.Second

// kafkaReplay is the idle-switch guard of a kafka source placed again
// without a snapshot (runKafka's goroutine only; nil for any other).
type kafkaReplay struct {
	// to is the partition's end offset when the copy started, once known.
	to    int64
	known bool
	// started is when the copy started; done: it read up to to, or
	// waited replayIdleGrace.
	started time.Time
	done    bool
}

func newKafkaReplay(t *task) *kafkaReplay {
	if t.spec.Generation <= 1 || t.genRestore != nil || t.spec.FromSnapshot != nil {
		return nil
	}
	return &kafkaReplay{started: time.Now()}
}

// holds reports whether the copy must not switch on its own while idle
// (idleSwitch) yet: it has not read its partition up to to.
func (r *kafkaReplay) holds(t *task) bool {
	if r == nil || r.done {
		return false
	}
	if r.known && t.genRecords >= r.to {
		r.done = true
		return false
	}
	if time.Since(r.started) > replayIdleGrace {
		r.done = true
		t.log.Warn("reconfiguration: a kafka source placed again did not read its partition up to where it ended when it started; it may switch while idle now",
			"read_to", t.genRecords, "end", r.to, "end_known", r.known, "waited", replayIdleGrace)
		return false
	}
	return true
}

// replayMarks are the kept early markers of a kafka source placed again
// (producer only).
type replayMarks struct {
	kept []fsm.ReconfigSwitch
	// marks are the early markers not sent again yet, by stream time,
	// once built (the copy knows the plans' cuts).
	marks []earlyMark
	built bool
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
	return &replayMarks{kept: slices.Clone(kept)}
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
			// Passed already (an idle switch after replayIdleGrace, or
			// a partition that changed): a boundary cannot go back.
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
	if len(m.marks) == 0 {
		t.rc.replay = nil // nothing left to send again
	}
	return boundary, nil
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
