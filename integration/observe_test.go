package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker"
)

// observeRate is the generator's configured rate (records per second).
const observeRate = 400

// observeQuery: a paced generator whose records a keyed aggregate on
// another fragment counts; so the aggregate's input crosses the data
// plane.
var observeQuery = fmt.Sprintf(`
name: obs
sources:
  - name: lines
    generator: {kind: words, seed: 7, rate: %d}
operators:
  - name: firsts
    type: map
    input: lines
    fields: {word: "split(line, ' ')[0]"}
  - name: counts
    type: aggregate
    input: firsts
    window: {size: 200ms}
    group_by: [word]
    aggregates: {cnt: "count()"}
    parallelism: 2
sinks:
  - {name: out, input: counts}
`, observeRate)

// observedOrg is one coordinator and two workers in this process, all
// serving HTTP (metrics, health), with mutual TLS and a client
// certificate.
type observedOrg struct {
	coord   *coordinator.Server
	workers []*worker.Worker
	client  *tlsutil.Credentials
	admin   pb.AdminServiceClient
}

func newObservedOrg(t *testing.T) *observedOrg {
	ca, err := tlsutil.NewCA("acme")
	if err != nil {
		t.Fatal(err)
	}
	tm := coordinator.FastTimings()
	tm.HeartbeatTTL, tm.LeaderGrace = 2*time.Second, 2*time.Second
	srv, err := coordinator.New(coordinator.Config{
		Org: "acme", NodeID: "c1", DataDir: filepath.Join(t.TempDir(), "c1"),
		GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		BootstrapExpect: 1, Timings: tm, Logger: logging.Discard(),
		TLS: coordCreds(t, ca, "c1"), CA: ca, GossipKey: []byte("0123456789abcdef0123456789abcdef"),
	})
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown() })
	o := &observedOrg{coord: srv}
	if o.client, err = tlsutil.New(ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(rpc.Identity{Org: "acme", Role: rpc.RoleClient, Name: "ops"}, nil, time.Hour)
	if err == nil {
		err = o.client.SetCertificate(certPEM, keyPEM)
	}
	if err != nil {
		t.Fatal(err)
	}
	conn := o.dial(t, srv.GRPCAddr(), rpc.RoleCoordinator)
	o.admin = pb.NewAdminServiceClient(conn)
	for i := range 2 {
		creds, err := tlsutil.New(ca.CertPEM)
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(worker.Config{Org: "acme", Name: fmt.Sprintf("w%d", i+1), Coordinators: []string{srv.GRPCAddr()}, Cores: 4,
			Logger: logging.Discard(), TLS: creds, HTTPAddr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		o.workers = append(o.workers, w)
	}
	for _, w := range o.workers {
		waitFor(t, 30*time.Second, "worker ready (/readyz)", func() bool { return httpStatus(w.HTTPAddr(), "/readyz") == http.StatusOK })
	}
	waitFor(t, 30*time.Second, "coordinator ready (/readyz)", func() bool { return httpStatus(srv.HTTPAddr(), "/readyz") == http.StatusOK })
	return o
}

func (o *observedOrg) dial(t *testing.T, addr, role string) *grpc.ClientConn {
	conn, err := rpc.Dial(addr, "", o.client.DialOption(tlsutil.Peer{Roles: []string{role}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func httpStatus(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// scrape fetches /metrics, fails the test on any promlint problem, and
// returns the parsed families.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s", addr, resp.Status)
	}
	problems, err := promlint.New(strings.NewReader(string(body))).Lint()
	if err != nil {
		t.Fatalf("promlint %s: %v", addr, err)
	}
	for _, p := range problems {
		t.Errorf("promlint %s: %s: %s", addr, p.Metric, p.Text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse %s/metrics: %v", addr, err)
	}
	return fams
}

// taskValues sums a per-task family by task label.
func taskValues(fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	f := fams[name]
	if f == nil {
		return out
	}
	for _, m := range f.Metric {
		task := ""
		for _, l := range m.Label {
			if l.GetName() == "task" {
				task = l.GetValue()
			}
		}
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		out[task] += v
	}
	return out
}

// TestMetricsOfARunningQuery is issue 12's done-when test for metrics: a
// generator query at a known rate runs on an in-process org; /metrics of
// the coordinator and of each worker pass promlint, the per-task tuple
// counters grow at a rate plausible against the generator's, and query
// stats report the same through the leader.
func TestMetricsOfARunningQuery(t *testing.T) {
	t.Parallel()
	o := newObservedOrg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	submitted := time.Now()
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(observeQuery), Filename: "obs.yaml"}); err != nil {
		t.Fatal(err)
	}

	// The coordinator's metrics.
	fams := scrape(t, o.coord.HTTPAddr())
	for _, name := range []string{"fedstream_raft_state", "fedstream_raft_commit_duration_seconds", "fedstream_fsm_apply_duration_seconds",
		"fedstream_fsm_table_rows", "fedstream_plan_placements_committed_total", "raft_apply_total", "fedstream_coordinator_ready"} {
		if fams[name] == nil {
			t.Errorf("coordinator /metrics lacks %s", name)
		}
	}

	// Every task's counters, summed over the workers, by task.
	counts := func(name string) map[string]float64 {
		sum := map[string]float64{}
		for _, w := range o.workers {
			for task, v := range taskValues(scrape(t, w.HTTPAddr()), name) {
				sum[task] += v
			}
		}
		return sum
	}
	const source, agg0, agg1, sink = "obs/lines/p0/r0", "obs/counts/p0/r0", "obs/counts/p1/r0", "obs/out/p0/r0"
	waitFor(t, 30*time.Second, "every task counting tuples", func() bool {
		in := counts("fedstream_task_input_tuples_total")
		return in[source] > 0 && in[agg0]+in[agg1] > 0 && in[sink] > 0
	})
	// Wait for about four seconds' worth of records (by count, not by the
	// clock), then compare the rates since the query was submitted with
	// the configured one. The generator never runs ahead of its schedule
	// (so this rate cannot exceed the configured one by much), and the
	// time before its task started only lowers it a little.
	waitFor(t, 60*time.Second, "the source drawing records", func() bool {
		return counts("fedstream_task_input_tuples_total")[source] >= 4*observeRate
	})
	in1, out1 := counts("fedstream_task_input_tuples_total"), counts("fedstream_task_output_tuples_total")
	secs := time.Since(submitted).Seconds()
	plausible := func(rate float64) bool { return rate >= observeRate/4 && rate <= observeRate*4 }
	check := func(what string, rate float64) {
		if !plausible(rate) {
			t.Errorf("%s: %.0f tuples/s, implausible for a generator at %d/s", what, rate, observeRate)
		}
	}
	check("source input", in1[source]/secs)
	check("source output", out1[source]/secs)
	check("aggregate input (both partitions)", (in1[agg0]+in1[agg1])/secs)
	for _, name := range []string{"fedstream_task_busy_seconds_total", "fedstream_dataplane_sent_bytes_total"} {
		found := false
		for _, w := range o.workers {
			if f := scrape(t, w.HTTPAddr())[name]; f != nil && len(f.Metric) > 0 {
				found = true
			}
		}
		if !found {
			t.Errorf("no worker exports %s", name)
		}
	}

	// Query stats: the leader's view of the same figures, rates over one
	// heartbeat interval (a short one, in which a generator catching up
	// after a delay may burst: wait for a report in range).
	var stats *pb.QueryStatsResponse
	waitFor(t, 30*time.Second, "query stats with plausible rates for every task", func() bool {
		resp, err := o.admin.QueryStats(context.Background(), &pb.QueryStatsRequest{Query: "obs"})
		if err != nil {
			t.Fatalf("query stats: %v", err)
		}
		byTask := map[string]*pb.TaskStats{}
		for _, ts := range resp.Tasks {
			byTask[ts.Task] = ts
		}
		for _, id := range []string{source, agg0, agg1, sink} {
			if ts := byTask[id]; ts == nil || ts.ReportedAtMs == 0 || ts.Worker == "" {
				return false
			}
		}
		if !plausible(byTask[source].InTps) || !plausible(byTask[agg0].InTps+byTask[agg1].InTps) {
			return false
		}
		stats = resp
		return true
	})
	for _, ts := range stats.Tasks {
		if ts.Busy < 0 || ts.Busy > 1 {
			t.Errorf("query stats: %s busy %v, want a share of time", ts.Task, ts.Busy)
		}
	}
	if _, err := o.admin.QueryStats(context.Background(), &pb.QueryStatsRequest{Query: "nope"}); err == nil {
		t.Error("query stats of an unknown query: no error")
	}
}

// TestHealthAndReflection is issue 12's done-when test for health and
// discovery: over mutual TLS, the gRPC health service of a coordinator
// and of a worker answers SERVING, and server reflection lists (and
// describes) each port's services.
func TestHealthAndReflection(t *testing.T) {
	t.Parallel()
	o := newObservedOrg(t)
	for _, port := range []struct {
		name, addr, role string
		want             []string
	}{
		{"coordinator", o.coord.GRPCAddr(), rpc.RoleCoordinator, []string{"fedstream.v1.AdminService", "fedstream.v1.WorkerService", "grpc.health.v1.Health"}},
		{"worker", o.workers[0].Addr(), rpc.RoleWorker, []string{"fedstream.v1.DataPlane", "grpc.health.v1.Health"}},
	} {
		conn := o.dial(t, port.addr, port.role)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("%s health check: %v", port.name, err)
		}
		if hc.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s health: %v, want SERVING", port.name, hc.Status)
		}
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatalf("%s reflection: %v", port.name, err)
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s reflection list: %v", port.name, err)
		}
		listed := map[string]bool{}
		for _, s := range resp.GetListServicesResponse().GetService() {
			listed[s.Name] = true
		}
		for _, s := range port.want {
			if !listed[s] {
				t.Errorf("%s reflection lists %v, lacks %s", port.name, listed, s)
			}
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: port.want[0]}}); err != nil {
			t.Fatal(err)
		}
		if resp, err = stream.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
			t.Errorf("%s reflection describe %s: %v %v", port.name, port.want[0], err, resp.GetErrorResponse())
		}
		_ = stream.CloseSend()
		cancel()
	}
	if code := httpStatus(o.workers[0].HTTPAddr(), "/healthz"); code != http.StatusOK {
		t.Errorf("worker /healthz: %d", code)
	}
	if code := httpStatus(o.coord.HTTPAddr(), "/healthz"); code != http.StatusOK {
		t.Errorf("coordinator /healthz: %d", code)
	}
}

