package runtime

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// runGenerator drives a generator source: tuples paced to the generator's
// rate in wall time, a BOUNDARY whenever stime reaches a new multiple of
// the boundary interval, and the final boundary at the generator's limit.
// Boundaries derive from stime only, so every replica emits the same
// stream, ids included.
func (t *task) runGenerator() {
	ctx := t.ctx
	interval := int64(t.r.opts.BoundaryInterval)
	rate := int64(0)
	if g := t.node.Source.Gen; g != nil {
		rate = int64(g.Rate)
	}
	speedup := int64(max(1, t.r.opts.SourceSpeedup))
	// pace (nil: none) scales the wall-clock rate; paceVer is the
	// version of its factor the pacing is anchored on.
	pace := t.r.opts.SourcePace
	var (
		paceVer    uint64
		paceFactor = 1.0
	)
	if pace != nil {
		paceVer, paceFactor = pace.ver.Load(), pace.Factor()
	}
	var (
		tp       tuple.Tuple
		boundary = int64(math.MinInt64)
		next     = int64(math.MinInt64) // no boundary is due below next
		start    = t.paceAnchor(0, rate, speedup, pace, paceFactor)
		n        int64
		timer    *time.Timer
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		close(t.genDone)
	}()
	if r := t.genRestore; r != nil {
		// Started from a snapshot: the generator is deterministic, so
		// drawing the records the snapshot's copy already emitted puts
		// it where that copy was; pacing continues from there.
		for range r.records {
			if !t.gen.Next(&tp) {
				break
			}
		}
		t.genRecords, boundary = r.records, r.boundary
		if boundary != math.MinInt64 {
			if next = boundary + interval; next < boundary {
				next = math.MaxInt64
			}
		}
		if rate > 0 {
			n = r.records
			start = t.paceAnchor(n, rate, speedup, pace, paceFactor)
		}
	}
	// A copy placed again without a snapshot (generation above 1: its
	// worker was lost and no peer replica was there to bootstrap from)
	// starts its stream at record 0, while its consumers resume by id
	// after what the lost copy gave them. Paced from 0 it would make them
	// wait as long as the lost copy had run (hours for a long query).
	// The stream is deterministic (record n depends only on the seed, the
	// partition and n; the ids on each output count what was routed to it
	// before), so the copy draws, without pacing, the records
	// its consumers already hold (OutputBuffer.Wanted: where they resumed)
	// and paces again from the first one they lack. Seeking to record n
	// directly is not possible: a generator's values come from one random
	// sequence drawn record by record, and each output's ids count the
	// records routed to it. The catch-up costs the CPU of generating those
	// records once (nothing is sent: readers start after their position),
	// not their paced wall time.
	catchUp := rate > 0 && t.spec.Generation > 1 && t.genRestore == nil
	behind := false // catching up (catchUp): pacing is suspended
	// A partition a rescale added starts at the rescale's cut: it drops
	// the records of its stream below it (counted as drawn, so a
	// snapshot's position stays a record number of the whole stream) and
	// first promises, with a boundary at the cut, that nothing below it
	// comes.
	pending, exhausted := false, false
	if !t.awaitSourceStart(ctx) {
		return
	}
	if t.gs.hasStart && t.genRecords == 0 && boundary == math.MinInt64 {
		for {
			if !t.gen.Next(&tp) {
				exhausted = true
				break
			}
			if tp.STime >= t.gs.start {
				pending = true
				break
			}
			t.genRecords++
		}
		if t.gs.start > boundary && t.gs.start != finalBoundary {
			if err := t.holdForCut(ctx, boundary, t.gs.start); err != nil {
				t.endWith(err)
				return
			}
			if err := t.emitBoundary(ctx, t.gs.start); err != nil {
				t.endWith(err)
				return
			}
			boundary = t.gs.start
			if next = boundary + interval; next < boundary {
				next = math.MaxInt64
			}
		}
		n = t.genRecords
		start = t.paceAnchor(n, rate, speedup, pace, paceFactor)
	}
	for !exhausted {
		// Requests between two records. The channels are looked at only
		// while someone offers one (genWaiting), and then with two
		// non-blocking receives of one case each: one select over both
		// channels locks both, which for every record cost the sending
		// worker of the forward benchmark 44 % of its CPU. A request
		// offered just after the check is taken after the next record.
		if t.genWaiting.Load() != 0 {
			select {
			case req := <-t.genSnap:
				req <- t.cutSource(ctx, boundary)
			default:
			}
			select {
			case c := <-t.genCtl:
				t.runGenCmd(ctx, c)
			default:
			}
		}
		if pending {
			pending = false // drawn above, at the start of the stream
		} else if !t.gen.Next(&tp) {
			break
		}
		if t.gs.hasEnd && tp.STime >= t.gs.end {
			break // a rescale removed the partition at this cut
		}
		t.genRecords++
		t.genDrawn = true
		if tp.STime < boundary {
			// A generator must not go back in time; clamp so the boundary
			// promise holds (deterministically, so replicas agree).
			tp.STime = boundary
		}
		// The division runs only once stime reaches the next multiple of
		// the interval (next), not for every record.
		if tp.STime >= next {
			var err error
			if b := floorDiv(tp.STime, interval) * interval; b > boundary {
				if err := t.holdForCut(ctx, boundary, b); err != nil {
					t.endWith(err)
					return
				}
				if err := t.emitBoundary(ctx, b); err != nil {
					t.endWith(err)
					return
				}
				boundary = b
				t.counters.busyUntilNow(t)
				if e := t.quiescentEpoch(b); e != 0 {
					// The quiescent baseline: nothing at or above the
					// cut until the plan is complete.
					if boundary, err = t.holdQuiescent(ctx, e, b); err != nil {
						t.endWith(err)
						return
					}
					tp.STime = max(tp.STime, boundary)
				}
			}
			if next = boundary + interval; next < boundary {
				next = math.MaxInt64 // no multiple of the interval above
			}
		}
		if rate > 0 {
			if pace != nil {
				if v := pace.ver.Load(); v != paceVer {
					// A new factor: the pacing starts again from here.
					paceVer, paceFactor, start, n = v, pace.Factor(), time.Now(), 0
					t.counters.origin.Store(start.UnixNano())
				}
			}
			n++
			due := start.Add(paced(n, rate, speedup, pace, paceFactor))
			// When this record was due: the source's lag (TaskStats.SourceLag)
			// is how long ago that was, and grows while the source is held
			// back between two records.
			t.counters.due.Store(due.UnixNano())
			wait := time.Until(due)
			if wait > 0 && catchUp {
				// Looked at only when ahead of the pacing, where the
				// source would wait anyway.
				switch {
				case t.behindConsumers():
					wait, behind = 0, true
				case behind:
					// Caught up: what is staged goes out, and the pacing
					// starts again from this record (or from the
					// query's origin, when it is not far off).
					behind = false
					n, wait = t.genRecords, 0
					start = t.paceAnchor(n, rate, speedup, pace, paceFactor)
					if err := t.flush(ctx); err != nil {
						t.endWith(err)
						return
					}
				}
			}
			if wait > 0 {
				// Ahead of schedule: what is staged goes out now rather
				// than when a batch fills.
				if err := t.flush(ctx); err != nil {
					t.endWith(err)
					return
				}
			}
			if wait > time.Millisecond && t.quiescentCatchUp(tp.STime) {
				wait = 0
			}
			if wait > time.Millisecond {
				t.counters.busyUntilNow(t)
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
			sleep:
				for {
					select {
					case <-timer.C:
						break sleep
					case <-ctx.Done():
						return
					case <-t.rcWake:
						// A plan handed meanwhile (setReconfig): installed
						// now rather than after the wait (holdForCut). The
						// record drawn is not tagged yet.
						if err := t.pollReconfig(); err != nil && t.emitErr == nil {
							t.emitErr = err
						}
						if t.quiescentCatchUp(tp.STime) {
							break sleep
						}
					}
				}
				t.counters.resume(t)
			}
		}
		tp.Type = tuple.Stable
		if t.rc.on || t.rc.pending.Load() != nil {
			// The quiescent baseline: nothing while its plan loads; a
			// live plan: nothing at or above its cut's floor before
			// the cut is known.
			err := t.holdSourceLoading(ctx, boundary)
			if err == nil {
				err = t.holdForCut(ctx, boundary, tp.STime)
			}
			if err != nil {
				t.endWith(err)
				return
			}
		}
		t.emitSource(ctx, &tp)
		t.genDrawn = false
		if t.emitErr != nil {
			t.endWith(t.emitErr)
			return
		}
	}
	t.counters.due.Store(0) // no record is due any more
	err := t.emitBoundary(ctx, finalBoundary)
	if err == nil {
		err = t.flush(ctx)
	}
	if err != nil {
		t.endWith(err)
		return
	}
	t.endReconfig()
	if !t.sourceEnded() {
		t.setState(StateRunning, "input exhausted")
	}
}

