package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator/health"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestHealthWarmupAfterStart: a query just submitted is watched for the
// warm-up before the loop may act on it, whatever its first figures say:
// a bottleneck reported from its first windows on (the source blocked
// 800 ms/s, the aggregate busy all the time, as a query catching up with
// what its source sent while its tasks started) brings no action during
// the warm-up, counted from the first sample of all its tasks, and the
// same figures bring one after it. The loop is stepped by hand with the
// times it is given.
func TestHealthWarmupAfterStart(t *testing.T) {
	t.Parallel()
	c, s := startHandSteppedHealth(t)
	defer c.shutdown()
	p := health.DefaultConfig()
	p.MinSamples, p.Persist = 3, 2
	const warmup = 20 * time.Second
	l := s.newHealthLoop(HealthConfig{Interval: 100 * time.Millisecond, Settle: time.Second, Warmup: warmup, Policy: &p})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	ms := t0.UnixMilli()
	report := func() {
		ms += 100
		s.liveStats.put("w-fake", []*pb.TaskStats{
			{Task: "hq/text/p0/r0", InTps: 100, OutTps: 100, Busy: 0.1, BackpressureMsPerS: 800, ReportedAtMs: ms},
			{Task: "hq/per_line/p0/r0", InTps: 100, OutTps: 100, Busy: 1, Queue: 50, ReportedAtMs: ms},
			{Task: "hq/out/p0/r0", InTps: 100, OutTps: 100, Busy: 0.05, ReportedAtMs: ms},
		}, time.Now())
	}
	// Twelve steps with a window each, the first of them starting the
	// warm-up: a full window of a bottleneck, no action.
	for i := range 12 {
		report()
		l.step(ctx, t0.Add(time.Duration(i)*warmup/20))
	}
	if acts := healthActions(t, s); len(acts) != 0 {
		t.Fatalf("%d actions during the warm-up, want none: %+v", len(acts), acts[0])
	}
	// The warm-up over: the same figures are acted on.
	report()
	l.step(ctx, t0.Add(warmup))
	acts := healthActions(t, s)
	if len(acts) != 1 || acts[0].Diagnosis != health.DiagUnderProvisioned || acts[0].Fragment != "per_line" {
		t.Fatalf("actions after the warm-up %+v, want one for under_provisioned per_line", acts)
	}
}

// startHandSteppedHealth starts a one-node cluster whose own health loop
// is off (the test steps one by hand), waits for its leader duties and
// submits healthTestQuery ("hq"). The caller shuts the cluster down.
func startHandSteppedHealth(t *testing.T) (*testCluster, *Server) {
	t.Helper()
	c := newTestClusterWith(t, 1, "", "", testTimings(), func(cfg *Config) { cfg.Health.Off = true })
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	if _, err := c.admin(0).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(healthTestQuery), Filename: "hq.yaml"}); err != nil {
		c.shutdown()
		t.Fatal(err)
	}
	return c, s
}
