package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

const vitalsQuery = `name: ward
replicas: 2
sources:
  - {name: vitals, generator: {kind: vitals, rate: 0, seed: 11, limit: %d}}
operators:
  - {name: feverish, type: filter, input: vitals, where: "temperature > 37.0"}
  - {name: per_patient, type: aggregate, input: feverish, window: {size: 1ms},
     group_by: [patient], aggregates: {n: "count()", hr: "max(heart_rate)"}, parallelism: 2}
sinks:
  - {name: out, input: per_patient}
`

// wardReference computes, straight from the generator of a ward query
// (vitalsQuery's shape: feverish patients counted per tumbling window of
// size), the result every sink row must match, keyed "patient@window end".
func wardReference(t *testing.T, queryYAML string, size time.Duration) map[string]string {
	t.Helper()
	q, err := queryspec.Parse("ref.yaml", []byte(queryYAML))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := source.NewGenerator(q.Sources[0].Gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := gen.Schema()
	iPatient, iTemp, iHR := s.Index("patient"), s.Index("temperature"), s.Index("heart_rate")
	type agg struct{ n, hr int64 }
	windows := map[string]*agg{}
	var tup tuple.Tuple
	for gen.Next(&tup) {
		if tup.Values[iTemp].F <= 37.0 {
			continue
		}
		end := (tup.STime/int64(size) + 1) * int64(size)
		key := fmt.Sprintf("%s@%s", tup.Values[iPatient].S, time.Unix(0, end).UTC().Format(time.RFC3339Nano))
		a := windows[key]
		if a == nil {
			a = &agg{hr: tup.Values[iHR].I}
			windows[key] = a
		}
		a.n++
		a.hr = max(a.hr, tup.Values[iHR].I)
	}
	out := map[string]string{}
	for k, a := range windows {
		out[k] = fmt.Sprintf("n=%d hr=%d", a.n, a.hr)
	}
	return out
}

// TestQueryEndToEndMatchesReference submits a query to a real org of
// processes, tails its sink through the CLI and compares every result with
// a reference computed directly from the generator.
func TestQueryEndToEndMatchesReference(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	const limit = 20000
	want := wardReference(t, fmt.Sprintf(vitalsQuery, limit), time.Millisecond)
	if len(want) < 50 {
		t.Fatalf("reference has only %d results; the test would prove little", len(want))
	}
	o := startOrg(t, 1, 2)
	waitFor(t, 30*time.Second, "2 ready workers", func() bool {
		ws, err := o.workerList(t, 0)
		return err == nil && len(ws) == 2 && ws[0].Status == "ready" && ws[1].Status == "ready"
	})
	file := filepath.Join(t.TempDir(), "ward.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(vitalsQuery, limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	var sub struct {
		Tasks int `json:"tasks"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := cli(ctx, t, &sub, "query", "submit", file, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	tail := command(ctx, t, "tail", "ward", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	tail.Stderr = &stderr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tail.Process.Kill(); _ = tail.Wait() }()
	got := map[string]string{}
	var lastID float64
	sc := bufio.NewScanner(stdout)
	for len(got) < len(want) && sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("tail printed a line that is not JSON: %q", sc.Text())
		}
		if r["type"] != "STABLE" {
			t.Fatalf("unexpected %v result: %s", r["type"], sc.Text())
		}
		id := r["id"].(float64)
		if id <= lastID {
			t.Fatalf("result ids not increasing: %v after %v", id, lastID)
		}
		lastID = id
		v, _ := r["values"].(map[string]any)
		key := fmt.Sprintf("%s@%s", v["patient"], v["window_end"])
		if _, dup := got[key]; dup {
			t.Fatalf("duplicate result for %s", key)
		}
		got[key] = fmt.Sprintf("n=%v hr=%v", v["n"], v["hr"])
	}
	if len(got) < len(want) {
		t.Fatalf("tail ended after %d of %d results: %v\nstderr: %s", len(got), len(want), sc.Err(), stderr.String())
	}
	var diffs []string
	for k, v := range want {
		if got[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s: got %q want %q", k, got[k], v))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("%d of %d results differ from the reference, e.g.\n%s", len(diffs), len(want), strings.Join(diffs[:min(10, len(diffs))], "\n"))
	}

	// Stopping the query releases every task on every worker.
	var stopped struct {
		Status string `json:"status"`
	}
	if err := cli(ctx, t, &stopped, "query", "stop", "ward", "--addr", o.grpc[0], "--token", o.adminToken); err != nil || stopped.Status != "stopped" {
		t.Fatalf("stop: %v %+v", err, stopped)
	}
	waitFor(t, 20*time.Second, "no tasks left on the workers", func() bool {
		ws, err := o.workerList(t, 0)
		if err != nil {
			return false
		}
		for _, w := range ws {
			if len(w.Tasks) > 0 {
				return false
			}
		}
		return true
	})
}
