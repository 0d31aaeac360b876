package benchmark

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestDCAAInProcess runs a reduced bench dcaa (one failure of 2X per
// strategy, short input, small saturation runs) with in-process workers,
// so that the bench cannot rot: every phase runs and yields its figures,
// and the failed replica's stable output equals the reference run's.
// Figures are not asserted against floors here (a loaded test machine
// says nothing about them); bench dcaa reports those.
//
// The DCAA failure must give tentative results, then corrections. A
// process short of CPU counts silence only over the time it could run
// (docs/DATAPLANE.md, failure detection under load), so at load 30 on
// two cores the 400 ms hold once went unnoticed: 0 tentative, which
// says nothing of the correction path the test is about. Such a run is
// inconclusive and runs again, at most three times in all; a product
// that never goes tentative still fails every one.
//
// Each run again holds the failure longer: 2X, then 4X, then 7X (bench
// dcaa's own durations). The detector counts a starved process's silence
// only over the time it could run, and stretches its timeout while its
// own timers wake late (local health), by design, so a planned failure
// must last long enough in the process's running time, which on a loaded
// machine is a fraction of the wall time: at load 24-27 the 400 ms hold
// went undetected in all three runs, and at load ~36 in 3 of 5.
func TestDCAAInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a reduced benchmark (several seconds)")
	}
	for attempt, dOverX := range []float64{2, 4, 7} {
		res := dcaaInProcessRun(t, dOverX)
		var undetected string
		for _, r := range res.Rows {
			if r.Strategy == StrategyDCAA && (r.Tentative == 0 || r.Undos == 0) {
				undetected = fmt.Sprintf("dcaa, D = %gX: %d tentative, %d UNDO: want tentative results, then corrections", dOverX, r.Tentative, r.Undos)
			}
		}
		if undetected == "" {
			return
		}
		if attempt == 2 {
			t.Fatalf("three runs, the last: %s", undetected)
		}
		t.Logf("run %d inconclusive (the failure was not detected as such: a loaded machine counts a starved process's silence as starvation): %s; running it again with a longer failure", attempt+1, undetected)
	}
}

// dcaaInProcessRun is one run of TestDCAAInProcess with one failure of
// dOverX·X: it checks every figure but the DCAA row's tentative results
// and UNDOs, which the caller judges.
func dcaaInProcessRun(t *testing.T, dOverX float64) *DCAAResult {
	var progress bytes.Buffer
	res, err := RunDCAA(t.Context(), DCAAConfig{
		X: 200 * time.Millisecond, DOverX: []float64{dOverX}, Warmup: time.Second, Recover: time.Second,
		SaturationRecords: 10_000, SaturationRounds: 1,
		Launch: InProcessLauncher(testLogger()), Logger: testLogger(),
		Progress: benchreport.NewProgress(&progress, "bench dcaa"),
	})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *res)
	if len(res.Rows) != 2 {
		t.Fatalf("%d rows, want one per strategy", len(res.Rows))
	}
	for _, r := range res.Rows {
		if !r.StableMatchesReference {
			t.Errorf("%s: stable output differs from the reference: %s", r.Strategy, r.Mismatch)
		}
	}
	if res.ReferenceResults == 0 || res.Rate <= 0 || res.K1RecordsPerCPUSec <= 0 || res.K2RecordsPerCPUSec <= 0 || res.K1RecordsPerSec <= 0 || res.K2RecordsPerSec <= 0 {
		t.Fatalf("a figure is missing: %+v", *res)
	}
	// In-process workers cannot be pinned: the overhead says so and
	// falls back to CPU time; both replicas produced the k = 1 output.
	if res.OverheadMethod != OverheadCPUTime || res.ReplicationOverhead != res.CPUOverhead || res.OverheadNote == "" {
		t.Errorf("in-process overhead: method %q, %g (cpu %g), note %q; want the CPU time fallback, stated", res.OverheadMethod, res.ReplicationOverhead, res.CPUOverhead, res.OverheadNote)
	}
	if res.SaturationOutputsMatch == nil || !*res.SaturationOutputsMatch || res.SaturationResults == 0 {
		t.Errorf("saturation outputs: match %v (%s), %d results", res.SaturationOutputsMatch, res.SaturationMismatch, res.SaturationResults)
	}
	if len(res.Floors) == 0 {
		t.Fatal("no floors checked")
	}
	return res
}

