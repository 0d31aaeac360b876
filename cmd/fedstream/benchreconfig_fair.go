package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fedstream/fedstream/worker/benchmark"
)

// The steady condition of a strategy's query before its updates, and
// where an update's time goes: what makes the live and quiescent figures
// comparable (a quiescent update drains what is in flight, so its query
// must carry no more lag than the live one's).

// paceSpread is the spread of the pacing anchors of query's generator
// partitions (TaskStats.PaceOrigin) on the org's workers; ok is false
// when none reported one.
func (o *reconfigOrg) paceSpread(query string) (spread time.Duration, ok bool) {
	var lo, hi time.Time
	for _, w := range o.fed.workers {
		for _, st := range w.Runtime().Stats() {
			if !strings.HasPrefix(st.TaskID, query+"/") || st.PaceOrigin.IsZero() {
				continue
			}
			if !ok || st.PaceOrigin.Before(lo) {
				lo = st.PaceOrigin
			}
			if !ok || st.PaceOrigin.After(hi) {
				hi = st.PaceOrigin
			}
			ok = true
		}
	}
	return hi.Sub(lo), ok
}

// paceOrigin is query's pacing origin in the coordinator's state (zero
// if it has none).
func (o *reconfigOrg) paceOrigin(query string) time.Time {
	q, err := o.fed.coords[0].State().Query(nil, query)
	if err != nil || q == nil || q.PaceOrigin == 0 {
		return time.Time{}
	}
	return time.Unix(0, q.PaceOrigin)
}

// lagBefore is the median and p99 (ms) of the pipeline's lag over the
// results arriving between from and to (since start): each result's
// arrival after the wall-clock time its stream time was due (origin +
// stime; the generators pace record n at origin + n/rate, so this is
// within one record's interval of when its source emitted it, unless
// the source itself was behind).
func lagBefore(recv []benchmark.ReconfigRecord, start, origin time.Time, from, to time.Duration) (p50, p99 float64, ok bool) {
	if origin.IsZero() {
		return 0, 0, false
	}
	base := start.Sub(origin) // arrival since the origin = base + At
	var lags []float64
	for _, rc := range recv {
		if rc.At < from || rc.At >= to {
			continue
		}
		lags = append(lags, float64(base+rc.At-time.Duration(rc.STime))/float64(time.Millisecond))
	}
	if len(lags) == 0 {
		return 0, 0, false
	}
	slices.Sort(lags)
	q := func(f float64) float64 {
		return math.Round(lags[min(len(lags)-1, int(f*float64(len(lags))))]*1000) / 1000
	}
	return q(0.5), q(0.99), true
}

// caughtUpLag and caughtUpMax: a strategy's warm-up begins once the
// newest result's lag is below caughtUpLag, or after caughtUpMax.
const (
	caughtUpLag = 50 * time.Millisecond
	caughtUpMax = 3 * time.Second
)

// awaitCaughtUp waits until the query's stream has caught up with its
// pacing origin (the newest result's lag below caughtUpLag), at most
// caughtUpMax. The sources pace from the query's origin, fixed at its
// submission: tasks placed late (the second strategy's query was seen to
// start 1.5 s after its submission, under load) draw that much of their
// streams at once, and a strategy's updates must not begin while the
// pipeline still works through it (a quiescent update drains what is in
// flight). Without an origin it returns at once.
func (r *orgRun) awaitCaughtUp(ctx context.Context, origin time.Time) {
	if origin.IsZero() {
		return
	}
	base := r.start.Sub(origin)
	_ = r.waitFor(ctx, "the stream caught up", caughtUpMax, func() bool {
		if len(r.recv) == 0 {
			return false
		}
		last := r.recv[len(r.recv)-1]
		return base+last.At-time.Duration(last.STime) < caughtUpLag
	})
}

// breakdownOf is the medians of an org run's per-update phases.
func breakdownOf(res *benchmark.StrategyResult) *benchmark.UpdateBreakdown {
	if len(res.SwitchedMs) == 0 {
		return nil
	}
	med := func(xs []float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		return medianOf(xs)
	}
	diffs := func(to, from []float64) []float64 {
		if len(to) != len(from) {
			return nil
		}
		var d []float64
		for i := range to {
			d = append(d, math.Round((to[i]-from[i])*1000)/1000)
		}
		return d
	}
	return &benchmark.UpdateBreakdown{WatchWokeMs: med(res.WatchWokeMs), WatchBuiltMs: med(res.WatchBuiltMs), ReceivedMs: med(res.ReceivedMs), LearnedMs: med(res.LearnedMs), ReportedMs: med(res.ReportedMs), InstalledMs: med(res.InstalledMs), RequestMs: med(res.RequestMs),
		AcksReceivedMs: med(res.AcksReceivedMs), SwitchedMs: med(res.SwitchedMs),
		RaftWriteMs:  med(diffs(res.SwitchedMs, res.AcksReceivedMs)),
		RaftWaitMs:   med(diffs(res.AckWriteMs, res.AcksReceivedMs)),
		RaftCommitMs: med(diffs(res.SwitchedMs, res.AckWriteMs))}
}

// medianFsync is the median of n 4-KiB writes, each followed by an fsync,
// to a file in dir: the disk's floor under a Raft write.
func medianFsync(dir string, n int) (time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsync-*")
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close(); _ = os.Remove(f.Name()) }()
	buf := make([]byte, 4096)
	took := make([]time.Duration, 0, n)
	for i := range n {
		buf[0] = byte(i)
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil { // appended, as a log entry is
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("fsync in %s: %w", filepath.Base(dir), err)
		}
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}
