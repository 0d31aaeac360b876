package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// The old copy of a live move does not process past an input gap.
//
// A live move leaves the old copy running, its consumers reading it,
// until the new copy has caught up. The old copy's input may move
// meanwhile: tasks leaving a worker declared down move one stream stage
// after the other, so a producer's move ends and then its consumer's
// begins, possibly before the consumer's old copy has subscribed to the
// producer's new copy. That copy holds its output for the subscribers it
// has seen; the consumer's new copy registered there before its snapshot
// and acknowledges as it goes, so the old copy, subscribing after it,
// resumes after tuples already discarded. Processing on, it put on its
// output results missing that input, which its consumers took until they
// switched: results lost, or a sink that never saw its final boundary
// (TestFalselyDownWorkerHandsOverWithoutReplicas, about one run in three
// at load 20), although the new copy had every tuple.
//
// The invariant: an unreplicated copy whose live snapshot a later copy of
// its task took (supersede) never processes input that follows a gap; its
// input waits instead, having told the upstream it is gone, until the copy
// is stopped (the move ends: its consumers switch to the new copy, whose
// output continues the old copy's, id for id) or is placed again as it is
// (a move rolled back, as a cross-org move may be: it is the task's only
// copy again, and names the loss as any input gap does). Only the next
// copy of an unreplicated task takes a live snapshot of it; replicated
// queries' inputs resume by stable id (DCAA) and never come here. A
// snapshot whose caller's assignment index is not known (an older build,
// or a partner org's copy, whose index is of another log: the relay
// clears it) does not supersede a copy placed by any index, and the gap
// is named as before.

// errSuperseded ends an attempt whose first batch follows a gap while the
// task is superseded: nothing of it was taken.
var errSuperseded = errors.New("input resumed after a gap while a later copy of the task has its state")

// supersedeWait is how often a waiting input looks whether its copy was
// placed again (a move rolled back); a stopped copy ends the wait at once.
const supersedeWait = 50 * time.Millisecond

// supersede records that a later copy of the task took a live snapshot
// of this copy, placed by the assignments of index placed (0: not known).
// Replicated tasks are never superseded: a peer replica takes live
// snapshots of them too.
func (t *task) supersede(placed uint64) {
	if t.plan == nil || t.plan.Query.Replicas > 1 || t.dm != nil {
		return
	}
	for {
		cur := t.supersededAt.Load()
		if cur >= placed+1 || t.supersededAt.CompareAndSwap(cur, placed+1) {
			return
		}
	}
}

// notePlaced takes from the task's spec whether assignments place this
// copy as the task's own (not the old copy of a move), and at which index.
func (t *task) notePlaced(spec TaskSpec) {
	if spec.MovingOut {
		t.sawMovingOut.Store(true)
		return
	}
	if spec.AssignIndex == 0 {
		return
	}
	for {
		cur := t.placedAt.Load()
		if cur >= spec.AssignIndex || t.placedAt.CompareAndSwap(cur, spec.AssignIndex) {
			return
		}
	}
}

// superseded reports whether a later copy took this copy's state and no
// assignments since placed it again as it is. Assignments older than the
// later copy's (a watch that lagged) do not count: at the index that
// placed the later copy, this one was already moving out.
func (t *task) superseded() bool {
	at := t.supersededAt.Load()
	return at != 0 && t.placedAt.Load() < at
}

// waitSuperseded holds input in after an attempt on upstream copy pl found
// a gap while the task was superseded: it tells the upstream this copy is
// gone (it holds nothing for it), and waits until the task stops (ctx) or
// is placed again. It returns ctx's error, or nil to go on.
func (in *input) waitSuperseded(ctx context.Context, pl Placement) error {
	t := in.t
	t.log.Warn("the old copy of a live move resumed an input after tuples its upstream had discarded: it processes nothing past them, and serves its output until its consumers switch to its new copy, which has that input",
		"input", in.upstream, "partition", in.upPartition, "after_id", in.sub.LastID(), "upstream", pl.TaskID, "upstream_generation", pl.Generation)
	t.noteWhileRunning("old copy of a live move: an input resumed after a gap; it processes nothing more and serves its output until its consumers switch")
	t.r.leaveStream(ctx, in.sub.Ref(), pl.WorkerAddr, t.spec.CopyID())
	tick := time.NewTicker(supersedeWait)
	defer tick.Stop()
	for t.superseded() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	t.log.Warn("the old copy of a live move is placed again as it is (the move was rolled back): its input resumes after the gap, whose loss it names",
		"input", in.upstream, "partition", in.upPartition, "after_id", in.sub.LastID())
	return nil
}

// leaveStream tells the upstream copy serving ref (at addr, or in this
// runtime) that subscriber name is gone for good, within leaveTimeout;
// best effort (see leaveUpstreams).
func (r *Runtime) leaveStream(ctx context.Context, ref *fedstreampb.StreamRef, addr, name string) {
	if local, err := r.LocalStream(ref); err == nil {
		local.Forget(name)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, leaveTimeout)
	defer cancel()
	conn, err := r.pool.Conn(addr)
	if err == nil {
		err = dataplane.Leave(ctx, conn, ref, name)
	}
	if err != nil {
		r.log.Debug("could not tell an upstream that a copy is gone", "task", name, "upstream", ref.TaskId, "err", err)
	}
}

// haltedRolledBack returns the snapshot that halted the task (a
// stop-and-copy move: it processes nothing more) when spec, the task's
// next assignment, places it again as it is after assignments showed it
// moving out: the move was rolled back (a cross-org move whose new copy
// did not take over), and the halted copy, left as it is, would keep the
// query stalled for good. Its state at the halt is exact, so the copy
// starts again from that snapshot; its inputs resume at the snapshot's
// positions, which its upstreams hold for it under its name for a lease
// (past that, the gap is named). nil: nothing to do. Assignments of one
// worker come in order, so an older one arriving late cannot follow the
// one that showed the move.
func (t *task) haltedRolledBack(spec TaskSpec) *TaskSnapshot {
	if spec.MovingOut || !t.sawMovingOut.Load() || !t.halted.Load() {
		return nil
	}
	return t.haltSnap
}
