package coordinator

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/fedstream/fedstream/fsm"
)

// liveness holds the leader's in-memory heartbeat deadlines. They are not
// replicated: a new leader cannot know when the old one last heard from each
// worker, so it starts every worker with TTL + grace.
type liveness struct {
	mu        sync.Mutex
	active    bool
	deadlines map[string]time.Time
}

func newLiveness() *liveness { return &liveness{deadlines: map[string]time.Time{}} }

func (l *liveness) start(workers []string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active = true
	l.deadlines = map[string]time.Time{}
	for _, w := range workers {
		l.deadlines[w] = until
	}
}

func (l *liveness) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active = false
	l.deadlines = map[string]time.Time{}
}

func (l *liveness) touch(id string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active {
		l.deadlines[id] = until
	}
}

func (l *liveness) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.deadlines, id)
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

// leaderLoop runs while this node leads: worker liveness and placement.
func (s *Server) leaderLoop(ctx context.Context) {
	s.logger.Info("became leader; starting leader duties")
	defer s.logger.Info("leader duties stopped")
	// The barrier makes sure the FSM holds every entry the previous leader
	// committed before we read state to decide anything.
	if err := s.raft.Barrier(10 * time.Second).Error(); err != nil {
		s.logger.Error("leader barrier failed", "err", err)
		return
	}
	s.reconcileVoters()
	workers, _ := s.State().Workers(nil)
	var ids []string
	for _, w := range workers {
		if w.Status == statusReady {
			ids = append(ids, w.ID)
		}
	}
	t := s.cfg.Timings
	s.liveness.start(ids, time.Now().Add(t.HeartbeatTTL+t.LeaderGrace))

	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); s.reapVoters(ctx) }()
	go func() { defer wg.Done(); s.expireWorkers(ctx) }()
	go func() { defer wg.Done(); s.scheduleLoop(ctx) }()
	wg.Wait()
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
				if err != nil || w == nil || w.Status == statusDown {
					s.liveness.forget(id)
					continue
				}
				s.logger.Warn("worker missed its heartbeat TTL; marking it down", "worker", id, "ttl", s.cfg.Timings.HeartbeatTTL)
				res, err := s.apply(ctx, fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerID: id, Status: statusDown})
				if err == nil && res.Err == nil {
					s.liveness.forget(id)
				}
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
		index, err = s.State().BlockingQuery(ctx, index, time.Minute, func(ws memdb.WatchSet) (uint64, error) {
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
		workers, err1 := s.State().Workers(nil)
		tasks, err2 := s.State().Tasks(nil)
		if err1 != nil || err2 != nil {
			continue
		}
		moves := replace(workers, tasks)
		if len(moves) == 0 {
			continue
		}
		s.logger.Info("re-placing tasks", "count", len(moves))
		res, err := s.apply(ctx, fsm.PlaceTasksType, fsm.PlaceTasksRequest{Placements: moves})
		if err != nil || res.Err != nil {
			s.logger.Error("placing tasks failed", "err", err)
		}
	}
}
