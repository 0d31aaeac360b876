package benchmark

import (
	"testing"
	"time"
)

// steadyRecords are results at perS per second from 0 to dur, each
// arriving lag(at) after its due time.
func steadyRecords(perS int, dur time.Duration, lag func(at time.Duration) time.Duration) []ReconfigRecord {
	var out []ReconfigRecord
	step := time.Second / time.Duration(perS)
	for due := time.Duration(0); due < dur; due += step {
		l := lag(due)
		out = append(out, ReconfigRecord{At: due + l, STime: int64(due)})
	}
	return out
}

// TestJudgeCapacityStep: a step is sustained when the consumer gets the
// offered rate with a steady latency and skipped nothing; a pipeline
// that falls behind (fewer results, latency growing) or a consumer that
// skipped results is not.
func TestJudgeCapacityStep(t *testing.T) {
	const perS = 10_000
	steady := func(time.Duration) time.Duration { return 20 * time.Millisecond }
	// Behind: the pipeline carries 80 % of what is offered, so a result
	// due at d arrives at d/0.8.
	behind := func(d time.Duration) time.Duration { return d / 4 }
	// A stall of 50 ms early in the window, caught up at once.
	blip := func(d time.Duration) time.Duration {
		if d > 1100*time.Millisecond && d < 1150*time.Millisecond {
			return 60 * time.Millisecond
		}
		return 10 * time.Millisecond
	}
	for _, c := range []struct {
		name        string
		lag         func(time.Duration) time.Duration
		offered     float64
		undelivered int
		sustained   bool
	}{
		{"steady", steady, perS, 0, true},
		{"short stall caught up", blip, perS, 0, true},
		{"falling behind", behind, perS, 0, false},
		{"fewer than offered", steady, 1.2 * perS, 0, false},
		{"consumer skipped results", steady, perS, 500, false},
	} {
		recv := steadyRecords(perS, 5*time.Second, c.lag)
		st := JudgeCapacityStep(recv, 0, time.Second, 4*time.Second, perS/10, c.offered, c.undelivered)
		if st.Sustained != c.sustained {
			t.Errorf("%s: %+v, want sustained %v", c.name, st, c.sustained)
		}
	}
	if st := JudgeCapacityStep(nil, 0, time.Second, 4*time.Second, 1, perS, 0); st.Sustained || st.DeliveredPerS != 0 {
		t.Errorf("no results: %+v", st)
	}
}

// TestNextCapacityRate: the probe rises while it is sustained, falls
// while it is not, then bisects until the bracket is within 15 %.
func TestNextCapacityRate(t *testing.T) {
	for _, c := range []struct {
		lo, hi, next int
		done         bool
	}{
		{1500, 0, 2250, false},
		{1, 0, 2, false},
		{0, 1500, 1000, false},
		{0, 1, 0, true},
		{2000, 4000, 2828, false},
		{2828, 3000, 0, true},
		{5, 6, 0, true},
	} {
		next, done := NextCapacityRate(c.lo, c.hi)
		if next != c.next || done != c.done {
			t.Errorf("NextCapacityRate(%d, %d) = %d, %v; want %d, %v", c.lo, c.hi, next, done, c.next, c.done)
		}
	}
	// A search over a pipeline that sustains up to 3300/s per source
	// ends bracketing it.
	lo, hi, rate := 0, 0, 1500
	for range 20 {
		if rate <= 3300 {
			lo = rate
		} else {
			hi = rate
		}
		next, done := NextCapacityRate(lo, hi)
		if done {
			break
		}
		rate = next
	}
	if lo > 3300 || hi <= 3300 || float64(hi) > 1.15*float64(lo) {
		t.Errorf("search ended with %d sustained, %d not", lo, hi)
	}
}
