package runtime

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/fedstream/fedstream/worker/tuple"
)

// merger is the deterministic merge of a task's input streams (SUnion in
// stable mode). It keeps, per input stream, the BOUNDARY stimes received
// and the data tuples not yet released. Data with stime below the minimum
// boundary over all inputs (the watermark) can no longer be preceded by
// anything, so it is released sorted by (stime, port, upstream partition,
// id).
//
// Release happens in steps, one per distinct boundary value any input
// carried up to the watermark, never at whatever the watermark happened to
// be when a batch arrived. Every input has received all its boundaries up
// to the watermark, so the steps depend only on the streams' contents:
// replicas emit the same boundaries, hence the same output ids, whatever
// the arrival interleaving.
//
// Tuples are not copied on the way through: an input's pending tuples are
// runs aliasing the delivered batches, and a release hands out runs (or,
// for inputs out of stime order, single tuples) aliasing the same memory.
// A delivered batch with an owner is handed back (Release) through take's
// finished list once every data tuple it holds has been released, so the
// caller recycles it after processing that release.
type merger struct {
	mu     sync.Mutex
	inputs []*mergeInput
	// released is the watermark of the last release.
	released int64
	// limit is the soft bound on pending tuples per input (see add).
	limit int
	// oneStep makes every release end at the first step it could end at
	// (one boundary interval of input), not the highest, so that a
	// backlog is worked through release by release (outputs flushed,
	// holds for a rescale seen, a calibrated cost spent after each)
	// instead of in one release of all of it. Tasks set it (buildInputs);
	// the output is the same either way.
	oneStep bool
	// wake has capacity one: a pending signal for the process goroutine.
	wake chan struct{}
	// space is closed (and replaced) after each release to wake inputs
	// waiting for room.
	space chan struct{}
	// Scratch reused by take: the release (runs, steps, finished batches)
	// and the sort buffer of inputs out of stime order.
	rel    mergeRelease
	sorted []mergedTuple
	// finished collects batches whose tuples have all left the queues
	// since the last take (batches without data tuples included).
	finished []batchOwner
	// halted: a stop-and-copy snapshot captured the merge; add refuses
	// every later batch (unacknowledged, so the upstream keeps it for the
	// copy that resumes from the snapshot) and take releases nothing.
	halted bool
	// cut, when below math.MaxInt64, is the stream time an aligned
	// snapshot waits for: take releases no step above it (see atCut).
	cut int64
	// cutStep makes the cut itself a release step once every input is
	// past it: a rescale's cut, where the task must have processed
	// exactly the tuples below the cut (see rescale.go). Every replica
	// sets the same cut, so they release the same steps.
	cutStep bool
	// holding: a rescale's prepare holds the merge (see hold); add then
	// holds no input back.
	holding bool
	// addWaits counts the adds waiting for room now (inputs held back by
	// the merge's bound).
	addWaits int
	// received is the highest stream time of a tuple or boundary any
	// input received (the final boundary aside; math.MinInt64: none),
	// released or not: see receivedFrontier. Written under mu, read
	// anywhere.
	received atomic.Int64
}

// batchOwner is what a delivered batch's memory is handed back to once
// its tuples are no longer used (dataplane.Batch implements it).
type batchOwner interface{ Release() }

type mergeInput struct {
	port, upPartition int
	// boundary is the latest boundary; steps the boundaries received
	// above the last release, increasing.
	boundary int64
	steps    []int64
	// queue holds the pending data tuples in stream order, as runs
	// aliasing the delivered batches; pending counts them.
	queue   []pendingRun
	pending int
	// unsorted says the queue is not in non-decreasing stime order (then
	// take sorts; otherwise it merges the inputs' queues as they are).
	unsorted bool
	// lastID is the id of the last tuple added: every tuple up to it is
	// processed or in queue. It is the input's position in a snapshot
	// (the subscriber's own LastID moves only after a delivery returns).
	lastID uint64
	// stable is, for a merging sink of a replicated query, the stable id
	// of the last stable tuple or boundary added (see filterDCAA): its
	// input position in a snapshot. Set with the batch under mu, so a
	// capture never sees a stable id whose batch the merge has not taken
	// (an add waiting for room, or cancelled while it waits).
	stable uint64
	// Live reconfiguration: every boundary carries its producer's marker
	// level (tuple.Version: the newest epoch whose markers it has passed
	// on). marks are the rises not yet released, level the input's level
	// as of the last release (see levelAt).
	marks     []inputMark
	markLevel uint64
	level     uint64
}

