package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
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
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Stalls: true,
		// The side-by-side method runs this binary's bench command in
		// child processes: a test binary has none.
		OverheadMethod: benchmark.OverheadSequential})
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
	// Each strategy's steady condition before its update and the
	// update's phases are reported, and the disk's fsync beside them.
	for name, s := range map[string]benchmark.StrategyResult{"live": res.Live, "quiescent": res.Quiescent} {
		if b := s.Breakdown; b == nil || b.SwitchedMs <= 0 || s.LagBeforeMsP50 <= 0 || s.LagBeforeMsP50 > s.LagBeforeMsP99 {
			t.Fatalf("%s: breakdown %+v, lag before p50 %v p99 %v ms", name, s.Breakdown, s.LagBeforeMsP50, s.LagBeforeMsP99)
		}
	}
	if res.FsyncMsP50 <= 0 {
		t.Fatalf("fsync %v ms", res.FsyncMsP50)
	}
	// The leader received the live plan's last acknowledgement before
	// the Raft write recording it was applied.
	if l := res.Live; len(l.AcksReceivedMs) != 1 || l.AcksReceivedMs[0] <= 0 || l.AcksReceivedMs[0] > l.SwitchedMs[0] {
		t.Fatalf("acknowledgements received at %v ms, switched at %v ms", l.AcksReceivedMs, l.SwitchedMs)
	}
	// The write carrying the last of them began in between.
	if l := res.Live; len(l.AckWriteMs) != 1 || l.AckWriteMs[0] < l.AcksReceivedMs[0] || l.AckWriteMs[0] > l.SwitchedMs[0] {
		t.Fatalf("acknowledgements received at %v ms, their write began at %v ms, switched at %v ms", l.AcksReceivedMs, l.AckWriteMs, l.SwitchedMs)
	}
	// Every task installed the live plan before the acknowledgements
	// were written.
	if l := res.Live; len(l.InstalledMs) != 1 || l.InstalledMs[0] <= 0 || l.InstalledMs[0] > l.SwitchedMs[0] {
		t.Fatalf("live plan installed at %v ms, switched at %v ms", l.InstalledMs, l.SwitchedMs)
	}
	// The quiescent update ends when the last source resumed, after it
	// paused and held at its marker. (The first result of the new
	// configuration may reach the consumer earlier: from the first
	// source to resume.)
	q := res.Quiescent
	if len(q.SourcesResumedMs) != 1 || len(q.InFlight) != 1 || len(q.DrainMs) != 1 {
		t.Fatalf("quiescent holds: %+v", q)
	}
	if p, s, r := q.SourcesPausedMs[0], q.SourcesStoppedMs[0], q.SourcesResumedMs[0]; p <= 0 || p > s || s > r || math.Abs(q.UpdateMsP50-r) > 0.01 {
		t.Fatalf("sources paused %v, held at their markers %v, resumed %v ms; first new result %v ms; update_ms %v", p, s, r, q.ResumedMs[0], q.UpdateMsP50)
	}
	for name, s := range map[string]benchmark.StrategyResult{"live": res.Live, "quiescent": res.Quiescent} {
		if d := s.DipWindow; d == nil || len(d.PerUpdate) != 1 || d.WindowMs <= 0 {
			t.Fatalf("%s: dip window %+v", name, d)
		}
	}
	if res.ReconnectMs <= 0 || res.ReconnectCutMs <= 0 || res.CPUMicrosPerResultOff <= 0 {
		t.Fatalf("reconnect %v ms after a cut of %v ms; %v µs per result", res.ReconnectMs, res.ReconnectCutMs, res.CPUMicrosPerResultOff)
	}
	// Every overhead run is reported, one of each mode in the round at
	// least, and the round's ratios are those of its runs. (A run that
	// was not steady may have had its whole window in one batch of
	// results: no wall time, no CPU.)
	modes := map[string]bool{}
	for _, r := range res.OverheadRuns {
		if r.Results <= 0 || (r.Steady && r.CPUMs <= 0) || r.Placement == "" {
			t.Fatalf("overhead run %+v", r)
		}
		modes[r.Mode] = true
	}
	if len(modes) != 3 || len(res.OverheadStaticRounds) != 1 || len(res.OverheadDynamicRounds) != 1 || math.Abs(res.OverheadStatic-res.OverheadStaticRounds[0]) > 1e-4 || res.OverheadSteadyRounds > 1 {
		t.Fatalf("overhead runs %+v, rounds %v %v", res.OverheadRuns, res.OverheadStaticRounds, res.OverheadDynamicRounds)
	}
	if p := res.Reconnect; p == nil || p.FirstBytesMs <= 0 || p.FirstBytesMs > p.FlagMs || p.FlagMs > p.CompleteMs || p.CompleteMs != res.ReconnectMs {
		t.Fatalf("reconnect phases %+v, reconnect_ms %v", p, res.ReconnectMs)
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

// TestParseSecondRate: a rate per source partition or a percentage of
// the measured capacity; anything else is refused with the flag named.
func TestParseSecondRate(t *testing.T) {
	if r, f, err := parseSecondRate("4000"); err != nil || r != 4000 || f != 0 {
		t.Errorf("4000: %v %v %v", r, f, err)
	}
	if r, f, err := parseSecondRate("80%"); err != nil || r != 0 || f != 0.8 {
		t.Errorf("80%%: %v %v %v", r, f, err)
	}
	for _, bad := range []string{"0", "-5", "fast", "0%", "120%", "x%"} {
		if _, _, err := parseSecondRate(bad); err == nil || !strings.Contains(err.Error(), "--second-rate") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestLagBefore: the lag is each result's arrival after its stream
// time's due time on the query's pacing origin, over the window only.
func TestLagBefore(t *testing.T) {
	origin := time.Unix(1000, 0)
	start := origin.Add(50 * time.Millisecond) // the run began 50 ms after the origin
	ms := time.Millisecond
	recv := []benchmark.ReconfigRecord{
		{At: 10 * ms, STime: int64(40 * ms)},   // arrives 60 ms after the origin: lag 20 ms, before the window
		{At: 100 * ms, STime: int64(140 * ms)}, // lag 10 ms
		{At: 110 * ms, STime: int64(130 * ms)}, // lag 30 ms
		{At: 120 * ms, STime: int64(150 * ms)}, // lag 20 ms
		{At: 200 * ms, STime: int64(0)},        // after the window
	}
	p50, p99, ok := lagBefore(recv, start, origin, 100*ms, 200*ms)
	if !ok || p50 != 20 || p99 != 30 {
		t.Fatalf("lag p50 %v p99 %v ms (ok %v), want 20 and 30", p50, p99, ok)
	}
	if _, _, ok := lagBefore(recv, start, time.Time{}, 0, time.Second); ok {
		t.Fatal("a lag without a pacing origin")
	}
}
