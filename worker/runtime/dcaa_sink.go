package runtime

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Sinks of replicated queries (DCAA, see docs/DATAPLANE.md). A sink runs
// no DCAA machine: it adds no delay of its own, so what it receives
// tentatively goes out at once, marked TENTATIVE. Its result stream is a
// consumer's view of its input made into a stream:
//
//   - its stable view (stable tuples and boundaries, in order) is its
//     inputs' stable views, passed through or merged deterministically, so
//     it is a failure-free run's output tuple for tuple, and the same on
//     every replica of the sink;
//   - after its last stable tuple come the tentative tuples that are
//     current (not taken back by their producer, not yet covered by stable
//     results); whenever one of those has to go (its producer's UNDO, a
//     switch of upstream replica, stable results arriving), the sink
//     appends an UNDO back to its last stable position and sends again
//     the tentative tuples that are still current; once nothing tentative
//     is left after a correction, REC_DONE.
//
// Positions outside the stable view are marked on the result stream
// (OutputBuffer.MarkNonStable), so its batches carry the position offset
// and a reader (tail, another replica's consumer) resumes by stable id.
// Inputs resume by stable id too: a sink switching replicas of an
// upstream that corrected its output neither skips nor repeats. On a
// replica whose stable ids follow another lineage (a correction that
// could not make every result exact) the input realigns by stream time
// (dcaa_lineage.go).

// passView is a pass-through sink's view of its only input stream
// (replicated queries only; under proc).
type passView struct {
	// stable is the stable id of the last stable tuple or boundary taken
	// (also in input.stableTaken, for the ack relays); stableB the stime
	// of the last stable boundary taken.
	stable  uint64
	stableB int64
	// pos is the last position of the sink's result stream;
	// lastStablePos the position an UNDO goes back to (its last stable
	// tuple, boundary or REC_DONE).
	pos, lastStablePos uint64
	// tentOpen: the result stream holds tentative tuples after
	// lastStablePos that were not taken back. recOpen: an UNDO went out
	// and its REC_DONE has not. switchRec: the sink took back tentative
	// tuples itself (a switch of replicas); it ends that correction with
	// REC_DONE after the next stable boundary.
	tentOpen, recOpen, switchRec bool
	// lastOff is the position offset at the end of the last batch of the
	// current attempt (offKnown: one came): a batch with the same offset
	// holds no tuple outside the stable view.
	lastOff  uint64
	offKnown bool
	// scratch for rebuilt batches.
	hdr tuple.Tuple
	// marks are UNCORRECTABLE ranges a realignment names (see
	// passBatchDCAA), put before the batch.
	marks [][2]int64
}

// passDCAA reports whether the task is a pass-through sink of a
// replicated query (then passView applies).
func (t *task) passDCAA() bool { return t.passThrough && t.dcaaOn() }

