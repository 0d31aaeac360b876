package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/retry"
)

// liveness holds the leader's in-memory heartbeat deadlines. They are not
// replicated: a new leader cannot know when the old one last heard from each
// worker, so it starts every worker with TTL + grace.
//
// A worker is "heard" once it registered or heartbeated to this leader
// since it took office. Registrations and heartbeats are recorded from
// the moment this node handles them as leader, which may be before the
// leader's duties start; stop forgets everything when leadership is lost.
type liveness struct {
	mu        sync.Mutex
	deadlines map[string]time.Time
	heard     map[string]bool
	// heardAt is when this leader last heard from each worker.
	heardAt map[string]time.Time
}

func newLiveness() *liveness {
	return &liveness{deadlines: map[string]time.Time{}, heard: map[string]bool{}, heardAt: map[string]time.Time{}}
}

// silentFor is how long ago this leader last heard from the worker;
// false when it has not heard from it since it took office.
func (l *liveness) silentFor(id string, now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.heardAt[id]
	if !ok {
		return 0, false
	}
	return now.Sub(at), true
}

// silentWorker reports, on the leader, whether ready worker w has missed
// its heartbeats: silent for more than half the heartbeat TTL (a worker
// beats every quarter of it: two beats missed), but not yet declared
// down (which takes the whole TTL, then a commit). Followers do not
// know when the leader last heard from a worker: false.
func (s *Server) silentWorker(w *fsm.Worker) (time.Duration, bool) {
	if w.Status != statusReady || !s.IsLeader() {
		return 0, false
	}
	silent, ok := s.liveness.silentFor(w.ID, time.Now())
	return silent, ok && silent > s.cfg.Timings.HeartbeatTTL/2
}

// start gives every worker without a deadline yet (not heard from) the
// deadline until.
func (l *liveness) start(workers []string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range workers {
		if _, ok := l.deadlines[w]; !ok {
			l.deadlines[w] = until
		}
	}
}

// serving gives every worker this leader has not heard from yet a
// deadline of until at least (see leaderLoop).
func (l *liveness) serving(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w, d := range l.deadlines {
		if !l.heard[w] && d.Before(until) {
			l.deadlines[w] = until
		}
	}
}

// heardFrom reports whether this leader heard from the worker.
func (l *liveness) heardFrom(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heard[id]
}

// shownStatus is the status reads report for w. The stored status is what
// the log says; right after an election (or a restart of every
// coordinator) a "ready" row only says the worker was ready under an
// earlier leader. Until the new leader's own unknown mark commits, a
// leader shows workers it has not heard from as unknown, and a node that
// knows no leader shows every ready worker unknown.
func (s *Server) shownStatus(w *fsm.Worker) string {
	if w.Status != statusReady {
		return w.Status
	}
	if s.IsLeader() {
		if !s.liveness.heardFrom(w.ID) {
			return statusUnknown
		}
		return w.Status
	}
	if _, id := s.raft.LeaderWithID(); id == "" {
		return statusUnknown
	}
	return w.Status
}

// unheard filters ids to the workers not heard from since begin.
func (l *liveness) unheard(ids []string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, id := range ids {
		if !l.heard[id] {
			out = append(out, id)
		}
	}
	return out
}

func (l *liveness) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deadlines = map[string]time.Time{}
	l.heard = map[string]bool{}
	l.heardAt = map[string]time.Time{}
}

func (l *liveness) touch(id string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deadlines[id] = until
	l.heard[id] = true
	l.heardAt[id] = time.Now()
}

// hear marks the worker heard from without giving it a deadline (a
// registration about to commit: see workerService.Register).
func (l *liveness) hear(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.heard[id] = true
}

func (l *liveness) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.deadlines, id)
	delete(l.heardAt, id)
}

