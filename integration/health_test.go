package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/coordinator/health"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// healthQuery is moveQuery's keyed aggregate with a calibrated cost: each
// input tuple costs it %s of processing, so one instance takes at most
// 1/cost tuples per second while the source sends 2000 per second. %s is
// either "autoscale: true" (the health manager looks after the query) or
// nothing (the reference, left alone).
const healthQuery = `
name: %s
%s
sources:
  - name: lines
    generator: {kind: words, seed: 42, limit: 14000, rate: 2000}
operators:
  - name: firsts
    type: map
    input: lines
    fields: {word: "split(line, ' ')[0]", n: "len(split(line, ' '))"}
  - name: counts
    type: aggregate
    input: firsts
    window: {size: 20ms}
    group_by: [word]
    aggregates: {cnt: "count()", total: "sum(n)"}
    parallelism: %d
    cost: %s
sinks:
  - {name: out, input: counts}
`

// TestHealthScalesUpUnderBackpressure runs a query whose keyed aggregate,
// at one partition, takes 1000 tuples per second at most (1ms per tuple)
// while its source sends 2000: the source blocks on it. The leader's
// health manager diagnoses it as under-provisioned and scales it up in
// one step to what the true processing rate calls for (3 at 97% busy),
// through the live rescale, while the query runs; every result equals
// the reference run's (no cost, two partitions, never rescaled).
func TestHealthScalesUpUnderBackpressure(t *testing.T) {
	t.Parallel()
	p := health.DefaultConfig()
	p.MinSamples, p.Persist = 3, 2
	o := newLiveOrgWith(t, 3, func(c *coordinator.Config) {
		c.Health = coordinator.HealthConfig{Interval: 200 * time.Millisecond, Settle: 3 * time.Second, Policy: &p}
		// Not the harness's 1 s TTL: see TestHealthRebalancesDataSkew.
		c.Timings.HeartbeatTTL = 10 * time.Second
	})
	submit := func(name, extra string, parallelism int, cost string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		y := fmt.Sprintf(healthQuery, name, extra, parallelism, cost)
		if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(y), Filename: name + ".yaml"}); err != nil {
			t.Fatal(err)
		}
	}
	// Both at once: the reference's sink holds its output until it is
	// read (its windows do not depend on when).
	submit("ref", "", 2, "0s")
	submit("hs", "autoscale: true", 1, "1ms")
	got := o.results(t, "hs", nil)
	want := o.results(t, "ref", nil)
	sameResultMaps(t, got, want)

	hc := o.healthClient(t)
	resp, err := hc.Actions(context.Background(), &pb.HealthActionsRequest{Query: "hs"})
	if err != nil {
		t.Fatal(err)
	}
	var up *pb.HealthAction
	for _, a := range resp.Actions {
		t.Logf("action: %s %s %s %d -> %d %s (%s) %s", a.Fragment, a.Diagnosis, a.Action, a.FromParallelism, a.ToParallelism, a.Outcome, a.Detail, a.OutcomeDetail)
		if a.Action == health.ActScaleUp && up == nil {
			up = a
		}
	}
	if up == nil {
		t.Fatalf("no scale-up in the action log: %+v", resp.Actions)
	}
	if up.Fragment != "counts" || up.Diagnosis != health.DiagUnderProvisioned || up.FromParallelism != 1 || up.ToParallelism < 2 ||
		!strings.Contains(up.Metrics, "true_rate") || up.Outcome == "failed" {
		t.Fatalf("first scale-up %+v", up)
	}
	counts := 0
	for _, ti := range o.query(t, "hs").Tasks {
		if strings.HasPrefix(ti.TaskId, "hs/counts/") {
			counts++
		}
	}
	if counts < 2 {
		t.Fatalf("%d tasks of counts after the scale-up, want at least 2", counts)
	}
}

// healthClient dials the coordinator's HealthService as the org's client.
func (o *liveOrg) healthClient(t *testing.T) pb.HealthServiceClient {
	t.Helper()
	client, err := tlsutil.New(o.ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := o.ca.Issue(rpc.Identity{Org: "acme", Role: rpc.RoleClient, Name: "ops"}, nil, time.Hour)
	if err == nil {
		err = client.SetCertificate(certPEM, keyPEM)
	}
	if err != nil {
		t.Fatal(err)
	}
	conn, err := rpc.Dial(o.cfgs[0].GRPCAddr, "", client.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewHealthServiceClient(conn)
}