// passBatchDCAA is passBatch for a replicated query: b came from the
// input's current attempt (fresh: its first batch).
func (t *task) passBatchDCAA(b *dataplane.Batch, fresh bool) error {
	if err := t.lockProc(t.ctx); err != nil {
		b.Release()
		return err
	}
	defer t.unlockProc()
	if t.halted.Load() {
		b.Release()
		return errHalted
	}
	first, last, off, offs, data := b.FirstID, b.LastID, b.Offset, b.Offsets, b.Encoded
	lin, linSince := b.Lineage, b.LineageSince
	in := t.inputs[0]
	if fresh {
		in.lw.subscribed(b.Named)
	}
	b.Offsets, b.Encoded = nil, nil
	b.Release()
	defer t.counters.passed(len(offs), time.Now())
	v := &t.pv
	buf := t.outs[0].buf
	if off > last {
		err := fmt.Errorf("%w: position offset %d beyond the last id %d", dataplane.ErrProtocol, off, last)
		t.endWith(err)
		return fmt.Errorf("%w: %w", errTaskEnded, err)
	}
	// A switch onto an upstream replica whose stable ids mean other
	// results (dcaa_lineage.go): the input subscribes again after the
	// ids both share (nothing of the batch is taken) and realigns by
	// stream time.
	if in.lw.start(fresh, lin, linSince, v.stable) {
		t.log.Info("DCAA sink input switched to an upstream replica whose stable ids mean other results: realigning by stream time",
			"taken", v.stable, "resume_after", in.lw.re.resumeAt)
		return errRealign
	}
	var undo []byte // an UNDO the sink sends itself before the batch
	if fresh {
		v.offKnown = false
		if v.tentOpen {
			// Another attempt (maybe another replica): what the last one
			// sent tentatively is not current any more.
			undo = v.undo()
			v.switchRec = true
		}
	}
	if in.lw.re.on {
		// Realigning: what the other replica gave already is dropped,
		// the sink follows this one's numbering from the first new
		// stable tuple or boundary.
		hdrs, err := stableHeaders(first, last, off, offs, data)
		if err != nil {
			t.endWith(err)
			return fmt.Errorf("%w: %w", errTaskEnded, err)
		}
		cut, taken, marks := in.lw.sinkRealign(hdrs)
		v.marks = append(v.marks, marks...)
		if cut < len(hdrs) {
			offs, v.stable = offs[cut:], taken
		} else {
			offs = nil
		}
	} else {
		in.lw.batch(lin, linSince)
	}
	if len(offs) == 0 {
		// All of it was taken from the other replica: acknowledged;
		// only what the sink itself puts before it goes out.
		if undo != nil || v.marks != nil {
			if _, err := t.passSlow(buf, first, last, off, nil, data, undo); err != nil {
				t.endWith(err)
				return fmt.Errorf("%w: %w", errTaskEnded, err)
			}
		}
		v.lastOff, v.offKnown = off, true
		t.tentative.Store(v.tentOpen)
		return nil
	}
	var lastHdr tuple.Tuple
	if _, err := tuple.DecodeHeader(data[offs[len(offs)-1]:], &lastHdr); err != nil {
		t.endWith(err)
		return fmt.Errorf("%w: %w", errTaskEnded, err)
	}
	clean := (off == 0 || v.offKnown && off == v.lastOff) && first > off && first-off == v.stable+1
	if clean && undo == nil && v.marks == nil && !v.tentOpen && !v.recOpen && !v.switchRec {
		// The all-stable case: the batch is the next part of the stable
		// stream, adopted as it is (at the sink's own next position).
		if err := buf.Adopt(t.ctx, v.pos+1, offs, data); err != nil {
			t.endWith(err)
			return fmt.Errorf("%w: %w", errTaskEnded, err)
		}
		v.pos += uint64(len(offs))
		v.lastStablePos = v.pos
		v.stable = last - off
		if lastHdr.Type == tuple.Boundary {
			v.stableB = lastHdr.STime
		}
		if err := in.lw.tookTailEncoded(offs, data); err != nil {
			t.endWith(err)
			return fmt.Errorf("%w: %w", errTaskEnded, err)
		}
	} else {
		final, err := t.passSlow(buf, first, last, off, offs, data, undo)
		if err != nil {
			t.endWith(err)
			return fmt.Errorf("%w: %w", errTaskEnded, err)
		}
		if final {
			// A producer's REC_DONE may follow its final boundary in the
			// same batch: the stream ends at the boundary all the same.
			lastHdr = tuple.Tuple{Type: tuple.Boundary, STime: finalBoundary}
		}
	}
	v.lastOff, v.offKnown = off, true
	t.passLast = last
	t.notePassedBatch(&lastHdr, offs, data)
	// Live reconfiguration: the sink's level follows the newest marker
	// level among the batch's boundaries (its last tuple may be an UNDO,
	// a REC_DONE or a tentative result).
	if lvl, ok := boundaryLevel(offs, data); ok {
		t.passLevel(&tuple.Tuple{Type: tuple.Boundary, Version: lvl})
	}
	t.inputs[0].setTaken(t.inputs[0].lw.tag(v.stable))
	t.tentative.Store(v.tentOpen)
	if lastHdr.Type == tuple.Boundary && lastHdr.STime == finalBoundary {
		t.endReconfig()
		t.setState(StateRunning, "input exhausted")
		return dataplane.ErrStopSubscription
	}
	return nil
}

