package main

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator"
)

// `bench scaling --json` prints the keys the issue promises scripts (the
// model only: the real-org word count takes a minute or two).
func TestBenchScalingJSON(t *testing.T) {
	out, err := runRoot(t, "bench", "scaling", "--json", "--sim-only")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Wordcount struct {
			Steps         *int           `json:"steps"`
			Seconds       *int           `json:"seconds"`
			Final         map[string]int `json:"final"`
			Optimal       map[string]int `json:"optimal"`
			Overprovision *float64       `json:"overprovision"`
		} `json:"wordcount"`
		LoadChange struct {
			Actions      *int `json:"actions"`
			Oscillations *int `json:"oscillations"`
		} `json:"load_change"`
		Noise struct {
			SimulatedS *int `json:"simulated_s"`
			Actions    *int `json:"actions"`
		} `json:"noise"`
		Diagnoses []struct {
			Injected  string `json:"injected"`
			Diagnosed string `json:"diagnosed"`
		} `json:"diagnoses"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	wc := r.Wordcount
	if wc.Steps == nil || wc.Seconds == nil || wc.Overprovision == nil || wc.Final["counter"] == 0 || wc.Optimal["splitter"] != 10 ||
		r.LoadChange.Actions == nil || r.LoadChange.Oscillations == nil || r.Noise.SimulatedS == nil || *r.Noise.SimulatedS != 3600 ||
		r.Noise.Actions == nil || len(r.Diagnoses) == 0 || r.Diagnoses[0].Injected == "" {
		t.Fatalf("bench scaling --json lacks keys: %s", out)
	}
}

// `health actions` and `health blacklist` reach a coordinator's
// HealthService and print JSON (empty on a new org).
func TestHealthCommands(t *testing.T) {
	dir := t.TempDir()
	srv, err := coordinator.New(coordinator.Config{Org: "acme", NodeID: "c1", DataDir: filepath.Join(dir, "c1"),
		GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0", BootstrapExpect: 1,
		InsecurePlaintext: true, Timings: coordinator.FastTimings()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	deadline := time.Now().Add(30 * time.Second)
	for !srv.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
	out, err := runRoot(t, "health", "actions", "--json", "--insecure-plaintext", "--addr", srv.GRPCAddr())
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var acts []map[string]any
	if err := json.Unmarshal([]byte(out), &acts); err != nil || acts == nil || len(acts) != 0 {
		t.Fatalf("health actions --json on a new org: %q (%v)", out, err)
	}
	out, err = runRoot(t, "health", "blacklist", "--json", "--insecure-plaintext", "--addr", srv.GRPCAddr())
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var bl struct {
		FailureRatio float64          `json:"failure_ratio"`
		MinEvaluated int              `json:"min_evaluated"`
		Pairs        []map[string]any `json:"pairs"`
	}
	if err := json.Unmarshal([]byte(out), &bl); err != nil || bl.FailureRatio != 0.5 || bl.MinEvaluated != 1 || bl.Pairs == nil {
		t.Fatalf("health blacklist --json: %q (%v)", out, err)
	}
}

// TestPairScope: a blacklist pair's scope names its query and operator;
// a query-wide pair (an older log entry without an operator) has none.
func TestPairScope(t *testing.T) {
	for _, tc := range []struct{ in, q, op string }{{"wc/splitter", "wc", "splitter"}, {"wc", "wc", ""}} {
		if q, op := pairScope(tc.in); q != tc.q || op != tc.op {
			t.Errorf("pairScope(%q) = %q, %q; want %q, %q", tc.in, q, op, tc.q, tc.op)
		}
	}
}
