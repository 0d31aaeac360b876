package main

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator/health"
)

// TestRealCalibrationKeepsDS2Ratios: the real-org word count scales DS2's
// rates by one factor: a splitter takes a tenth of the source's
// sentences, a counter a twentieth of its words, so the optimum stays
// 10 + 20; costs out of the operator's range are refused.
func TestRealCalibrationKeepsDS2Ratios(t *testing.T) {
	c, err := realCalibration(1000)
	if err != nil {
		t.Fatal(err)
	}
	if c.WordsPerSentence < 9.5 || c.WordsPerSentence > 10.5 {
		t.Fatalf("words per sentence %.2f, want about 10 (5..15 uniform)", c.WordsPerSentence)
	}
	if c.SplitterCost != (10 * time.Millisecond).String() {
		t.Fatalf("splitter cost %s, want 10ms a sentence", c.SplitterCost)
	}
	if sp := 1000 / c.SplitterCapacity; math.Abs(sp-10) > 0.01 {
		t.Fatalf("optimum splitters %.3f, want 10", sp)
	}
	if ct := 1000 * c.WordsPerSentence / c.CounterCapacity; math.Abs(ct-20) > 0.01 {
		t.Fatalf("optimum counters %.3f, want 20", ct)
	}
	if _, err := realCalibration(50); err == nil {
		t.Fatal("50 sentences/s (a 200 ms splitter cost) accepted")
	}
}

// TestSkewThreshold: the data-skew query's threshold is chosen from the
// generator's lines so that the hot partition receives about the skew
// asked for more than each other one.
func TestSkewThreshold(t *testing.T) {
	for _, skew := range []float64{0.1, 0.2, 0.5} {
		th, reached, hot, err := skewThreshold(skew)
		if err != nil {
			t.Fatal(err)
		}
		if th <= 0 || hot < 0 || hot > 3 || math.Abs(reached-skew) > 0.05 {
			t.Errorf("skew %.2f: threshold %d, reached %.3f, hot partition %d", skew, th, reached, hot)
		}
	}
}

// TestRealLoadScenariosRun: the load-change and noise scenarios run on a
// real org, shortened to seconds (the bench runs them for minutes): the
// source's pace is changed while the query runs, and both report what
// the bench prints. Their figures are the bench's, not asserted here.
func TestRealLoadScenariosRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two in-process orgs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := loadOptions{realOptions: realOptions{sentences: 100, settle: time.Second, logger: logging.Stderr("error")},
		warmup: time.Second, phase: time.Second, ratio: 20, seed: 1, noiseWarmup: time.Second, noiseSpan: 40 * time.Second}
	lc, err := runRealLoadChange(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(lc.Phases) != 3 || lc.Phases[1].Factor != 0.8 || lc.Phases[2].Factor != 0.8*1.3 || lc.Mode != "real_org" {
		t.Fatalf("load change: %+v", lc)
	}
	n, err := runRealNoise(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if n.SimulatedS != 40 || n.Ratio != 20 || n.Interval != "50ms" || n.Settle != "50ms" || n.WallS < 2 || n.Mode != "real_org" {
		t.Fatalf("noise: %+v", n)
	}
	if got := oscillationsOf("up:a", "down:a", "up:b", "up:b", "down:c", "up:c"); got != [2]int{1, 2} {
		t.Fatalf("oscillations (up then down, reversals) = %v, want [1 2]", got)
	}
}

func oscillationsOf(acts ...string) [2]int {
	var log []RealAction
	for _, a := range acts {
		dir, frag, _ := strings.Cut(a, ":")
		log = append(log, RealAction{Fragment: frag, Action: map[string]string{"up": health.ActScaleUp, "down": health.ActScaleDown}[dir]})
	}
	u, r := oscillations(log)
	return [2]int{u, r}
}
