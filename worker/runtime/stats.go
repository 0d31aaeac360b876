package runtime

import (
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// TaskStats are one task's cumulative figures since it started here. They
// are counters and current levels; rates come from the difference of two
// readings (Prometheus does that, and so do the worker's reports to the
// coordinators).
type TaskStats struct {
	TaskID, Query, Fragment string
	Generation              int
	// InTuples counts the data tuples the task took: from its inputs
	// (operators and sinks; for a sink with a single input, boundary
	// markers too), drawn from its generator, or ingested. An operator
	// task of a replicated query counts each stable input tuple once,
	// when it is released stable (in order or replayed by a correction),
	// never its tentative releases (dcaaRun.release).
	InTuples uint64
	// OutTuples counts the data tuples it emitted (a tuple routed to
	// several downstream fragments counts once).
	OutTuples uint64
	// BusyNanos is the time spent processing (releasing input through
	// the operators, drawing records), without the time blocked on a full
	// output buffer, which BlockedNanos counts. Both count as time
	// passes: the release being processed and the waits for room going
	// on are in them up to the reading, not only once they end.
	BusyNanos, BlockedNanos int64
	// OpenBusyNanos is the part of BusyNanos spent on the release being
	// processed, whose tuples InTuples counts only once it ends: tuples
	// per useful second are InTuples over BusyNanos less OpenBusyNanos,
	// each taken as a difference of two readings.
	OpenBusyNanos int64
	// Queue is the number of data tuples received and not yet processed;
	// Gate (a task that merges its inputs) where its release stands.
	Queue int
	Gate  MergeGate
	// OutputBytes is what the task's output buffers hold; Unacked the
	// tuples of its output streams some downstream has not acknowledged
	// yet (a sink's result ring is not counted: nobody acknowledges it).
	OutputBytes, Unacked int64
	// Switches counts the subscriptions that went to another copy of an
	// upstream task than the one read before (a replica fail-over, a
	// moved upstream).
	Switches uint64
	// SourceLag is how far a generator source with a rate is behind its
	// schedule: how long ago the last record it drew was due (0 on or
	// ahead of schedule, and for other tasks). A source held back by its
	// consumers falls behind; one whose consumers take more than its
	// rate catches up.
	SourceLag time.Duration
	// PaceOrigin is, for a paced generator source, the wall-clock time
	// its pacing places its stream's first record at (the query's pacing
	// origin when it follows it, see TaskSpec.PaceOrigin); zero for other
	// tasks. Partitions of one query with different origins run that far
	// apart in stream time.
	PaceOrigin time.Time
	// Held is Unacked stream by stream: the tuples of its output each
	// downstream partition has not acknowledged (streams holding none are
	// left out). A backlog in front of one slow partition shows here,
	// not in that partition's own queue: it takes what it processes.
	Held []HeldBacklog
	// CutHolds counts the times a source held before a reconfiguration
	// plan's lowest possible cut because the plan had not switched yet
	// (a live plan that took longer than its switch margin; a quiescent
	// one, whose margin is a nanosecond, at a boundary); 0 for other
	// tasks.
	CutHolds uint64
}

// HeldBacklog is what a task holds, not yet acknowledged, for one
// downstream partition.
type HeldBacklog struct {
	Fragment  string
	Partition int
	Tuples    int64
}

// taskCounters are a task's figures behind TaskStats. The counters are
// atomics written by the task's producing goroutine once per release,
// batch or step and read at any time; the marks belong to the generator
// goroutine.
type taskCounters struct {
	in, out atomic.Uint64
	busy    atomic.Int64
	// due: when the generator's last drawn record was due (Unix ns; 0:
	// none, or no rate).
	due atomic.Int64
	// origin: the generator's pacing anchor (Unix ns; paceAnchor).
	origin atomic.Int64
	// cutHolds: a source's holds for a reconfiguration cut (holdForCut).
	cutHolds atomic.Uint64

	mark        time.Time // generator: start of the busy period being timed
	markBlocked int64     // generator: blockedNanos at mark

	// shown is the highest BusyNanos stats reported (see busyNanos).
	shown atomic.Int64
}

// busyNanos is the task's busy time up to now, as stats reports it: the
// releases processed (busy) and the one being processed so far (a
// release started at since, with blockedAt of blocked time then; blocked
// is the outputs' blocked time now, waits going on included). A release
// counts as it runs, not only when it ends: a sensor window shorter than
// a release (the bench's compressed windows of 33 ms, releases of a
// backlogged operator of 100 ms or more) otherwise read 0 busy while the
// task worked through it and then at most one window's worth (busy is
// capped at 1 per window) when it ended, which lost most of a saturated
// task's busy time and made its true rate (tuples per useful second) look
// several times higher than it was. The figure never decreases: a reading
// taken while the two atomics of a release that just ended or began are
// out of step would otherwise go back, and the sensors drop a window
// whose counters went back.
// open is the busy time of the release going on (0: none), whose tuples
// InTuples does not count yet.
func (c *taskCounters) busyNanos(since, blockedAt, blocked int64, now time.Time) (n, open int64) {
	if since != 0 {
		open = max(0, now.UnixNano()-since-max(0, blocked-blockedAt))
	}
	n = c.busy.Load() + open
	for {
		s := c.shown.Load()
		if n <= s {
			return s, open
		}
		if c.shown.CompareAndSwap(s, n) {
			return n, open
		}
	}
}

// blockedNanos is the total time the task's outputs blocked it.
func (t *task) blockedNanos() int64 {
	var n int64
	for _, o := range t.outs {
		n += o.buf.BlockedNanos()
	}
	return n
}

// publishCounts makes the producing goroutine's own counts (tuples routed,
// records drawn) readable by others. It runs at each flush and boundary.
func (t *task) publishCounts() {
	if t.node == nil {
		return
	}
	if t.gen != nil {
		t.counters.in.Store(uint64(max(t.genRecords, 0)))
	}
	if t.node.Kind != queryspec.KindSink {
		t.counters.out.Store(t.seq)
	}
}

// released accounts one processed release of an operator or sink task:
// its data tuples, and the time since start less what its outputs blocked
// it since blocked was read.
func (c *taskCounters) released(t *task, runs []mergedRun, start time.Time, blocked int64) {
	n := 0
	for i := range runs {
		n += len(runs[i].tuples)
	}
	c.in.Add(uint64(n))
	if t.node.Kind == queryspec.KindSink {
		c.out.Add(uint64(n)) // a sink passes its input on as its result
	}
	c.busy.Add(max(0, int64(time.Since(start))-(t.blockedNanos()-blocked)))
}

// passed accounts a batch a pass-through sink adopted at start.
func (c *taskCounters) passed(n int, start time.Time) {
	c.in.Add(uint64(n))
	c.out.Add(uint64(n))
	c.busy.Add(int64(time.Since(start)))
}

// ingested accounts an ingest request that accepted *accepted lines since
// start.
func (c *taskCounters) ingested(accepted *uint64, start time.Time) {
	c.in.Add(*accepted)
	c.busy.Add(int64(time.Since(start)))
}

// busyUntilNow adds the generator's busy time since its mark (less the
// time its outputs blocked it meanwhile) and moves the mark to now.
func (c *taskCounters) busyUntilNow(t *task) {
	now, blocked := time.Now(), t.blockedNanos()
	if !c.mark.IsZero() {
		c.busy.Add(max(0, int64(now.Sub(c.mark))-(blocked-c.markBlocked)))
	}
	c.mark, c.markBlocked = now, blocked
}

// resume starts timing a busy period of the generator again after a
// pacing wait.
func (c *taskCounters) resume(t *task) {
	c.mark, c.markBlocked = time.Now(), t.blockedNanos()
}

// countSwitch counts an attempt that reads another upstream copy than the
// previous attempt did (not the first attempt, nor a retry of the same
// copy).
func (in *input) countSwitch(pl Placement) {
	prev := in.prev
	in.prev = pl
	if prev.TaskID == "" {
		return
	}
	if prev.TaskID != pl.TaskID || prev.WorkerAddr != pl.WorkerAddr || prev.Generation != pl.Generation {
		in.switches.Add(1)
	}
}

// queueTuples is the task's input waiting in its merge, and the merge's
// gate: none for a task whose merge is not fed (see mergeFed).
func (t *task) queueTuples() (int, MergeGate) {
	if !t.mergeFed() {
		return 0, MergeGate{}
	}
	return t.merge.pendingTuples()
}

// pendingTuples is the number of data tuples queued in the merge, and
// its inputs' boundaries: the lowest one (the input holding the release
// back, by port and upstream partition) and the highest.
func (m *merger) pendingTuples() (n int, gate MergeGate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	gate.Lowest, gate.Highest = math.MaxInt64, math.MinInt64
	for _, in := range m.inputs {
		n += in.pending
		if in.boundary < gate.Lowest {
			gate.Lowest, gate.Port, gate.UpPartition = in.boundary, in.port, in.upPartition
		}
		gate.Highest = max(gate.Highest, in.boundary)
	}
	if len(m.inputs) == 0 {
		return n, MergeGate{}
	}
	gate.Released = m.released
	return n, gate
}

// MergeGate is where a merging task's release stands: the merge releases
// in stream-time order up to the lowest boundary its inputs have all
// passed, so the input with the lowest boundary holds back what the
// others delivered above it.
type MergeGate struct {
	// Released is the watermark of the last release; Lowest the lowest
	// latest boundary of an input (stream time, ns), that of input Port
	// from upstream partition UpPartition; Highest the highest.
	Released, Lowest, Highest int64
	Port, UpPartition         int
}

// stats reads the task's figures. It takes each output buffer's lock
// briefly; it never waits for the task's processing.
func (t *task) stats() TaskStats {
	// The release going on, read before the outputs' blocked time (the
	// blocked time it subtracts is then at least that of its start).
	since, blockedAt := t.busySince.Load(), t.busyBlocked.Load()
	st := TaskStats{TaskID: t.spec.TaskID, Query: t.spec.Query, Fragment: t.spec.Fragment, Generation: t.spec.Generation,
		InTuples: t.counters.in.Load(), OutTuples: t.counters.out.Load(), CutHolds: t.counters.cutHolds.Load()}
	if due := t.counters.due.Load(); due != 0 {
		st.SourceLag = max(0, time.Duration(time.Now().UnixNano()-due))
	}
	if o := t.counters.origin.Load(); o != 0 && t.gen != nil {
		st.PaceOrigin = time.Unix(0, o)
	}
	st.Queue, st.Gate = t.queueTuples()
	ring := t.node != nil && t.node.Kind == queryspec.KindSink
	// A rescale adds outputs and inputs while the task runs (under outMu
	// and inMu).
	t.outMu.RLock()
	outs := slices.Clone(t.outs)
	t.outMu.RUnlock()
	for _, o := range outs {
		bs := o.buf.Stats()
		st.BlockedNanos += bs.BlockedNanos
		st.OutputBytes += int64(bs.Bytes)
		if !ring {
			st.Unacked += int64(bs.Tuples)
			if bs.Tuples > 0 {
				st.Held = append(st.Held, HeldBacklog{Fragment: o.consumer, Partition: o.partition, Tuples: int64(bs.Tuples)})
			}
		}
	}
	st.BusyNanos, st.OpenBusyNanos = t.counters.busyNanos(since, blockedAt, st.BlockedNanos, time.Now())
	t.inMu.Lock()
	inputs := slices.Clone(t.inputs)
	t.inMu.Unlock()
	for _, in := range inputs {
		st.Switches += in.switches.Load()
	}
	return st
}

// Stats reports the figures of every task running here, sorted by task
// id. Metrics and the worker's reports read it; it costs the tasks
// nothing but a brief lock of each output buffer and merge queue.
func (r *Runtime) Stats() []TaskStats {
	tasks := r.tasksByID()
	out := make([]TaskStats, 0, len(tasks))
	for _, t := range tasks {
		out = append(out, t.stats())
	}
	return out
}
