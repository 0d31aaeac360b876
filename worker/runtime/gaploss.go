package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"math"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Input lost outside DCAA. A query without replicas loses input for good
// when a subscription resumes after tuples its upstream no longer holds:
// a copy placed again without state (its worker was declared down, no
// replica to start from) subscribes from the start of its input, which
// the upstream discarded once the lost copy had acknowledged it; a
// consumer that comes back after its lease resumes after what was
// overrun meanwhile. The results that needed those tuples are lost, and
// were lost silently: only the upstream's log said "subscriber resumes
// after discarded tuples". Now the input that finds such a gap names it
// as DCAA names what it could not correct: the task's status says which
// stream times may be missing (the task shows lossy in `query status`),
// and an UNCORRECTABLE record of that range (widened by the task's
// window) goes on every output; every task downstream relays it (widened
// by its own window) and notes it, and a sink puts it on its result
// stream, where `fedstream tail` prints it.

// noteInputGap names the input a subscription that resumed after id
// after lost: the first batch it delivered, b, starts past after+1. A
// replicated query's inputs are the DCAA machine's (which resumes by
// stable id and names its own losses) and never come here.
func (in *input) noteInputGap(ctx context.Context, after uint64, b *dataplane.Batch) error {
	if b.FirstID <= after+1 {
		return nil
	}
	t := in.t
	from := int64(math.MinInt64)
	if after > 0 && t.merge != nil {
		// Complete up to the input's last boundary.
		from = t.merge.inputBoundary(in.idx)
	}
	to := int64(math.MaxInt64)
	if st, ok := firstSTime(b); ok && st < math.MaxInt64 {
		to = st + 1 // tuples of that stream time may be gone too
	}
	t.log.Warn("input resumed after tuples its upstream had discarded: results depending on them are lost",
		"input", in.upstream, "partition", in.upPartition, "after_id", after, "first_id", b.FirstID, "from", from, "to", to)
	cause := fmt.Sprintf("input from %s partition %d resumed after id %d, but its upstream no longer held ids %d to %d (taken by an earlier copy of this task, or discarded while this input was away)",
		in.upstream, in.upPartition, after, after+1, b.FirstID-1)
	return t.nameLoss(ctx, [][2]int64{{from, to}}, cause)
}

// relayLoss puts the UNCORRECTABLE records among an input's tuples on the
// task's outputs, outside DCAA (see noteInputGap).
func (in *input) relayLoss(ctx context.Context, ts []tuple.Tuple) error {
	marks := markersOf(ts)
	if len(marks) == 0 {
		return nil
	}
	return in.t.nameLoss(ctx, marks, fmt.Sprintf("results of %s partition %d that it named lost", in.upstream, in.upPartition))
}

// firstSTime is the stream time of b's first tuple.
func firstSTime(b *dataplane.Batch) (int64, bool) {
	if len(b.Tuples) > 0 {
		return b.Tuples[0].STime, true
	}
	if len(b.Offsets) > 0 {
		var tp tuple.Tuple
		if _, err := tuple.DecodeHeader(b.Encoded[b.Offsets[0]:], &tp); err == nil {
			return tp.STime, true
		}
	}
	return 0, false
}

// nameLoss notes in the task's status, and puts on its outputs, the
// record of each range of results lost (widened by the task's window),
// once each. A sink passing its input through adopts its input's ids and
// writes no record of its own: the upstream's record passes through.
func (t *task) nameLoss(ctx context.Context, ranges [][2]int64, cause string) error {
	if err := t.lockProc(ctx); err != nil {
		return err
	}
	defer t.unlockProc()
	if t.halted.Load() {
		return nil
	}
	put := false
	for _, r := range ranges {
		from, to := t.widen(r[0], r[1])
		if !t.unc.add(from, to) {
			continue
		}
		t.stateMu.Lock()
		t.uncorrected = uncorrectableNote(from, to, cause)
		t.stateMu.Unlock()
		if t.passThrough {
			continue
		}
		for _, o := range t.outs {
			mk := tuple.UncorrectableMarker(from, to)
			if err := t.appendTo(ctx, o, &mk); err != nil {
				return err
			}
		}
		put = true
	}
	if !put {
		return nil
	}
	return t.flush(ctx)
}

// logGap logs the range a DCAA input names after resuming by stable id
// (after taken) over ids its upstream replica no longer holds
// (lineageWatch.gapAfter): the replica numbers its stream as the input
// does, nothing is realigned, the results between are lost.
func logGap(log *slog.Logger, in *input, taken uint64, r [2]int64) {
	log.Warn("DCAA input resumed after stable ids its upstream replica no longer holds (discarded: acknowledged by other consumers, or past its buffer bound): results of the stream times between named as not corrected",
		"input", in.upstream, "partition", in.upPartition, "after_stable_id", taken, "from", r[0], "to", r[1])
}
