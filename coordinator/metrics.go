package coordinator

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/gometrics"
)

// coordMetrics are the coordinator's own instruments; the rest of its
// metrics are read at scrape time (collector).
type coordMetrics struct {
	commit    prometheus.Histogram
	fsmApply  prometheus.Histogram
	forwarded *prometheus.CounterVec
	plans     *prometheus.CounterVec
	placed    prometheus.Counter
	refused   *prometheus.CounterVec
	// health: the health manager's actions and alerts, by diagnosis and
	// action (health_loop.go).
	health *prometheus.CounterVec
}

// Latency buckets from 0.5 ms to about 4 s: a loopback commit takes a
// millisecond or two, one across a WAN or to a slow disk hundreds.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 14)

func newCoordMetrics() *coordMetrics {
	return &coordMetrics{
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fedstream_raft_commit_duration_seconds",
			Help:    "Time from proposing a command on the leader until it is committed and applied there.",
			Buckets: latencyBuckets,
		}),
		fsmApply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fedstream_fsm_apply_duration_seconds",
			Help:    "Time the state machine takes to apply one committed log entry.",
			Buckets: latencyBuckets,
		}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fedstream_forwarded_requests_total",
			Help: "Calls this coordinator forwarded to the leader, by method.",
		}, []string{"method"}),
		plans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fedstream_plans_total",
			Help: "Plans the plan applier took, by the manager that made them.",
		}, []string{"source"}),
		placed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fedstream_plan_placements_committed_total",
			Help: "Task placements the plan applier committed.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fedstream_plan_refusals_total",
			Help: "Placements and slot map changes the plan applier (or the state machine) refused, by reason.",
		}, []string{"reason"}),
		health: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fedstream_health_actions_total",
			Help: "Entries the health manager added to its action log, by diagnosis, action and outcome at the time (pending: carried out and waiting for evaluation; alert: a diagnosis no resolver could act on; failed).",
		}, []string{"diagnosis", "action", "outcome"}),
	}
}

func (m *coordMetrics) register(reg prometheus.Registerer, s *Server) {
	reg.MustRegister(m.commit, m.fsmApply, m.forwarded, m.plans, m.placed, m.refused, m.health, collector{s}, gometrics.Install())
}

// refusalReason classifies a refusal's text into a bounded label value.
func refusalReason(r fsm.PlanRefusal) string {
	why := r.Reason
	switch {
	case r.TaskID == "":
		return "slot_map"
	case strings.HasPrefix(why, "stale plan"):
		return "stale"
	case strings.HasPrefix(why, "zone spread"):
		return "zone_spread"
	case strings.Contains(why, "does not exist"):
		return "task_gone"
	case strings.Contains(why, "not registered"), strings.Contains(why, ", not "):
		return "worker_not_ready"
	case strings.Contains(why, "already runs"):
		return "replica_conflict"
	case strings.Contains(why, "at capacity"):
		return "capacity"
	}
	return "other"
}

// methodName is the last part of a full gRPC method name.
func methodName(full string) string {
	return full[strings.LastIndexByte(full, '/')+1:]
}

// timedFSM measures each Apply of the state machine, and notes when it
// applied each reconfiguration plan (plans).
type timedFSM struct {
	*fsm.FSM
	h     prometheus.Histogram
	plans *acksReceived
}

// Apply implements raft.FSM.
func (t timedFSM) Apply(l *raft.Log) any {
	start := time.Now()
	res := t.FSM.Apply(l)
	done := time.Now()
	t.h.Observe(done.Sub(start).Seconds())
	if t.plans != nil && len(l.Data) > 0 && fsm.MessageType(l.Data[0]) == fsm.ReconfigureQueryType {
		t.plans.notePlanApplied(l.Data[1:], res, done)
	}
	return res
}

var (
	descRaftState   = prometheus.NewDesc("fedstream_raft_state", "1 for the Raft state this coordinator is in (follower, candidate, leader, shutdown), 0 for the others.", []string{"state"}, nil)
	descRaftTerm    = prometheus.NewDesc("fedstream_raft_term", "Current Raft term.", nil, nil)
	descLastIndex   = prometheus.NewDesc("fedstream_raft_last_index", "Index of the last entry of this coordinator's Raft log.", nil, nil)
	descCommitIndex = prometheus.NewDesc("fedstream_raft_commit_index", "Index of the last entry this coordinator knows committed.", nil, nil)
	descApplied     = prometheus.NewDesc("fedstream_raft_applied_index", "Index of the last entry applied to this coordinator's state machine.", nil, nil)
	descHasLeader   = prometheus.NewDesc("fedstream_raft_has_leader", "1 when this coordinator knows a leader.", nil, nil)
	descVoters      = prometheus.NewDesc("fedstream_raft_voters", "Voters in the Raft configuration.", nil, nil)
	descTableRows   = prometheus.NewDesc("fedstream_fsm_table_rows", "Rows of each table of the replicated state.", []string{"table"}, nil)
	descReady       = prometheus.NewDesc("fedstream_coordinator_ready", "1 when the coordinator is ready (knows a leader, has applied what it knows committed); /readyz and the gRPC health service say the same.", nil, nil)
	descLiveStats   = prometheus.NewDesc("fedstream_live_task_stats", "Tasks whose latest figures the leader holds in memory for query stats (0 on followers).", nil, nil)
)

