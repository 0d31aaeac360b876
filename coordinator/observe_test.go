package coordinator

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func getHTTP(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func healthOf(t *testing.T, c *testCluster, i int) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(c.conn(i, "")).Check(ctxT(t, 5*time.Second), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.Status
}

// TestHealthServesOnlyWhenReady: a coordinator that knows no leader (it
// waits to be added to a cluster that never comes) is alive (/healthz)
// but not ready: /readyz answers 503 and its gRPC health service
// NOT_SERVING (grpc's health server starts SERVING, which it used to
// report regardless). A single-node cluster becomes ready once it leads.
func TestHealthServesOnlyWhenReady(t *testing.T) {
	t.Parallel()
	withHTTP := func(c *Config) { c.HTTPAddr = "127.0.0.1:0" }
	lone := newTestClusterWith(t, 1, "", "", testTimings(), withHTTP, func(c *Config) { c.BootstrapExpect = 0 })
	addr := lone.nodes[0].HTTPAddr()
	if code, _ := getHTTP(addr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz of a live coordinator: %d", code)
	}
	// Several readiness decisions later it is still not ready.
	time.Sleep(3 * readinessEvery) // not synchronisation: lets wrong answers show
	if st := healthOf(t, lone, 0); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health of a coordinator without a leader: %v, want NOT_SERVING", st)
	}
	code, body := getHTTP(addr, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no Raft leader") {
		t.Fatalf("/readyz without a leader: %d %q", code, body)
	}

	one := newTestClusterWith(t, 1, "", "", testTimings(), withHTTP)
	waitFor(t, 15*time.Second, "health SERVING once leading", func() bool { return healthOf(t, one, 0) == healthpb.HealthCheckResponse_SERVING })
	if code, body := getHTTP(one.nodes[0].HTTPAddr(), "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz of a leader: %d %q", code, body)
	}
}

// TestQueryStatsThroughFollowers: a worker's heartbeat carries per-task
// figures; sent to a follower it is forwarded to the leader, which keeps
// them in memory; QueryStats asked of another follower is forwarded too and
// answers them, for the query's own tasks only, naming the reporting
// worker whatever the report claims.
func TestQueryStatsThroughFollowers(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, "", "")
	l := c.leader()
	f1, f2 := (l+1)%3, (l+2)%3
	submit(t, c.admin(l), "qs", 1)
	reg, err := c.workers(l).Register(ctxT(t, 5*time.Second), &pb.RegisterRequest{Addr: "127.0.0.1:20999", Cores: 2})
	if err != nil {
		t.Fatal(err)
	}
	report := []*pb.TaskStats{
		{Task: "qs/text/p0/r0", Worker: "someone-else", InTps: 123, OutTps: 45, Busy: 0.25, Queue: 7, BackpressureMsPerS: 12, ReportedAtMs: time.Now().UnixMilli()},
		{Task: "other/x/p0/r0", InTps: 1},
	}
	var got *pb.QueryStatsResponse
	waitFor(t, 15*time.Second, "query stats with the reported figures", func() bool {
		if _, err := c.workers(f1).Heartbeat(ctxT(t, 5*time.Second), &pb.HeartbeatRequest{WorkerId: reg.WorkerId, TaskStats: report}); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		resp, err := c.admin(f2).QueryStats(ctxT(t, 5*time.Second), &pb.QueryStatsRequest{Query: "qs"})
		if err != nil {
			t.Fatalf("query stats: %v", err)
		}
		for _, ts := range resp.Tasks {
			if ts.Task == "qs/text/p0/r0" && ts.InTps == 123 {
				got = resp
				return true
			}
		}
		return false
	})
	tasks := map[string]*pb.TaskStats{}
	for _, ts := range got.Tasks {
		tasks[ts.Task] = ts
	}
	if len(tasks) != 2 || tasks["qs/out/p0/r0"] == nil || tasks["other/x/p0/r0"] != nil {
		t.Fatalf("query stats list %v, want the query's two tasks only", got.Tasks)
	}
	src := tasks["qs/text/p0/r0"]
	if src.Worker != reg.WorkerId || src.OutTps != 45 || src.Busy != 0.25 || src.Queue != 7 || src.BackpressureMsPerS != 12 {
		t.Fatalf("source task stats %v, want the report under worker %s", src, reg.WorkerId)
	}
	if tasks["qs/out/p0/r0"].ReportedAtMs != 0 {
		t.Fatalf("an unreported task has figures: %v", tasks["qs/out/p0/r0"])
	}
	// The Go view the leader's later managers read.
	if live := c.nodes[l].LiveTaskStats("qs"); len(live) != 1 || live[0].InTps != 123 {
		t.Fatalf("LiveTaskStats on the leader: %v", live)
	}
	if live := c.nodes[f1].LiveTaskStats("qs"); len(live) != 0 {
		t.Fatalf("LiveTaskStats on a follower: %v, want none (only the leader keeps them)", live)
	}
	if _, err := c.admin(f2).QueryStats(ctxT(t, 5*time.Second), &pb.QueryStatsRequest{Query: "nope"}); err == nil || !strings.Contains(err.Error(), "no query named") {
		t.Fatalf("query stats of an unknown query: %v", err)
	}
}

func TestRefusalReasonsAreBounded(t *testing.T) {
	t.Parallel()
	for why, want := range map[string]string{
		"stale plan: the task is unplaced at generation 1, the plan expected it on worker w at generation 2": "stale",
		"task q/f/p0/r0 does not exist (its query was stopped or resubmitted)":                               "task_gone",
		"worker w-1 is not registered":                              "worker_not_ready",
		"worker w-1 is down, not ready":                             "worker_not_ready",
		"worker w-1 already runs a replica of partition 0 of f":     "replica_conflict",
		"worker w-1 is at capacity: 32 tasks on 2 cores":            "capacity",
		"zone spread: zone a already runs a replica of partition 0": "zone_spread",
		"something new": "other",
	} {
		if got := refusalReason(fsm.PlanRefusal{TaskID: "q/f/p0/r0", Reason: why}); got != want {
			t.Errorf("refusalReason(%q) = %s, want %s", why, got, want)
		}
	}
	if got := refusalReason(fsm.PlanRefusal{Query: "q", Fragment: "f", Reason: "stale plan"}); got != "slot_map" {
		t.Errorf("slot map refusal: %s", got)
	}
}
