package benchmark

import (
	"bytes"
	"testing"
	"time"

	"github.com/fedstream/fedstream/internal/benchreport"
)

// TestDCAAInProcess runs a reduced bench dcaa (one failure of 2X per
// strategy, short input, small saturation runs) with in-process workers,
// so that the bench cannot rot: every phase runs and yields its figures,
// and the failed replica's stable output equals the reference run's.
// Figures are not asserted against floors here (a loaded test machine
// says nothing about them); bench dcaa reports those.
func TestDCAAInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a reduced benchmark (several seconds)")
	}
	var progress bytes.Buffer
	res, err := RunDCAA(t.Context(), DCAAConfig{
		X: 200 * time.Millisecond, DOverX: []float64{2}, Warmup: time.Second, Recover: time.Second,
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
		if r.Strategy == StrategyDCAA && (r.Tentative == 0 || r.Undos == 0) {
			t.Errorf("dcaa, D = 2X: %d tentative, %d UNDO: want tentative results, then corrections", r.Tentative, r.Undos)
		}
	}
	if res.ReferenceResults == 0 || res.Rate <= 0 || res.K1RecordsPerCPUSec <= 0 || res.K2RecordsPerCPUSec <= 0 {
		t.Fatalf("a figure is missing: %+v", *res)
	}
	if len(res.Floors) == 0 {
		t.Fatal("no floors checked")
	}
}
