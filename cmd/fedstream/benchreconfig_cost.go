package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/worker/benchmark"
)

// The steady overhead of version tracking in the org benchmark: the same
// query run with tracking off (submitted at its final definition, no plan)
// and with one completed plan of static or dynamic tracking (submitted at
// the previous definition and updated to the same final one), each
// measured as the process's CPU time per sink result over a window at the
// scenario's paced rate.
//
// The runs go in rounds, one run of each mode per round, the order
// rotating between rounds; a round's three runs follow each other within
// seconds, so a slow phase of the machine or of the process (a leftover
// of the strategies' runs, another program's burst) tends to hit a whole
// round rather than one mode. The overhead is the median over the rounds
// of each round's own ratio (1 - off/tracking), and every run is reported
// with what could explain an outlier: the process's CPU while the org ran
// no query just before it, the garbage collections in its window, the
// tasks of other queries still running, and where the tasks ran.

// orgBenchParts are the parts of the org benchmark --only may name.
var orgBenchParts = []string{"live", "quiescent", "overhead", "reconnect"}

// costModes are the tracking modes a round measures ("" is off).
var costModes = []string{"", fsm.TrackingStatic, fsm.TrackingDynamic}

// costIdle is how long the process's CPU is sampled with no query running
// before each run (CostRun.IdleCPUPct).
const costIdle = 300 * time.Millisecond

// costAttempts bounds the runs of one mode in a round: a run whose
// window was not steady is measured again.
const costAttempts = 3

// costSteadiness is how far a window's wall time may stray from its
// stretch of stream time (a fraction of it) for the run to count as
// steady.
const costSteadiness = 0.05

// costSteadyMin is the least such stray allowed: ten boundary intervals,
// the release rhythm of the benchmark's org, for short windows (tests).
const costSteadyMin = 50 * time.Millisecond

// costNote reports run on prog.
func costNote(prog *benchreport.Progress, run benchmark.CostRun) {
	steady := ""
	if !run.Steady {
		steady = "  NOT STEADY"
	}
	prog.Note("overhead round %d %-7s %6.2f µs/result  %6d results in %5.0f ms  cpu %5.0f ms (idle gc %4.0f ms)  gc %2d  %5.0f B/result  idle org %4.1f%% cpu  other tasks %d  placement %s%s",
		run.Round, run.Mode, run.MicrosPerResult, run.Results, run.WindowMs, run.CPUMs, run.IdleGCMs, run.GCCycles, run.AllocBytesPerResult, run.IdleCPUPct, run.OtherTasks, run.Placement, steady)
}

// orgOverhead measures cfg.ThroughputRuns rounds and fills res's
// overhead figures. prog gets one line per run. profile, when
// not empty, is the prefix of a CPU profile of the first round's window
// of each mode (PREFIX-off.pprof, ...).
func orgOverhead(ctx context.Context, o *reconfigOrg, cfg benchmark.ReconfigConfig, res *benchmark.ReconfigResult, prog *benchreport.Progress, profile string) error {
	byMode := map[string][]float64{}
	var static, dynamic []float64
	// steadyStatic and steadyDynamic are the ratios of the rounds whose
	// three runs were all steady.
	var steadyStatic, steadyDynamic []float64
	for round := range cfg.ThroughputRuns {
		cost := map[string]float64{}
		steady := true
		for k := range costModes {
			// Each round in another order: no mode is always the one
			// measured first, after the previous round's last.
			tracking := costModes[(round+k)%len(costModes)]
			prof := ""
			if profile != "" && round == 0 {
				prof = strings.TrimSuffix(profile, ".pprof") + "-" + costModeName(tracking) + ".pprof"
			}
			var run benchmark.CostRun
			for attempt := range costAttempts {
				var err error
				if run, err = orgCost(ctx, o, cfg, tracking, round, prof); err != nil {
					return err
				}
				run.Order, run.Attempt = k, attempt
				res.OverheadRuns = append(res.OverheadRuns, run)
				costNote(prog, run)
				if run.Steady {
					break
				}
				prof = ""
			}
			steady = steady && run.Steady
			cost[run.Mode] = run.MicrosPerResult
			byMode[run.Mode] = append(byMode[run.Mode], run.MicrosPerResult)
		}
		st, dyn := 1-cost["off"]/cost[fsm.TrackingStatic], 1-cost["off"]/cost[fsm.TrackingDynamic]
		static, dynamic = append(static, st), append(dynamic, dyn)
		if steady {
			steadyStatic, steadyDynamic = append(steadyStatic, st), append(steadyDynamic, dyn)
			res.OverheadSteadyRounds++
		}
	}
	res.OverheadStaticRounds, res.OverheadDynamicRounds = roundTo(static, 4), roundTo(dynamic, 4)
	over := "every round (none had its three runs steady: the figure is noise)"
	if len(steadyStatic) > 0 {
		// A round with a run that was never steady measured the load's
		// changes as much as the tracking.
		static, dynamic = steadyStatic, steadyDynamic
		over = fmt.Sprintf("the %d rounds whose three runs were steady", len(steadyStatic))
	}
	res.OverheadStatic, res.OverheadDynamic = medianOf(static), medianOf(dynamic)
	res.CPUMicrosPerResultOff = medianOf(byMode["off"])
	res.OverheadBasis = fmt.Sprintf("process CPU time (less the GC's idle marking) per result at %d results/s over %v stretches of stream time, the same final query with tracking off (submitted so) and with a completed plan of each tracking; %d rounds of one run per mode, order rotating; median over %s of each round's 1 - off/tracking",
		cfg.Sources*cfg.Rate, cfg.ThroughputWindow, cfg.ThroughputRuns, over)
	prog.Note("overhead per round: static %v, dynamic %v; median over %s: static %.2f%%, dynamic %.2f%%",
		res.OverheadStaticRounds, res.OverheadDynamicRounds, over, 100*res.OverheadStatic, 100*res.OverheadDynamic)
	return nil
}

