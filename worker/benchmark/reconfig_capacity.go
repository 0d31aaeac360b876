package benchmark

import (
	"math"
	"time"
)

// The capacity probe of `bench reconfig --second-rate P%`: the rate the
// hospital pipeline sustains end to end, paced as the measured runs are.
// An unpaced run is no measure of it: its generators advance stream time
// by 1 µs per record, so a boundary comes every 5,000 records of a
// source and the stages move huge batches, where paced sources send a
// boundary every 5 ms of wall time and flush whenever they are ahead;
// on a quiet machine the unpaced figure was 16 times what the paced
// pipeline could carry. So each step of the probe runs the scenario
// paced at one rate and watches the benchmark's own consumer over a
// window: the rate is sustained when the results arrive as fast as they
// are offered and their latency does not grow.

// CapacityStep is one step of the capacity probe.
type CapacityStep struct {
	RatePerSource int `json:"rate_per_source"`
	// OfferedPerS is what the sources produce (results/s), DeliveredPerS
	// what reached the consumer over the window.
	OfferedPerS   float64 `json:"offered_per_s"`
	DeliveredPerS float64 `json:"delivered_per_s"`
	// LagStartMs and LagEndMs are the median latency (arrival minus due
	// time, above the least one of the step) of the results of the
	// window's first and last fifth.
	LagStartMs float64 `json:"lag_start_ms"`
	LagEndMs   float64 `json:"lag_end_ms"`
	// Undelivered: tuples the sink's ring dropped before the consumer
	// read them (the consumer fell behind).
	Undelivered int  `json:"undelivered,omitempty"`
	Sustained   bool `json:"sustained"`
	// Confirm marks a step of the confirmation: the rate the search
	// found, run as long as a measured run (WindowS seconds), where the
	// consumer's backlog and the process's heap grow as in the runs at
	// the second rate.
	Confirm bool    `json:"confirm,omitempty"`
	WindowS float64 `json:"window_s,omitempty"`
}

// Thresholds of a sustained step: at least capacityDelivered of the
// offered rate delivered, the latency grown by at most capacityLagGrowth
// of the window, nothing undelivered. (A first version allowed 5 % of
// the window: in its first run a step at 27,560/s grew 100 ms in 3 s and
// passed, and the measured runs at 75 % of the capacity it found then
// had a p99 latency of 0.6-1.1 s: a queue that grows 3 % of the time is
// not sustained.)
const (
	capacityDelivered = 0.97
	capacityLagGrowth = 0.02
)

// JudgeCapacityStep judges one step from the consumer's records: the
// window is from..to (since the run's start), origin the wall time of
// stream time 0 (the least arrival minus stream time), offered the
// results/s the sources produce, undelivered the tuples the consumer
// skipped during the step.
func JudgeCapacityStep(recv []ReconfigRecord, origin, from, to time.Duration, ratePerSource int, offered float64, undelivered int) CapacityStep {
	st := CapacityStep{RatePerSource: ratePerSource, OfferedPerS: offered, Undelivered: undelivered}
	if to <= from {
		return st
	}
	edge := (to - from) / 5
	var n int
	var first, last []float64
	for _, r := range recv {
		if r.At < from || r.At >= to {
			continue
		}
		n++
		lag := float64(r.At-origin-time.Duration(r.STime)) / float64(time.Millisecond)
		switch {
		case r.At < from+edge:
			first = append(first, lag)
		case r.At >= to-edge:
			last = append(last, lag)
		}
	}
	window := (to - from).Seconds()
	st.DeliveredPerS = float64(n) / window
	if len(first) == 0 || len(last) == 0 {
		return st
	}
	st.LagStartMs, st.LagEndMs = median(first), median(last)
	st.Sustained = undelivered == 0 && st.DeliveredPerS >= capacityDelivered*offered &&
		st.LagEndMs-st.LagStartMs <= capacityLagGrowth*window*1000
	return st
}

// NextCapacityRate is the next rate per source the probe tries: up by
// half while every step so far was sustained (hi 0: no failed step yet),
// down by a third while none was (lo 0), then the geometric middle of the
// highest sustained and the lowest failed rate. done is true when the two
// are within 15 % of each other (or the rates run out).
func NextCapacityRate(lo, hi int) (next int, done bool) {
	switch {
	case hi == 0:
		return max(lo+1, lo*3/2), false
	case lo == 0:
		if hi <= 1 {
			return 0, true
		}
		return max(1, hi*2/3), false
	case float64(hi) <= 1.15*float64(lo) || hi-lo <= 1:
		return 0, true
	}
	return int(math.Round(math.Sqrt(float64(lo) * float64(hi)))), false
}