// TestDCAASaturationPlacement: in the overhead runs each replica runs on
// worker processes of its own (the pair pinned to one CPU): every task of
// replica 0 on srcR0 or measured, every task of replica 1 on srcR1 or
// peer, sources apart from the rest.
func TestDCAASaturationPlacement(t *testing.T) {
	q, err := dcaaQuery("place", 2, "500ms", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range plan.Nodes {
		for p := range max(1, n.Partitions) {
			for r := range 2 {
				w := dcaaSaturationWhere(n, p, r)
				want := [2][2]int{{measured, srcR0}, {peer, srcR1}}[r][btoi(n.Kind == queryspec.KindSource)]
				if w != want {
					t.Errorf("%s partition %d replica %d on worker %d, want %d", n.Name, p, r, w, want)
				}
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSinkThroughput: every input record over the time from the start to
// the final boundary; no final boundary is an error.
func TestSinkThroughput(t *testing.T) {
	start := time.Unix(100, 0)
	evs := []streamEvent{
		{Type: tuple.Boundary, STime: 5, Nanos: start.Add(time.Second).UnixNano()},
		{Type: tuple.Boundary, STime: finalBoundary, Nanos: start.Add(3 * time.Second).UnixNano()},
	}
	got, err := sinkThroughput(evs, 1000, start)
	if err != nil || got != 1000 {
		t.Fatalf("sinkThroughput = %g, %v; want 1000 (3000 records in 3 s)", got, err)
	}
	if _, err := sinkThroughput(evs[:1], 1000, start); err == nil {
		t.Fatal("no final boundary: no error")
	}
}

// TestDCAASideWindow: a window's figures from two samples of both sides,
// and no window when a side took in nothing (it is merged into the next).
func TestDCAASideWindow(t *testing.T) {
	prev := [2]sideSample{{cpu: 1e9, records: 1000, gc: 1}, {cpu: 2e9, records: 5000, gc: 3}}
	// k = 1: 200 000 records on 1 CPU-second; k = 2: 180 000 on 1 s.
	cur := [2]sideSample{{cpu: 2e9, records: 201_000, gc: 2}, {cpu: 3e9, records: 185_000, gc: 5}}
	w, ok := sideWindow(prev, cur, 2*time.Second)
	if !ok {
		t.Fatal("no window")
	}
	want := DCAASideWindow{Ms: 2000, K1RecordsPerCPUSec: 200_000, K2RecordsPerCPUSec: 180_000, K1RecordsPerSec: 50_000, K2RecordsPerSec: 45_000,
		K1CPUUse: 0.25, K2CPUUse: 0.25, K1GC: 1, K2GC: 2, Overhead: 0.1}
	if w != want {
		t.Fatalf("window %+v, want %+v", w, want)
	}
	cur[1].records = prev[1].records
	if _, ok := sideWindow(prev, cur, 2*time.Second); ok {
		t.Fatal("a side without records gave a window")
	}
}

// TestDCAAPairedFigures: a paired round's figures from each side's CPU
// and wall time over the same records: the overhead is 1 - CPU(k=1) /
// CPU(k=2), records per CPU-second and CPU use per copy beside it.
func TestDCAAPairedFigures(t *testing.T) {
	var r DCAAPairedRound
	// 1.8 M records a side: k = 1 on 3 CPU-seconds in 3 s, k = 2 on
	// 3.6 CPU-seconds in 4 s.
	r.pairedFigures(1_800_000, [2]time.Duration{3 * time.Second, 3600 * time.Millisecond}, [2]time.Duration{3 * time.Second, 4 * time.Second})
	want := DCAAPairedRound{K1CPUMs: 3000, K2CPUMs: 3600, K1Ms: 3000, K2Ms: 4000, K1RecordsPerCPUSec: 600_000, K2RecordsPerCPUSec: 500_000,
		K1CPUUse: 0.5, K2CPUUse: 0.45, Overhead: 0.1667}
	if r != want {
		t.Fatalf("round %+v, want %+v", r, want)
	}
}

// TestDCAASourceTasks: the records of a copy are counted at its sources,
// every partition and replica.
func TestDCAASourceTasks(t *testing.T) {
	q, err := dcaaQuery("readers", 2, "500ms", dcaaSideRate, 10)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := sourceTasks(q)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"readers/conns/p0/r0", "readers/conns/p0/r1", "readers/conns/p1/r0", "readers/conns/p1/r1", "readers/conns/p2/r0", "readers/conns/p2/r1"}
	if !slices.Equal(ids, want) {
		t.Fatalf("readers %v, want %v", ids, want)
	}
}
