package benchmark

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/worker/runtime"
)

// OverheadDCAASide is bench dcaa's replication overhead measured side by
// side (see dcaaBench.overheadSide): records per CPU-second of k = 2
// (DCAA) against k = 1, both running at once at saturation, window by
// window. The default where the workers are processes of their own.
const OverheadDCAASide = "side_by_side_cpu_per_record"

// Defaults of the side-by-side replication overhead (DCAAConfig).
var (
	// Two-second windows: the eight processes of a sample answer within
	// tens of milliseconds of each other under load, and that skew is
	// the noise of a window's ratio; for the same measuring time a
	// longer window narrows the interval (noise / window, over the
	// square root of the windows).
	DefaultDCAASideWindow  = 2 * time.Second
	DefaultDCAASideWindows = 4
)

const (
	// dcaaSideSettle is how long both sides run in a round before the
	// first window: the tasks start, connect and fill their buffers,
	// and what the DCAA machine keeps grows from empty.
	dcaaSideSettle = time.Second
	// dcaaSideRate is each source partition's records per second of
	// stream time in the side-by-side and paired rounds. The side-by-side
	// rounds pace their sources at it (the paired rounds draw them 20
	// times faster): on an idle machine a copy's sources then drew
	// exactly 300 000 records a second, into output buffers the
	// operators emptied far more slowly, so a side was not saturated (see
	// sourceTasks). Not 0 (as fast as possible, stream
	// time 1 µs per record): a boundary interval of stream time is then
	// 50 000 records per partition, and boundaries, the heartbeats of a
	// DCAA input, would come seconds of work apart under load; at this
	// rate 5 000.
	dcaaSideRate = 100_000
	// dcaaSideRecords is each source partition's input in a side-by-side
	// round: more than any round gets through, so that neither side ends
	// inside the windows; the round stops the queries.
	dcaaSideRecords = 50_000_000
	// minSideCPUUse: below this CPU use per copy (half a CPU on an idle
	// two-CPU machine) the side-by-side note says the machine was busy.
	minSideCPUUse = 0.25
)

// DCAASideWindow is one window of the side-by-side overhead: what each
// side (k = 1: two one-replica copies; k = 2: the query with two
// replicas) did in the same interval of wall time.
type DCAASideWindow struct {
	Round int `json:"round"`
	// K2Set is the set of worker processes k = 2 ran on this round (0 or
	// 1; k = 1 ran on the other): the sets swap every round.
	K2Set int     `json:"k2_set"`
	Ms    float64 `json:"ms"`
	// Records per CPU-second of the side's four worker processes,
	// counting every record each copy took in (two copies a side).
	K1RecordsPerCPUSec float64 `json:"k1_records_per_cpu_s"`
	K2RecordsPerCPUSec float64 `json:"k2_records_per_cpu_s"`
	// Records per second per copy, and CPU-seconds per second per copy:
	// what the scheduler gave each side while they shared the CPUs.
	K1RecordsPerSec float64 `json:"k1_records_per_s"`
	K2RecordsPerSec float64 `json:"k2_records_per_s"`
	K1CPUUse        float64 `json:"k1_cpu_use"`
	K2CPUUse        float64 `json:"k2_cpu_use"`
	// K1GC and K2GC are the garbage collections of each side's processes
	// in the window.
	K1GC int `json:"k1_gc"`
	K2GC int `json:"k2_gc"`
	// K2Unstable counts k = 2's tasks that were not STABLE (a DCAA
	// input took the saturation's backpressure or a starved upstream
	// for a failure) at the window's end: their tentative releases and
	// corrections are part of what the window's k = 2 records cost.
	K2Unstable int `json:"k2_unstable,omitempty"`
	// Overhead is 1 − K2RecordsPerCPUSec / K1RecordsPerCPUSec.
	Overhead float64 `json:"overhead"`
}

// sideSample is one reading of a side's four worker processes: their
// CPU time and garbage collections, and the records the side's first
// operator tasks took in.
type sideSample struct {
	cpu, gc, records int64
	// unstable: the side's tasks not STABLE (or tentative) at the reading.
	unstable int
}

