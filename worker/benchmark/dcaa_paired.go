package benchmark

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// OverheadDCAAPaired is bench dcaa's replication overhead measured in
// paired rounds of a fixed input (see dcaaBench.overheadPaired): the
// default where the workers are processes of their own.
const OverheadDCAAPaired = "paired_rounds_cpu_per_record"

// Defaults of the paired overhead rounds (DCAAConfig).
const (
	// DefaultDCAAPairedRounds is how many measured rounds the paired
	// method runs (after the warm-up rounds it leaves out): about 3 s
	// each on an idle two-CPU machine.
	DefaultDCAAPairedRounds = 12
	// dcaaPairedWarmUp is how many rounds the paired method runs first
	// and leaves out: two with each side on each process set. A fresh
	// process set takes about two rounds of each kind to settle (heap
	// growth): on a quiet machine (session 16) with one warm-up round the
	// first counted round gave -29 % and -36 % against 4-9 % for the
	// rest, with two +31 % and +36 %, pulling the mean of 12 rounds 3-4
	// points off either way; with four the rounds ran 4-16 % and the
	// interval shrank from +-7-9 to +-2.5 points.
	dcaaPairedWarmUp = 4
	// dcaaPairedSpeedup makes the paired rounds' sources run flat out:
	// their stimes stay those of dcaaSideRate (boundaries, the DCAA
	// heartbeats, 5 000 records apart), but they are due this many times
	// faster than that (2 million records per second and partition),
	// far above what a copy gets through, so every round is at
	// saturation from its first record to its last. (At dcaaSideRate
	// itself the sources' pacing bound: on an idle machine a copy took in
	// exactly its 300 000 records a second.)
	dcaaPairedSpeedup = 20
	// dcaaPairedTimeout bounds one paired round.
	dcaaPairedTimeout = 3 * time.Minute
)

// DCAAPairedRound is one round of the paired overhead: both sides ran
// the same fixed input to its end at the same time.
type DCAAPairedRound struct {
	Round int `json:"round"`
	// K2Set is the set of worker processes k = 2 ran on (0 or 1; k = 1
	// ran on the other): the sets swap every round.
	K2Set int `json:"k2_set"`
	// K1CPUMs and K2CPUMs are the CPU time (getrusage, user and system)
	// each side's four worker processes used over the round; K1Ms and
	// K2Ms the wall time from the round's start to the side's last sink
	// seeing the end of the input.
	K1CPUMs float64 `json:"k1_cpu_ms"`
	K2CPUMs float64 `json:"k2_cpu_ms"`
	K1Ms    float64 `json:"k1_ms"`
	K2Ms    float64 `json:"k2_ms"`
	// Records per CPU-second of each side (every record each copy or
	// replica took in: both sides take in the same number), and CPU use
	// per copy (CPU-seconds per second of the side's wall time).
	K1RecordsPerCPUSec float64 `json:"k1_records_per_cpu_s"`
	K2RecordsPerCPUSec float64 `json:"k2_records_per_cpu_s"`
	K1CPUUse           float64 `json:"k1_cpu_use"`
	K2CPUUse           float64 `json:"k2_cpu_use"`
	// K1GC and K2GC are the garbage collections of each side's processes
	// in the round (each round starts from a collected heap).
	K1GC int `json:"k1_gc"`
	K2GC int `json:"k2_gc"`
	// K2Tentative and K2Undos are the tentative results and UNDOs k = 2's
	// sinks emitted: a DCAA input that saw a starved upstream as failed
	// (see DCAAResult.SaturationTentative); their corrections are in the
	// round's CPU.
	K2Tentative int `json:"k2_tentative"`
	K2Undos     int `json:"k2_undos"`
	// Overhead is 1 − K2RecordsPerCPUSec / K1RecordsPerCPUSec, that is
	// 1 − K1CPUMs / K2CPUMs.
	Overhead float64 `json:"overhead"`
}