// expired returns the workers whose deadline passed, sorted.
func (l *liveness) expired(now time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, d := range l.deadlines {
		if now.After(d) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// leaderDuties is the running set of leader-only loops.
type leaderDuties struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (d *leaderDuties) stop() {
	d.cancel()
	<-d.done
}

// monitorLeadership starts the leader's duties on election and stops them
// on loss of leadership.
func (s *Server) monitorLeadership(ctx context.Context) {
	var duties *leaderDuties
	stopLeading := func() {
		if duties != nil {
			duties.stop()
			duties = nil
		}
		s.liveness.stop()
		s.liveStats.forget()
	}
	defer stopLeading()
	for {
		select {
		case <-ctx.Done():
			return
		case isLeader := <-s.leaderCh:
			switch {
			case isLeader && duties == nil:
				lctx, cancel := context.WithCancel(ctx)
				duties = &leaderDuties{cancel: cancel, done: make(chan struct{})}
				go func(d *leaderDuties) {
					defer close(d.done)
					s.leaderLoop(lctx)
				}(duties)
			case !isLeader:
				stopLeading()
			}
		}
	}
}

// setupRetry paces the retries of a failed leadership set-up.
var setupRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// leaderLoop runs while this node leads: worker liveness and placement.
//
// Invariant: a leader either runs its duties, or is retrying its set-up
// (within LeaderSetupTimeout), or is giving leadership away. It never sits
// idle: a failed barrier used to end this loop with the node still leader,
// doing no liveness checks and no scheduling until leadership changed for
// some other reason.
func (s *Server) leaderLoop(ctx context.Context) {
	s.logger.Info("became leader; starting leader duties")
	defer s.logger.Info("leader duties stopped")
	// The term is read before the set-up: if leadership moved and came
	// back meanwhile, this loop's context ends and the next loop marks
	// its own term.
	term := s.raft.CurrentTerm()
	for {
		err := s.setUpLeadership(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		s.logger.Error("leadership set-up keeps failing; transferring leadership to another coordinator",
			"err", err, "tried_for", s.cfg.Timings.LeaderSetupTimeout)
		terr := awaitFuture(ctx, s.raft.LeadershipTransfer())
		if terr == nil {
			// Raft reports the loss on leaderCh; monitorLeadership then
			// stops this (finished) loop's duties.
			s.logger.Warn("leadership transferred after failed set-up")
			return
		}
		if ctx.Err() != nil {
			return
		}
		// No other voter could take over (a one-node cluster, or none
		// reachable): keep trying to set up.
		s.logger.Error("leadership transfer failed; retrying set-up", "err", terr)
	}
	s.setUpTerm.Store(term)
	// The grace a new leader gives its workers runs from when it serves
	// their heartbeats: until now they were held (leaderOrForward), and
	// the set-up's deadlines, set after its barrier, ran through its
	// commit of the unknown marks, which takes seconds under load.
	s.liveness.serving(time.Now().Add(s.cfg.Timings.HeartbeatTTL + s.cfg.Timings.LeaderGrace))
	s.leading.Store(true)
	defer s.leading.Store(false)
	defer s.acksLeadershipEnded()

	var wg sync.WaitGroup
	// The org's signing identity enters its Raft state (issue 11).
	wg.Add(1)
	go func() { defer wg.Done(); s.ensureOrgIdentity(ctx) }()
	if s.load != nil {
		// The load manager moves this org's tasks to partners and back
		// (issue 11 item 5).
		wg.Add(1)
		go func() { defer wg.Done(); s.load.Run(ctx) }()
	}
	wg.Add(7)
	// The plan applier is the only writer of placements; it lives as long
	// as these duties, and is installed before the loops that use it.
	runApplier := s.startPlanApplier()
	go func() { defer wg.Done(); runApplier(ctx) }()
	go func() { defer wg.Done(); s.reapVoters(ctx) }()
	go func() { defer wg.Done(); s.expireWorkers(ctx) }()
	go func() { defer wg.Done(); s.scheduleLoop(ctx) }()
	go func() { defer wg.Done(); s.removeDownWorkers(ctx) }()
	go func() { defer wg.Done(); s.resumeRescalesLoop(ctx) }()
	go func() { defer wg.Done(); s.boundMoves(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); s.rebootstrapLossy(ctx) }()
	// Cross-org migration: both sides of every partner's moves.
	wg.Add(2)
	go func() { defer wg.Done(); s.syncPartners(ctx) }()
	go func() { defer wg.Done(); s.expireHosted(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); s.runHealth(ctx) }()
	wg.Wait()
}

// setUpLeadership runs the new leader's set-up, retrying with backoff for
// up to LeaderSetupTimeout. Every step may be repeated.
func (s *Server) setUpLeadership(ctx context.Context) error {
	budget := s.cfg.Timings.LeaderSetupTimeout
	sctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	return retry.Do(sctx, setupRetry, 0, func(attempt int, err error, delay time.Duration) {
		s.logger.Warn("leadership set-up failed; retrying", "attempt", attempt, "err", err, "retry_in", delay)
	}, s.setUpOnce)
}

// runBarrier waits until the FSM holds every entry committed before this
// leader's term (tests may replace it to inject failures).
func (s *Server) runBarrier(ctx context.Context, timeout time.Duration) error {
	if s.cfg.hooks.barrier != nil {
		return s.cfg.hooks.barrier(timeout)
	}
	return awaitFuture(ctx, s.raft.Barrier(timeout))
}

// setUpOnce is one attempt of the leader's set-up.
func (s *Server) setUpOnce(ctx context.Context) error {
	// The barrier makes sure the FSM holds every entry the previous leader
	// committed before we read state to decide anything.
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	if err := s.runBarrier(ctx, timeout); err != nil {
		return fmt.Errorf("leader barrier: %w", err)
	}
	s.reconcileVoters(ctx)
	workers, err := s.State().Workers(nil)
	if err != nil {
		return fmt.Errorf("read workers: %w", err)
	}
	var ids, wasReady []string
	for _, w := range workers {
		if w.Status != statusDown {
			ids = append(ids, w.ID)
		}
		if w.Status == statusReady {
			wasReady = append(wasReady, w.ID)
		}
	}
	t := s.cfg.Timings
	s.liveness.start(ids, time.Now().Add(t.HeartbeatTTL+t.LeaderGrace))
	// This leader has heard from no worker yet: after a full restart the
	// "ready" rows may describe processes long gone. They show unknown
	// (their tasks too) until their first heartbeat to this leader marks
	// them ready again, or their TTL plus grace marks them down. Their
	// tasks stay placed meanwhile.
	if wasReady = s.liveness.unheard(wasReady); len(wasReady) > 0 {
		res, err := s.apply(ctx, fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerIDs: wasReady, Status: statusUnknown, At: time.Now().UnixNano()})
		if err == nil {
			err = res.Err
		}
		if err != nil {
			return fmt.Errorf("mark workers unknown until they heartbeat: %w", err)
		}
	}
	return nil
}

// removeDownWorkers deletes, through Raft, the records of workers down
// longer than RemoveDownWorkersAfter. Their tasks were placed elsewhere
// when they went down; without this, every worker that ever registered
// would keep a row forever. A down worker whose down time was never
// stamped (went down under an older build) is stamped now.
func (s *Server) removeDownWorkers(ctx context.Context) {
	after := s.cfg.Timings.RemoveDownWorkersAfter
	tick := time.NewTicker(min(max(after/10, 10*time.Millisecond), time.Minute))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			workers, err := s.State().Workers(nil)
			if err != nil {
				s.logger.Error("removing down workers: read workers", "err", err)
				continue
			}
			for _, w := range workers {
				if w.Status != statusDown {
					continue
				}
				var res *fsm.ApplyResult
				var err error
				switch {
				case w.StatusSince == 0:
					res, err = s.apply(ctx, fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerID: w.ID, Status: statusDown, At: now.UnixNano()})
				case now.Sub(time.Unix(0, w.StatusSince)) > after:
					s.logger.Info("removing worker down too long", "worker", w.ID, "addr", w.Addr, "down_since", time.Unix(0, w.StatusSince).UTC(), "limit", after)
					res, err = s.apply(ctx, fsm.DeleteWorkerType, fsm.DeleteWorkerRequest{WorkerID: w.ID})
				}
				if err == nil && res != nil {
					err = res.Err
				}
				if err != nil && ctx.Err() == nil {
					s.logger.Warn("removing down worker failed", "worker", w.ID, "err", err)
				}
			}
		}
	}
}

