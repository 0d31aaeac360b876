package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/benchmark"
)

// TestReconfigBenchOrgSmall runs `bench reconfig` in its org on a small
// scenario: both strategies update through the coordinator with no
// result processed by mixed versions, lost or duplicated, each version
// path present, and every figure produced (the quiescent update is a
// pause at the sink, the reconnect completes after the link returns).
func TestReconfigBenchOrgSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an org in process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := runReconfigOrg(ctx, benchmark.ReconfigConfig{Sources: 2, Rate: 500, Updates: 1, Warmup: 600 * time.Millisecond,
		Spacing: time.Second, ThroughputRuns: 1, ThroughputSettle: 100 * time.Millisecond, ThroughputWindow: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Stalls: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.MixedVersionTuples != 0 || res.LostOrDuplicated != 0 {
		t.Fatalf("mixed %d, lost or duplicated %d", res.MixedVersionTuples, res.LostOrDuplicated)
	}
	for name, s := range map[string]benchmark.StrategyResult{"live": res.Live, "quiescent": res.Quiescent} {
		if s.UpdateMsP50 <= 0 || (name == "quiescent" && len(s.ResumedMs) != 1) || s.Paths["v1"] == 0 || s.Paths["v2"] == 0 || len(s.Buckets) == 0 || s.LongestGapMs <= 0 {
			t.Fatalf("%s: %+v", name, s)
		}
	}
	// The leader received the live plan's last acknowledgement before
	// the Raft write recording it was applied.
	if l := res.Live; len(l.AcksReceivedMs) != 1 || l.AcksReceivedMs[0] <= 0 || l.AcksReceivedMs[0] > l.SwitchedMs[0] {
		t.Fatalf("acknowledgements received at %v ms, switched at %v ms", l.AcksReceivedMs, l.SwitchedMs)
	}
	if res.ReconnectMs <= 0 || res.ReconnectCutMs <= 0 || res.CPUMicrosPerResultOff <= 0 {
		t.Fatalf("reconnect %v ms after a cut of %v ms; %v µs per result", res.ReconnectMs, res.ReconnectCutMs, res.CPUMicrosPerResultOff)
	}
}

// TestFirstOfEpoch: the quiescent update ends at the first result of the
// new epoch at or after the update, not at an older result drained after
// the pause nor at one before the update.
func TestFirstOfEpoch(t *testing.T) {
	recv := []benchmark.ReconfigRecord{{At: 5, Version: 1}, {At: 10, Version: 0}, {At: 20, Version: 0}, {At: 30, Version: 1}, {At: 40, Version: 2}}
	for _, c := range []struct {
		e    uint64
		from time.Duration
		want time.Duration
		ok   bool
	}{{1, 8, 30, true}, {1, 0, 5, true}, {2, 8, 40, true}, {3, 0, 0, false}} {
		got, ok := firstOfEpoch(recv, c.e, c.from)
		if got != c.want || ok != c.ok {
			t.Errorf("firstOfEpoch(epoch %d, from %v) = %v, %v; want %v, %v", c.e, c.from, got, ok, c.want, c.ok)
		}
	}
}