// overheadPaired measures the replication overhead in paired rounds. In
// each round k = 1 (two one-replica copies of the query) and k = 2 (the
// query with two replicas, DCAA with X) run at the same time, each on
// four worker processes of its own (placed as dcaaSaturationWhere says;
// the two sets swap every round), on the same fixed input: every source
// partition draws SaturationRecords records, flat out (dcaaPairedSpeedup),
// and the round ends when every sink of both sides has seen the end of
// the input. Each side's CPU time over the round is read from its
// processes (getrusage) before the round starts and after both sides
// ended, while they are idle: so the readings do not depend on when a
// busy process answers, and every record a side took in is in its
// count. Both sides take in the same records (two copies or two replicas
// of three partitions of SaturationRecords each), so a round's overhead
// is
//
//	1 − (records per CPU-second of k = 2) / (records per CPU-second of k = 1) = 1 − CPU(k = 1) / CPU(k = 2).
//
// At saturation a side's throughput is its records per CPU-second times
// the CPU it gets: this is 1 − throughput(k = 2) / throughput(k = 1) on
// equal CPUs. Every process runs a garbage collection before a round
// (opGC), so that no round pays for the previous one's garbage, and a
// warm-up round with each side on each process set (fresh processes:
// heap growth, page faults, connections; see dcaaPairedWarmUp) is left
// out. The figure is the mean over the rounds with
// a 95 % confidence interval (Student's t over the rounds); every sink's
// stable output must equal k = 1's first copy's (SaturationOutputsMatch),
// so every replica really processed every record.
//
// What it leaves out: the side that ends first leaves the CPUs to the
// other for the rest of the round (K1Ms and K2Ms say how long each ran);
// and time a side waits without using its CPU is not charged to it.
func (b *dcaaBench) overheadPaired(ctx context.Context, res *DCAAResult) error {
	res.OverheadMethod = OverheadDCAAPaired
	var procs [2][dcaaProcesses]*workerClient
	for s := range procs {
		defer b.stopSet(&procs[s])
		if err := b.launchSet(ctx, &procs[s], fmt.Sprintf("bench-dcaa-paired-%d-", s), dcaaPairedSpeedup); err != nil {
			return err
		}
	}
	var (
		rounds []DCAAPairedRound
		ref    []string
	)
	match := true
	res.SaturationOutputsMatch = &match
	for round := range b.cfg.SaturationRounds + dcaaPairedWarmUp {
		r, outs, err := b.pairedRound(ctx, procs, round)
		if err != nil {
			return err
		}
		for i, rows := range outs {
			switch {
			case ref == nil:
				ref = rows
				res.SaturationResults = len(ref)
			case match:
				if d := compareStable(rows, ref); d != "" {
					match = false
					res.SaturationMismatch = fmt.Sprintf("round %d, sink %d: %s", round, i, d)
				}
			}
		}
		if round < dcaaPairedWarmUp {
			b.cfg.Progress.Note("overhead paired rounds: warm-up round left out (overhead %.1f%%, %s)", 100*r.Overhead, pairedRoundSummary(r))
			continue
		}
		res.SaturationTentative += r.K2Tentative
		res.SaturationUndos += r.K2Undos
		b.cfg.Progress.Step("overhead paired", round, b.cfg.SaturationRounds, fmt.Sprintf(
			"k=2 on set %d: overhead %.1f%% (%s)", r.K2Set, 100*r.Overhead, pairedRoundSummary(r)))
		rounds = append(rounds, r)
	}
	res.OverheadPairedRounds = rounds
	var fs []sideFigures
	for _, r := range rounds {
		perSec := func(ms float64) float64 { return float64(b.pairedRecords()) / saturationCopies / (ms / 1000) }
		fs = append(fs, sideFigures{overhead: r.Overhead, perCPU: [2]float64{r.K1RecordsPerCPUSec, r.K2RecordsPerCPUSec},
			perSec: [2]float64{perSec(r.K1Ms), perSec(r.K2Ms)}, cpuUse: [2]float64{r.K1CPUUse, r.K2CPUUse}})
		res.CPUOverheadRounds = append(res.CPUOverheadRounds, r.Overhead)
	}
	res.setSideFigures(fs)
	res.OverheadNote = fmt.Sprintf("paired rounds: k=1 (two one-replica copies) and k=2 (DCAA, X %v) at once on four worker processes each, unpinned, sharing the CPUs, each round the same %d records per source partition (%d records a side) drawn flat out to the end of the input; each side's CPU time over the round read from its idle processes before and after (every process garbage-collected before the round), overhead = 1 - k1's CPU / k2's CPU per round; mean over %d rounds (the sides' process sets swapped every round, two warm-up rounds on each arrangement left out) with a 95%% confidence interval (t over the rounds); medians: records per second per copy k1 %s, k2 %s, CPU use per copy %.2f and %.2f; time a side waited without its CPU is not counted against it",
		b.cfg.X, b.cfg.SaturationRecords, b.pairedRecords(), len(rounds),
		fmtRate(res.K1RecordsPerSec), fmtRate(res.K2RecordsPerSec), res.K1CPUUse, res.K2CPUUse)
	res.noteBusySides()
	return nil
}

// pairedRecords is the records each side takes in in a paired round: two
// copies (or replicas) of every source partition's input.
func (b *dcaaBench) pairedRecords() int64 {
	return saturationCopies * dcaaMonitors * b.cfg.SaturationRecords
}