// collector reads a coordinator's Raft and state figures at scrape time.
type collector struct{ s *Server }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descRaftTerm, descLastIndex, descCommitIndex, descApplied,
		descHasLeader, descVoters, descTableRows, descReady, descLiveStats} {
		ch <- d
	}
	for _, d := range loadDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if r := s.raft; r != nil {
		state := r.State()
		for _, st := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
			gauge(descRaftState, b2f(state == st), strings.ToLower(st.String()))
		}
		gauge(descRaftTerm, float64(r.CurrentTerm()))
		gauge(descLastIndex, float64(r.LastIndex()))
		gauge(descCommitIndex, float64(r.CommitIndex()))
		gauge(descApplied, float64(r.AppliedIndex()))
		_, id := r.LeaderWithID()
		gauge(descHasLeader, b2f(id != ""))
		if cf := r.GetConfiguration(); cf.Error() == nil {
			n := 0
			for _, srv := range cf.Configuration().Servers {
				if srv.Suffrage == raft.Voter {
					n++
				}
			}
			gauge(descVoters, float64(n))
		}
	}
	s.collectLoad(gauge)
	if s.fsm != nil {
		if rows, err := s.State().TableRows(); err == nil {
			for table, n := range rows {
				gauge(descTableRows, float64(n), table)
			}
		}
	}
	ready, _ := s.readiness()
	gauge(descReady, b2f(ready))
	gauge(descLiveStats, float64(s.liveStats.size()))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// readyState is the coordinator's last readiness decision (see
// watchReadiness).
type readyState struct {
	ready bool
	why   string
}

// readiness is the coordinator's /readyz.
func (s *Server) readiness() (bool, string) {
	if st := s.readyNow.Load(); st != nil {
		return st.ready, st.why
	}
	return false, "starting"
}

// readinessEvery is how often the coordinator decides whether it is ready.
const readinessEvery = 200 * time.Millisecond

// watchReadiness decides, every readinessEvery, whether the coordinator
// is ready, and keeps the gRPC health service in step: SERVING only while
// it knows a leader and has applied every entry it knew committed at the
// previous decision (a node replaying a long log, restoring a snapshot or
// cut off from its cluster is not). Comparing with the previous decision's
// commit index keeps a busy but healthy node ready, although entries
// commit between any two looks.
func (s *Server) watchReadiness(ctx context.Context) {
	t := time.NewTicker(readinessEvery)
	defer t.Stop()
	var prevCommit uint64
	serving := healthpb.HealthCheckResponse_UNKNOWN
	for {
		ready, why := true, ""
		_, leader := s.raft.LeaderWithID()
		applied := s.raft.AppliedIndex()
		switch {
		case s.fsm.HaltErr() != nil:
			ready, why = false, "the state machine halted on an entry this build cannot apply"
		case leader == "":
			ready, why = false, "no Raft leader known"
		case applied < prevCommit:
			ready, why = false, fmt.Sprintf("catching up: applied index %d is behind commit index %d", applied, prevCommit)
		}
		prevCommit = s.raft.CommitIndex()
		s.readyNow.Store(&readyState{ready: ready, why: why})
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			want = healthpb.HealthCheckResponse_SERVING
		}
		if want != serving {
			s.health.SetServingStatus("", want)
			serving = want
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// HTTPAddr is where the coordinator serves metrics, health and whatever
// was mounted with HandleHTTP ("" without Config.HTTPAddr, or before
// Start).
func (s *Server) HTTPAddr() string { return s.ops.Addr() }

// HandleHTTP mounts h on the coordinator's HTTP server under pattern
// (net/http.ServeMux patterns; "/" is free for a web view, /metrics,
// /healthz and /readyz are taken). Call it before or after Start.
func (s *Server) HandleHTTP(pattern string, h http.Handler) { s.ops.Handle(pattern, h) }
