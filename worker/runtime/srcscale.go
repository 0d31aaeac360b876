package runtime

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/fedstream/fedstream/worker/operator"
)

// Live rescaling of a generator source fragment S (see docs/DATAPLANE.md,
// "Rescaling a generator source"). It runs through the same three phases
// as the rescale of a keyed fragment, S's slot map carrying the number of
// partitions, the epoch and the cut (its slots mean nothing: nobody routes
// to a source). With the cut T:
//
//   - a partition the rescale keeps goes on unchanged;
//   - a partition it removes emits exactly the records of its
//     deterministic stream with stime below T, then its final boundary;
//   - a partition it adds emits exactly the records of its deterministic
//     stream with stime at or above T, after a boundary at T (it draws and
//     drops the records below T first, so its record numbers, and with
//     them a snapshot's position, are those of the whole stream);
//   - every task reading S holds from the prepare, adds the inputs of
//     added partitions at the go and has passed the cut once each removed
//     partition's stream ended (the keyed rescale's downstream role).
//
// T comes from Raft, so replicas of a partition emit the same stream.

// genScale is a generator's part in rescales of its own fragment. Its
// fields are read and written by the generator goroutine only, or before
// it starts (newTask).
type genScale struct {
	// await: the partition is added by a rescale whose cut is not known
	// yet; it draws nothing until start is set.
	await bool
	// hasStart: the stream starts at start (records below are dropped).
	hasStart bool
	start    int64
	// hasEnd: a rescale removes the partition; the stream ends below end
	// (endEpoch is that rescale's epoch, reported once the final boundary
	// went out).
	hasEnd   bool
	end      int64
	endEpoch uint64
}

// initSourceScale sets where a generator partition's stream starts when a
// rescale added it: the cut of the rescale under way (awaited when it is
// not set yet), or the start its fragment's map records.
func (t *task) initSourceScale() {
	m := t.spec.SlotMaps[t.spec.Fragment]
	if m == nil || t.gen == nil {
		return
	}
	p := t.spec.Partition
	switch n := m.Next; {
	case n != nil && p >= m.Partitions && n.Go:
		t.gs.hasStart, t.gs.start = true, n.Cut
	case n != nil && p >= m.Partitions:
		t.gs.await = true
	case p < len(m.Starts) && m.Starts[p] != math.MinInt64:
		t.gs.hasStart, t.gs.start = true, m.Starts[p]
	}
}

