package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/coordinator/health"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// sloQuery runs at parallelism 1 with a throughput SLO its one source
// partition cannot meet: 100 sentences a second, each its own group of a
// 200 ms window, reach the sink as about 100 results a second.
const sloQuery = `
name: slo
replicas: %d
slo:
  throughput: 250
sources:
  - name: lines
    generator: {kind: words, seed: 42, rate: 100}
operators:
  - name: per_line
    type: aggregate
    input: lines
    window: {size: 200ms}
    group_by: [line]
    aggregates: {n: "count()"}
sinks:
  - {name: out, input: per_line}
`

// TestSLOScalesTheSource is the user's path of issue 14 on an in-process
// org: a query submitted at parallelism 1 with a throughput SLO above what
// its source sends. The health manager diagnoses the missed SLO with the
// source as the bottleneck, logs scale_sources of the source from 1 to 3
// partitions, carries it out through the live rescale of the source, and
// judges it improved once the SLO is met; `fedstream health actions`
// shows it.
func TestSLOScalesTheSource(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an org for about 20 s")
	}
	testSLOScalesTheSource(t, 1)
}

// TestSLOScalesTheSourceReplicated is TestSLOScalesTheSource with
// replicas 2 (the demo query's setting): the aggregate reading the source
// runs a DCAA machine on each replica, and follows the source's rescale.
func TestSLOScalesTheSourceReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an org for about 20 s")
	}
	testSLOScalesTheSource(t, 2)
}

func testSLOScalesTheSource(t *testing.T, replicas int) {
	p := health.DefaultConfig()
	p.MinSamples, p.Persist = 3, 2
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fed, err := startDev(ctx, devOptions{org: "slo", coordinators: 1, workers: 2, dataDir: t.TempDir(), noHTTP: true,
		health: coordinator.HealthConfig{Interval: 500 * time.Millisecond, Settle: 3 * time.Second, Policy: &p}, sensorWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer fed.stop()
	f := &clientFlags{addr: fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: fed.tlsDir}}
	if err := fed.waitReady(ctx, f, 2); err != nil {
		t.Fatal(err)
	}
	conn, err := f.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := pb.NewAdminServiceClient(conn)
	if _, err := admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(sloQuery, replicas)), Filename: "slo.yaml"}); err != nil {
		t.Fatal(err)
	}
	type action struct {
		Fragment        string `json:"fragment"`
		Diagnosis       string `json:"diagnosis"`
		Action          string `json:"action"`
		FromParallelism int    `json:"from_parallelism"`
		ToParallelism   int    `json:"to_parallelism"`
		Outcome         string `json:"outcome"`
		OutcomeDetail   string `json:"outcome_detail"`
	}
	var scaled *action
	var out string
	deadline := time.Now().Add(2 * time.Minute)
	for scaled == nil || scaled.Outcome == "pending" {
		if time.Now().After(deadline) {
			t.Fatalf("no evaluated scale_sources action within 2 minutes; health actions:\n%s", out)
		}
		time.Sleep(500 * time.Millisecond) // polling the CLI, as a user would
		out, err = runRoot(t, "health", "actions", "--json", "--query", "slo", "--addr", f.addr, "--tls-dir", fed.tlsDir)
		if err != nil {
			t.Fatalf("health actions: %v: %s", err, out)
		}
		var acts []action
		if err := json.Unmarshal([]byte(out), &acts); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		scaled = nil
		for i := range acts {
			if acts[i].Action == health.ActScaleSources {
				scaled = &acts[i]
			}
		}
	}
	if scaled.Fragment != "lines" || scaled.Diagnosis != health.DiagSLOViolated || scaled.FromParallelism != 1 || scaled.ToParallelism != 3 {
		t.Fatalf("action %+v, want slo_violated -> scale_sources of lines from 1 to 3 partitions", scaled)
	}
	if scaled.Outcome != "improved" {
		t.Fatalf("scale_sources judged %s (%s), want improved: the SLO met", scaled.Outcome, scaled.OutcomeDetail)
	}
	q, err := admin.GetQuery(ctx, &pb.GetQueryRequest{Name: "slo"})
	if err != nil {
		t.Fatal(err)
	}
	sources := 0
	for _, tk := range q.Tasks {
		if tk.Fragment == "lines" {
			sources++
		}
	}
	if sources != 3*replicas {
		t.Fatalf("the source runs %d tasks, want 3 partitions of %d replicas", sources, replicas)
	}
	table, err := runRoot(t, "health", "actions", "--addr", f.addr, "--tls-dir", fed.tlsDir)
	if err != nil || !strings.Contains(table, "scale_sources") || !strings.Contains(table, "1 -> 3") {
		t.Fatalf("health actions table: %v\n%s", err, table)
	}
	t.Logf("health actions:\n%s", table)
}