// overheadSide measures the replication overhead side by side: k = 1
// (two independent one-replica copies of the query, as in the sequential
// method) and k = 2 (the query with two replicas, DCAA with X) run at the
// same time at saturation (sources as fast as they can), each side on
// four worker processes of its own placed as dcaaSaturationWhere says,
// both sides sharing the machine's CPUs. In each window of wall time
// every process's CPU time (getrusage) and each copy's records taken in
// (drawn by its sources, see sourceTasks) are read, and the window's
// overhead is
//
//	1 − (records per CPU-second of k = 2) / (records per CPU-second of k = 1).
//
// At saturation every process is CPU-bound, so records per CPU-second is
// the throughput a side reaches per CPU it is given: the same quantity
// as 1 − throughput(k = 2) / throughput(k = 1) on equal CPUs, without
// depending on which side the scheduler or another program favoured in
// that window. A burst of other work, a slow phase of the machine, hits
// both sides in the same window and cancels in its ratio; run one after
// the other (the sequential method) the pairs' k = 1 and k = 2 ran tens
// of seconds apart on a machine whose CPU per record drifted by a factor
// of up to 4 between them under load. The sets of processes swap sides
// every round and the order the sides start in rotates, so a set or a
// start order that is faster weighs on both. The figure is the mean over
// the windows with a 95 % confidence interval (Student's t), and the
// median and per-round means beside it.
//
// What this leaves out, said in OverheadNote: time a side waits without
// using its CPU (the other side takes the CPU then) is not counted
// against it; the windows' records per second per copy (K1/K2RecordsPerSec)
// and CPU use show whether a side idled.
func (b *dcaaBench) overheadSide(ctx context.Context, res *DCAAResult) error {
	res.OverheadMethod = OverheadDCAASide
	var other [dcaaProcesses]*workerClient
	defer b.stopSet(&other)
	if err := b.launchSet(ctx, &other, "bench-dcaa-side-worker-", 1); err != nil {
		return err
	}
	sets := [2][dcaaProcesses]*workerClient{b.w, other}
	var (
		ws    []DCAASideWindow
		stall int
	)
	for round := range b.cfg.SaturationRounds {
		rw, merged, err := b.sideRound(ctx, sets, round)
		if err != nil {
			return err
		}
		stall += merged
		var ov []float64
		for _, w := range rw {
			ov = append(ov, w.Overhead)
		}
		mean, _ := MeanCI95(ov)
		res.OverheadRoundMeans = append(res.OverheadRoundMeans, round4(mean))
		b.cfg.Progress.Step("overhead side by side", round+1, b.cfg.SaturationRounds, fmt.Sprintf(
			"k=2 on set %d: %d windows, mean overhead %.1f%% (%s)", round%2, len(rw), 100*mean, sideRoundSummary(rw)))
		ws = append(ws, rw...)
	}
	res.OverheadWindows = ws
	var fs []sideFigures
	for _, w := range ws {
		fs = append(fs, sideFigures{overhead: w.Overhead, perCPU: [2]float64{w.K1RecordsPerCPUSec, w.K2RecordsPerCPUSec},
			perSec: [2]float64{w.K1RecordsPerSec, w.K2RecordsPerSec}, cpuUse: [2]float64{w.K1CPUUse, w.K2CPUUse}})
	}
	res.setSideFigures(fs)
	res.OverheadNote = fmt.Sprintf("side by side: k=1 (two one-replica copies) and k=2 (DCAA, X %v) at once at saturation on four worker processes each, unpinned, sharing the CPUs; records per CPU-second of each side's processes in the same %v windows (%v of settling per round left out), overhead = 1 - k2's / k1's per window; mean over %d windows of %d rounds (the sides' process sets swapped every round) with a 95%% confidence interval (t over the windows); time a side waited without its CPU is not counted against it: compare the records per second per copy (k1 %s, k2 %s) and CPU use per copy (%.2f, %.2f)",
		b.cfg.X, b.cfg.SideWindow, dcaaSideSettle, len(ws), b.cfg.SaturationRounds,
		fmtRate(res.K1RecordsPerSec), fmtRate(res.K2RecordsPerSec), res.K1CPUUse, res.K2CPUUse)
	res.noteBusySides()
	if stall > 0 {
		res.OverheadNote += fmt.Sprintf("; %d windows in which a side took in no record were merged into the next", stall)
	}
	return nil
}

