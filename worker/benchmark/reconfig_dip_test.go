package benchmark

import (
	"math"
	"math/rand"
	"testing"
	"time"
)

// dipStream is a sink's arrivals at 15,000 results/s in batches of 75
// every 5 ms (one release step each), each batch late by up to jitter
// (pseudo-random, fixed seed), for total; lose(at) drops a result that
// would arrive at at.
func dipStream(total, jitter time.Duration, lose func(at time.Duration, i int) bool) []ReconfigRecord {
	rng := rand.New(rand.NewSource(7))
	var recv []ReconfigRecord
	i := 0
	for t := 4 * time.Millisecond; t < total; t += 5 * time.Millisecond {
		at := t + time.Duration(rng.Int63n(int64(jitter)+1))
		for range 75 {
			i++
			if lose != nil && lose(at, i) {
				continue
			}
			recv = append(recv, ReconfigRecord{At: at, Key: "0/p/0"})
		}
	}
	return recv
}

func dipUpdates() []time.Duration {
	var u []time.Duration
	for i := range 10 {
		u = append(u, 2500*time.Millisecond+time.Duration(i)*3*time.Second)
	}
	return u
}

// TestWindowDipResolvesAFifthOfAPercent: on a steady stream arriving in
// release batches late by up to 2 ms, the 100 ms statistic reads a whole
// batch (5 %) where nothing happens, while the windowed one, over ten
// updates, has a resolution (the control's interval) and an interval
// below 0.2 %: no loss reads as at most 0.2 %; a real 0.5 % loss in the
// second after each update is measured as above 0.2 %, and the interval
// covers the true loss (0.5 %, 0.1 %).
func TestWindowDipResolvesAFifthOfAPercent(t *testing.T) {
	const total = 33 * time.Second
	ups := dipUpdates()
	steady := dipStream(total, 2*time.Millisecond, nil)
	d := WindowDip(steady, ups, time.Second)
	if d == nil || len(d.PerUpdate) != 10 || len(d.Control) != 10 {
		t.Fatalf("dip %+v", d)
	}
	t.Logf("steady: mean %.5f ± %.5f, control %.5f ± %.5f", d.Mean, d.CI95, d.ControlMu, d.Resolution)
	if d.Resolution <= 0 || d.Resolution >= 0.002 || d.Upper >= 0.002 || math.Abs(d.Mean) > d.CI95 {
		t.Fatalf("steady stream: mean %.5f ± %.5f, control %.5f ± %.5f; want both intervals under 0.2%% and covering 0", d.Mean, d.CI95, d.ControlMu, d.Resolution)
	}
	// The statistic on the same stream: a batch late across a
	// bucket edge reads as a 5 % dip.
	if old := AnalyseReconfig(nil, steady, 0, ups, nil, 0).ThroughputDip; old < 0.04 {
		t.Fatalf("100 ms statistic %.4f on a jittered stream; the test stream does not show its resolution", old)
	}
	for _, c := range []struct {
		every      int // one result lost in every
		loss       float64
		aboveFifth bool
	}{{200, 0.005, true}, {1000, 0.001, false}} {
		lossy := dipStream(total, 2*time.Millisecond, func(at time.Duration, i int) bool {
			for _, u := range ups {
				if at >= u && at < u+time.Second {
					return i%c.every == 0
				}
			}
			return false
		})
		d := WindowDip(lossy, ups, time.Second)
		t.Logf("loss of 1 in %d: mean %.5f ± %.5f", c.every, d.Mean, d.CI95)
		if d.Mean-d.CI95 > c.loss || d.Upper < c.loss || (d.Mean-d.CI95 > 0.002) != c.aboveFifth {
			t.Errorf("loss of 1 in %d: mean %.5f ± %.5f; want an interval covering %.4f, above 0.2%%: %v", c.every, d.Mean, d.CI95, c.loss, c.aboveFifth)
		}
		if math.Abs(d.ControlMu) > d.Resolution {
			t.Errorf("loss of 1 in %d: control %.5f ± %.5f reads an effect where there is none", c.every, d.ControlMu, d.Resolution)
		}
	}
}

// TestArrivalCurve: the count at a batch's arrival includes it, and
// between two batches the later one counts in proportion to the time
// elapsed since the earlier one.
func TestArrivalCurve(t *testing.T) {
	c := newArrivalCurve([]ReconfigRecord{{At: 10}, {At: 10}, {At: 20}, {At: 20}, {At: 20}, {At: 20}})
	for _, x := range []struct {
		at   time.Duration
		want float64
	}{{5, 0}, {10, 2}, {15, 4}, {20, 6}, {25, 6}} {
		if got := c.count(x.at); got != x.want {
			t.Errorf("count(%v) = %v, want %v", x.at, got, x.want)
		}
	}
	if WindowDip(nil, []time.Duration{time.Second}, time.Second) != nil {
		t.Error("a dip with no results")
	}
}