// noteMark records tp if it is a boundary that raises the input's marker
// level (the caller holds the merger's lock).
func (in *mergeInput) noteMark(tp *tuple.Tuple) {
	if tp.Type != tuple.Boundary {
		return
	}
	level := tp.Version
	if tp.STime == finalBoundary {
		// An input that ended sends no tuple of any epoch any more: it
		// holds back no plan, present or future (a plan committed after
		// a finite stream ended would otherwise wait for markers its
		// ended upstream can never send).
		level = endedLevel
	}
	if level > in.markLevel {
		in.markLevel = level
		in.marks = append(in.marks, inputMark{tp.STime, level})
	}
}

// endedLevel is the marker level of an input past its final boundary.
const endedLevel = math.MaxUint64

// inputMark is a boundary that raised an input's marker level.
type inputMark struct {
	stime int64
	level uint64
}

// pendingRun is a run of consecutive data tuples of one delivered batch.
type pendingRun struct {
	tuples []tuple.Tuple
	batch  *heldBatch // nil when the batch has no owner
}

// heldBatch counts the runs of a delivered batch still queued.
type heldBatch struct {
	owner batchOwner
	runs  int
}

// mergedRun is a run of released data tuples of one input, consecutive in
// the release order.
type mergedRun struct {
	port, upPartition int
	tuples            []tuple.Tuple
}

// mergedTuple is a data tuple with its origin (the sort of inputs out of
// stime order).
type mergedTuple struct {
	port, upPartition int
	t                 tuple.Tuple
}

// mergeRelease is what take hands out: the released runs in release
// order, the release steps (increasing, the last one the new watermark)
// and the batches to hand back once the runs are processed.
type mergeRelease struct {
	runs     []mergedRun
	steps    []int64
	finished []batchOwner
}

func newMerger(limit int) *merger {
	m := &merger{released: math.MinInt64, limit: limit, wake: make(chan struct{}, 1), space: make(chan struct{}), cut: math.MaxInt64}
	m.received.Store(math.MinInt64)
	return m
}

// addInput registers an input stream and returns its index.
// A rescale adds inputs while the others run and read theirs.
func (m *merger) addInput(port, upPartition int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inputs = append(m.inputs, &mergeInput{port: port, upPartition: upPartition, boundary: math.MinInt64})
	return len(m.inputs) - 1
}

// setFloor records that input i carries nothing with stime below level:
// an input a rescale added, whose partition starts at the rescale's cut
// (its upstream task processes, and so emits, nothing below the cut).
// The input then counts as having received a boundary at level, without
// a release step there, so the other inputs' tuples below level are
// released without waiting for the added partition's first boundary.
// That wait would be a cycle: an added partition sends its first boundary
// only when the inputs of its own task reach the cut, which a shared
// upstream blocked on an old partition's full buffer may never do, while
// the old partition reaches the cut only once its output below it is
// taken here.
func (m *merger) setFloor(i int, level int64) {
	m.mu.Lock()
	in := m.inputs[i]
	raised := level > in.boundary
	if raised {
		in.boundary = level
	}
	m.mu.Unlock()
	if raised {
		m.poke()
	}
}

// highestStepLocked returns the highest step of any input at or below wm
// (the last release's watermark when there is none).
func (m *merger) highestStepLocked(wm int64) int64 {
	top := m.released
	for _, in := range m.inputs {
		for _, s := range in.steps {
			if s <= wm && s > top {
				top = s
			}
		}
	}
	return top
}

// waiting reports the inputs the merge waits for: when some input has
// brought a boundary beyond the last release (it has something to
// release) while others have not, those others (by index). nil when no
// input is ahead, or none is behind.
func (m *merger) waiting() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	ahead := false
	var behind []int
	for i, in := range m.inputs {
		if in.boundary > m.released {
			ahead = true
		} else {
			behind = append(behind, i)
		}
	}
	if !ahead {
		return nil
	}
	return behind
}

func (m *merger) minBoundaryLocked() int64 {
	low := int64(math.MaxInt64)
	for _, in := range m.inputs {
		low = min(low, in.boundary)
	}
	return low
}

