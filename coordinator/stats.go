package coordinator

import (
	"context"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// liveStats holds, on the leader, the latest per-task figures each worker
// reported with its heartbeat. They are ephemeral and frequent, so they
// stay in memory and never go through Raft: a new leader starts empty and
// is filled by the next round of heartbeats.
type liveStats struct {
	mu sync.Mutex
	// byWorker: worker id -> task id -> latest figures, with when they
	// arrived.
	byWorker map[string]workerStats
}

type workerStats struct {
	at    time.Time
	tasks map[string]*pb.TaskStats
	// hist holds each task's sensor windows, oldest first, at most
	// statsHistory (the health loop reads every window once, whatever
	// its own interval).
	hist map[string][]*pb.TaskStats
}

// statsHistory bounds the windows kept per task: half a minute of
// one-second windows.
const statsHistory = 30

func newLiveStats() *liveStats { return &liveStats{byWorker: map[string]workerStats{}} }

// put replaces what a worker reported before with its new report. A
// report may hold several windows of a task (TaskStats.window_ms), oldest
// first: the newest stands for the task, and every window newer than the
// ones already kept joins the task's history. Tasks missing from the
// report are gone from the worker.
func (l *liveStats) put(worker string, tasks []*pb.TaskStats, now time.Time) {
	m := make(map[string]*pb.TaskStats, len(tasks))
	byTask := map[string][]*pb.TaskStats{}
	for _, t := range tasks {
		if t.GetTask() == "" {
			continue
		}
		c := proto.Clone(t).(*pb.TaskStats)
		c.Worker = worker // the reporter, whatever the report says
		if p := m[t.Task]; p == nil || c.ReportedAtMs >= p.ReportedAtMs {
			m[t.Task] = c
		}
		byTask[t.Task] = append(byTask[t.Task], c)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.byWorker[worker].hist
	hist := make(map[string][]*pb.TaskStats, len(byTask))
	for id, list := range byTask {
		h := prev[id]
		for _, c := range list {
			if n := len(h); c.ReportedAtMs > 0 && (n == 0 || c.ReportedAtMs > h[n-1].ReportedAtMs) {
				h = append(h, c)
			}
		}
		if len(h) > statsHistory {
			h = append([]*pb.TaskStats(nil), h[len(h)-statsHistory:]...)
		}
		hist[id] = h
	}
	l.byWorker[worker] = workerStats{at: now, tasks: m, hist: hist}
}

// windows returns clones of the windows worker reported for task after
// afterMs (Unix ms), oldest first.
func (l *liveStats) windows(task, worker string, afterMs int64) []*pb.TaskStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*pb.TaskStats
	for _, w := range l.byWorker[worker].hist[task] {
		if w.ReportedAtMs > afterMs {
			out = append(out, proto.Clone(w).(*pb.TaskStats))
		}
	}
	return out
}

// forget drops every report (leadership lost).
func (l *liveStats) forget() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byWorker = map[string]workerStats{}
}

// of returns clones of the figures reported for task ids, from reports
// newer than notBefore, by task id (several when two workers report the
// same task, as during a move).
func (l *liveStats) of(ids map[string]bool, notBefore time.Time) map[string][]*pb.TaskStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]*pb.TaskStats{}
	for w, ws := range l.byWorker {
		if ws.at.Before(notBefore) {
			delete(l.byWorker, w) // the worker stopped reporting
			continue
		}
		for id, ts := range ws.tasks {
			if ids == nil || ids[id] {
				out[id] = append(out[id], proto.Clone(ts).(*pb.TaskStats))
			}
		}
	}
	return out
}

func (l *liveStats) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ws := range l.byWorker {
		n += len(ws.tasks)
	}
	return n
}

// statsMaxAge is how old a worker's last report may be before its figures
// are dropped: two heartbeat TTLs, some eight heartbeat intervals (a
// worker heartbeats every quarter of the TTL, and is marked down after a
// TTL without one).
func (s *Server) statsMaxAge() time.Duration { return 2 * s.cfg.Timings.HeartbeatTTL }

// LiveTaskStats returns the latest figures the workers reported for the
// tasks of query (every query when query is ""), sorted by task and
// worker. Only the leader holds them (followers return none): they are
// kept in memory from the workers' heartbeats and are at most a few
// heartbeat intervals old (ReportedAtMs says when). Rates are over the
// reporting worker's last heartbeat interval. Self-regulation and
// federation read them through this method.
func (s *Server) LiveTaskStats(query string) []*pb.TaskStats {
	var ids map[string]bool
	if query != "" {
		tasks, err := s.State().TasksByQuery(nil, query)
		if err != nil {
			return nil
		}
		ids = make(map[string]bool, len(tasks))
		for _, t := range tasks {
			ids[t.ID] = true
		}
	}
	var out []*pb.TaskStats
	for _, list := range s.liveStats.of(ids, time.Now().Add(-s.statsMaxAge())) {
		out = append(out, list...)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Task != out[j].Task {
			return out[i].Task < out[j].Task
		}
		return out[i].Worker < out[j].Worker
	})
	return out
}

// QueryStats answers with the live figures of every task of a query: the
// leader's, so followers forward it. A task no worker has reported yet
// (pending, or placed moments ago) is listed with its worker and no
// figures (reported_at_ms 0).
func (as *adminService) QueryStats(ctx context.Context, req *pb.QueryStatsRequest) (*pb.QueryStatsResponse, error) {
	s := as.s
	if req.Query == "" {
		return nil, status.Error(codes.InvalidArgument, "query stats: query name is required")
	}
	resp := &pb.QueryStatsResponse{}
	if handled, err := s.leaderOrForward(ctx, adminMethod+"QueryStats", req, resp); handled {
		return resp, err
	}
	q, err := s.State().Query(nil, req.Query)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "query stats: %v", err)
	}
	if q == nil {
		return nil, status.Errorf(codes.NotFound, "no query named %q (fedstream query list shows the queries)", req.Query)
	}
	tasks, err := s.State().TasksByQuery(nil, req.Query)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "query stats: %v", err)
	}
	reported := map[string]bool{}
	resp = &pb.QueryStatsResponse{Query: req.Query}
	for _, ts := range s.LiveTaskStats(req.Query) {
		reported[ts.Task] = true
		resp.Tasks = append(resp.Tasks, ts)
	}
	for _, t := range tasks {
		if !reported[t.ID] {
			resp.Tasks = append(resp.Tasks, &pb.TaskStats{Task: t.ID, Worker: t.WorkerID})
		}
	}
	sort.SliceStable(resp.Tasks, func(i, j int) bool { return resp.Tasks[i].Task < resp.Tasks[j].Task })
	return resp, nil
}