func costModeName(tracking string) string {
	if tracking == "" {
		return "off"
	}
	return tracking
}

func roundTo(xs []float64, digits int) []float64 {
	p := math.Pow(10, float64(digits))
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = math.Round(x*p) / p
	}
	return out
}

// orgCost runs the scenario paced in the org, with tracking off ("": no
// plan) or with one plan of the given tracking completed first, and
// measures the process's CPU time per sink result over a window after it.
//
// Both run the same operators over the window: the tracking runs are
// submitted at version 1 and updated to version 2, the run without
// tracking is submitted at version 2 (the versions' expressions differ in
// cost: comparing version 1 without tracking with version 2 with it
// measured the expressions as much as the tracking).
func orgCost(ctx context.Context, o *reconfigOrg, cfg benchmark.ReconfigConfig, tracking string, round int, profile string) (benchmark.CostRun, error) {
	mode := costModeName(tracking)
	run := benchmark.CostRun{Mode: mode, Round: round}
	name := fmt.Sprintf("sepsis-cost-%s-%d", mode, round)
	// Long enough never to end inside the window.
	limit := int64((cfg.ThroughputSettle + cfg.ThroughputWindow + 30*time.Second).Seconds() * float64(cfg.Rate))
	first := 2
	if tracking != "" {
		first = 1
	}
	// The org with no query running: what the process burns besides
	// the runs (the coordinator, a leftover of earlier runs).
	c0, t0 := benchmark.ProcessCPU(), time.Now()
	select {
	case <-time.After(costIdle):
	case <-ctx.Done():
		return run, ctx.Err()
	}
	run.IdleCPUPct = round1(100 * float64(benchmark.ProcessCPU()-c0) / float64(time.Since(t0)))
	r, err := o.submit(ctx, name, benchmark.ReconfigQuery(name, cfg.Sources, cfg.Rate, limit, first))
	if err != nil {
		return run, err
	}
	defer r.end()
	if err := r.waitFor(ctx, "the first result", 30*time.Second, func() bool { return len(r.recv) > 0 }); err != nil {
		return run, err
	}
	if tracking != "" {
		e, err := r.update(ctx, benchmark.ReconfigQuery(name, cfg.Sources, cfg.Rate, limit, 2), fsm.StrategyLive, tracking, orgMargin)
		if err != nil {
			return run, err
		}
		if err := r.complete(ctx, e); err != nil {
			return run, err
		}
	}
	select {
	case <-time.After(cfg.ThroughputSettle):
	case <-ctx.Done():
		return run, ctx.Err()
	}
	run.Placement, run.OtherTasks = o.placement(name)
	// Garbage the earlier runs left is not this run's cost.
	runtime.GC()
	if profile != "" {
		if f, err := os.Create(profile); err == nil {
			// 1 kHz rather than 100 Hz: a window's few thousand
			// samples resolve a cost of a percent.
			runtime.SetCPUProfileRate(1000)
			if err := pprof.StartCPUProfile(f); err == nil {
				defer pprof.StopCPUProfile()
			}
			defer f.Close()
		}
	}
	// The window spans a stretch of stream time at the sink: from the
	// first result at or above from to the first at or above to; its
	// results are those of the stretch (the paced sources make as many
	// in every run) and the CPU is that of the time the org took to
	// deliver them. A window of wall time instead counted the results
	// that happened to arrive in it, more or fewer than were processed
	// in it as the pipeline's lag at its two ends differed (36,980 to
	// 48,970 for 45,000 in a run under load).
	r.mu.Lock()
	from := r.recv[len(r.recv)-1].STime + int64(costLead)
	r.mu.Unlock()
	to := from + int64(cfg.ThroughputWindow)
	start, end := r.addMark(from), r.addMark(to)
	wait := func(m *stimeMark) error {
		select {
		case <-m.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cfg.ThroughputWindow + 30*time.Second):
			return fmt.Errorf("%w: %s: no result at stream time %v", errOrgBench, name, time.Duration(m.at))
		}
	}
	if err := wait(start); err != nil {
		return run, err
	}
	if err := wait(end); err != nil {
		return run, err
	}
	if profile != "" {
		pprof.StopCPUProfile()
	}
	r.mu.Lock()
	n := 0
	for _, rc := range r.recv {
		if rc.STime >= from && rc.STime < to {
			n++
		}
	}
	r.mu.Unlock()
	cpu := end.cpu - start.cpu
	idleGC := end.idleGC - start.idleGC
	if n <= 0 || cpu <= 0 {
		return run, fmt.Errorf("%w: %s: %d results, %v CPU in the window", errOrgBench, name, n, cpu)
	}
	run.Results, run.WindowMs = n, round1(float64(end.when.Sub(start.when))/1e6)
	run.CPUMs, run.IdleGCMs = round1(float64(cpu)/1e6), round1(float64(idleGC)/1e6)
	run.MicrosPerResult = math.Round(float64(cpu-idleGC)/float64(n)) / 1e3
	// The stretch arrived at the pace it was produced: the pipeline's
	// lag was about the same at both ends, so the CPU of the window is
	// that of processing the stretch. Otherwise (the process starved,
	// then catching up) the window holds work of other stretches, and
	// batches grow with the backlog, which makes each result cheaper.
	run.Steady = (end.when.Sub(start.when) - cfg.ThroughputWindow).Abs() <= max(costSteadyMin, time.Duration(costSteadiness*float64(cfg.ThroughputWindow)))
	run.GCCycles = int(end.gcCycles - start.gcCycles)
	run.AllocBytesPerResult = math.Round(float64(end.allocBytes-start.allocBytes) / float64(n))
	return run, nil
}