// add takes a batch of input i (in stream order). The merger keeps
// references into batch until its tuples are released; owner, if not
// nil, gets the batch back through take's finished list after that, and
// the caller must not use batch once add returned. To bound memory add
// waits while input i already holds limit pending tuples and is ahead of
// the slowest input; the slowest input is never held back, so the merge
// always makes progress. stable, when not 0, is the batch's last stable
// id (a merging sink of a replicated query, see mergeInput.stable).
func (m *merger) add(ctx context.Context, i int, batch []tuple.Tuple, owner batchOwner, stable uint64) error {
	m.mu.Lock()
	in := m.inputs[i]
	for in.pending >= m.limit && in.boundary > m.minBoundaryLocked() && !m.halted && !m.holding {
		ch := m.space
		m.addWaits++
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			m.mu.Lock()
			m.addWaits--
			m.mu.Unlock()
			return ctx.Err()
		}
		m.mu.Lock()
		m.addWaits--
	}
	if m.halted {
		m.mu.Unlock()
		return errHalted
	}
	if len(batch) > 0 {
		in.lastID = batch[len(batch)-1].ID
	}
	if stable != 0 {
		in.stable = stable
	}
	var held *heldBatch
	if owner != nil {
		held = &heldBatch{owner: owner}
	}
	advanced := false
	start := -1 // start of the current run of data tuples
	last := int64(math.MinInt64)
	if n := len(in.queue); n > 0 {
		r := in.queue[n-1].tuples
		last = r[len(r)-1].STime
	}
	top := m.received.Load()
	for k := range batch {
		tp := &batch[k]
		if tp.STime > top && tp.STime != finalBoundary {
			top = tp.STime
		}
		if tp.Type.IsData() {
			if start < 0 {
				start = k
			}
			if tp.STime < last {
				in.unsorted = true
			}
			last = tp.STime
			continue
		}
		if start >= 0 {
			in.queueRun(batch[start:k], held)
			start = -1
		}
		in.noteMark(tp)
		if tp.Type == tuple.Boundary && tp.STime > in.boundary {
			in.boundary = tp.STime
			// An input added to a running merge (a partition a rescale
			// added) may bring boundaries the merge released already:
			// they are no step.
			if tp.STime > m.released {
				in.steps = append(in.steps, tp.STime)
			}
			advanced = true
		}
		// UNDO and REC_DONE belong to DCAA corrections, not stable mode.
	}
	if start >= 0 {
		in.queueRun(batch[start:], held)
	}
	m.received.Store(top)
	if held != nil && held.runs == 0 {
		m.finished = append(m.finished, owner) // nothing of it is kept
	}
	m.mu.Unlock()
	if advanced {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

func (in *mergeInput) queueRun(tuples []tuple.Tuple, held *heldBatch) {
	in.queue = append(in.queue, pendingRun{tuples: tuples, batch: held})
	in.pending += len(tuples)
	if held != nil {
		held.runs++
	}
}

// take releases what the minimum boundary allows (see mergeRelease): the
// caller processes, for each step, the tuples below it and then advances
// to it, and then hands back the finished batches. ok is false when the
// watermark has not moved. The release is reused by the next take.
func (m *merger) take() (rel *mergeRelease, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	wm := m.minBoundaryLocked()
	forced := false
	if wm > m.cut && m.cutStep && m.cut > m.released {
		wm, forced = m.cut, true
	} else if wm <= m.cut && wm > m.released {
		// The minimum boundary is a step of the input holding it, unless
		// it is a floor (setFloor): then the release ends at the highest
		// step below it, so steps stay those the streams carry.
		wm = m.highestStepLocked(wm)
	} else if wm > m.cut {
		// Release up to the highest step at or below the cut: any step
		// below the minimum boundary may end a release, and releases go
		// step by step, so the output is the same as without the cut.
		capped := m.released
		for _, in := range m.inputs {
			for _, s := range in.steps {
				if s <= m.cut && s > capped {
					capped = s
				}
			}
		}
		wm = capped
	}
	if wm <= m.released || m.halted {
		return nil, false
	}
	if m.oneStep {
		// Any step below the minimum boundary may end a release (as the
		// cut above does): the output is the same. The release forced up
		// to a cut goes step by step too; the last one ends at the cut.
		first := wm
		for _, in := range m.inputs {
			for _, s := range in.steps {
				if s > m.released && s < first {
					first = s
				}
			}
		}
		if first < wm {
			wm, forced = first, false
		}
	}
	rel = &m.rel
	steps := rel.steps[:0]
	for _, in := range m.inputs {
		n := 0
		for n < len(in.steps) && in.steps[n] <= wm {
			n++
		}
		steps = append(steps, in.steps[:n]...)
		in.steps = append(in.steps[:0], in.steps[n:]...)
	}
	if forced {
		steps = append(steps, wm)
	}
	slices.Sort(steps)
	rel.steps = slices.Compact(steps)
	clear(rel.runs) // drop references to batches handed back before
	rel.runs = rel.runs[:0]
	clear(rel.finished)
	rel.finished = append(rel.finished[:0], m.finished...)
	clear(m.finished)
	m.finished = m.finished[:0]
	sorted := true
	for _, in := range m.inputs {
		sorted = sorted && !in.unsorted
	}
	if sorted {
		m.mergeSortedLocked(rel, wm)
	} else {
		m.collectAndSortLocked(rel, wm)
	}
	m.released = wm
	close(m.space)
	m.space = make(chan struct{})
	return rel, true
}

// mergeOrder is the release order: (stime, port, upstream partition, id).
func mergeOrder(a, b *mergedTuple) int {
	return cmp.Or(
		cmp.Compare(a.t.STime, b.t.STime),
		cmp.Compare(a.port, b.port),
		cmp.Compare(a.upPartition, b.upPartition),
		cmp.Compare(a.t.ID, b.t.ID),
	)
}

// collectAndSortLocked releases the pending tuples below wm of every input
// and sorts them into the release order. The released tuples are copied
// into m.sorted (their values still alias the batches, which are handed
// back only after the release is processed); the kept ones are compacted
// within their runs.
func (m *merger) collectAndSortLocked(rel *mergeRelease, wm int64) {
	clear(m.sorted)
	out := m.sorted[:0]
	for _, in := range m.inputs {
		in.unsorted = false
		last := int64(math.MinInt64)
		queue := in.queue[:0]
		for _, r := range in.queue {
			keep := r.tuples[:0]
			for _, tp := range r.tuples {
				if tp.STime < wm {
					out = append(out, mergedTuple{port: in.port, upPartition: in.upPartition, t: tp})
					continue
				}
				if tp.STime < last {
					in.unsorted = true
				}
				last = tp.STime
				keep = append(keep, tp)
			}
			in.pending -= len(r.tuples) - len(keep)
			if len(keep) > 0 {
				queue = append(queue, pendingRun{tuples: keep, batch: r.batch})
			} else {
				m.runDoneLocked(rel, r)
			}
		}
		clear(in.queue[len(queue):])
		in.queue = queue
	}
	slices.SortFunc(out, func(a, b mergedTuple) int { return mergeOrder(&a, &b) })
	m.sorted = out
	for k := range out {
		mt := &out[k]
		rel.runs = append(rel.runs, mergedRun{port: mt.port, upPartition: mt.upPartition, tuples: unsafe.Slice(&mt.t, 1)})
	}
}

// runDoneLocked notes that every tuple of run r left its queue.
func (m *merger) runDoneLocked(rel *mergeRelease, r pendingRun) {
	if r.batch == nil {
		return
	}
	r.batch.runs--
	if r.batch.runs == 0 {
		rel.finished = append(rel.finished, r.batch.owner)
	}
}

// mergeCursor walks the released prefix of one input's queue.
type mergeCursor struct {
	run, off int // position in the queue
	left     int // released tuples not yet merged
}

// head returns the cursor's next tuple.
func (c *mergeCursor) head(in *mergeInput) *tuple.Tuple { return &in.queue[c.run].tuples[c.off] }

// releasedCount returns how many tuples at the front of a queue in stime
// order have stime below wm.
func (in *mergeInput) releasedCount(wm int64) int {
	n := 0
	for _, r := range in.queue {
		if r.tuples[len(r.tuples)-1].STime < wm {
			n += len(r.tuples)
			continue
		}
		k, _ := slices.BinarySearchFunc(r.tuples, wm, func(tp tuple.Tuple, wm int64) int { return cmp.Compare(tp.STime, wm) })
		return n + k
	}
	return n
}

// mergeSortedLocked releases the pending tuples below wm when every
// input's queue is in stime order: each input's released tuples are then a
// prefix of its queue, already in release order (ids increase along a
// stream), so a k-way merge of the prefixes gives the order a sort would.
// The merge hands out maximal runs: the best input's tuples are taken
// for as long as they precede every other input's head.
func (m *merger) mergeSortedLocked(rel *mergeRelease, wm int64) {
	var cursors [8]mergeCursor
	cs := cursors[:0]
	if len(m.inputs) > len(cursors) {
		cs = make([]mergeCursor, 0, len(m.inputs))
	}
	for _, in := range m.inputs {
		cs = append(cs, mergeCursor{left: in.releasedCount(wm)})
	}
	// before reports whether a (of input i) precedes b (of input j != i).
	// Inputs differ in (port, upstream partition), so ids never decide.
	before := func(a *tuple.Tuple, i int, b *tuple.Tuple, j int) bool {
		if a.STime != b.STime {
			return a.STime < b.STime
		}
		x, y := m.inputs[i], m.inputs[j]
		return cmp.Or(cmp.Compare(x.port, y.port), cmp.Compare(x.upPartition, y.upPartition)) < 0
	}
	for {
		// The input with the first head, and the one with the next.
		best, next := -1, -1
		for i, in := range m.inputs {
			if cs[i].left == 0 {
				continue
			}
			switch {
			case best < 0:
				best = i
			case before(cs[i].head(in), i, cs[best].head(m.inputs[best]), best):
				best, next = i, best
			case next < 0 || before(cs[i].head(in), i, cs[next].head(m.inputs[next]), next):
				next = i
			}
		}
		if best < 0 {
			break
		}
		in, c := m.inputs[best], &cs[best]
		run := in.queue[c.run].tuples
		end := min(len(run), c.off+c.left)
		if next >= 0 {
			// Stop at the first tuple the next input's head precedes.
			limit := cs[next].head(m.inputs[next])
			k := c.off + 1 // the head itself is first
			for k < end && before(&run[k], best, limit, next) {
				k++
			}
			end = k
		}
		rel.runs = append(rel.runs, mergedRun{port: in.port, upPartition: in.upPartition, tuples: run[c.off:end]})
		c.left -= end - c.off
		c.off = end
		if c.off == len(run) {
			c.run, c.off = c.run+1, 0
		}
	}
	for i, in := range m.inputs {
		c := &cs[i]
		for _, r := range in.queue[:c.run] {
			in.pending -= len(r.tuples)
			m.runDoneLocked(rel, r)
		}
		if c.off > 0 {
			r := &in.queue[c.run]
			r.tuples = r.tuples[c.off:]
			in.pending -= c.off
		}
		rest := copy(in.queue, in.queue[c.run:])
		clear(in.queue[rest:]) // drop references to released batches
		in.queue = in.queue[:rest]
	}
}

// mergeState is the merge's part of a task snapshot: the watermark of the
// last release and, per input, its position and what it received and has
// not released.
type mergeState struct {
	released int64
	inputs   []mergeInputState
}

type mergeInputState struct {
	port, upPartition int
	lastID            uint64
	stable            uint64 // see mergeInput.stable
	boundary          int64
	steps             []int64
	// pending are the data tuples received and not released, in stream
	// order, deep copies.
	pending []tuple.Tuple
}

// capture copies the merge's state; with halt, the merge then refuses
// every further batch and releases nothing more. Called between two
// releases (the task's processing lock held), so what the operator
// reflects is exactly everything received below released.
func (m *merger) capture(halt bool) mergeState {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := mergeState{released: m.released}
	for _, in := range m.inputs {
		is := mergeInputState{port: in.port, upPartition: in.upPartition, lastID: in.lastID, stable: in.stable,
			boundary: in.boundary, steps: slices.Clone(in.steps)}
		for _, r := range in.queue {
			for k := range r.tuples {
				is.pending = append(is.pending, *r.tuples[k].Clone())
			}
		}
		st.inputs = append(st.inputs, is)
	}
	if halt {
		m.halted = true
		close(m.space) // wake an add waiting for room: it refuses now
		m.space = make(chan struct{})
	}
	return st
}

// install puts a captured state into a new merger whose inputs were added
// in the same order (before any batch arrived).
func (m *merger) install(st mergeState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(st.inputs) != len(m.inputs) {
		return fmt.Errorf("%w: snapshot has %d inputs, the task %d", ErrSnapshotMismatch, len(st.inputs), len(m.inputs))
	}
	for i, is := range st.inputs {
		in := m.inputs[i]
		if in.port != is.port || in.upPartition != is.upPartition {
			return fmt.Errorf("%w: input %d is port %d partition %d in the snapshot, port %d partition %d in the task",
				ErrSnapshotMismatch, i, is.port, is.upPartition, in.port, in.upPartition)
		}
	}
	m.released = st.released
	for i, is := range st.inputs {
		in := m.inputs[i]
		in.lastID, in.stable, in.boundary, in.steps = is.lastID, is.stable, is.boundary, slices.Clone(is.steps)
		in.queue, in.pending, in.unsorted = nil, 0, false
		if len(is.pending) > 0 {
			// A copy of the slice: the queue compacts runs in place, and one
			// snapshot may start several tasks (the values are only read).
			in.queueRun(slices.Clone(is.pending), nil)
			last := int64(math.MinInt64)
			for _, tp := range is.pending {
				if tp.STime < last {
					in.unsorted = true
				}
				last = tp.STime
			}
		}
	}
	return nil
}

// hold makes take release nothing more (a cut at the last release) and
// returns that release's watermark.
//
// While it holds, the merge takes every batch, over its bound too: it
// releases nothing, so an input held back would stay so until the hold is
// lifted, and the upstream task feeding it, blocked in the middle of a
// release on its full output, could not finish that release and hold in
// turn (the prepare would wait for it for ever). What comes meanwhile is
// bounded: each upstream holds after the release it is in.
func (m *merger) hold() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cut, m.cutStep, m.holding = m.released, false, true
	close(m.space) // wake an add waiting for room: it takes its batch now
	m.space = make(chan struct{})
	return m.released
}