// TestDemoMetrics scrapes `fedstream dev` as a user runs it (`make run`):
// the demo query on its three coordinators and two workers. The
// coordinator's and both workers' /metrics pass promlint, and the demo's
// three generators (2000 records/s each) show input rates plausible
// against that: counted by the tuples drawn, not by the clock, so a slow
// machine only makes the test wait longer.
func TestDemoMetrics(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a real process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := command(ctx, t, "dev", "--duration", "90s", "--json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	// The banner names every process's HTTP address: "  coordinator c1
	// grpc ADDR  http http://ADDR (...)" and "  worker w1 ...".
	var coordHTTP string
	var workerHTTP []string
	lines := bufio.NewScanner(stderr)
	for lines.Scan() && len(workerHTTP) < 2 {
		f := strings.Fields(lines.Text())
		i := slices.Index(f, "http")
		if i < 0 || i+1 >= len(f) || len(f) < 2 {
			continue
		}
		addr := strings.TrimPrefix(f[i+1], "http://")
		switch {
		case f[0] == "coordinator" && coordHTTP == "":
			coordHTTP = addr
		case f[0] == "worker":
			workerHTTP = append(workerHTTP, addr)
		}
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	if coordHTTP == "" || len(workerHTTP) != 2 {
		t.Fatalf("dev's banner named coordinator %q and workers %v", coordHTTP, workerHTTP)
	}
	drawn := func() float64 {
		n := 0.0
		for _, w := range workerHTTP {
			for task, v := range taskValues(scrape(t, w), "fedstream_task_input_tuples_total") {
				if strings.HasPrefix(task, "netmon/m") { // m1, m2, m3: both replicas
					n += v
				}
			}
		}
		return n
	}
	waitFor(t, 90*time.Second, "the demo's generators drawing records", func() bool { return drawn() > 0 })
	start, n0 := time.Now(), drawn()
	// 3 generators x 2 replicas x 2000 records/s: wait for four seconds'
	// worth, then the rate over the wait must be plausible (a generator
	// never runs ahead of its schedule, so it cannot be far above).
	const rate = 3 * 2 * 2000
	waitFor(t, 90*time.Second, "four seconds of demo input", func() bool { return drawn()-n0 >= 4*rate })
	if got := (drawn() - n0) / time.Since(start).Seconds(); got > 2*rate || got < rate/8 {
		t.Fatalf("demo sources drew %.0f records/s, want about %d", got, rate)
	}
	fams := scrape(t, coordHTTP)
	if fams["fedstream_raft_state"] == nil {
		t.Fatal("the coordinator's /metrics has no fedstream_raft_state")
	}
}