// undo encodes an UNDO back to the last stable position (the caller
// appends it outside the stable view).
func (v *passView) undo() []byte {
	v.hdr = tuple.Tuple{Type: tuple.Undo, STime: int64(v.lastStablePos)}
	v.tentOpen, v.recOpen = false, true
	return tuple.AppendTuple(nil, &v.hdr)
}

// passSlow passes a batch that holds tuples outside the stable view, or
// stable ones taken already (a resumption by stable id resends them), or
// follows a correction: tuple by tuple (see passView). final reports the
// final boundary: nothing after it is passed.
func (t *task) passSlow(buf *dataplane.OutputBuffer, first, last, off uint64, offs []int, data, undo []byte) (final bool, err error) {
	v := &t.pv
	n := uint64(0)
	for _, o := range offs {
		if tp := tuple.PeekType(data[o:]); tp == tuple.Stable || tp == tuple.Boundary {
			n++
		}
	}
	if n > last-off {
		return false, fmt.Errorf("%w: %d stable tuples in a batch whose stable id ends at %d", dataplane.ErrProtocol, n, last-off)
	}
	sid := last - off - n
	start := v.pos + 1
	var out []byte
	var outOffs []int
	put := func(enc []byte, stable bool) {
		v.pos++
		if !stable {
			buf.MarkNonStable(v.pos, v.pos)
		}
		outOffs = append(outOffs, len(out))
		out = append(out, enc...)
	}
	if undo != nil {
		put(undo, false)
	}
	// name puts an UNCORRECTABLE record (enc) on the result stream, once
	// per range, never taken back, and notes it with its cause. The
	// result stream's stable ids may differ from the other sink
	// replica's from here on (its lineage).
	name := func(from, to int64, enc []byte, cause string) {
		if !t.unc.add(from, to) {
			return
		}
		t.inputs[0].diverged.Store(true)
		t.noteUncorrectable(from, to, cause)
		buf.Diverge(v.pos - buf.PositionOffset(v.pos))
		buf.NoteUncorrectable(from, to) // put below, in this batch
		if enc == nil {
			mk := tuple.UncorrectableMarker(from, to)
			enc = tuple.AppendTuple(nil, &mk)
		}
		put(enc, false)
	}
	for _, r := range v.marks {
		name(r[0], r[1], nil, causeUpstream) // named before the batch (passBatchDCAA)
	}
	v.marks = nil
	gapChecked := false // the first stable tuple or boundary past v.stable was checked for a gap
	for i, o := range offs {
		end := len(data)
		if i+1 < len(offs) {
			end = offs[i+1]
		}
		enc := data[o:end]
		var h tuple.Tuple
		if _, err := tuple.DecodeHeader(enc, &h); err != nil {
			return false, fmt.Errorf("result %d: %w", first+uint64(i), err)
		}
		switch h.Type {
		case tuple.Stable, tuple.Boundary:
			sid++
			if sid <= v.stable && (h.Type == tuple.Stable || h.STime != finalBoundary) {
				// Taken already (resent after a resumption). The final
				// boundary is taken whatever its stable id (replicas of a
				// lossy upstream number their stable streams differently;
				// see dcaa.Machine's deliver): by id, it was lost and the
				// sink never ended. (Only the final one: stableB is not
				// kept current by the all-stable path, so a stream time
				// test would pass resent boundaries twice.)
				continue
			}
			if !gapChecked {
				// The first one past what the sink took: a resumption by
				// stable id over ids the replica no longer holds skipped
				// results, named (gapAfter). A realignment's batch
				// (passBatchDCAA) starts at v.stable+1: its own gap is
				// the realignment's to name.
				gapChecked = true
				in := t.inputs[0]
				if r, ok := in.lw.gapAfter(sid, v.stable, h.STime); ok {
					logGap(t.log, in, v.stable, r)
					name(r[0], r[1], nil, causeGap)
					for _, c := range in.lw.concerning() { // records maybe among the ids skipped
						name(c[0], c[1], nil, causeUpstream)
					}
				}
			}
			if v.tentOpen {
				// Stable after tentative without an UNDO: take them back
				// first, so an UNDO never goes below a stable tuple.
				put(v.undo(), false)
			}
			put(enc, true)
			v.stable, v.lastStablePos = max(v.stable, sid), v.pos
			t.inputs[0].lw.took(h.STime, h.Type == tuple.Boundary)
			if h.Type == tuple.Boundary {
				v.stableB = h.STime
				if h.STime == finalBoundary {
					final = true
				}
				if v.switchRec {
					v.hdr = tuple.Tuple{Type: tuple.RecDone}
					put(tuple.AppendTuple(nil, &v.hdr), false)
					v.switchRec, v.recOpen, v.lastStablePos = false, false, v.pos
				}
			}
		case tuple.Tentative:
			if h.STime < v.stableB {
				continue // covered by stable results already
			}
			if sid < v.stable && t.inputs[0].lw.covers(h.STime) {
				// The replica went tentative before it had the stable
				// results the sink took (a resumption by stable id into
				// its tentative tail): this one stands for some of them.
				continue
			}
			put(enc, false)
			v.tentOpen = true
		case tuple.Undo:
			if v.tentOpen {
				put(v.undo(), false)
			}
		case tuple.RecDone:
			if v.recOpen && !v.tentOpen {
				put(enc, false)
				v.recOpen, v.switchRec, v.lastStablePos = false, false, v.pos
			}
		case tuple.Uncorrectable:
			// Passed once per range (both replicas of the upstream send
			// one, a resumption resends it).
			var mk tuple.Tuple
			if _, err := tuple.DecodeTuple(enc, &mk); err != nil {
				return false, fmt.Errorf("result %d: %w", first+uint64(i), err)
			}
			t.inputs[0].diverged.Store(true)
			if from, to, ok := tuple.UncorrectableRange(&mk); ok {
				name(from, to, enc, causeUpstream)
			}
		}
		if final {
			break
		}
	}
	if len(outOffs) == 0 {
		return final, nil
	}
	return final, buf.Adopt(t.ctx, start, outOffs, out)
}

