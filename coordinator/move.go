package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// Live task moves (issue 9 item 3).
//
// MoveTask commits one plan through the plan applier: the task's next
// generation is placed on the target worker, and the previous copy stays
// assigned to its worker as a moving-out copy (fsm.Task.MovingFrom). The
// new copy's assignment names the old copy as its bootstrap source with
// halt: the new worker fetches a stop-and-copy snapshot from it
// (DataPlane FetchSnapshot) and starts from it; the snapshot carries the
// old copy's output not yet taken by every downstream, so downstreams
// switch to the new copy when the placement changes, each resuming after
// the last tuple it took. Until then they read the old copy, which keeps
// running (see consumerPlacement). Both copies report their output
// position during the move; when the new copy runs and its position has
// reached the old copy's (fsm.Task.MoveCatchUp), the state machine clears
// MovingFrom: consumers switch to a copy that has already produced what
// they would otherwise wait for, and the old worker stops the old copy.
// The wait is bounded (Timings.MoveCatchUpBound, boundMoves), and a move
// whose new copy does not run is rolled back (Timings.MoveStartBound,
// stuckMove).
// No tuple is lost (the new copy resumes after the snapshot's input
// positions, and upstream buffers keep those tuples for the old copy's
// subscriber, halted and not acknowledging, within its lease) and none is
// processed twice (the old copy processes nothing after the snapshot).

// MoveTask implements AdminService.MoveTask.
func (as *adminService) MoveTask(ctx context.Context, req *pb.MoveTaskRequest) (*pb.MoveTaskResponse, error) {
	s := as.s
	if req.TaskId == "" || req.ToWorker == "" {
		return nil, status.Error(codes.InvalidArgument, "move: a task id and a target worker are required")
	}
	resp := &pb.MoveTaskResponse{}
	if handled, err := s.leaderOrForward(ctx, adminMethod+"MoveTask", req, resp); handled {
		return resp, err
	}
	st := s.State()
	t, err := st.Task(nil, req.TaskId)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "move: %v", err)
	}
	if t == nil {
		return nil, status.Errorf(codes.NotFound, "move: no task %q", req.TaskId)
	}
	if t.WorkerID == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "move: task %s is not placed (%s): nothing runs to move", t.ID, t.Message)
	}
	if t.MovingFrom != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "move: task %s is still moving from %s: wait until its new copy runs", t.ID, t.MovingFrom)
	}
	if err := s.checkNeighbourMoves(st, t); errors.Is(err, ErrNeighbourMoving) {
		return nil, status.Errorf(codes.FailedPrecondition, "move: %v", err)
	} else if err != nil {
		return nil, status.Errorf(codes.Internal, "move: %v", err)
	}
	to, err := resolveWorker(st, req.ToWorker)
	if err != nil {
		return nil, err
	}
	if isPartnerWorker(to) {
		return nil, status.Errorf(codes.InvalidArgument, "move: %s stands for partner org %s: move a task there with task move --to-org", to.ID, to.Labels[partnerLabel])
	}
	if to.ID == t.WorkerID {
		return nil, status.Errorf(codes.InvalidArgument, "move: task %s already runs on worker %s", t.ID, to.ID)
	}
	if q, err := st.Query(nil, t.Query); err != nil {
		return nil, status.Errorf(codes.Internal, "move: %v", err)
	} else if err := checkWorkerRunsPlans(q, to); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "move %s: %v", t.ID, err)
	}
	// Consumers switch once the new copy has caught up, when every
	// coordinator knows how (protocol 5); otherwise as soon as it runs.
	catchUp := s.checkProtocol(catchUpProtocol, "a live move that waits for catch-up") == nil
	if h := s.cfg.hooks.moveChecked; h != nil {
		h(t.ID)
	}
	out, err := s.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, StateIndex: st.LatestIndex(),
		Placements: []fsm.PlannedPlacement{{TaskID: t.ID, FromWorker: t.WorkerID, FromGeneration: t.Gen(), ToWorker: to.ID, Live: true, CatchUp: catchUp}}})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "move %s: %v", t.ID, err)
	}
	if len(out.Result.Refused) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "move %s refused: %s", t.ID, out.Result.RefusedText())
	}
	return &pb.MoveTaskResponse{TaskId: t.ID, FromWorker: t.WorkerID, ToWorker: to.ID, Generation: int32(t.Gen() + 1)}, nil
}

// ErrNeighbourMoving: a task next to the one to move in its stream (one
// it reads from, or one reading from it) is in a live move; a producer
// and its consumer never move live at once (see streamMoves).
var ErrNeighbourMoving = errors.New("a task next to it in the stream is in a live move")

