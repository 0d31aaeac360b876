package benchmark

import (
	"context"
	"testing"
	"time"
)

// TestReconfigBenchSmall runs the reconfiguration benchmark on a small
// scenario: every figure is produced, no tuple is processed by mixed
// versions, lost or duplicated, and both strategies really updated (each
// version path is present).
func TestReconfigBenchSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := RunReconfig(ctx, ReconfigConfig{Sources: 2, Rate: 1000, Updates: 1, Warmup: 500 * time.Millisecond,
		Spacing: 700 * time.Millisecond, OverheadRecords: 2000, ThroughputRuns: 1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if res.MixedVersionTuples != 0 || res.LostOrDuplicated != 0 {
		t.Fatalf("mixed %d, lost or duplicated %d", res.MixedVersionTuples, res.LostOrDuplicated)
	}
	for name, s := range map[string]StrategyResult{"live": res.Live, "quiescent": res.Quiescent} {
		if s.UpdateMsP50 <= 0 || s.Paths["v1"] == 0 || s.Paths["v2"] == 0 || len(s.Buckets) == 0 {
			t.Fatalf("%s: %+v", name, s)
		}
	}
	if res.ReconnectMs <= 0 {
		t.Fatalf("reconnect %v ms", res.ReconnectMs)
	}
	if len(res.Charts()) != 2 {
		t.Fatal("charts")
	}
}