// setRescaleCut makes take release up to cut and stop there, with cut
// itself a release step (see cutStep).
func (m *merger) setRescaleCut(cut int64) {
	m.mu.Lock()
	m.cut, m.cutStep, m.holding = cut, true, false
	m.mu.Unlock()
	m.poke()
}

// liftCut removes any cut or hold and wakes the processing.
func (m *merger) liftCut() {
	m.mu.Lock()
	m.cut, m.cutStep, m.holding = math.MaxInt64, false, false
	m.mu.Unlock()
	m.poke()
}

// poke wakes the process goroutine.
func (m *merger) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// addsWaiting is how many adds wait for room now.
func (m *merger) addsWaiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addWaits
}

// inputLastID returns the id of the last tuple input i received.
func (m *merger) inputLastID(i int) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inputs[i].lastID
}

// inputBoundary returns the latest boundary input i received.
func (m *merger) inputBoundary(i int) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inputs[i].boundary
}

// releasedAt returns the watermark of the last release.
func (m *merger) releasedAt() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.released
}

// setCut makes take release no step above cut (math.MaxInt64: no cut).
func (m *merger) setCut(cut int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cut = cut
}

// atCut reports whether the merge has released every step at or below
// its cut and none above: every input's boundary reached the cut (so no
// step at or below it can still come) and none is left to release. past
// reports that it released beyond the cut before the cut was set.
func (m *merger) atCut() (at, past bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.released > m.cut {
		return false, true
	}
	for _, in := range m.inputs {
		if in.boundary < m.cut || len(in.steps) > 0 && in.steps[0] <= m.cut {
			return false, false
		}
	}
	return true, false
}