// checkNeighbourMoves returns ErrNeighbourMoving, naming the move, when a
// live move of t cannot start now for a move next to it in its stream.
// Movers check it first for a quick answer; the plan applier checks again
// against the state the move commits on, where plans are serialised, so
// two moves checked at once cannot both start.
func (s *Server) checkNeighbourMoves(st *fsm.StateStore, t *fsm.Task) error {
	tasks, err := st.Tasks(nil)
	if err != nil {
		return err
	}
	if up, down := newStreamMoves(tasks, s.taskInputs()).blocking(t, false); len(up)+len(down) > 0 {
		return fmt.Errorf("%w: %s", ErrNeighbourMoving, neighbourMoveText(t, up, down))
	}
	return nil
}

// isIngestSource reports whether fragment of query q is an ingest source.
// Such a source moves stop-and-copy (its bootstrap halts it): the old copy
// takes no line after the snapshot, and its clients resend to the new
// copy from their last acknowledged offset (docs/QUERY.md, "Ingest").
func isIngestSource(plans *planCache, q *fsm.Query, fragment string) bool {
	if q == nil {
		return false
	}
	plan := plans.plan(q)
	if plan == nil {
		return false
	}
	n := plan.Node(fragment)
	return n != nil && n.Kind == queryspec.KindSource && n.Source != nil && n.Source.Ingest
}

// resolveWorker finds a worker by id, or by name when one worker has it.
func resolveWorker(st *fsm.StateStore, idOrName string) (*fsm.Worker, error) {
	workers, err := st.Workers(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read workers: %v", err)
	}
	var byName []*fsm.Worker
	for _, w := range workers {
		if w.ID == idOrName {
			return w, nil
		}
		if w.Name == idOrName {
			byName = append(byName, w)
		}
	}
	switch len(byName) {
	case 1:
		return byName[0], nil
	case 0:
		return nil, status.Errorf(codes.NotFound, "no worker with id or name %q", idOrName)
	}
	return nil, status.Errorf(codes.InvalidArgument, "%d workers are named %q: give the worker id", len(byName), idOrName)
}

// haltMoves makes moves stop-and-copy: the old copy halts at the
// snapshot. Live moves (false) leave it running while the new copy
// starts and catches up; consumers read the old copy until the new one
// runs (see consumerPlacement).
const haltMoves = false

// consumerPlacement is where the consumers of a task read it from: during
// a live move the old copy, which runs until the new one has caught up
// and reported running; otherwise where the task is placed.
func consumerPlacement(t *fsm.Task) (worker string, generation int) {
	if t.MovingFrom != "" && !haltMoves {
		return t.MovingFrom, max(t.MovingFromGeneration, 1)
	}
	return t.WorkerID, t.Gen()
}

// bootstrapSource says where a task's new copy takes its starting
// snapshot: from the old copy of a live move (halted), or, for a copy
// placed again after its worker was lost (generation > 1), from a running
// peer replica of its partition (not halted). nil: no such copy (the task
// replays from its upstreams' buffers). addrs maps worker ids to
// data-plane addresses; ready says whether a worker is ready.
func bootstrapSource(t *fsm.Task, peers []*fsm.Task, addrs map[string]string, ready func(string) bool) *pb.SnapshotSource {
	if t.IsMovingOut() {
		return nil
	}
	if t.MovingFrom != "" {
		if addr := addrs[t.MovingFrom]; addr != "" {
			return &pb.SnapshotSource{WorkerAddr: addr, TaskId: t.ID, Generation: int32(max(t.MovingFromGeneration, 1)), Halt: haltMoves || t.MoveHalt}
		}
		return nil
	}
	if t.Gen() <= 1 || (t.ScaleEpoch != 0 && t.Gen() == int(t.ScaleEpoch)) {
		// A first copy, or the first copy of a partition a rescale added:
		// it starts empty and takes its slots at the rescale's cut.
		return nil
	}
	pick := snapshotPeer(t, peers, func(worker string) bool { return ready(worker) && addrs[worker] != "" })
	if pick == nil {
		return nil
	}
	return &pb.SnapshotSource{WorkerAddr: addrs[pick.WorkerID], TaskId: pick.ID, Generation: int32(pick.Gen())}
}

// snapshotPeer is the peer replica of t's partition a new copy of t takes
// its starting snapshot from (nil: none), among the running copies on
// workers usable says may serve one. A STABLE peer first: its state is
// exact and snapshottable now (one holding tentative state is
// snapshotted only once stable again). Never a lossy peer: its state is
// not a failure-free run's, and the new copy would start inexact without
// knowing it.
func snapshotPeer(t *fsm.Task, peers []*fsm.Task, usable func(worker string) bool) *fsm.Task {
	var pick *fsm.Task
	for _, p := range peers {
		if p.ID == t.ID || p.Fragment != t.Fragment || p.Partition != t.Partition || p.WorkerID == "" || p.WorkerID == t.WorkerID {
			continue
		}
		if p.Query != t.Query || p.State != states.TaskRunning || p.Lossy || !usable(p.WorkerID) {
			continue
		}
		if p.ReplicaState == replicaStable {
			return p
		}
		if pick == nil {
			pick = p
		}
	}
	return pick
}