// sideRound runs one side-by-side round: k = 2 on sets[round%2], k = 1
// on the other set, and returns its windows and how many windows were
// merged into the next because a side took in no record in them.
func (b *dcaaBench) sideRound(ctx context.Context, sets [2][dcaaProcesses]*workerClient, round int) ([]DCAASideWindow, int, error) {
	k2set := round % 2
	sides, err := b.sideSpecs(sets, k2set, dcaaSideRecords)
	if err != nil {
		return nil, 0, err
	}
	// Start order: k = 1 first in rounds 0, 1, 4, 5, ...; k = 2 first in
	// the others, so each set starts first with each k.
	order := []int{0, 1}
	if (round/2)%2 == 1 {
		order = []int{1, 0}
	}
	stop := func() {
		for _, s := range sides {
			for _, w := range s.w {
				if _, err := w.call(context.WithoutCancel(ctx), request{Op: opApply}); err != nil {
					b.cfg.Logger.Warn("bench dcaa: side-by-side stop", "worker", w.name, "err", err)
				}
			}
		}
	}
	defer stop()
	for _, s := range order {
		for _, i := range []int{measured, peer, srcR1, srcR0} {
			if _, err := sides[s].w[i].call(ctx, request{Op: opApply, Tasks: sides[s].specs[i]}); err != nil {
				return nil, 0, err
			}
		}
	}
	if err := sleepCtx(ctx, dcaaSideSettle); err != nil {
		return nil, 0, err
	}
	// All eight at once: the readings of one sample lie within a
	// millisecond or so of each other on an idle machine.
	sample := func() ([2]sideSample, error) {
		var out [2]sideSample
		rs, err := callSides(ctx, &sides, func(int, int) request { return request{Op: opTaskStats} })
		if err != nil {
			return out, err
		}
		for s := range sides {
			for _, r := range rs[s] {
				out[s].cpu += r.CPUNanos
				out[s].gc += int64(r.GCCycles)
				out[s].unstable += r.Unstable
				for id, n := range r.TaskIn {
					if sides[s].sources[id] {
						out[s].records += int64(n)
					}
				}
			}
		}
		return out, nil
	}
	prev, err := sample()
	if err != nil {
		return nil, 0, err
	}
	start, from := time.Now(), time.Now()
	var (
		ws     []DCAASideWindow
		merged int
	)
	for k := range b.cfg.SideWindows {
		// Window ends on the round's clock: a late wake-up does not
		// shift the later windows.
		if err := sleepCtx(ctx, time.Until(start.Add(time.Duration(k+1)*b.cfg.SideWindow))); err != nil {
			return nil, 0, err
		}
		cur, err := sample()
		if err != nil {
			return nil, 0, err
		}
		now := time.Now()
		w, ok := sideWindow(prev, cur, now.Sub(from))
		if !ok {
			// A side took in nothing (starved, or waiting): its CPU and
			// records go into the next window, so that the ratio is
			// taken over an interval in which both sides worked.
			merged++
			continue
		}
		w.Round, w.K2Set = round, k2set
		ws = append(ws, w)
		prev, from = cur, now
	}
	return ws, merged, nil
}

// sideFigures are one window's or round's figures of the two sides
// ([0] k = 1, [1] k = 2) of a side-by-side or paired overhead.
type sideFigures struct {
	overhead               float64
	perCPU, perSec, cpuUse [2]float64
}

// setSideFigures sets the replication overhead from the windows' or
// rounds' figures: their mean with its 95 % interval (-1: fewer than
// two) and median, and the medians of each side's records per
// CPU-second, records per second and CPU use per copy.
func (res *DCAAResult) setSideFigures(fs []sideFigures) {
	var ov []float64
	var perCPU, perSec, use [2][]float64
	for _, f := range fs {
		ov = append(ov, f.overhead)
		for s := range 2 {
			perCPU[s] = append(perCPU[s], f.perCPU[s])
			perSec[s] = append(perSec[s], f.perSec[s])
			use[s] = append(use[s], f.cpuUse[s])
		}
	}
	mean, ci := MeanCI95(ov)
	res.ReplicationOverhead, res.ReplicationOverheadCI95 = round4(mean), round4(ci)
	if len(ov) < 2 {
		res.ReplicationOverheadCI95 = -1
	}
	res.ReplicationOverheadMedian = round4(median(ov))
	res.CPUOverhead = res.ReplicationOverhead
	res.K1RecordsPerCPUSec, res.K2RecordsPerCPUSec = math.Round(median(perCPU[0])), math.Round(median(perCPU[1]))
	res.K1RecordsPerSec, res.K2RecordsPerSec = math.Round(median(perSec[0])), math.Round(median(perSec[1]))
	res.K1CPUUse, res.K2CPUUse = math.Round(median(use[0])*100)/100, math.Round(median(use[1])*100)/100
}