// restorePassView sets a restored pass-through sink's view from its
// snapshot: its input resumes after stable id after; its stream ends at
// pos with nothing tentative (a sink holding tentative results is not
// snapshotted).
func (t *task) restorePassView(after uint64, boundary int64, pos uint64) {
	t.pv = passView{stable: after, stableB: boundary, pos: pos, lastStablePos: pos}
	t.inputs[0].stableTaken.Store(after)
}

// mergeView is a merging sink's tentative part (replicated queries
// only): the stable merge is the merger's, fed only the inputs' stable
// tuples and boundaries (renumbered by stable id, duplicates dropped);
// the tentative tuples each input brought, current ones only, are kept
// here and go out at once (see sync).
type mergeView struct {
	mu sync.Mutex // guards tent, dirty
	// tent holds, per input, its current tentative tuples (copies) in
	// arrival order; dirty: some were taken back since the last sync.
	tent  [][]tuple.Tuple
	dirty bool
	// Under proc: emitted are the tentative tuples the result stream
	// holds after lastStablePos (not taken back), as (input, index in
	// tent at the time) pairs' tuples; recOpen: an UNDO went out, its
	// REC_DONE has not.
	emitted       []tuple.Tuple
	lastStablePos uint64
	recOpen       bool
	// skipped counts the tentative tuples not kept for the bound (see
	// filterDCAA); tentMax is the most any input's tent held (figures).
	skipped, tentMax atomic.Uint64
}

// mergeDCAA reports whether the task is a merging sink of a replicated
// query (then mergeView applies).
func (t *task) mergeDCAA() bool { return t.mv != nil }