// replicaStable is fsm.Task.ReplicaState of a STABLE DCAA replica.
var replicaStable = pb.ReplicaState_REPLICA_STABLE.String()

// catchUpProtocol is the replication protocol that knows catch-up moves
// (fsm.PlannedPlacement.CatchUp).
const catchUpProtocol = 5

// boundMoves is a leader duty that ends every in-org live move within
// bounds, so that none holds its neighbours in the stream for ever (a
// producer's live move waits while a consumer of it is in a live move,
// see streamMoves):
//   - a catch-up move whose new copy has run for Timings.MoveCatchUpBound
//     without catching up with the old copy ends anyway (consumers
//     switch, the old copy stops; logged), so a new copy that cannot
//     catch up never keeps both copies running;
//   - a move whose new copy has not run within Timings.MoveStartBound (or
//     failed, or sits on a worker declared down) is rolled back
//     (rollBackStuckMove).
//
// The clock of each move starts when this leader first sees it (in its
// new copy's state): a new leader starts it again, so a bound is per
// leader, at most doubled.
func (s *Server) boundMoves(ctx context.Context) {
	catchUp, start := s.cfg.Timings.MoveCatchUpBound, s.cfg.Timings.MoveStartBound
	tick := min(catchUp/4, start/4, time.Second)
	runningSince := map[string]time.Time{} // task id@generation -> first seen running
	waitingSince := map[string]time.Time{} // task id@generation -> since when seen moving without running
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		st := s.State()
		tasks, err := st.Tasks(nil)
		if err != nil {
			s.logger.Error("move bounds: read tasks", "err", err)
			continue
		}
		workers, err := st.Workers(nil)
		if err != nil {
			s.logger.Error("move bounds: read workers", "err", err)
			continue
		}
		byID := make(map[string]*fsm.Worker, len(workers))
		for _, w := range workers {
			byID[w.ID] = w
		}
		now := time.Now()
		seen := map[string]bool{}
		for _, t := range tasks {
			if t.MovingFrom == "" || t.IsMovingOut() {
				continue
			}
			key := fmt.Sprintf("%s@%d", t.ID, t.Gen())
			seen[key] = true
			since, ok := waitingSince[key]
			if !ok || t.State == states.TaskRunning || t.State == states.TaskStalled {
				since, waitingSince[key] = now, now // (not waiting)
			}
			if why := stuckMove(t, byID, s.haltsOldCopy(st, t), now.Sub(since), start); why != "" {
				s.rollBackStuckMove(ctx, t, why)
				continue
			}
			if !t.MoveCatchUp || t.State != states.TaskRunning {
				// (A stalled new copy ends its move at once: see
				// fsm maybeEndMove.)
				continue
			}
			ran, ok := runningSince[key]
			if !ok {
				runningSince[key] = now
				continue
			}
			if now.Sub(ran) < catchUp {
				continue
			}
			s.logger.Warn("live move: the new copy has not caught up with the old one within the bound; switching consumers to it anyway",
				"task", t.ID, "generation", t.Gen(), "from", t.MovingFrom, "to", t.WorkerID, "bound", catchUp,
				"position", posText(t.MovePosition), "old_position", posText(t.MovingFromPosition))
			upd := fsm.UpdateTaskStatesRequest{WorkerID: t.WorkerID,
				States: []fsm.TaskStateUpdate{{TaskID: t.ID, Generation: t.Gen(), State: t.State, SwitchMove: true}}}
			res, err := s.apply(ctx, fsm.UpdateTaskStatesType, upd)
			if err == nil && res.Err != nil {
				err = res.Err
			}
			if err != nil {
				s.logger.Error("live move: ending the move after its catch-up bound failed; will retry", "task", t.ID, "err", err)
			}
		}
		for _, m := range []map[string]time.Time{runningSince, waitingSince} {
			for key := range m {
				if !seen[key] {
					delete(m, key)
				}
			}
		}
	}
}

