package main

import (
	"math"
	"testing"
	"time"
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