// filterDCAA prepares a batch for a merging sink's merger: stable tuples
// and boundaries, renumbered by stable id, those taken already dropped;
// tentative tuples, UNDO and REC_DONE go to the view. fresh: the
// attempt's first batch (what the input had tentatively is no longer
// current: another replica may be read now). It reports whether the view
// changed (sync it) and taken, the stable id of the batch's last stable
// tuple or boundary kept (the input's stable id once the merger took
// the batch). input.stableTaken is not moved here: the merger may wait
// for room, or the attempt end, before it takes the batch, and until
// then the batch is not taken (a snapshot, a resumption, the ack relays
// go by what the merger holds; see mergeInput.stable).
func (in *input) filterDCAA(b *dataplane.Batch, fresh bool) (changed bool, marks, gaps [][2]int64, taken uint64, err error) {
	mv := in.t.mv
	taken = in.stableTaken.Load()
	if fresh {
		in.lw.subscribed(b.Named)
	}
	// A switch onto an upstream replica whose stable ids mean other
	// results (dcaa_lineage.go): subscribe again and realign, nothing of
	// the batch taken.
	if in.lw.start(fresh, b.Lineage, b.LineageSince, taken) {
		in.t.log.Info("DCAA sink input switched to an upstream replica whose stable ids mean other results: realigning by stream time",
			"input", in.upstream, "partition", in.upPartition, "taken", taken, "resume_after", in.lw.re.resumeAt)
		return false, nil, nil, 0, errRealign
	}
	if fresh {
		in.offKnown = false
		mv.mu.Lock()
		if len(mv.tent[in.idx]) > 0 {
			mv.tent[in.idx], mv.dirty, changed = nil, true, true
		}
		mv.mu.Unlock()
	}
	realigning := in.lw.re.on
	if !realigning {
		in.lw.batch(b.Lineage, b.LineageSince)
	}
	if off := b.Offset; !realigning && (off == 0 || in.offKnown && off == in.lastOff) && b.FirstID > off && b.FirstID-off == taken+1 {
		// Nothing outside the stable view, nothing taken twice: as it is.
		in.lastOff, in.offKnown = off, true
		in.lw.tookTail(b.Tuples)
		return changed, marks, nil, b.LastID - off, nil
	}
	if _, err := stableIDs(b); err != nil {
		return changed, nil, nil, 0, err
	}
	if realigning {
		// What the other replica gave already is dropped; the input
		// follows this one's numbering from the first new stable tuple
		// or boundary.
		cut, renumbered, named := in.lw.sinkRealign(b.Tuples)
		marks = named
		clear(b.Tuples[:cut])
		if b.Tuples = b.Tuples[cut:]; len(b.Tuples) > 0 {
			taken = renumbered
		}
	}
	in.lastOff, in.offKnown = b.Offset, true
	released := in.t.merge.releasedAt()
	// bnd is the input's last boundary taken: a boundary past it is new
	// whatever its stable id (replicas of a lossy upstream number their
	// stable streams differently; see dcaa.Machine's deliver). By id
	// alone, such an upstream's final boundary was lost after a switch
	// and the sink never ended.
	bnd := in.t.merge.inputBoundary(in.idx)
	// sid is the replica's stable id before each tuple (stableIDs set the
	// stable ones').
	sid := b.LastID - b.Offset
	for k := range b.Tuples {
		if tp := b.Tuples[k].Type; tp == tuple.Stable || tp == tuple.Boundary {
			sid--
		}
	}
	kept := b.Tuples[:0]
	gapChecked := false // the first stable tuple or boundary past taken was checked for a gap
	mv.mu.Lock()
	for _, tp := range b.Tuples {
		switch tp.Type {
		case tuple.Stable, tuple.Boundary:
			sid = tp.ID
			if tp.ID <= taken {
				if tp.Type == tuple.Stable || tp.STime <= bnd {
					continue
				}
				tp.ID = taken // ids stay increasing in the merger
			} else if !realigning && !gapChecked {
				// Resumed by stable id over ids the replica no longer
				// holds: named (gapAfter).
				if r, ok := in.lw.gapAfter(tp.ID, taken, tp.STime); ok {
					logGap(in.t.log, in, taken, r)
					marks, gaps = append(marks, r), append(gaps, r)
					marks = append(marks, in.lw.concerning()...) // records maybe among the ids skipped
				}
			}
			gapChecked = true
			taken = tp.ID
			if tp.Type == tuple.Boundary {
				bnd = max(bnd, tp.STime)
			}
			kept = append(kept, tp)
		case tuple.Tentative:
			if tp.STime < released || !realigning && sid < taken && in.lw.covers(tp.STime) {
				// Released stable already, or (the replica went tentative
				// before it had the stable results the input took: a
				// resumption by stable id into its tentative tail) stands
				// for some the input took.
				continue
			}
			// Bounded per input (InputPendingTuples): past it, during a
			// long failure, later tentative results of this input are not
			// shown; the ones shown stay current until the stable results
			// replace them, so nothing is taken back for the bound.
			if len(mv.tent[in.idx]) >= in.t.r.opts.InputPendingTuples {
				mv.skipped.Add(1)
				continue
			}
			mv.tent[in.idx] = append(mv.tent[in.idx], *tp.Clone())
			changed = true
			if n := uint64(len(mv.tent[in.idx])); n > mv.tentMax.Load() {
				mv.tentMax.Store(n)
			}
		case tuple.Undo:
			if len(mv.tent[in.idx]) > 0 {
				mv.tent[in.idx], mv.dirty, changed = nil, true, true
			}
		case tuple.Uncorrectable:
			if from, to, ok := tuple.UncorrectableRange(&tp); ok {
				marks = append(marks, [2]int64{from, to})
			}
		}
	}
	mv.mu.Unlock()
	clear(b.Tuples[len(kept):])
	b.Tuples = kept
	in.lw.tookTail(kept)
	return changed, marks, gaps, taken, nil
}