// behindConsumers reports whether a consumer of the generator already
// holds output it has not produced yet (OutputBuffer.Wanted): the case of
// a copy restarted without a snapshot (runGenerator). Generator goroutine
// only (it reads the writers).
func (t *task) behindConsumers() bool {
	for _, o := range t.outs {
		if o.w.LastID() < o.buf.Wanted() {
			return true
		}
	}
	return false
}

// paced is how long after its pacing's start record n of a generator at
// rate (records a second, > 0) is due, speedup times faster and, with a
// pace, at factor times the pace.
func paced(n, rate, speedup int64, pace *Pace, factor float64) time.Duration {
	if pace == nil {
		return time.Duration(n * int64(time.Second) / rate / speedup)
	}
	return time.Duration(float64(n) * float64(time.Second) / (float64(rate*speedup) * factor))
}

// genCmd is work for a generator source's goroutine, run between two
// records (see Runtime rescales): f runs; then, if hold is not nil, the
// goroutine draws nothing more, running further commands, until hold
// closes or the task stops.
type genCmd struct {
	f    func()
	hold <-chan struct{}
	done chan struct{} // closed once f ran
}

func (t *task) runGenCmd(ctx context.Context, c genCmd) {
	if c.f != nil {
		c.f()
	}
	close(c.done)
	if c.hold == nil {
		return
	}
	for {
		select {
		case c2 := <-t.genCtl:
			c2.hold = nil // one hold at a time
			t.runGenCmd(ctx, c2)
		case <-c.hold:
			return
		case <-ctx.Done():
			return
		}
	}
}