// awaitSourceStart runs on the generator goroutine of a partition a
// rescale adds, before it draws anything: it serves holds, snapshots and
// commands until the rescale's go gives it its start. ok is false when
// the task stops first.
func (t *task) awaitSourceStart(ctx context.Context) bool {
	if !t.gs.await || t.gs.hasStart {
		return true
	}
	t.setState(StateRunning, "added by a rescale: waits for its cut")
	defer t.setState(StateRunning, "")
	for !t.gs.hasStart {
		select {
		case c := <-t.genCtl:
			t.runGenCmd(ctx, c)
		case req := <-t.genSnap:
			req <- t.cutSource(ctx, math.MinInt64)
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// goSourceRescale applies the go of a rescale of the generator's own
// fragment f (map m): the partition learns where its stream starts (an
// added one) or ends (a removed one), then its hold is lifted. A kept or
// added partition has passed the cut at once; a removed one once its
// final boundary went out (runGenerator).
func (t *task) goSourceRescale(ctx context.Context, f string, m *SlotMap) bool {
	n := m.Next
	p := t.spec.Partition
	removed := p >= n.Partitions
	ran := t.onGenerator(ctx, func() {
		if removed && !t.gs.hasEnd {
			t.gs.hasEnd, t.gs.end, t.gs.endEpoch = true, n.Cut, n.Epoch
		}
		if t.gs.await && !t.gs.hasStart {
			t.gs.hasStart, t.gs.start = true, n.Cut
		}
	}, nil)
	if !ran && ctx.Err() != nil {
		return false
	}
	if !removed || !ran {
		// Kept or added: nothing to wait for. A generator that ended
		// (its limit) emitted its final boundary already.
		t.rs.progMu.Lock()
		t.rs.cutDone = n.Epoch
		t.rs.progMu.Unlock()
	}
	t.log.Info("source rescale: cut set", "fragment", f, "epoch", n.Epoch, "cut", n.Cut, "removed", removed)
	t.liftHold()
	return true
}

// sourceEnded reports, on the generator goroutine after its final
// boundary, that a partition a rescale removed has passed the cut.
func (t *task) sourceEnded() bool {
	if !t.gs.hasEnd {
		return false
	}
	t.rs.progMu.Lock()
	t.rs.cutDone = max(t.rs.cutDone, t.gs.endEpoch)
	t.rs.progMu.Unlock()
	t.setState(StateRunning, fmt.Sprintf("removed by a rescale at stream time %d; stops when the rescale finishes", t.gs.end))
	return true
}

// stopInline makes a task that processed its single input inline process
// through the merge goroutine from now on, as a task with several inputs
// does: a rescaled source gave it more. The caller holds proc.
func (t *task) stopInline() {
	if t.inlineEmit == nil || t.inlineOff.Swap(true) {
		return
	}
	t.wg.Add(1)
	go func() { defer t.wg.Done(); t.runMerge() }()
	t.log.Info("rescale: inputs added; the merge goroutine processes from now on")
}

// paceAnchor returns the wall-clock time from which a generator paced at
// rate (speedup and pace's factor applied: paced) emits record n+1 next,
// having drawn n records of its stream, and notes it for TaskStats.
//
// It is the query's pacing origin (TaskSpec.PaceOrigin, fixed in Raft)
// when the query has one and the runtime follows it (PaceFromOrigin): every partition and replica of the query, and
// every later copy of one (moved, restored, added by a rescale), then
// places each stream time at the same wall-clock time, however far apart
// they started. Anchored on its own start instead, a partition that
// started later stays that far behind the others in stream time for the
// whole run, and a merge downstream (which releases in stream-time
// order) holds every other partition's records that long: the bench
// measured a 270 ms start spread between three workers held as a
// standing 270 ms of pipeline lag. A partition behind the origin's
// schedule draws its records without waiting until it is on it.
//
// The origin is not used, and the partition paces as if it had drawn its
// n records at the rate up to now: without one, under a pace factor
// other than 1 (Pace: tests and benchmarks changing the speed mid-run),
// or when following it would mean catching up more than paceCatchUpMax
// or waiting more than paceWaitMax (a copy started long after the query,
// a source that fell far behind, a worker clock far off the leader's).
// Pacing decides only when records come, never their content.
func (t *task) paceAnchor(n, rate, speedup int64, pace *Pace, factor float64) time.Time {
	if rate <= 0 {
		return time.Now()
	}
	at := time.Now().Add(-paced(n, rate, speedup, pace, factor))
	if o := t.spec.PaceOrigin; t.r.opts.PaceFromOrigin && !o.IsZero() && factor == 1 {
		if d := at.Sub(o); d <= paceCatchUpMax && d >= -paceWaitMax {
			at = o
		}
	}
	t.counters.origin.Store(at.UnixNano())
	return at
}

// paceCatchUpMax and paceWaitMax bound how far a generator follows its
// query's pacing origin: it draws up to paceCatchUpMax of its stream
// without waiting to get on the origin's schedule, and waits up to
// paceWaitMax to get back on it. paceCatchUpMax is long: a partition
// beyond it paces from its own start and stays that far behind the
// others for good, which is worse than a burst. With a bound of 5 s,
// partitions of a query placed 8 s after its submission on a machine at
// load 40 fell on both sides of it and ran 5.4 s apart.
const (
	paceCatchUpMax = time.Minute
	paceWaitMax    = time.Second
)

// inline returns the emitter a single input's goroutine processes with,
// nil when the task processes through its merge goroutine.
func (t *task) inline() operator.Emitter {
	if t.inlineOff.Load() {
		return nil
	}
	return t.inlineEmit
}