// costLead is how far past the newest result's stream time at the sink
// an overhead window starts: past what is in flight.
const costLead = 200 * time.Millisecond

// stimeMark is a moment of a run: when the first result at or above
// stream time at reached the benchmark's consumer, and the process's
// counters then.
type stimeMark struct {
	at       int64
	done     chan struct{}
	when     time.Time
	cpu      time.Duration
	idleGC   time.Duration
	gcCycles uint64
	// allocBytes is the bytes the process allocated in total.
	allocBytes uint64
}

// addMark adds a mark at stream time at.
func (r *orgRun) addMark(at int64) *stimeMark {
	m := &stimeMark{at: at, done: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.marks = append(r.marks, m)
	return m
}

// fireMarks (under r.mu) fires the marks at or below stime, the newest
// result's.
func (r *orgRun) fireMarks(stime int64) {
	keep := r.marks[:0]
	for _, m := range r.marks {
		if stime < m.at {
			keep = append(keep, m)
			continue
		}
		ms := []metrics.Sample{{Name: "/cpu/classes/gc/mark/idle:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:bytes"}}
		metrics.Read(ms)
		m.when, m.cpu = time.Now(), benchmark.ProcessCPU()
		m.idleGC = time.Duration(ms[0].Value.Float64() * 1e9)
		m.gcCycles, m.allocBytes = ms[1].Value.Uint64(), ms[2].Value.Uint64()
		close(m.done)
	}
	clear(r.marks[len(keep):])
	r.marks = keep
}

func round1(x float64) float64 { return math.Round(x*10) / 10 }

// placement says where query's tasks run, per fragment the worker of
// each task in task id order ("flag:2 ward:0120120120"), and how many
// tasks of other queries run meanwhile.
func (o *reconfigOrg) placement(query string) (string, int) {
	type at struct{ id, worker string }
	byFrag := map[string][]at{}
	other := 0
	for i, w := range o.fed.workers {
		for _, st := range w.Runtime().States() {
			rest, ok := strings.CutPrefix(st.TaskID, query+"/")
			if !ok {
				other++
				continue
			}
			frag, _, _ := strings.Cut(rest, "/")
			byFrag[frag] = append(byFrag[frag], at{rest, fmt.Sprint(i)})
		}
	}
	frags := make([]string, 0, len(byFrag))
	for k := range byFrag {
		frags = append(frags, k)
	}
	slices.Sort(frags)
	var b strings.Builder
	for _, f := range frags {
		ts := byFrag[f]
		slices.SortFunc(ts, func(a, b at) int { return strings.Compare(a.id, b.id) })
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f + ":")
		for _, t := range ts {
			b.WriteString(t.worker)
		}
	}
	return b.String(), other
}