// noteBusySides adds to the overhead's note that the sides got too little
// CPU for the figure to say much, when they did (minSideCPUUse).
func (res *DCAAResult) noteBusySides() {
	if min(res.K1CPUUse, res.K2CPUUse) < minSideCPUUse {
		res.OverheadNote += fmt.Sprintf("; the sides got little CPU (%.2f and %.2f per copy, %.2f on an idle two-CPU machine): other work on the machine; at such throughput the costs every process pays per second (timers, heartbeats, acks) weigh on each record and the figure says little",
			res.K1CPUUse, res.K2CPUUse, 1.0/saturationCopies)
	}
}

// callSides sends a request (req(side, process)) to every process of both
// sides at once and returns their responses, [side][process].
func callSides(ctx context.Context, sides *[2]dcaaSide, req func(s, i int) request) ([2][dcaaProcesses]response, error) {
	var (
		out  [2][dcaaProcesses]response
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for s := range sides {
		for i, w := range sides[s].w {
			wg.Go(func() {
				resp, err := w.call(ctx, req(s, i))
				mu.Lock()
				defer mu.Unlock()
				out[s][i] = resp
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", w.name, err))
				}
			})
		}
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// launchSet starts a set of worker processes named prefix0..3 into set,
// their sources running speedup times faster than their rate (0 or 1:
// at it). The caller stops them (stopSet), also after an error.
func (b *dcaaBench) launchSet(ctx context.Context, set *[dcaaProcesses]*workerClient, prefix string, speedup int) error {
	for i := range set {
		name := fmt.Sprintf("%s%d", prefix, i)
		p, err := b.cfg.Launch(ctx, name)
		if err != nil {
			return err
		}
		set[i] = newWorkerClient(name, p)
		resp, err := set[i].call(ctx, request{Op: opHello, SourceSpeedup: speedup, BoundaryInterval: b.cfg.Boundary})
		if err != nil {
			return err
		}
		set[i].addr = resp.Addr
	}
	return nil
}

// stopSet stops the processes launchSet started.
func (b *dcaaBench) stopSet(set *[dcaaProcesses]*workerClient) {
	for _, w := range set {
		if w == nil {
			continue
		}
		if err := w.proc.Stop(); err != nil {
			b.cfg.Logger.Warn("bench worker stop", "worker", w.name, "err", err)
		}
	}
}

// dcaaSide is one side of a side-by-side overhead round: its worker
// processes (placed as dcaaSaturationWhere says), each one's tasks, the
// task ids of its sources (sourceTasks) and of its sinks (one per copy or
// replica, on the measured and the peer process).
type dcaaSide struct {
	w       [dcaaProcesses]*workerClient
	specs   [dcaaProcesses][]runtime.TaskSpec
	sources map[string]bool
	sinks   []string
}

// sideSpecs builds a round's two sides, [0] k = 1 (two one-replica copies
// of the query) and [1] k = 2 (the query with two replicas, DCAA with X),
// k = 2 on sets[k2set] and k = 1 on the other set, each source partition
// drawing records records at dcaaSideRate.
func (b *dcaaBench) sideSpecs(sets [2][dcaaProcesses]*workerClient, k2set int, records int64) ([2]dcaaSide, error) {
	var sides [2]dcaaSide
	sides[0].w, sides[1].w = sets[1-k2set], sets[k2set]
	for s := range sides {
		sides[s].sources = map[string]bool{}
		addrs := make([]string, dcaaProcesses)
		for i, w := range sides[s].w {
			addrs[i] = w.addr
		}
		add := func(replicas int, where func(n *queryspec.Node, partition, replica int) int) error {
			q, err := dcaaQuery(b.nextName("dcaaside"), replicas, b.cfg.X.String(), dcaaSideRate, records)
			if err != nil {
				return err
			}
			specs, err := specsFor(q, where, addrs)
			if err != nil {
				return err
			}
			for i := range specs {
				sides[s].specs[i] = append(sides[s].specs[i], specs[i]...)
			}
			ids, err := sourceTasks(q)
			for _, id := range ids {
				sides[s].sources[id] = true
			}
			if replicas == 2 {
				sides[s].sinks = append(sides[s].sinks, queryspec.TaskID(q.Name, "alerts", 0, 0), queryspec.TaskID(q.Name, "alerts", 0, 1))
			} else {
				sides[s].sinks = append(sides[s].sinks, queryspec.TaskID(q.Name, "alerts", 0, 0))
			}
			return err
		}
		if s == 1 {
			if err := add(2, dcaaSaturationWhere); err != nil {
				return sides, err
			}
			continue
		}
		for c := range saturationCopies {
			if err := add(1, func(n *queryspec.Node, p, _ int) int { return dcaaSaturationWhere(n, p, c) }); err != nil {
				return sides, err
			}
		}
	}
	return sides, nil
}

// sideWindow is the window between two samples of both sides (index 0:
// k = 1, 1: k = 2) d apart; false when a side took in no record or used
// no CPU in it.
func sideWindow(prev, cur [2]sideSample, d time.Duration) (DCAASideWindow, bool) {
	var (
		w       DCAASideWindow
		perCPU  [2]float64
		perSec  [2]float64
		cpuUse  [2]float64
		gc      [2]int
		secs    = d.Seconds()
		copies  = float64(saturationCopies)
		present = secs > 0
	)
	for s := range 2 {
		records, cpu := cur[s].records-prev[s].records, time.Duration(cur[s].cpu-prev[s].cpu)
		if records <= 0 || cpu <= 0 {
			present = false
			continue
		}
		perCPU[s] = float64(records) / cpu.Seconds()
		perSec[s] = float64(records) / copies / secs
		cpuUse[s] = cpu.Seconds() / copies / secs
		gc[s] = int(cur[s].gc - prev[s].gc)
	}
	if !present {
		return w, false
	}
	w.Ms = math.Round(secs*1e4) / 10
	w.K1RecordsPerCPUSec, w.K2RecordsPerCPUSec = math.Round(perCPU[0]), math.Round(perCPU[1])
	w.K1RecordsPerSec, w.K2RecordsPerSec = math.Round(perSec[0]), math.Round(perSec[1])
	w.K1CPUUse, w.K2CPUUse = math.Round(cpuUse[0]*1000)/1000, math.Round(cpuUse[1]*1000)/1000
	w.K1GC, w.K2GC = gc[0], gc[1]
	w.K2Unstable = cur[1].unstable
	w.Overhead = round4(1 - perCPU[1]/perCPU[0])
	return w, true
}

// sourceTasks is the task ids of q's sources, every partition and
// replica: the records they drew are the records the copies of the query
// took in, eventually. They are counted as drawn (each flush publishes
// the count), so a window sees them at a batch's granularity; the
// operators count their input per release, and a release can take a
// whole output buffer of backlog, which left most windows without a
// count. But the sources run ahead of the operators by up to their output
// buffers, two of 256 Ki tuples per source partition (one per partition
// of the aggregate), about 3 million records a side: in session 16 (load
// 32) each side's sources took about 10 s to fill them, drawing 3.4-4.5
// million records while the aggregates took in 0.45 million, and only
// then were they held to what the operators took. A round's first
// windows therefore count mostly the sources' own work, and its later
// ones the pipeline's: the windows' records per CPU-second fell from
// about 620 000 to under 200 000 on both sides in every round of the
// quiet runs. The paired method (dcaa_paired.go) runs a fixed input to
// its end instead.
func sourceTasks(q *queryspec.Query) ([]string, error) {
	plan, err := q.FusedPlan()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, n := range plan.Nodes {
		if n.Kind != queryspec.KindSource {
			continue
		}
		for p := range max(1, n.Partitions) {
			for r := range max(1, q.Replicas) {
				ids = append(ids, queryspec.TaskID(q.Name, n.Name, p, r))
			}
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: query %s has no source", ErrDCAABench, q.Name)
	}
	return ids, nil
}

// sideRoundSummary is a round's median figures for the progress line.
func sideRoundSummary(ws []DCAASideWindow) string {
	var k1, k2, u1, u2 []float64
	unstable, gc1, gc2 := 0, 0, 0
	for _, w := range ws {
		k1, k2 = append(k1, w.K1RecordsPerCPUSec), append(k2, w.K2RecordsPerCPUSec)
		u1, u2 = append(u1, w.K1CPUUse), append(u2, w.K2CPUUse)
		gc1, gc2 = gc1+w.K1GC, gc2+w.K2GC
		if w.K2Unstable > 0 {
			unstable++
		}
	}
	return fmt.Sprintf("per CPU-second k=1 %s, k=2 %s; CPU use per copy %.2f and %.2f; GC cycles %d and %d; %d windows ended with k=2 tasks not STABLE",
		fmtRate(median(k1)), fmtRate(median(k2)), median(u1), median(u2), gc1, gc2, unstable)
}

func fmtRate(v float64) string { return benchreport.Rate(v, "records") }

// round4 rounds to four decimals (a hundredth of a percent).
func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }
