package dataplane

// renumber is the state of a stream whose ids are continued after the
// position its consumer resumes at, whenever that consumer comes (see
// RenumberOnFirstResume), under OutputBuffer.mu.
type renumber struct {
	// pending: the stream awaits its first acknowledging data
	// subscription.
	pending bool
}

// RenumberOnFirstResume makes the buffer continue its stream after the
// position its first acknowledging data subscription resumes at: the
// tuples appended before it came, numbered from 1, are renumbered to
// follow that position (and so is the Writer, at its next call). It is
// for the stream of a copy placed again without the state of the copy
// before it (an ingest source after its worker was lost), whose consumer
// resumes after the ids it took from that copy: numbered from 1, the new
// copy's first tuples fell at or below that position and the consumer
// skipped them. The consumer takes nothing from the copy before its
// first subscription, so nothing it holds is renumbered. Tuples an
// overrun discarded before the consumer came stay discarded, and are
// named in a warning then. Only for a stream with one acknowledging
// subscriber (a query without replicas); call it before the buffer is
// reachable by subscribers.
func (b *OutputBuffer) RenumberOnFirstResume() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.renumber.pending = true
}

// resumeFirst is called as an acknowledging data subscription starts,
// after id after, before anything is read: the first one renumbers a
// stream waiting for it (RenumberOnFirstResume).
func (b *OutputBuffer) resumeFirst(after uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.renumber.pending {
		return
	}
	b.renumber.pending = false
	if after == 0 {
		return // the consumer holds nothing of the stream: ids stand
	}
	lost := b.dropped
	for _, c := range b.chunks {
		c.first += after
	}
	b.lastID += after
	// Ids up to after are not here (as ResumeAfter), nor the ones an
	// overrun discarded before the consumer came.
	b.dropped += after
	b.stScan = stScan{}
	b.shift.Add(after)
	if lost > 0 {
		b.opts.Logger.Warn("the consumer came after records of this copy placed again were discarded (overrun while it was away); it misses them",
			"after_id", after, "discarded", lost)
	} else {
		b.opts.Logger.Info("copy placed again numbers its stream after its consumer's position, which came after it took records",
			"after_id", after, "renumbered", b.count)
	}
}

// idsAbsolute, as the shift an append's ids follow, says they are the
// stream's own, given by a caller that is not the stream's Writer.
const idsAbsolute = ^uint64(0)

// shifted is first, numbered under the buffer's renumbering shift, as
// the stream numbers it now. b.mu must be held.
func (b *OutputBuffer) shifted(first, shift uint64) uint64 {
	if shift == idsAbsolute {
		return first
	}
	return first + b.shift.Load() - shift
}

// syncShift applies to the Writer a renumbering its buffer made since
// its last call (resumeFirst): its staged and appended ids follow the
// buffer's. Only the Writer's owner calls it.
func (w *Writer) syncShift() {
	if s := w.buf.shift.Load(); s != w.shift {
		w.applyShift(s)
	}
}

// applyShift moves the Writer's ids by the buffer's renumbering up to s.
func (w *Writer) applyShift(s uint64) {
	d := s - w.shift
	w.shift = s
	// first matters only while tuples are staged (stage sets it anew).
	w.first += d
	w.lastID += d
	w.appendedID += d
}