// syncTentative brings the result stream's tentative part up to date
// (the caller holds proc): tentative tuples that arrived are appended;
// when some that went out are no longer current (taken back, or covered
// by the stable release up to released), the sink sends UNDO back to its
// last stable position and the current ones again; once a correction
// leaves nothing tentative, REC_DONE.
func (t *task) syncTentative(ctx context.Context) error {
	mv := t.mv
	released := t.merge.releasedAt()
	mv.mu.Lock()
	var cur []tuple.Tuple
	for i, ts := range mv.tent {
		keep := ts[:0]
		for _, tp := range ts {
			if tp.STime >= released {
				keep = append(keep, tp)
			} else {
				mv.dirty = true
			}
		}
		clear(ts[len(keep):])
		mv.tent[i] = keep
		cur = append(cur, keep...)
	}
	dirty := mv.dirty
	mv.dirty = false
	mv.mu.Unlock()
	if !dirty && len(cur) == len(mv.emitted) && (len(cur) > 0 || !mv.recOpen) && prefixOf(mv.emitted, cur) {
		return nil // nothing changed
	}
	o := t.outs[0]
	if dirty || !prefixOf(mv.emitted, cur) {
		if len(mv.emitted) > 0 {
			if err := t.appendNonStable(ctx, o, &tuple.Tuple{Type: tuple.Undo, STime: int64(mv.lastStablePos)}); err != nil {
				return err
			}
			mv.emitted, mv.recOpen = mv.emitted[:0], true
		}
	}
	if len(mv.emitted) == 0 && len(cur) > 0 {
		mv.lastStablePos = o.w.LastID()
	}
	for k := len(mv.emitted); k < len(cur); k++ {
		tp := cur[k]
		tp.Type = tuple.Tentative
		if err := t.appendNonStable(ctx, o, &tp); err != nil {
			return err
		}
		mv.emitted = append(mv.emitted, cur[k])
	}
	if len(cur) == 0 && mv.recOpen {
		if err := t.appendNonStable(ctx, o, &tuple.Tuple{Type: tuple.RecDone}); err != nil {
			return err
		}
		mv.recOpen = false
	}
	t.tentative.Store(len(mv.emitted) > 0)
	return t.flush(ctx)
}

// beforeStable takes back the tentative tuples the result stream holds
// before a stable release appends to it (an UNDO never goes below a
// stable tuple); the caller holds proc and syncs after the release.
func (t *task) beforeStable(ctx context.Context) error {
	mv := t.mv
	if len(mv.emitted) == 0 {
		return nil
	}
	if err := t.appendNonStable(ctx, t.outs[0], &tuple.Tuple{Type: tuple.Undo, STime: int64(mv.lastStablePos)}); err != nil {
		return err
	}
	mv.emitted, mv.recOpen = mv.emitted[:0], true
	mv.mu.Lock()
	mv.dirty = true
	mv.mu.Unlock()
	return nil
}