// pairedRound runs one paired round (k = 2 on procs[round%2]) and returns
// it with the stable output of every sink (k = 1's copies, then k = 2's
// replicas).
func (b *dcaaBench) pairedRound(ctx context.Context, procs [2][dcaaProcesses]*workerClient, round int) (DCAAPairedRound, [][]string, error) {
	k2set := round % 2
	r := DCAAPairedRound{Round: round, K2Set: k2set}
	sides, err := b.sideSpecs(procs, k2set, b.cfg.SaturationRecords)
	if err != nil {
		return r, nil, err
	}
	all := func(req func(s, i int) request) ([2][dcaaProcesses]response, error) {
		return callSides(ctx, &sides, req)
	}
	stop := func() {
		if _, err := all(func(int, int) request { return request{Op: opApply} }); err != nil {
			b.cfg.Logger.Warn("bench dcaa: paired round stop", "err", err)
		}
	}
	// The previous round's tasks are stopped (its deferred stop); their
	// garbage is collected before the readings.
	before, err := all(func(int, int) request { return request{Op: opGC} })
	if err != nil {
		return r, nil, err
	}
	// Operators and sinks first (they wait for their upstreams), then
	// the sources; the side that goes first alternates every two rounds,
	// so each set starts first with each k.
	order := []int{0, 1}
	if (round/2)%2 == 1 {
		order = []int{1, 0}
	}
	start := time.Now()
	for _, group := range [][]int{{measured, peer}, {srcR1, srcR0}} {
		for _, s := range order {
			for _, i := range group {
				if _, err := sides[s].w[i].call(ctx, request{Op: opApply, Tasks: sides[s].specs[i]}); err != nil {
					return r, nil, err
				}
			}
		}
	}
	defer stop()
	sinkWorkers := []int{measured, peer} // sink i of a side runs there
	for s := range sides {
		for i := range sides[s].sinks {
			if _, err := sides[s].w[sinkWorkers[i]].call(ctx, request{Op: opEventsStart, Task: sides[s].sinks[i]}); err != nil {
				return r, nil, err
			}
		}
	}
	// Wait for every sink's end of input; each side's wall time is up to
	// its last sink's.
	wctx, cancel := context.WithTimeout(ctx, dcaaPairedTimeout)
	defer cancel()
	var (
		evs  [2][][]streamEvent
		ends [2]time.Duration
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for s := range sides {
		evs[s] = make([][]streamEvent, len(sides[s].sinks))
		for i := range sides[s].sinks {
			w := sides[s].w[sinkWorkers[i]]
			wg.Go(func() {
				resp, err := w.call(wctx, request{Op: opTailWait})
				mu.Lock()
				defer mu.Unlock()
				ends[s] = max(ends[s], time.Since(start))
				evs[s][i] = resp.Events
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", w.name, err))
				}
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			return r, nil, fmt.Errorf("%w: paired overhead round %d: the sinks did not see the end of the input within %v (%w)", ErrDCAABench, round, dcaaPairedTimeout, err)
		}
		return r, nil, err
	}
	after, err := all(func(int, int) request { return request{Op: opCPU} })
	if err != nil {
		return r, nil, err
	}
	var (
		cpu  [2]time.Duration
		gc   [2]int
		outs [][]string
	)
	for s := range sides {
		for i := range dcaaProcesses {
			cpu[s] += time.Duration(after[s][i].CPUNanos - before[s][i].CPUNanos)
			gc[s] += int(after[s][i].GCCycles - before[s][i].GCCycles)
		}
		if cpu[s] <= 0 || ends[s] <= 0 {
			return r, nil, fmt.Errorf("%w: paired overhead round %d: side k=%d used %v of CPU in %v", ErrDCAABench, round, s+1, cpu[s], ends[s])
		}
		for i, e := range evs[s] {
			v, err := stableRows(e)
			if err != nil {
				return r, nil, fmt.Errorf("%w: paired overhead round %d, k=%d, sink %d: %w", ErrDCAABench, round, s+1, i, err)
			}
			if s == 1 {
				r.K2Tentative += v.tentative
				r.K2Undos += v.undos
			}
			outs = append(outs, v.rows)
		}
	}
	r.pairedFigures(b.pairedRecords(), cpu, ends)
	r.K1GC, r.K2GC = gc[0], gc[1]
	return r, outs, nil
}

// pairedFigures sets a round's figures from what each side ([0] k = 1,
// [1] k = 2) took in (records, the same for both), the CPU time its
// processes used and its wall time (both positive).
func (r *DCAAPairedRound) pairedFigures(records int64, cpu, wall [2]time.Duration) {
	n := float64(records)
	r.K1CPUMs, r.K2CPUMs = ms(cpu[0]), ms(cpu[1])
	r.K1Ms, r.K2Ms = ms(wall[0]), ms(wall[1])
	r.K1RecordsPerCPUSec, r.K2RecordsPerCPUSec = math.Round(n/cpu[0].Seconds()), math.Round(n/cpu[1].Seconds())
	r.K1CPUUse = math.Round(cpu[0].Seconds()/wall[0].Seconds()/saturationCopies*1000) / 1000
	r.K2CPUUse = math.Round(cpu[1].Seconds()/wall[1].Seconds()/saturationCopies*1000) / 1000
	r.Overhead = round4(1 - cpu[0].Seconds()/cpu[1].Seconds())
}

// pairedRoundSummary is a round's figures for the progress line.
func pairedRoundSummary(r DCAAPairedRound) string {
	return fmt.Sprintf("per CPU-second k=1 %s, k=2 %s; wall %.0f and %.0f ms; CPU use per copy %.2f and %.2f; GC cycles %d and %d; k=2 tentative %d, UNDO %d",
		fmtRate(r.K1RecordsPerCPUSec), fmtRate(r.K2RecordsPerCPUSec), r.K1Ms, r.K2Ms, r.K1CPUUse, r.K2CPUUse, r.K1GC, r.K2GC, r.K2Tentative, r.K2Undos)
}
