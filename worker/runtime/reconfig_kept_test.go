package runtime

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
)

// The tests of a source's reconfiguration frontier kept by the leader
// across the task's copies (fsm ReconfigKept): the rig plays the leader,
// keeping every copy's reports with the FSM's own rule
// (ReconfigKept.Merge) and setting the cut above the frontiers of the
// copies placed and the kept ones (fsm advanceReconfig).

// keptLeader is the rig's leader state: what it keeps of every copy's
// reports, by task.
type keptLeader struct {
	kept map[string]*fsm.ReconfigKept
	// off plays a leader from before protocol 11: it keeps nothing, and
	// the moving-out copy of a live move does not count.
	off bool
}

// keepReports merges what every copy on every worker reports (the
// moving-out copy of a live move's too) into the leader's state.
func (r *reconfigRun) keepReports(l *keptLeader) {
	if l.off {
		return
	}
	if l.kept == nil {
		l.kept = map[string]*fsm.ReconfigKept{}
	}
	for _, st := range r.c.states() {
		if !st.Reconfig {
			continue
		}
		var sws []fsm.ReconfigSwitch
		for _, sw := range st.ReconfigSwitches {
			if sw.Epoch != 0 {
				sws = append(sws, sw)
			}
		}
		l.kept[st.TaskID], _ = l.kept[st.TaskID].Merge(st.ReconfigFrontier, sws)
	}
}

// leaderCut is the cut the leader sets for plan 1 once every task
// acknowledged it: above the frontier of every copy placed (not the old
// copy on moving, if any) and every kept one, plus margin.
func (r *reconfigRun) leaderCut(l *keptLeader, moving *worker, id string, margin time.Duration) int64 {
	r.t.Helper()
	r.waitAcked(1)
	r.keepReports(l)
	frontier := int64(math.MinInt64)
	for _, w := range r.c.workers {
		for _, st := range w.rt.States() {
			if w == moving && st.TaskID == id {
				continue
			}
			frontier = max(frontier, st.ReconfigFrontier)
		}
	}
	for _, k := range l.kept {
		if k != nil {
			frontier = max(frontier, k.Frontier)
		}
	}
	return frontier + int64(margin)
}

// aheadOfItsSibling hands plan 2 (margin) to every task but the copy of
// src on at, waits until src's sibling partition held at the plan's
// lowest cut and src ran 100 records (50 ms of stream time, 2.5 margins)
// past it, then hands it the plan too and waits until it held at its own
// floor: src acknowledged with a frontier well above every other task's.
func (r *reconfigRun) aheadOfItsSibling(at *worker, src, sibling string, margin time.Duration) {
	r.t.Helper()
	r.margin = margin
	before := r.rc
	before.Plans = slices.Clone(r.rc.Plans)
	r.appendPlan(2)
	r.publishExceptOn(at, src, &before)
	waitUntil(r.t, "the sibling held at the plan's lowest cut", func() bool { return r.cutHolds(sibling) > 0 })
	ahead := r.stats(sibling).OutTuples + 100
	waitUntil(r.t, "the source 100 records ahead of its held sibling", func() bool { return r.statsOn(at, src).OutTuples >= ahead })
	r.publish()
	waitUntil(r.t, "the source held at its own floor", func() bool { return r.statsOn(at, src).CutHolds > 0 })
}

// statsOn is the statistics of the copy of task id on worker w.
func (r *reconfigRun) statsOn(w *worker, id string) TaskStats {
	for _, st := range w.rt.Stats() {
		if st.TaskID == id {
			return st
		}
	}
	return TaskStats{}
}

// finishKept switches plan 1 at cut, completes it once every task has
// its markers, reads the sink to its end and checks every output: none
// lost, duplicated or mixed, the upgrade mid-stream, and each tagged
// with the epoch its stream time gives under the cut (checkTagsByCut):
// a tuple a source emitted at or above the cut under the old epoch fails.
func (r *reconfigRun) finishKept(cut int64, limit int, done <-chan struct{}) {
	r.t.Helper()
	r.rc.Plans[0].Phase, r.rc.Plans[0].Cut = fsm.ReconfigSwitched, cut
	r.publish()
	if err := r.pace.Set(restSpeed); err != nil {
		r.t.Fatal(err)
	}
	r.waitLevel(1)
	r.complete()
	<-done
	paths := r.check(limit, true)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		r.t.Fatalf("the upgrade did not happen mid-stream: %v", paths)
	}
	r.checkTagsByCut()
}

// TestReconfigMovedOutCopyLearnsThePlanAfterItsSnapshot: a live move of
// a source partition starts (its new copy from a snapshot taken before
// any plan), then a plan comes; the old copy, still serving its
// consumers, learns it well ahead of every other task, acknowledges it
// with its frontier and holds at its floor. The old copy's report counts
// for nothing but its position at the leader, and the new copy, started
// from a snapshot that had no plan, acknowledges with its own frontier,
// behind. The leader keeps the old copy's frontier (fsm ReconfigKept) and
// the cut goes above it. Before protocol 11 (the rig's leader with
// keeping off) the cut fell below records the old copy had emitted
// under the old epoch, which the consumers had taken from it.
func TestReconfigMovedOutCopyLearnsThePlanAfterItsSnapshot(t *testing.T) {
	testMovedOutCopyLearnsThePlan(t, &keptLeader{})
}

// The runs of the tests of kept frontiers: keptLimit lines per source
// partition, plans of margin keptMargin; the source of partition 0
// acknowledges ahead of its sibling's (aheadOfItsSibling).
const (
	keptLimit   = 4000
	keptMargin  = 20 * time.Millisecond
	keptSource  = "rc/lines/p0/r0"
	keptSibling = "rc/lines/p1/r0"
)