// levelAt returns, once the release step `step` is processed, each
// input's marker level and the task's (their minimum). A marker raises an
// input's level only at a step above its stime, when every tuple that came
// before it on that input (stime at most the marker's) has been processed;
// at the final step, every marker counts. Steps depend on the streams
// only, so replicas rise at the same step.
func (m *merger) levelAt(step int64, levels []uint64) (uint64, []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	low := uint64(math.MaxUint64)
	levels = levels[:0]
	for _, in := range m.inputs {
		n := 0
		for n < len(in.marks) && (in.marks[n].stime < step || step == math.MaxInt64) {
			in.level = in.marks[n].level
			n++
		}
		in.marks = append(in.marks[:0], in.marks[n:]...)
		low = min(low, in.level)
		levels = append(levels, in.level)
	}
	if len(m.inputs) == 0 {
		low = 0
	}
	return low, levels
}

// noteMarks records the marker-level rises among the boundaries of a batch
// of input i without queueing anything: for a task whose DCAA machine
// releases the input instead of the merger (the machine's stable steps
// then call levelAt as the merger's do).
func (m *merger) noteMarks(i int, batch []tuple.Tuple) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in := m.inputs[i]
	top := m.received.Load()
	for k := range batch {
		in.noteMark(&batch[k])
		if st := batch[k].STime; st > top && st != finalBoundary {
			top = st
		}
	}
	m.received.Store(top)
}

// receivedFrontier is the highest stream time any input received (a
// tuple or a boundary, released or not; math.MinInt64: none).
func (m *merger) receivedFrontier() int64 { return m.received.Load() }

// receivedLevels returns each input's marker level as received (released
// or not).
func (m *merger) receivedLevels() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]uint64, len(m.inputs))
	for i, in := range m.inputs {
		out[i] = in.markLevel
	}
	return out
}