// expireWorkers marks workers whose heartbeat deadline passed as down.
func (s *Server) expireWorkers(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Timings.HeartbeatTTL / 10)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			for _, id := range s.liveness.expired(now) {
				w, err := s.State().Worker(nil, id)
				if err != nil {
					s.logger.Error("expiring workers: read worker", "worker", id, "err", err)
					continue // retried on the next tick
				}
				if w == nil || w.Status == statusDown {
					s.liveness.forget(id)
					continue
				}
				s.logger.Warn("worker missed its heartbeat TTL; marking it down", "worker", id, "ttl", s.cfg.Timings.HeartbeatTTL)
				res, err := s.apply(ctx, fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerID: id, Status: statusDown, At: now.UnixNano()})
				if err == nil {
					err = res.Err
				}
				if err != nil {
					if ctx.Err() == nil {
						s.logger.Warn("marking worker down failed; retrying on the next tick", "worker", id, "err", err)
					}
					continue
				}
				s.liveness.forget(id)
			}
		}
	}
}

// scheduleLoop re-places tasks that are unplaced or sit on a worker that is
// not ready, whenever workers or tasks change.
func (s *Server) scheduleLoop(ctx context.Context) {
	var index uint64
	for ctx.Err() == nil {
		var err error
		// Planned again when a move held back (inOrder) stops waiting,
		// whether or not the state changed.
		wait := time.Minute
		if at := s.moveOrder.next(time.Now()); !at.IsZero() {
			wait = min(wait, max(time.Until(at), 10*time.Millisecond))
		}
		index, err = s.State().BlockingQuery(ctx, index, wait, func(ws memdb.WatchSet) (uint64, error) {
			if _, err := s.State().Workers(ws); err != nil {
				return 0, err
			}
			if _, err := s.State().Tasks(ws); err != nil {
				return 0, err
			}
			return max(s.State().TableIndex("workers"), s.State().TableIndex("tasks")), nil
		})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.logger.Error("scheduler watch failed", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		at := s.State().LatestIndex()
		workers, err1 := s.State().Workers(nil)
		tasks, err2 := s.State().Tasks(nil)
		if err := errors.Join(err1, err2); err != nil {
			s.logger.Error("scheduler cannot read the state", "err", err)
			continue
		}
		moves := replace(workers, tasks, s.hostedLoad(), s.handOverNow())
		if len(moves) == 0 && len(s.missingSlotMaps()) == 0 {
			continue
		}
		if len(moves) > 0 {
			s.logger.Info("re-placing tasks", "count", len(moves))
		}
		// Refusals are logged and stored on waiting tasks by the applier.
		s.placeAndLog(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceReplace, StateIndex: at, Placements: moves})
	}
}
