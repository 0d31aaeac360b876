package runtime

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Results that could not be corrected (DCAA, docs/DATAPLANE.md "Failures
// longer than the replay bound"). When a correction cannot make every
// result exact (an operator task dropped stable input kept for its
// replay, past DCAAKeepTuples), the task says so in its status and puts
// an UNCORRECTABLE record (tuple.UncorrectableMarker: the stream-time
// range of the results concerned) on every output stream, outside the
// stable view. Every task downstream relays it on its own outputs, the
// range widened by its own window (a window overlapping the range is
// not exact either), and notes it in its status; a sink puts it on its
// result stream, where `fedstream tail` prints it (with --stable-only
// too: it is about final results) and a Kafka sink logs and counts it.
// So a query never loses a correction silently.

// maxUncorrectableSeen bounds the ranges a task remembers having put on
// its outputs (to relay each once, although both replicas of an upstream
// send their own and a resumption resends them); past it the oldest is
// forgotten, and a marker of that range coming again is relayed again (a
// duplicate record, never a missing one).
const maxUncorrectableSeen = 16

// uncorrectableSeen is the ranges a task put on its outputs already.
type uncorrectableSeen struct {
	mu     sync.Mutex
	ranges [][2]int64
}

// add records [from, to) and reports whether it was new (not within a
// range recorded already).
func (s *uncorrectableSeen) add(from, to int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.ranges {
		if r[0] <= from && to <= r[1] {
			return false
		}
	}
	if len(s.ranges) == maxUncorrectableSeen {
		s.ranges = append(s.ranges[:0], s.ranges[1:]...)
	}
	s.ranges = append(s.ranges, [2]int64{from, to})
	return true
}

// list returns a copy of the ranges recorded (a task snapshot's).
func (s *uncorrectableSeen) list() [][2]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ranges)
}

// has reports whether [from, to) is within a range recorded already.
func (s *uncorrectableSeen) has(from, to int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.ranges {
		if r[0] <= from && to <= r[1] {
			return true
		}
	}
	return false
}

// divergeBefore gives an operator task's outputs their own lineage
// before its machine takes a batch carrying ranges to relay (an
// upstream's UNCORRECTABLE records, or a switch onto a diverged replica):
// the machine may release stable results computed from what follows them
// in the batch before relayUncorrectable puts the record, and those
// results' ids must already count as diverged. Ranges relayed already
// change nothing.
func (d *dcaaRun) divergeBefore(ctx context.Context, ranges [][2]int64) error {
	t := d.t
	fresh := false
	for _, r := range ranges {
		if from, to := t.widen(r[0], r[1]); !t.unc.has(from, to) {
			fresh = true
		}
	}
	if !fresh {
		return nil
	}
	if err := t.lockProc(ctx); err != nil {
		return err
	}
	defer t.unlockProc()
	if t.halted.Load() {
		return nil
	}
	for _, o := range t.outs { // under proc, as putUncorrectable
		last := o.w.LastID()
		o.buf.Diverge(last - o.buf.PositionOffset(last))
	}
	return nil
}