// stuckMove says why the live move of t (t.MovingFrom set, not the
// moving-out copy), whose new copy does not run, is rolled back now; ""
// while it may wait longer or is not rolled back at all. workers maps
// worker ids to their records; halts says whether the new copy's
// snapshot halts the old copy; waited is how long this leader has seen
// the move without a running new copy, bound Timings.MoveStartBound.
//
// The invariant it keeps, with the catch-up bound: a live move that
// leaves its old copy running ends within MoveStartBound +
// MoveCatchUpBound (per leader), ended or rolled back. Rolling back is
// safe while the old copy runs on: its consumers never left it (see
// consumerPlacement) and it processed every input; the new copy, never
// read from, is dropped. Not rolled back:
//   - a move whose snapshot halts the old copy (stop-and-copy, an ingest
//     source): once the new copy has fetched it the old copy takes no
//     input any more, so it cannot take over again. Such a move holds no
//     producer back (streamMoves), only its own consumers, which go
//     ahead stop-and-copy past their wait (inOrder).
//   - a move to or from a partner org: cross-org migration bounds and
//     rolls back its own moves (xorg_move.go).
//
// A new copy whose upstreams did not confirm its registration fetches a
// halting snapshot on its own (worker runtime), which the state does not
// show; rolled back after that, the halted old copy, placed again as it
// is, starts again from the snapshot that halted it (the worker's
// haltedRolledBack).
func stuckMove(t *fsm.Task, workers map[string]*fsm.Worker, halts bool, waited, bound time.Duration) string {
	if t.MovingFrom == "" || t.IsMovingOut() || halts || !inOrgMove(t, workers) {
		return ""
	}
	// A new copy on a worker declared down is rolled back whatever it last
	// reported: its consumers still read the old copy, and placed again
	// from there it would start without the old copy's state.
	switch to := workers[t.WorkerID]; {
	case to == nil:
		return fmt.Sprintf("its new copy's worker %s is no longer registered", t.WorkerID)
	case to.Status == statusDown:
		return fmt.Sprintf("its new copy's worker %s is down", t.WorkerID)
	case t.State == states.TaskRunning || t.State == states.TaskStalled:
		return "" // the catch-up bound ends it
	case t.State == states.TaskFailed:
		return "its new copy failed: " + t.Message
	case waited >= bound:
		return fmt.Sprintf("its new copy did not run within %s (it is %s)", bound, t.State)
	}
	return ""
}

// haltsOldCopy reports whether the snapshot a live move's new copy takes
// halts the old copy: a stop-and-copy move, or an ingest source's (see
// isIngestSource).
func (s *Server) haltsOldCopy(st *fsm.StateStore, t *fsm.Task) bool {
	if t.MoveHalt || haltMoves {
		return true
	}
	q, err := st.Query(nil, t.Query)
	return err != nil || isIngestSource(&s.plans, q, t.Fragment)
}

// rollsBack reports whether a live move of t whose new copy's worker is
// down is rolled back by boundMoves, rather than placed again by the
// scheduler (which would start a copy without the old copy's state,
// although the old copy may well run on). Every coordinator must apply
// AbortMove (protocol 7).
func (s *Server) rollsBack(t *fsm.Task) bool {
	st := s.State()
	workers := map[string]*fsm.Worker{}
	for _, id := range []string{t.WorkerID, t.MovingFrom} {
		w, err := st.Worker(nil, id)
		if err != nil {
			return false
		}
		if w != nil {
			workers[id] = w
		}
	}
	return inOrgMove(t, workers) && !s.haltsOldCopy(st, t) && s.checkProtocol(abortMoveProtocol, "rolling back a live move") == nil
}

// inOrgMove reports whether neither copy of t's move is at a partner org
// (workers maps worker ids to their records; one not there is not).
func inOrgMove(t *fsm.Task, workers map[string]*fsm.Worker) bool {
	for _, id := range []string{t.WorkerID, t.MovingFrom} {
		if w := workers[id]; w != nil && isPartnerWorker(w) {
			return false
		}
	}
	return true
}

// abortMoveProtocol is the replication protocol that knows AbortMove.
const abortMoveProtocol = 7

// rollBackStuckMove rolls the live move of t back (see stuckMove): the
// task is on its old copy again, at its old generation; the new copy is
// no longer assigned and its worker stops it. If the old copy's worker is
// down, the scheduler then places the task again as any task of a down
// worker (in stream order: see inOrder). AbortMove applies only while
// the move is the same and not ended, so it cannot race the move's end.
func (s *Server) rollBackStuckMove(ctx context.Context, t *fsm.Task, why string) {
	s.logger.Warn("live move rolled back: the old copy, which its consumers still read, takes over again",
		"task", t.ID, "generation", t.Gen(), "from", t.MovingFrom, "to", t.WorkerID, "reason", why)
	err := s.applyCmd(ctx, fsm.AbortMoveType, fsm.AbortMoveRequest{TaskID: t.ID, Generation: t.Gen(), Reason: why})
	switch {
	case err == nil:
	case errors.Is(err, fsm.ErrNotMoving):
		s.logger.Info("live move: the move ended before its rollback", "task", t.ID, "generation", t.Gen())
	case ctx.Err() == nil:
		s.logger.Error("live move: rolling back failed; will retry", "task", t.ID, "err", err)
	}
}

func posText(p *uint64) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}