// onGenerator runs f on the generator goroutine between two records
// (then holds it until hold closes, when hold is not nil) and waits until
// f ran. It returns false when the generator has ended or ctx ended.
func (t *task) onGenerator(ctx context.Context, f func(), hold <-chan struct{}) bool {
	c := genCmd{f: f, hold: hold, done: make(chan struct{})}
	if !t.offerGenCmd(ctx, c) {
		return false
	}
	select {
	case <-c.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// offerGenCmd hands c to the generator goroutine, counted in genWaiting
// while it is offered; false when the generator or ctx ended first.
func (t *task) offerGenCmd(ctx context.Context, c genCmd) bool {
	t.genWaiting.Add(1)
	defer t.genWaiting.Add(-1)
	select {
	case t.genCtl <- c:
		return true
	case <-t.genDone:
		return false
	case <-ctx.Done():
		return false
	}
}

// endWith marks the task failed unless err only reports that it is being
// stopped.
func (t *task) endWith(err error) {
	if !t.stopping(err) {
		t.fail(err)
	}
}

// sourceCut is a generator source's position, taken by its own goroutine
// between two records (see cutSource).
type sourceCut struct {
	snap *TaskSnapshot
	err  error
}

// genPosition is where a generator source restored from a snapshot
// resumes: after records records, the last BOUNDARY emitted at boundary.
type genPosition struct {
	records  int64
	boundary int64
}

// cutSource flushes the source's outputs and captures its snapshot: the
// records drawn so far, the last boundary, the output positions (with
// what consumers have not yet taken). Run by the generator goroutine.
func (t *task) cutSource(ctx context.Context, boundary int64) sourceCut {
	if err := t.flush(ctx); err != nil {
		return sourceCut{err: err}
	}
	records := t.genRecords
	if t.genDrawn {
		// Held between drawing a record and emitting it: the copy
		// draws it again.
		records--
	}
	s := &TaskSnapshot{TaskID: t.spec.TaskID, Query: t.spec.Query, Fragment: t.spec.Fragment,
		Partition: t.spec.Partition, Replica: t.spec.Replica, Seq: t.seq, Released: boundary,
		SourceRecords: records, SourceLevel: t.rc.earlyLevel(boundary)}
	t.snapshotCut(s)
	if t.srcChain != nil {
		op, err := t.srcChain.Snapshot()
		if err != nil {
			return sourceCut{err: fmt.Errorf("task %s: operator snapshot: %w", t.spec.TaskID, err)}
		}
		s.Operator = op
	}
	for _, o := range t.outs {
		pos := OutputPosition{Consumer: o.consumer, Partition: o.partition, LastID: o.w.LastID()}
		if err := captureTail(o.buf, &pos); err != nil {
			return sourceCut{err: fmt.Errorf("task %s: %w", t.spec.TaskID, err)}
		}
		s.Outputs = append(s.Outputs, pos)
	}
	return sourceCut{snap: s}
}

// snapshotSource asks the generator goroutine for its cut. A source
// cannot halt (a live move leaves it running until its new copy runs).
func (t *task) snapshotSource(ctx context.Context, opts SnapshotOptions) (*TaskSnapshot, error) {
	if opts.Halt || opts.Aligned {
		return nil, fmt.Errorf("%w: a source snapshot cannot halt or align (%s)", ErrNotSnapshottable, t.spec.TaskID)
	}
	reply := make(chan sourceCut, 1)
	if err := t.offerSnapshot(ctx, reply); err != nil {
		return nil, err
	}
	select {
	case c := <-reply:
		return c.snap, c.err
	case <-ctx.Done():
		return nil, fmt.Errorf("task %s: snapshot: %w", t.spec.TaskID, ctx.Err())
	}
}

// offerSnapshot hands a snapshot request to the source goroutine, counted
// in genWaiting while it is offered.
func (t *task) offerSnapshot(ctx context.Context, reply chan sourceCut) error {
	t.genWaiting.Add(1)
	defer t.genWaiting.Add(-1)
	select {
	case t.genSnap <- reply:
		return nil
	case <-t.genDone:
		return fmt.Errorf("%w: source %s has ended", ErrNotSnapshottable, t.spec.TaskID)
	case <-ctx.Done():
		return fmt.Errorf("task %s: snapshot: %w", t.spec.TaskID, ctx.Err())
	}
}

// restoreSource makes a generator source built by newTask continue from
// a snapshot of a copy of it.
func (t *task) restoreSource(s *TaskSnapshot) error {
	if s.Query != t.spec.Query || s.Fragment != t.spec.Fragment || s.Partition != t.spec.Partition {
		return fmt.Errorf("%w: snapshot of %s/%s/p%d, task %s", ErrSnapshotMismatch, s.Query, s.Fragment, s.Partition, t.spec.TaskID)
	}
	if len(s.Inputs) != 0 || s.SourceRecords < 0 {
		return fmt.Errorf("%w: not a source's snapshot", ErrSnapshotMismatch)
	}
	if (t.srcChain == nil) != (s.Operator == nil) {
		return fmt.Errorf("%w: operator state present %v, task has operators %v", ErrSnapshotMismatch, s.Operator != nil, t.srcChain != nil)
	}
	if t.srcChain != nil {
		if err := t.srcChain.Restore(s.Operator); err != nil {
			return fmt.Errorf("%w: %w", ErrSnapshotMismatch, err)
		}
	}
	if err := t.resumeOutputs(s); err != nil {
		return err
	}
	t.restoreCut(s)
	t.genRestore = &genPosition{records: s.SourceRecords, boundary: s.Released}
	t.seq = s.Seq
	t.restored = true
	return nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// ingestState is the state of an ingest source. mu serialises Ingest
// calls: they produce the task's output.
type ingestState struct {
	mu     sync.Mutex
	parser interface {
		Parse(lineNo uint64, line []byte, t *tuple.Tuple) error
	}
	// arrival: the schema has no timestamp field, so a record's stime is
	// its arrival time. Otherwise stime is the record's first timestamp
	// field, whatever its value (the Unix epoch included).
	arrival bool
	// lateness is the source's allowed lateness (nanoseconds, >= 0).
	lateness int64
	// newest is the largest stime accepted (math.MinInt64 before the
	// first record). A record earlier than newest - lateness is late.
	newest int64
	// boundary is the stime of the last BOUNDARY emitted: never above
	// newest - lateness, so no record accepted later is below it.
	boundary int64
	// closed: the final boundary was emitted (IngestRequest.close); the
	// source accepts no more lines.
	closed bool
	tp     tuple.Tuple
	// producers is what each producer (IngestRequest.producer) has
	// given this copy; it is part of the snapshot (see ingestmove.go).
	producers map[string]*ingestProducer
	// uses orders producers by last use, to evict the oldest.
	uses uint64
	// requests counts the ingest calls that produced (lines or a
	// boundary): an idle source switches to a reconfiguration plan on its
	// own (idleTicks).
	requests uint64
	// movedOut is the snapshot a move took of this copy: from then on it
	// takes no line and no close (dataplane.ErrSourceMoved), so the new
	// copy, started from the snapshot, is the only one to go on. A fetch
	// asked again (the transfer broke off) gets the same snapshot.
	movedOut *TaskSnapshot
	// snapWaits: a move's snapshot waits for mu (snapshotIngest). A
	// request held for a reconfiguration's cut (holdForCut) gives way to
	// it: the cut may wait for the moved copy's acknowledgement, which
	// waits for the snapshot.
	snapWaits atomic.Bool
}

func newIngestState(node *queryspec.Node) *ingestState {
	schema := node.HeadSchema()
	st := &ingestState{parser: source.NewLineParser(schema), arrival: true,
		newest: math.MinInt64, boundary: math.MinInt64}
	for _, f := range schema.Fields {
		if f.Kind == tuple.KindTimestamp {
			st.arrival = false
		}
	}
	if node.Source != nil {
		st.lateness = int64(node.Source.Lateness())
	}
	return st
}

// floor is the smallest stime the source accepts now: newest - lateness
// (saturating), and never below the last boundary.
func (st *ingestState) floor() int64 {
	f := int64(math.MinInt64)
	if st.newest >= math.MinInt64+st.lateness {
		f = st.newest - st.lateness
	}
	return max(f, st.boundary)
}

// ingestLines parses JSON lines into the source's stream. Good lines are
// accepted even when others are bad; bad and late lines come back as
// LineErrors naming the line. Lateness is judged per record, in line
// order, whatever the batching: a record more than the source's
// allowed_lateness before the newest accepted record is refused. After
// the lines, a BOUNDARY at newest - allowed_lateness tells downstream
// tasks that time has passed.
func (t *task) ingestLines(reqCtx context.Context, firstLine uint64, lines []byte) (uint64, []*fedstreampb.LineError, error) {
	if err := t.awaitAligned(reqCtx); err != nil {
		return 0, nil, err
	}
	st := t.ingest
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.movedOut != nil {
		return 0, nil, t.movedErr()
	}
	accepted, errs, _, err := t.ingestLocked(reqCtx, firstLine, lines)
	return accepted, errs, err
}

// ingestLocked is ingestLines with st.mu held. last is the number of the
// last line taken (accepted or refused as bad), firstLine-1 if none.
func (t *task) ingestLocked(reqCtx context.Context, firstLine uint64, lines []byte) (accepted uint64, errs []*fedstreampb.LineError, last uint64, _ error) {
	st := t.ingest
	last = firstLine - 1
	st.requests++
	if st.closed && len(lines) > 0 {
		return 0, nil, last, fmt.Errorf("%w: source %s of query %s was closed (fedstream ingest --close) and accepts no more lines", dataplane.ErrSourceClosed, t.spec.Fragment, t.spec.Query)
	}
	// Stop on either the task stopping or the client going away.
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	defer context.AfterFunc(reqCtx, cancel)()

	defer t.counters.ingested(&accepted, time.Now())
	lineNo := firstLine
	for len(lines) > 0 {
		line := lines
		if i := bytes.IndexByte(lines, '\n'); i >= 0 {
			line, lines = lines[:i], lines[i+1:]
		} else {
			lines = nil
		}
		no := lineNo
		lineNo++
		if len(bytes.TrimSpace(line)) == 0 && len(lines) == 0 {
			break // the end of the last line
		}
		tp := &st.tp
		if err := st.parser.Parse(no, line, tp); err != nil {
			errs = append(errs, &fedstreampb.LineError{Line: no, Error: validUTF8(err.Error())})
			last = no
			continue
		}
		if st.arrival {
			tp.STime = time.Now().UnixNano()
		}
		if msg := t.checkIngestTime(tp.STime, st.newest); msg != "" {
			errs = append(errs, &fedstreampb.LineError{Line: no, Error: fmt.Sprintf("line %d: %s; refused", no, msg)})
			last = no
			continue
		}
		if floor := st.floor(); tp.STime < floor {
			errs = append(errs, &fedstreampb.LineError{Line: no, Error: fmt.Sprintf(
				"line %d: late record: time %s is before %s, more than the source's allowed_lateness (%s) behind the newest accepted record (%s); refused",
				no, formatSTime(tp.STime), formatSTime(floor), time.Duration(st.lateness), formatSTime(st.newest))})
			last = no
			continue
		}
		// Values alias nothing the caller keeps: the buffer encodes them.
		tp.Type = tuple.Stable
		if err := t.holdForCut(ctx, st.boundary, tp.STime); err != nil {
			t.discardStaged()
			return accepted, errs, last, fmt.Errorf("ingest into %s: %w", t.spec.TaskID, err)
		}
		t.emitSource(ctx, tp)
		if t.emitErr == nil {
			// Line by line, so that a failure leaves exactly the lines
			// before it accepted.
			t.emitErr = t.flush(ctx)
		}
		if err := t.emitErr; err != nil {
			t.emitErr = nil // the next request may succeed
			t.discardStaged()
			return accepted, errs, last, fmt.Errorf("ingest into %s: %w", t.spec.TaskID, err)
		}
		accepted++
		last = no
		st.newest = max(st.newest, tp.STime)
	}
	if b := st.floor(); b > st.boundary {
		err := t.holdForCut(ctx, st.boundary, b)
		if err == nil {
			err = t.emitBoundary(ctx, b)
		}
		if err == nil {
			err = t.flush(ctx)
		}
		if err != nil {
			t.discardStaged()
			return accepted, errs, last, fmt.Errorf("ingest into %s: %w", t.spec.TaskID, err)
		}
		st.boundary = b
	}
	return accepted, errs, last, nil
}

// closeIngest ends an ingest source: its final boundary releases every
// open window downstream and ends the sinks' result streams. Closing a
// closed source does nothing.
func (t *task) closeIngest(reqCtx context.Context) error {
	if err := t.awaitAligned(reqCtx); err != nil {
		return err
	}
	st := t.ingest
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.movedOut != nil {
		return t.movedErr()
	}
	return t.closeLocked(reqCtx)
}

// closeLocked is closeIngest with st.mu held.
func (t *task) closeLocked(reqCtx context.Context) error {
	st := t.ingest
	if st.closed {
		return nil
	}
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	defer context.AfterFunc(reqCtx, cancel)()
	err := t.emitBoundary(ctx, finalBoundary)
	if err == nil {
		err = t.flush(ctx)
	}
	if err != nil {
		t.discardStaged()
		return fmt.Errorf("close %s: %w", t.spec.TaskID, err)
	}
	st.closed, st.boundary = true, finalBoundary
	t.endReconfig()
	t.setState(StateRunning, "input closed")
	return nil
}

// checkIngestTime says why an ingested record's stime is refused ("" if
// it is not). Stimes that are the engine's own markers are refused: the
// final boundary (math.MaxInt64) would end the stream for every later
// record, and math.MinInt64 is "no time yet". So is a stime further
// ahead of the source's time than Options.MaxFuture, where the source's
// time is the later of the newest record accepted so far (newest) and
// this worker's clock: replaying old data moves it forward with the data,
// live data is judged against the clock, and a typo (year 2200) is
// refused instead of making every later record late. Replicas judge
// against their own clocks, so only a record within clock skew of the
// limit can be judged differently.
func (t *task) checkIngestTime(stime, newest int64) string {
	switch stime {
	case finalBoundary:
		return fmt.Sprintf("time %d is the engine's end-of-stream marker (math.MaxInt64) and cannot be a record's time", stime)
	case math.MinInt64:
		return fmt.Sprintf("time %d is the engine's no-time marker (math.MinInt64) and cannot be a record's time", stime)
	}
	limit := t.r.opts.MaxFuture
	base := max(newest, time.Now().UnixNano())
	if stime <= base || stime-base <= int64(limit) {
		return ""
	}
	return fmt.Sprintf("time %s is %s ahead of the source's time %s (the later of the newest accepted record and the worker's clock); at most %s ahead is accepted (worker setting max-future)",
		formatSTime(stime), aheadBy(stime, base), formatSTime(base), limit)
}

func formatSTime(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// aheadBy is stime - base as a duration, saturating for centuries.
func aheadBy(stime, base int64) string {
	d := uint64(stime) - uint64(base)
	if d > math.MaxInt64 {
		return "more than 292 years"
	}
	if day := uint64(24 * time.Hour); d >= 2*365*day {
		return fmt.Sprintf("about %d years", d/(365*day))
	}
	return time.Duration(d).Round(time.Second).String()
}

// validUTF8 makes a message safe for a proto3 string field, which must be
// valid UTF-8: a message that is not would fail the whole response.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