// uncorrectableNote is the status text naming results that could not be
// corrected.
func uncorrectableNote(from, to int64, cause string) string {
	f := "the start"
	if from != math.MinInt64 {
		f = time.Unix(0, from).UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("results with stream time from %s to %s could not be corrected: %s; later results are exact",
		f, time.Unix(0, to).UTC().Format(time.RFC3339Nano), cause)
}

// Why a range was named, for the status note (see lossCauses).
const (
	causeUpstream = "an upstream named them lost (a failure outlasted the input kept for a replay, or input could no longer be had)"
	causeGap      = "an input resumed after stable ids its upstream replica no longer held (discarded before this task took them)"
	causeRestart  = "every replica of this task was lost together and this copy started without their state, after its upstream had discarded the input they had taken; only results they had not delivered are concerned"
)

// lossCauses tells the ranges an input names itself from the ones it
// relays (an upstream's record, or what a realignment cannot vouch for:
// causeUpstream): gap, a resumption over discarded ids
// (lineageWatch.gapAfter); restart, a copy started without state
// (task.lostBeforeStart).
type lossCauses struct{ gap, restart [][2]int64 }

func (c lossCauses) of(r [2]int64) string {
	switch {
	case slices.Contains(c.gap, r):
		return causeGap
	case slices.Contains(c.restart, r):
		return causeRestart
	}
	return causeUpstream
}

// noteUncorrectable sets the task's status note for a range named for
// cause (an operator task's own loss is noted by dcaaRun.lost).
func (t *task) noteUncorrectable(from, to int64, cause string) {
	note := uncorrectableNote(from, to, cause)
	t.log.Warn("DCAA results named as not corrected", "from", from, "to", to, "cause", cause)
	t.stateMu.Lock()
	t.uncorrected = note
	t.stateMu.Unlock()
}

// widen is the range of a task's results that depend on input results
// in [from, to): for a windowed operator, up to one window later.
func (t *task) widen(from, to int64) (int64, int64) {
	if w := windowOf(t.node); w > 0 && to < math.MaxInt64-int64(w) {
		to += int64(w)
	}
	return from, to
}

// markersOf returns the ranges of the UNCORRECTABLE records among ts.
func markersOf(ts []tuple.Tuple) [][2]int64 {
	var out [][2]int64
	for k := range ts {
		if ts[k].Type != tuple.Uncorrectable {
			continue
		}
		if from, to, ok := tuple.UncorrectableRange(&ts[k]); ok {
			out = append(out, [2]int64{from, to})
		}
	}
	return out
}

// putUncorrectable appends the record of [from, to) to every output
// stream of an operator task run by its machine, outside the stable
// view, unless it went out already (the caller holds proc).
func (d *dcaaRun) putUncorrectable(ctx context.Context, from, to int64) error {
	t := d.t
	if !t.unc.add(from, to) {
		return nil
	}
	d.growOutputs()
	for i, o := range t.outs {
		if !d.nsOpen[i] {
			// An open range (tentative output) covers it already.
			next := o.w.LastID() + 1
			o.buf.MarkNonStable(next, next)
		}
		// From here on the stream's stable ids may mean other results
		// than on the peer replicas: a new lineage, diverging after the
		// last stable id so far (the correction's UNDO target).
		last := o.w.LastID()
		o.buf.Diverge(last - o.buf.PositionOffset(last))
		mk := tuple.UncorrectableMarker(from, to)
		if err := t.appendTo(ctx, o, &mk); err != nil {
			return err
		}
		o.buf.NoteUncorrectable(from, to)
	}
	return t.flush(ctx)
}

// relayUncorrectable puts the records an input delivered (ranges) on an
// operator task's outputs, widened by its window, and notes them with
// their causes.
func (d *dcaaRun) relayUncorrectable(ctx context.Context, ranges [][2]int64, causes lossCauses) error {
	t := d.t
	if err := t.lockProc(ctx); err != nil {
		return err
	}
	defer t.unlockProc()
	if t.halted.Load() {
		return nil
	}
	for _, r := range ranges {
		from, to := t.widen(r[0], r[1])
		if err := d.putUncorrectable(t.ctx, from, to); err != nil {
			t.endWith(err)
			return fmt.Errorf("%w: %w", errTaskEnded, err)
		}
		t.noteUncorrectable(from, to, causes.of(r))
	}
	return nil
}

// sinkUncorrectable appends the record of [from, to) to a merging sink's
// result stream unless it went out already (the caller holds proc), and
// notes it with its cause.
func (t *task) sinkUncorrectable(ctx context.Context, from, to int64, cause string) error {
	if !t.unc.add(from, to) {
		return nil
	}
	t.noteUncorrectable(from, to, cause)
	o := t.outs[0]
	last := o.w.LastID()
	o.buf.Diverge(last - o.buf.PositionOffset(last))
	mk := tuple.UncorrectableMarker(from, to)
	if err := t.appendNonStable(ctx, o, &mk); err != nil {
		return err
	}
	o.buf.NoteUncorrectable(from, to)
	return t.flush(ctx)
}

// lostBeforeStart is the range of input a DCAA operator copy placed
// again without state can never take (ts: its input's first batch
// holding a stable tuple, stable ids set). With every replica of its
// partition lost together, no peer could give it a snapshot; it replays
// what its upstream still buffers, and when the upstream has discarded
// the start of the stream (acknowledged by the lost copies), the first
// stable tuple it gets is not the first of the stream: the results that
// needed what came before it (the lost copies' unfinished windows) are
// lost for good. The input treats that like an upstream's record of
// [start, first tuple's stream time], so the task relays it (widened by
// its window) to the sinks and notes it in its status; its stable ids,
// numbered from 1 again, get a lineage of their own (divergeBefore), so
// consumers realign by stream time instead of skipping the copy's first
// results as already taken from the lost copies.
func (t *task) lostBeforeStart(in *input, ts []tuple.Tuple) ([2]int64, bool) {
	if t.spec.Generation <= 1 || t.spec.FromSnapshot != nil || t.restored || t.addedByRescale() {
		return [2]int64{}, false
	}
	for k := range ts {
		tp := &ts[k]
		if tp.Type != tuple.Stable && tp.Type != tuple.Boundary {
			continue
		}
		if tp.ID <= 1 {
			return [2]int64{}, false // the upstream still held the whole stream
		}
		to := tp.STime
		if to < math.MaxInt64 {
			to++ // tuples of that stream time may have been discarded too
		}
		t.log.Warn("DCAA copy started without state: its upstream discarded the start of its input; results depending on it cannot be corrected",
			"input", in.upstream, "partition", in.upPartition, "first_stable_id", tp.ID, "to", to)
		return [2]int64{math.MinInt64, to}, true
	}
	return [2]int64{}, false
}