// startKeptRun starts reconfigYAML over three workers (startReconfigRun)
// at a tenth of its pace, so that a plan switches mid-stream (see
// startReplicaRun), and returns once output flows, with the tail's end.
func startKeptRun(t *testing.T) (*reconfigRun, <-chan struct{}) {
	t.Helper()
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, keptLimit), fsm.TrackingStatic)
	if err := r.pace.Set(0.1); err != nil {
		t.Fatal(err)
	}
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	return r, done
}

func testMovedOutCopyLearnsThePlan(t *testing.T, l *keptLeader) {
	const moved = keptSource
	r, done := startKeptRun(t)
	from, to := r.c.workers[0], r.c.workers[1]
	var old TaskSpec
	for _, s := range r.c.specs[from] {
		if s.TaskID == moved {
			old = s
		}
	}
	m := r.c.startCopy(t, moved, from, to, false)
	// The old copy runs on, its consumers reading it, until they switch:
	// it stays in its worker's specs and learns what the others learn.
	old.InMove = true
	r.c.specs[from] = append(r.c.specs[from], old)
	r.aheadOfItsSibling(from, moved, keptSibling, keptMargin)
	cut := r.leaderCut(l, from, moved, keptMargin)
	// The consumers switch to the new copy once it runs from its
	// snapshot, the old copy is stopped.
	r.c.specs[from] = slices.DeleteFunc(r.c.specs[from], func(s TaskSpec) bool { return s.TaskID == moved })
	r.c.switchTo(m)
	r.finishKept(cut, keptLimit, done)
}

// TestReconfigCopyPlacedAgainAfterItsWorkerWasLost: a source partition
// acknowledges a plan well ahead of every other task and holds at its
// floor; its worker is lost and the task placed again without a
// snapshot. The leader keeps the lost copy's frontier and gives it to
// the new copy with its assignment (TaskSpec.ReconfigKept): the new copy
// acknowledges with it (and holds at the floor it gives), and the cut
// goes above everything the lost copy emitted. Before protocol 11 (the
// rig's leader with keeping off) the new copy acknowledged with its own
// frontier, from the start of its stream, the cut fell below records
// the lost copy had emitted under the old epoch, and the consumers,
// which had taken them, kept them so.
func TestReconfigCopyPlacedAgainAfterItsWorkerWasLost(t *testing.T) {
	testCopyPlacedAgain(t, &keptLeader{})
}

func testCopyPlacedAgain(t *testing.T, l *keptLeader) {
	const lostSrc = keptSource
	r, done := startKeptRun(t)
	lost, next := r.c.workers[0], r.c.workers[1]
	r.aheadOfItsSibling(lost, lostSrc, keptSibling, keptMargin)
	r.keepReports(l)
	spec := r.c.loseWorker(lost, lostSrc)
	if !l.off {
		spec.ReconfigKept = l.kept[lostSrc]
	}
	r.c.placeAgainFromNothing(t, lost, spec, next)
	if k := spec.ReconfigKept; k != nil {
		// The new copy starts from what was kept: it acknowledges with
		// the lost copy's frontier, though it starts its stream again.
		r.waitAcked(1)
		if f := r.states()[lostSrc].ReconfigFrontier; f < k.Frontier {
			t.Fatalf("the new copy acknowledged with frontier %d, below the kept %d", f, k.Frontier)
		}
	}
	r.finishKept(r.leaderCut(l, nil, "", keptMargin), keptLimit, done)
}

// TestReconfigSwitchPoints: a source records where it switched to each
// epoch (its first record or boundary of it; the epochs it skipped at
// the same point) and reports the newest, and a copy given kept switch
// points tags by them instead of by the cuts: one past its cut (the
// earlier copy learned the cut late) from its stream time on, and one
// before it (an idle source's early marker) from just above its stream
// time (since session 20: the marker came after the records at its
// time; before, they were tagged with the new epoch too).
func TestReconfigSwitchPoints(t *testing.T) {
	rc := &fsm.QueryReconfig{Plans: []fsm.ReconfigPlan{{Epoch: 1, Phase: fsm.ReconfigSwitched, Cut: 100}, {Epoch: 2, Phase: fsm.ReconfigSwitched, Cut: 200}}}
	cuts := []epochCut{{1, 100}, {2, 200}}
	first := &reconfigState{cur: rc, cuts: cuts}
	for _, st := range []int64{50, 99} {
		first.noteSwitch(first.sourceEpoch(st), st)
	}
	// Nothing between the two cuts: from 0 straight to 2.
	first.noteSwitch(first.sourceEpoch(230), 230)
	first.noteSwitch(first.sourceEpoch(240), 240)
	rep := first.switches.Load()
	if rep == nil || rep[0] != (fsm.ReconfigSwitch{Epoch: 2, At: 230}) || rep[1] != (fsm.ReconfigSwitch{Epoch: 1, At: 230}) || rep[2].Epoch != 0 {
		t.Fatalf("reported switches %v, want epochs 2 and 1 at 230", rep)
	}
	next := &reconfigState{cur: rc, cuts: cuts, switchAt: map[uint64]int64{1: 150, 2: 180}}
	// 180 is below plan 2's cut: an idle source's early marker, a
	// boundary the earlier copy sent after its records at 180, which are
	// of epoch 1; from 181 on, 2 (see cutEpoch). 150 is at or above plan
	// 1's cut: a first record of epoch 1, which is.
	for st, want := range map[int64]uint64{99: 0, 120: 0, 150: 1, 179: 1, 180: 1, 181: 2, 199: 2, 300: 2} {
		if got := next.sourceEpoch(st); got != want {
			t.Errorf("a copy given the kept switch points tags stime %d with %d, want %d", st, got, want)
		}
	}
}