// appendNonStable appends tp to o marked outside the stable view.
func (t *task) appendNonStable(ctx context.Context, o *outStream, tp *tuple.Tuple) error {
	next := o.w.LastID() + 1
	o.buf.MarkNonStable(next, next)
	return t.appendTo(ctx, o, tp)
}

// prefixOf reports whether a is a prefix of b (same tuples: stime, input
// order and values; the view keeps them by copy).
func prefixOf(a, b []tuple.Tuple) bool {
	if len(a) > len(b) {
		return false
	}
	for i := range a {
		if a[i].STime != b[i].STime || a[i].ID != b[i].ID || !slices.Equal(a[i].Values, b[i].Values) {
			return false
		}
	}
	return true
}

// newMergeView sets a merging sink of a replicated query up.
func (t *task) newMergeView() {
	t.mv = &mergeView{tent: make([][]tuple.Tuple, len(t.inputs))}
}

// growMergeView follows inputs a rescale added.
func (mv *mergeView) grow(n int) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	for len(mv.tent) < n {
		mv.tent = append(mv.tent, nil)
	}
}

// sinkTentativeHeld reports whether a sink's result stream holds
// tentative results or an open correction (it is then not snapshotted: a
// copy could not take them back).
func (t *task) sinkTentativeHeld() bool {
	if t.passDCAA() {
		return t.pv.tentOpen || t.pv.recOpen || t.pv.switchRec
	}
	if t.mv != nil {
		return len(t.mv.emitted) > 0 || t.mv.recOpen
	}
	return false
}

// mergeDCAA is a merging sink's delivery in a replicated query, before
// the merger takes b: see filterDCAA (taken is its stable id for the
// merger); a changed tentative part goes out at once.
func (in *input) mergeDCAA(ctx context.Context, b *dataplane.Batch, fresh bool) (taken uint64, err error) {
	changed, marks, gaps, taken, err := in.filterDCAA(b, fresh)
	if err != nil {
		return 0, fmt.Errorf("input %s partition %d: %w", in.upstream, in.upPartition, err)
	}
	if !changed && len(marks) == 0 {
		return taken, nil
	}
	if len(marks) > 0 {
		in.diverged.Store(true)
	}
	t := in.t
	if err := t.lockProc(ctx); err != nil {
		return 0, err
	}
	defer t.unlockProc()
	if t.halted.Load() {
		return taken, nil
	}
	for _, r := range marks {
		if err := t.sinkUncorrectable(t.ctx, r[0], r[1], lossCauses{gap: gaps}.of(r)); err != nil {
			t.endWith(err)
			return 0, fmt.Errorf("%w: %w", errTaskEnded, err)
		}
	}
	if !changed {
		return taken, nil
	}
	if err := t.syncTentative(t.ctx); err != nil {
		t.endWith(err)
		return 0, fmt.Errorf("%w: %w", errTaskEnded, err)
	}
	return taken, nil
}

// boundaryLevel returns the highest marker level (tuple.Version) among the
// boundaries of an encoded batch; ok is false when it holds none.
func boundaryLevel(offs []int, data []byte) (level uint64, ok bool) {
	for _, o := range offs {
		if tuple.PeekType(data[o:]) != tuple.Boundary {
			continue
		}
		var h tuple.Tuple
		if _, err := tuple.DecodeHeader(data[o:], &h); err != nil {
			continue
		}
		level, ok = max(level, h.Version), true
	}
	return level, ok
}

// stableHeaders decodes the headers of an encoded batch (first to last,
// position offset off at its end) with their stable ids set, as
// stableIDs does for a decoded one: a pass-through sink's input decodes
// nothing else, and this only while it realigns.
func stableHeaders(first, last, off uint64, offs []int, data []byte) ([]tuple.Tuple, error) {
	hb := dataplane.Batch{FirstID: first, LastID: last, Offset: off, Tuples: make([]tuple.Tuple, len(offs))}
	for k, o := range offs {
		if _, err := tuple.DecodeHeader(data[o:], &hb.Tuples[k]); err != nil {
			return nil, fmt.Errorf("result %d: %w", first+uint64(k), err)
		}
	}
	if _, err := stableIDs(&hb); err != nil {
		return nil, err
	}
	return hb.Tuples, nil
}
