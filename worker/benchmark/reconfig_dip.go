package benchmark

import (
	"math"
	"slices"
	"sort"
	"time"
)

// The throughput dip at a resolution finer than the 100 ms
// buckets can give.
//
// A sink receives a batch per release step (every boundary interval, 75
// results at 15,000/s every 5 ms), so a plain count of arrivals in a
// window is off by up to a batch at each edge: one release is 5 % of a
// 100 ms bucket and still 0.5 % of a one-second window, coarser than the
// 0.2 % to be shown. WindowDip therefore counts results on the
// interpolated arrival curve (each batch's results spread evenly over the
// time since the previous batch, during which they were produced), which
// leaves only the arrival jitter at the window's two edges, and averages
// over every update of the run, with a 95 % confidence interval from
// their spread. The same statistic one window earlier, where nothing
// changes (the control), gives the run's noise floor: its interval is the
// resolution, the smallest mean dip the run could tell from none.

// ReconfigDip is the throughput around a strategy's updates: per update,
// 1 - (results per second over the window after the update began) /
// (results per second over the window before), and the control, the
// same one window earlier. Means are over the updates (signed: a window
// that caught up a delay counts as negative, so noise averages out
// rather than adding up); CI95 is the half-width of a 95 % confidence
// interval of the mean (Student's t over the updates; -1 with fewer than
// two).
type ReconfigDip struct {
	WindowMs   float64   `json:"window_ms"`
	PerUpdate  []float64 `json:"per_update"`
	Mean       float64   `json:"mean"`
	CI95       float64   `json:"ci95"`
	Control    []float64 `json:"control_per_update"`
	ControlSD  float64   `json:"control_sd"`
	ControlMu  float64   `json:"control_mean"`
	Resolution float64   `json:"resolution"`
	// Upper is Mean + CI95: the largest mean dip the run is compatible
	// with (-1 with fewer than two updates).
	Upper float64 `json:"upper"`
}

// arrivalCurve is the number of results arrived by each time,
// interpolated between the arrivals of batches.
type arrivalCurve struct {
	at  []time.Duration // distinct arrival times, increasing
	cum []float64       // results arrived at or before at[i]
}

func newArrivalCurve(recv []ReconfigRecord) arrivalCurve {
	ts := make([]time.Duration, len(recv))
	for i, r := range recv {
		ts[i] = r.At
	}
	slices.Sort(ts)
	var c arrivalCurve
	for i, t := range ts {
		if n := len(c.at); n > 0 && c.at[n-1] == t {
			c.cum[n-1] = float64(i + 1)
			continue
		}
		c.at = append(c.at, t)
		c.cum = append(c.cum, float64(i+1))
	}
	return c
}

// count is the results arrived by t: at a batch's arrival all of it;
// between two batches, the earlier one and the share of the later one
// that the time elapsed since the earlier one stands for.
func (c arrivalCurve) count(t time.Duration) float64 {
	j := sort.Search(len(c.at), func(i int) bool { return c.at[i] >= t })
	switch {
	case j == len(c.at):
		if j == 0 {
			return 0
		}
		return c.cum[j-1]
	case c.at[j] == t:
		return c.cum[j]
	case j == 0:
		return 0
	}
	f := float64(t-c.at[j-1]) / float64(c.at[j]-c.at[j-1])
	return c.cum[j-1] + (c.cum[j]-c.cum[j-1])*f
}

// rate is results per second over [a, b).
func (c arrivalCurve) rate(a, b time.Duration) float64 {
	return (c.count(b) - c.count(a)) / (b - a).Seconds()
}

// WindowDip computes the dip over windows of length w around each update
// (updates: when each began, since the run's start, as the records' At).
// An update whose windows leave the stream, and a control whose windows
// reach back into the previous update's window after, are left out; nil
// when no update has its windows.
func WindowDip(recv []ReconfigRecord, updates []time.Duration, w time.Duration) *ReconfigDip {
	if len(recv) == 0 || w <= 0 {
		return nil
	}
	c := newArrivalCurve(recv)
	first, last := c.at[0], c.at[len(c.at)-1]
	d := &ReconfigDip{WindowMs: float64(w) / float64(time.Millisecond)}
	prevEnd := first
	for _, u := range updates {
		if u-w >= first && u+w <= last {
			if before := c.rate(u-w, u); before > 0 {
				d.PerUpdate = append(d.PerUpdate, 1-c.rate(u, u+w)/before)
			}
		}
		if u-2*w >= prevEnd && u <= last {
			if before := c.rate(u-2*w, u-w); before > 0 {
				d.Control = append(d.Control, 1-c.rate(u-w, u)/before)
			}
		}
		prevEnd = u + w
	}
	if len(d.PerUpdate) == 0 {
		return nil
	}
	d.Mean, _, d.CI95 = meanCI(d.PerUpdate)
	d.ControlMu, d.ControlSD, d.Resolution = meanCI(d.Control)
	d.Upper = -1
	if d.CI95 >= 0 {
		d.Upper = d.Mean + d.CI95
	}
	return d
}

// meanCI is the mean of xs, their sample standard deviation and the
// half-width of a 95 % confidence interval of the mean (sd and ci -1
// with fewer than two values; all 0 with none).
func meanCI(xs []float64) (mean, sd, ci float64) {
	if len(xs) == 0 {
		return 0, -1, -1
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, -1, -1
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	sd = math.Sqrt(ss / float64(len(xs)-1))
	return mean, sd, t975(len(xs)-1) * sd / math.Sqrt(float64(len(xs)))
}

// MeanCI95 is meanCI for other packages: the mean of xs and the
// half-width of its 95 % confidence interval (-1 with fewer than two).
func MeanCI95(xs []float64) (mean, ci float64) {
	mean, _, ci = meanCI(xs)
	return mean, ci
}

// t975 is the 97.5 % quantile of Student's t distribution with df
// degrees of freedom (two-sided 95 %).
func t975(df int) float64 {
	table := [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	switch {
	case df < 1:
		return math.Inf(1)
	case df <= len(table):
		return table[df-1]
	case df <= 60:
		return 2.000
	case df <= 120:
		return 1.980
	}
	return 1.960
}
