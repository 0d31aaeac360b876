package benchmark

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/worker/dcaa"
	"github.com/fedstream/fedstream/worker/runtime"
	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrDCAABench means the DCAA benchmark could not produce a measurement.
var ErrDCAABench = errors.New("benchmark: dcaa")

// Strategies of bench dcaa: DCAA with the configured X, and "process
// immediately" (max_delay 0: nothing waits, anything not yet stable is
// released tentatively and corrected later).
const (
	StrategyDCAA      = "dcaa"
	StrategyImmediate = "immediate"
)

// Defaults of bench dcaa (DCAAConfig).
var (
	DefaultDCAAX        = 500 * time.Millisecond
	DefaultDCAABoundary = 50 * time.Millisecond
	DefaultDCAADOverX   = []float64{0.5, 1, 2, 4, 7}
)

// The bench's query, the network monitor of examples/netmon.yaml made
// fast: three monitor partitions of connection records, counted per
// source host over 100 ms windows (connections and distinct ports) in two
// partitions, two filters (busy, probing) joined on the host. The
// thresholds keep every window's scanners (about 7 connections to 7
// ports per window each at the default rate) and no background host.
//
// One difference from the example: a last unkeyed map (alert, one
// partition) between the join and the sink. Sinks behind a keyed
// fragment merge its partitions, and merging sinks do not yet handle
// UNDO (docs/DATAPLANE.md "Not done yet"); behind the map the sink passes
// its single input stream through, tentative results, UNDO and REC_DONE
// included, as a DCAA operator task produced them.
const (
	dcaaWindow    = 100 * time.Millisecond
	dcaaJoin      = 50 * time.Millisecond // joins each window's busy and probing rows, not the neighbours'
	dcaaThreshold = 3
	dcaaMonitors  = 3
	// minPinnedCPUUse: below this CPU use per replica, a pinned
	// overhead run says that the replicas did not have their CPUs.
	minPinnedCPUUse = 0.8
	// dcaaSaturationTimeout bounds one replication overhead run.
	dcaaSaturationTimeout = 3 * time.Minute
	// dcaaReferenceSpeedup runs the failure-free reference run this many
	// times faster than real time (same stimes, same results).
	dcaaReferenceSpeedup = 4
)

// DCAAConfig configures RunDCAA. Zero fields take the defaults.
type DCAAConfig struct {
	// X is the DCAA strategy's max_delay (default 500ms).
	X time.Duration
	// Boundary is the workers' boundary interval, their heartbeat period
	// (default 50ms); the detection timeout follows from it
	// (dcaa.DetectTimeout).
	Boundary time.Duration
	// DOverX are the failure durations, as multiples of X (default 0.5,
	// 1, 2, 4, 7).
	DOverX []float64
	// Strategies to run (default dcaa and immediate).
	Strategies []string
	// Rate is each of the three source partitions' records per second
	// (default 2000).
	Rate int
	// Warmup is how long a run goes before its failure (default 1.5s);
	// Recover how long it goes on after the longest failure (default 3s).
	// Every run's input lasts Warmup + max(DOverX)·X + Recover.
	Warmup, Recover time.Duration
	// SaturationRecords is each source partition's input in the
	// replication overhead runs, generated as fast as possible (default
	// 300000).
	SaturationRecords int64
	// SaturationRounds: the replication overhead runs (k = 1, k = 2) are
	// repeated this many times as pairs, alternating their order (default
	// 5); the median of the pairs' overheads is the figure.
	SaturationRounds int
	// OverheadMethod is how the replication overhead is measured:
	// OverheadDCAAPaired (the default with worker processes: rounds of a
	// fixed input, SaturationRecords per source partition, of which
	// SaturationRounds are measured), OverheadDCAASide (windows of a
	// running pair) or OverheadSequential (the pinned pairs of
	// SaturationRounds; the default with in-process workers, whose CPU
	// cannot be told apart).
	OverheadMethod string
	// SideWindow and SideWindows are the side-by-side method's windows
	// per round (default 2s and 4); its rounds are SaturationRounds.
	SideWindow  time.Duration
	SideWindows int
	// ProfileDir, when not empty, makes every worker process write a CPU
	// profile of each saturation run to
	// ProfileDir/k<k>-round<round>-<role>.cpu (roles src0, ops0 for
	// replica 0, src1, ops1 for replica 1). The workers must be processes
	// of their own and not profile their whole life.
	ProfileDir string
	// SkipSwitch leaves out the kill run (switch_ms); SkipOverhead the
	// saturation runs (replication_overhead); SkipFailures the reference
	// run and the failure rows (rows, rate).
	SkipSwitch, SkipOverhead, SkipFailures bool
	Launch                                 Launcher
	Logger                                 *slog.Logger
	Progress                               *benchreport.Progress
}

// DCAARow is one failure of one strategy.
type DCAARow struct {
	Strategy string  `json:"strategy"`
	DOverX   float64 `json:"d_over_x"`
	DMs      float64 `json:"d_ms"`
	// Tentative counts the tentative results the measured sink replica
	// emitted; Undos and RecDones its corrections.
	Tentative int `json:"tentative"`
	Undos     int `json:"undos"`
	RecDones  int `json:"rec_dones"`
	// TentativeAfterHeal counts the tentative results that arrived after
	// the links were healed (the replicas were still stabilizing, or went
	// tentative again), and CorrectedMs is from the heal to the first
	// REC_DONE after it (the failure's corrections done; 0: none).
	TentativeAfterHeal int     `json:"tentative_after_heal"`
	CorrectedMs        float64 `json:"corrected_ms"`
	// FirstTentativeMs is from the cut to the first tentative result at
	// the measured sink (0: none): the detection timeout plus the shares
	// of X the stages waited, plus the pipeline's own latency. A failure
	// shorter than this gives no tentative result (see BENCHMARKS.md on
	// D = X).
	FirstTentativeMs float64 `json:"first_tentative_ms,omitempty"`
	// TentativeBound is the floor's bound 1.1 × rate × (D − 0.9X) for a
	// DCAA row with D > X (0 otherwise).
	TentativeBound float64 `json:"tentative_bound,omitempty"`
	// MaxAddedLatencyMs: see RunDCAA.
	MaxAddedLatencyMs float64 `json:"max_added_latency_ms"`
	// StableMatchesReference: the measured replica's stable view (UNDOs
	// applied, dcaa.StableView) holds exactly the reference run's
	// results, in order; Mismatch says where it differs first.
	StableMatchesReference bool   `json:"stable_matches_reference"`
	Mismatch               string `json:"mismatch,omitempty"`
	StableResults          int    `json:"stable_results"`
	// PeerMatchesReference: the same for the other sink replica.
	PeerMatchesReference bool `json:"peer_matches_reference"`
}

// DCAAFloor is one of issue 10's floors and whether this run met it.
type DCAAFloor struct {
	Name  string `json:"name"`
	Holds bool   `json:"holds"`
	// Detail gives the figures behind it.
	Detail string `json:"detail"`
}

// DCAAResult is what `bench dcaa --json` prints. Times are milliseconds.
type DCAAResult struct {
	XMs        float64 `json:"x_ms"`
	BoundaryMs float64 `json:"boundary_ms"`
	DetectMs   float64 `json:"detect_ms"`
	// Rate is the reference run's results per second of stream time at
	// the sink: the rate at which tentative results can appear, which the
	// floor on tentative tuples is stated in. InputRate is the records
	// per second of the three source partitions together.
	Rate      float64 `json:"rate"`
	InputRate int     `json:"input_rate"`
	// ReplicationOverhead is 1 − throughput(k = 2, SUnion) /
	// throughput(k = 1) at saturation, measured as OverheadMethod says
	// (see dcaaBench.overhead): with OverheadPinned each replica's worker
	// processes have a CPU of their own and throughput is records per
	// second at the sink (K1RecordsPerSec, K2RecordsPerSec: SinkOverhead);
	// with OverheadCPUTime it is records per CPU-second of the worker
	// processes per replica (K1RecordsPerCPUSec, K2RecordsPerCPUSec:
	// CPUOverhead). Both figures are given either way; OverheadNote says
	// which CPUs were used, or why nothing was pinned.
	ReplicationOverhead float64 `json:"replication_overhead"`
	// ReplicationOverheadCI95 is the half-width of the 95 % confidence
	// interval of ReplicationOverhead (side by side: over the windows;
	// -1: fewer than two windows; 0: the sequential method, which gives
	// none), and ReplicationOverheadMedian the median window's overhead.
	// OverheadRoundMeans are the side-by-side rounds' means and
	// OverheadWindows every window (DCAASideWindow).
	ReplicationOverheadCI95   float64          `json:"replication_overhead_ci95"`
	ReplicationOverheadMedian float64          `json:"replication_overhead_median"`
	OverheadRoundMeans        []float64        `json:"overhead_round_means,omitempty"`
	OverheadWindows           []DCAASideWindow `json:"overhead_windows,omitempty"`
	// OverheadPairedRounds is every measured round of the paired method
	// (DCAAPairedRound); ReplicationOverheadCI95 is then over the rounds.
	OverheadPairedRounds []DCAAPairedRound `json:"overhead_paired_rounds,omitempty"`
	OverheadMethod       string            `json:"overhead_method"`
	OverheadNote         string            `json:"overhead_note"`
	SinkOverhead         float64           `json:"sink_overhead"`
	CPUOverhead          float64           `json:"cpu_overhead"`
	// OverheadRounds and CPUOverheadRounds are each pair's sink and CPU
	// overhead, in the order run; SinkOverhead and CPUOverhead are their
	// medians. The K1/K2 figures below are medians over the rounds too.
	// (Side by side: no pairs and no sink figure; CPUOverhead is
	// ReplicationOverhead and the K1/K2 figures are the medians of the
	// windows', per copy.)
	OverheadRounds     []float64 `json:"overhead_rounds"`
	CPUOverheadRounds  []float64 `json:"cpu_overhead_rounds"`
	K1RecordsPerCPUSec float64   `json:"k1_records_per_cpu_s"`
	K2RecordsPerCPUSec float64   `json:"k2_records_per_cpu_s"`
	K1RecordsPerSec    float64   `json:"k1_records_per_s"`
	K2RecordsPerSec    float64   `json:"k2_records_per_s"`
	// K1CPUUse and K2CPUUse are the CPU-seconds the worker processes
	// used per second of the run and per replica, in the run with the
	// best sink throughput: near 1 when pinned, each replica had its CPU
	// to itself; well below 1 when other work on the machine took it
	// (then the sink figures measure that work as much as replication).
	K1CPUUse float64 `json:"k1_cpu_use"`
	K2CPUUse float64 `json:"k2_cpu_use"`
	// OverheadLoad is the machine's load average (1, 5, 15 minutes) at
	// the start and at the end of the overhead runs (Linux; empty
	// elsewhere): other work on the machine disturbs the pinned runs.
	OverheadLoad string `json:"overhead_load,omitempty"`
	// SaturationOutputsMatch (the sequential method only; absent side by
	// side, whose rounds are stopped, not run to the end): every sink
	// replica of every overhead run produced the same stable output as
	// the first k = 1 run (SaturationResults results); SaturationMismatch
	// says where one differed first.
	SaturationOutputsMatch *bool  `json:"saturation_outputs_match,omitempty"`
	SaturationMismatch     string `json:"saturation_mismatch,omitempty"`
	SaturationResults      int    `json:"saturation_results"`
	// SaturationTentative counts the tentative results and UNDOs the
	// sinks of the k = 2 saturation runs emitted: with sources as fast as
	// they can, one partition running ahead of another by more than a
	// task's share of X looks like a failed input, and the corrections
	// that follow are part of what replication costs there.
	SaturationTentative int `json:"saturation_tentative"`
	SaturationUndos     int `json:"saturation_undos"`
	// SwitchMs is the longest interval without output (results or
	// boundaries) at sink replica 0 when the worker of the source replica
	// its aggregate reads (replica 0 of source partition 0) is killed
	// (SIGKILL: the connections reset, so the failure is detected at
	// once), over the interval from the kill to a detection timeout plus
	// X after it: the time from the failure until output resumed from
	// the other upstream replica, bounded below by the output's own
	// rhythm, NormalGapMs (the same measure over the second before the
	// kill). SwitchTentative counts tentative results after the kill
	// (P1: none).
	SwitchMs        float64     `json:"switch_ms"`
	NormalGapMs     float64     `json:"normal_gap_ms"`
	SwitchTentative int         `json:"switch_tentative"`
	Rows            []DCAARow   `json:"rows"`
	Floors          []DCAAFloor `json:"floors"`
	// ReferenceResults is the failure-free reference run's result count.
	ReferenceResults int `json:"reference_results"`
}

// The bench's worker processes. Source partition 0's replicas run on
// srcR0 and srcR1 alone, so that cutting a worker's links to those two
// makes every replica of that upstream unreachable for it (and killing
// srcR0 kills one replica only). The other source partitions and
// replica 1 of every operator and of the sink run on peer; replica 0 of
// every operator and of the sink (the measured one) on measured. Both
// peer and measured have fault injection: a failure cuts both, so that no
// replica can move to an upstream replica that still has the partition.
const (
	srcR0 = iota
	srcR1
	peer
	measured
	dcaaProcesses
)

type dcaaBench struct {
	cfg DCAAConfig
	w   [dcaaProcesses]*workerClient
	// specs are the last applied query's tasks per worker.
	specs [dcaaProcesses][]runtime.TaskSpec
	q     *queryspec.Query
	runs  int
}

// RunDCAA runs the Borealis-style DCAA experiment on the network
// monitoring query with two replicas (see DCAAResult and DCAARow):
//
//   - A failure-free reference run with one replica (no DCAA), sped up,
//     gives the reference results and Rate.
//   - For each strategy and each D: a fresh run of the query with
//     replicas 2; after Warmup the links from both replicas' workers to
//     both replicas of source partition 0 are held (bytes stop, nothing
//     fails: a silent partition) for D, then healed, so no replica of
//     any task can reach that upstream. The aggregates keep live input
//     from the two other source partitions, so they have data to
//     release: within X (DCAA) or at once (immediate) they release
//     tentative results, corrected after the heal. Sink replica 0 is
//     measured.
//   - The largest added latency of a row is the maximum, over the
//     reference's result stream times s, of lag(s) − normal, where
//     lag(s) = answer(s) − s, answer(s) is the wall time at which the
//     measured sink first emitted any result, tentative or stable, with
//     stream time ≥ s (results come in stream time order, so this is
//     when the answer for s or a later one was first shown), and normal
//     is the median lag before the failure in the same run (see
//     maxAddedLatency). So it is the delay the failure added to the
//     first answer for each moment of the input, tentative or final; a
//     result the failure made impossible (its input was cut) is not
//     waited for, as DCAA promises an answer within X for what is
//     available, and its correction is checked by the stable view.
//   - switch_ms: a run in which the process of one replica of source
//     partition 0 is killed (see DCAAResult.SwitchMs).
//   - Replication overhead: k = 1 and k = 2 (DCAA with X) at saturation.
func RunDCAA(ctx context.Context, cfg DCAAConfig) (*DCAAResult, error) {
	if cfg.X <= 0 {
		cfg.X = DefaultDCAAX
	}
	if cfg.Boundary <= 0 {
		cfg.Boundary = DefaultDCAABoundary
	}
	if len(cfg.DOverX) == 0 {
		cfg.DOverX = DefaultDCAADOverX
	}
	if len(cfg.Strategies) == 0 {
		cfg.Strategies = []string{StrategyDCAA, StrategyImmediate}
	}
	for _, s := range cfg.Strategies {
		if s != StrategyDCAA && s != StrategyImmediate {
			return nil, fmt.Errorf("%w: strategy %q (want %s or %s)", ErrDCAABench, s, StrategyDCAA, StrategyImmediate)
		}
	}
	for _, d := range cfg.DOverX {
		if d <= 0 || d > 100 {
			return nil, fmt.Errorf("%w: failure duration %g X: want more than 0 and at most 100", ErrDCAABench, d)
		}
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 2000
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = 1500 * time.Millisecond
	}
	if cfg.Recover <= 0 {
		cfg.Recover = 3 * time.Second
	}
	if cfg.SaturationRecords <= 0 {
		cfg.SaturationRecords = 300_000
	}
	if cfg.SaturationRounds <= 0 {
		cfg.SaturationRounds = 5
		if cfg.OverheadMethod == OverheadDCAAPaired {
			cfg.SaturationRounds = DefaultDCAAPairedRounds
		}
	}
	switch cfg.OverheadMethod {
	case "", OverheadDCAAPaired, OverheadDCAASide, OverheadSequential:
	default:
		return nil, fmt.Errorf("%w: overhead method %q (want %s, %s or %s)", ErrDCAABench, cfg.OverheadMethod, OverheadDCAAPaired, OverheadDCAASide, OverheadSequential)
	}
	if cfg.SideWindow <= 0 {
		cfg.SideWindow = DefaultDCAASideWindow
	}
	if cfg.SideWindows <= 0 {
		cfg.SideWindows = DefaultDCAASideWindows
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Launch == nil {
		l, err := DefaultLauncher()
		if err != nil {
			return nil, err
		}
		cfg.Launch = l
	}
	res := &DCAAResult{
		XMs: ms(cfg.X), BoundaryMs: ms(cfg.Boundary), DetectMs: ms(dcaa.DetectTimeout(cfg.Boundary)),
		InputRate: cfg.Rate * dcaaMonitors,
	}
	b := &dcaaBench{cfg: cfg}
	// Every run's input: long enough for the longest failure.
	streamTime := cfg.Warmup + time.Duration(slices.Max(cfg.DOverX)*float64(cfg.X)) + cfg.Recover
	records := int64(cfg.Rate) * int64(streamTime/time.Millisecond) / 1000

	var ref []string
	if !cfg.SkipFailures {
		cfg.Progress.Note("reference run: one replica, %d records per source partition at %d/s, %dx speed", records, cfg.Rate, dcaaReferenceSpeedup)
		var err error
		if ref, err = b.reference(ctx, records); err != nil {
			return nil, err
		}
		res.ReferenceResults = len(ref)
		res.Rate = math.Round(float64(len(ref))/streamTime.Seconds()*10) / 10
		cfg.Progress.Note("reference: %d results (%.1f/s)", len(ref), res.Rate)
	}

	for i := range b.w {
		name := fmt.Sprintf("bench-dcaa-worker-%d", i)
		p, err := cfg.Launch(ctx, name)
		if err != nil {
			b.stop()
			return nil, err
		}
		b.w[i] = newWorkerClient(name, p)
		resp, err := b.w[i].call(ctx, request{Op: opHello, Faults: i == measured || i == peer, BoundaryInterval: cfg.Boundary})
		if err != nil {
			b.stop()
			return nil, err
		}
		b.w[i].addr = resp.Addr
	}
	defer b.stop()

	if !cfg.SkipOverhead {
		loadBefore := LoadAverage()
		var err error
		switch {
		case cfg.OverheadMethod == OverheadSequential:
			err = b.overhead(ctx, res)
		case b.w[0].proc.Pid == 0 && cfg.OverheadMethod == "":
			// In-process workers share one process's CPU time: the
			// side-by-side method cannot tell the sides apart.
			err = b.overhead(ctx, res)
		case b.w[0].proc.Pid == 0:
			err = fmt.Errorf("%w: the side-by-side and paired overheads need worker processes of their own", ErrDCAABench)
		case cfg.OverheadMethod == OverheadDCAASide:
			err = b.overheadSide(ctx, res)
		default:
			err = b.overheadPaired(ctx, res)
		}
		if err != nil {
			return nil, err
		}
		if loadBefore != "" {
			res.OverheadLoad = loadBefore + " -> " + LoadAverage()
		}
	}
	for _, strategy := range cfg.Strategies {
		if cfg.SkipFailures {
			break
		}
		for _, d := range cfg.DOverX {
			row, err := b.failureRun(ctx, strategy, d, records, ref)
			if err != nil {
				return nil, err
			}
			if strategy == StrategyDCAA && d > 1 {
				row.TentativeBound = math.Round(1.1*res.Rate*(row.DMs-0.9*res.XMs)/1000*10) / 10
			}
			cfg.Progress.Step(strategy, 0, 0, fmt.Sprintf("D = %gX: %d tentative (%d after the heal, first %.0f ms after the cut), %d UNDO, corrected %.0f ms after the heal, max added latency %.0f ms, stable matches reference: %t (peer: %t)",
				d, row.Tentative, row.TentativeAfterHeal, row.FirstTentativeMs, row.Undos, row.CorrectedMs, row.MaxAddedLatencyMs, row.StableMatchesReference, row.PeerMatchesReference))
			if row.Mismatch != "" {
				cfg.Progress.Note("  %s", row.Mismatch)
			}
			res.Rows = append(res.Rows, row)
		}
	}
	if !cfg.SkipSwitch {
		if err := b.switchRun(ctx, records, res); err != nil {
			return nil, err
		}
	}
	res.Floors = dcaaFloors(res, !cfg.SkipFailures, !cfg.SkipSwitch, !cfg.SkipOverhead)
	return res, nil
}

// dcaaQuery is the bench's query (see dcaaWindow).
func dcaaQuery(name string, replicas int, maxDelay string, rate int, records int64) (*queryspec.Query, error) {
	return queryspec.Parse(name+".yaml", fmt.Appendf(nil, `
name: %s
replicas: %d
availability: {max_delay: "%s"}
sources:
  - name: conns
    generator: {kind: netmon, monitors: %d, rate: %d, seed: %d, limit: %d}
    parallelism: %d
operators:
  - name: per_src
    type: aggregate
    input: conns
    window: {size: %s}
    group_by: [src]
    aggregates: {conns: "count()", ports: "count_distinct(port)"}
    parallelism: 2
  - {name: busy, type: filter, input: per_src, where: "conns > %d", parallelism: 2}
  - {name: probing, type: filter, input: per_src, where: "ports > %d", parallelism: 2}
  - {name: both, type: join, left: busy, right: probing, on: [src], window: {size: %s}, parallelism: 2}
  - {name: alert, type: map, input: both, fields: {src: src, conns: conns, ports: ports, window_end: window_end}}
sinks:
  - {name: alerts, input: alert}
`, name, replicas, maxDelay, dcaaMonitors, rate, benchSeed, records, dcaaMonitors, dcaaWindow, dcaaThreshold, dcaaThreshold, dcaaJoin))
}

// dcaaWhere is the placement of the bench's tasks (see srcR0).
func dcaaWhere(n *queryspec.Node, partition, replica int) int {
	switch {
	case n.Kind == queryspec.KindSource && partition == 0 && replica == 0:
		return srcR0
	case n.Kind == queryspec.KindSource && partition == 0:
		return srcR1
	case n.Kind == queryspec.KindSource, replica == 1:
		return peer
	}
	return measured
}

// dcaaSaturationWhere is the placement of the replication overhead runs:
// each replica of the query on worker processes of its own, as each
// replica ran on machines of its own in Borealis' measurements. Replica
// 0's sources run on srcR0 and the rest of it on measured; replica 1's
// sources on srcR1 and the rest on peer. With pinning (see
// dcaaBench.overhead) each pair has a CPU to itself.
func dcaaSaturationWhere(n *queryspec.Node, _, replica int) int {
	switch {
	case n.Kind == queryspec.KindSource && replica == 0:
		return srcR0
	case n.Kind == queryspec.KindSource:
		return srcR1
	case replica == 0:
		return measured
	}
	return peer
}

// specsFor places every task of q: where gives each task's worker
// index, addrs the workers' addresses. It returns each worker's tasks.
func specsFor(q *queryspec.Query, where func(n *queryspec.Node, partition, replica int) int, addrs []string) ([][]runtime.TaskSpec, error) {
	plan, err := q.FusedPlan()
	if err != nil {
		return nil, err
	}
	var (
		placements []runtime.Placement
		owner      []int
	)
	for _, node := range plan.Nodes {
		for p := range max(1, node.Partitions) {
			for r := range max(1, q.Replicas) {
				w := where(node, p, r)
				placements = append(placements, runtime.Placement{
					TaskID: queryspec.TaskID(q.Name, node.Name, p, r), Fragment: node.Name,
					Partition: p, Replica: r, WorkerAddr: addrs[w],
				})
				owner = append(owner, w)
			}
		}
	}
	out := make([][]runtime.TaskSpec, len(addrs))
	for i, pl := range placements {
		out[owner[i]] = append(out[owner[i]], runtime.TaskSpec{
			TaskID: pl.TaskID, Query: q.Name, Fragment: pl.Fragment, Partition: pl.Partition,
			Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements,
		})
	}
	return out, nil
}

// sinkID is the task id of the bench query's sink replica r.
func (b *dcaaBench) sinkID(r int) string { return queryspec.TaskID(b.q.Name, "alerts", 0, r) }

// reference runs the query with one replica, every task on a worker of its
// own running sources faster than real time, and returns its results.
func (b *dcaaBench) reference(ctx context.Context, records int64) ([]string, error) {
	p, err := b.cfg.Launch(ctx, "bench-dcaa-reference")
	if err != nil {
		return nil, err
	}
	w := newWorkerClient("bench-dcaa-reference", p)
	defer func() { _ = p.Stop() }()
	resp, err := w.call(ctx, request{Op: opHello, SourceSpeedup: dcaaReferenceSpeedup, BoundaryInterval: b.cfg.Boundary})
	if err != nil {
		return nil, err
	}
	if b.q, err = dcaaQuery("dcaaref", 1, "0", b.cfg.Rate, records); err != nil {
		return nil, err
	}
	specs, err := specsFor(b.q, func(*queryspec.Node, int, int) int { return 0 }, []string{resp.Addr})
	if err != nil {
		return nil, err
	}
	if _, err := w.call(ctx, request{Op: opApply, Tasks: specs[0]}); err != nil {
		return nil, err
	}
	if _, err := w.call(ctx, request{Op: opEventsStart, Task: b.sinkID(0)}); err != nil {
		return nil, err
	}
	tail, err := w.call(ctx, request{Op: opTailWait})
	if err != nil {
		return nil, err
	}
	view, err := stableRows(tail.Events)
	if err != nil {
		return nil, fmt.Errorf("%w: the reference run: %w", ErrDCAABench, err)
	}
	if len(view.rows) == 0 {
		return nil, fmt.Errorf("%w: the reference run produced no results", ErrDCAABench)
	}
	if view.tentative+view.undos != 0 {
		return nil, fmt.Errorf("%w: the reference run (one replica) produced %d tentative results and %d UNDO", ErrDCAABench, view.tentative, view.undos)
	}
	return view.rows, nil
}

// apply starts query q on the bench's workers (measured first, the
// sources last) and follows the sinks named in tails (replica numbers)
// with events tails.
func (b *dcaaBench) apply(ctx context.Context, q *queryspec.Query, where func(n *queryspec.Node, partition, replica int) int, tails ...int) error {
	b.q = q
	addrs := make([]string, len(b.w))
	for i, w := range b.w {
		addrs[i] = w.addr
	}
	specs, err := specsFor(q, where, addrs)
	if err != nil {
		return err
	}
	for _, i := range []int{measured, peer, srcR1, srcR0} {
		b.specs[i] = specs[i]
		if _, err := b.w[i].call(ctx, request{Op: opApply, Tasks: specs[i]}); err != nil {
			return err
		}
	}
	for _, r := range tails {
		w := measured
		if r == 1 {
			w = peer
		}
		if _, err := b.w[w].call(ctx, request{Op: opEventsStart, Task: b.sinkID(r)}); err != nil {
			return err
		}
	}
	return nil
}

// wait returns the events the tails of the sinks of replica 0 (on
// measured) and 1 (on peer) read.
func (b *dcaaBench) wait(ctx context.Context, workers ...int) ([][]streamEvent, error) {
	var out [][]streamEvent
	for _, w := range workers {
		r, err := b.w[w].call(ctx, request{Op: opTailWait})
		if err != nil {
			return nil, err
		}
		out = append(out, r.Events)
	}
	return out, nil
}

func (b *dcaaBench) nextName(prefix string) string {
	b.runs++
	return fmt.Sprintf("%s%d", prefix, b.runs)
}

// maxDelay is the query's availability.max_delay for a strategy.
func (b *dcaaBench) maxDelay(strategy string) string {
	if strategy == StrategyImmediate {
		return "0"
	}
	return b.cfg.X.String()
}

// failureRun runs the query once with every replica of source partition 0
// unreachable for the measured worker for dOverX·X (see RunDCAA).
func (b *dcaaBench) failureRun(ctx context.Context, strategy string, dOverX float64, records int64, ref []string) (DCAARow, error) {
	row := DCAARow{Strategy: strategy, DOverX: dOverX}
	d := time.Duration(dOverX * float64(b.cfg.X))
	q, err := dcaaQuery(b.nextName("dcaa"), 2, b.maxDelay(strategy), b.cfg.Rate, records)
	if err != nil {
		return row, err
	}
	began := time.Now()
	if err := b.apply(ctx, q, dcaaWhere, 0, 1); err != nil {
		return row, err
	}
	if err := sleepCtx(ctx, b.cfg.Warmup-time.Since(began)); err != nil {
		return row, err
	}
	cut := fmt.Sprintf("cut %s hold\ncut %s hold\n", b.w[srcR0].addr, b.w[srcR1].addr)
	if err := b.faults(ctx, cut); err != nil {
		return row, err
	}
	cutAt := time.Now()
	if err := sleepCtx(ctx, d-time.Since(cutAt)); err != nil {
		return row, err
	}
	if err := b.faults(ctx, ""); err != nil {
		return row, err
	}
	healedAt := time.Now()
	row.DMs = ms(healedAt.Sub(cutAt))
	b.cfg.Progress.Note("%s D = %gX: links held for %.0f ms, healed; waiting for the end of the input", strategy, dOverX, row.DMs)
	evs, err := b.wait(ctx, measured, peer)
	if err != nil {
		return row, err
	}
	for _, ev := range evs[0] {
		if ev.Type == tuple.Tentative && row.FirstTentativeMs == 0 && ev.Nanos >= cutAt.UnixNano() {
			row.FirstTentativeMs = max(ms(time.Duration(ev.Nanos-cutAt.UnixNano())), 0.01)
		}
		switch {
		case ev.Nanos < healedAt.UnixNano():
		case ev.Type == tuple.Tentative:
			row.TentativeAfterHeal++
		case ev.Type == tuple.RecDone && row.CorrectedMs == 0:
			row.CorrectedMs = max(ms(time.Duration(ev.Nanos-healedAt.UnixNano())), 0.01)
		}
	}
	got, err := stableRows(evs[0])
	row.Tentative, row.Undos, row.RecDones = got.tentative, got.undos, got.recDones
	if err != nil {
		row.Mismatch = err.Error()
	} else {
		row.StableResults = len(got.rows)
		row.Mismatch = compareStable(got.rows, ref)
		row.StableMatchesReference = row.Mismatch == ""
	}
	if p, err := stableRows(evs[1]); err == nil {
		row.PeerMatchesReference = compareStable(p.rows, ref) == ""
	}
	row.MaxAddedLatencyMs = ms(maxAddedLatency(evs[0], ref, cutAt))
	return row, nil
}

// faults sets the cut links of both replicas' workers (measured and
// peer) to spec.
func (b *dcaaBench) faults(ctx context.Context, spec string) error {
	for _, w := range []int{measured, peer} {
		if _, err := b.w[w].call(ctx, request{Op: opFaults, Spec: spec}); err != nil {
			return err
		}
	}
	return nil
}

// switchRun kills the process of replica 0 of source partition 0, which
// the measured replica reads, and measures how long the measured sink's
// output stalled (DCAAResult.SwitchMs). It runs last: that worker is gone
// after it.
func (b *dcaaBench) switchRun(ctx context.Context, records int64, res *DCAAResult) error {
	q, err := dcaaQuery(b.nextName("dcaakill"), 2, b.cfg.X.String(), b.cfg.Rate, records)
	if err != nil {
		return err
	}
	began := time.Now()
	if err := b.apply(ctx, q, dcaaWhere, 0); err != nil {
		return err
	}
	if err := sleepCtx(ctx, b.cfg.Warmup-time.Since(began)); err != nil {
		return err
	}
	b.cfg.Progress.Note("killing the worker of source partition 0, replica 0 (SIGKILL)")
	killedAt := time.Now()
	if err := b.w[srcR0].proc.Kill(); err != nil {
		return err
	}
	evs, err := b.wait(ctx, measured)
	if err != nil {
		return err
	}
	var times []int64
	for _, ev := range evs[0] {
		times = append(times, ev.Nanos)
		if ev.Type == tuple.Tentative && ev.Nanos >= killedAt.UnixNano() {
			res.SwitchTentative++
		}
	}
	res.SwitchMs = ms(longestGap(times, killedAt, killedAt.Add(dcaa.DetectTimeout(b.cfg.Boundary)+b.cfg.X)))
	res.NormalGapMs = ms(longestGap(times, killedAt.Add(-time.Second), killedAt.Add(-time.Millisecond)))
	b.cfg.Progress.Step("switch", 0, 0, fmt.Sprintf("output stalled %.0f ms after the kill (normal rhythm %.0f ms), %d tentative", res.SwitchMs, res.NormalGapMs, res.SwitchTentative))
	return nil
}

// Methods of the replication overhead (DCAAResult.OverheadMethod).
const (
	// OverheadPinned: each replica's worker processes pinned to a CPU of
	// their own, throughput at the sink.
	OverheadPinned = "pinned_sink_throughput"
	// OverheadCPUTime: the fallback without pinning (not Linux, fewer
	// than two CPUs allowed, in-process workers): records per CPU-second
	// of the worker processes, per replica.
	OverheadCPUTime = "cpu_time_per_replica"
)

// overhead measures the replication overhead at saturation:
// 1 − throughput(k = 2, DCAA) / throughput(k = 1, stable merge), each
// replica (each copy, with k = 1) given the same dedicated resources.
//
// Two replicas do twice the work. In Borealis each replica ran on
// machines of its own, so replication cost only what the DCAA machinery
// adds (SUnion, boundaries, stable ids, acks to both replicas, output
// buffering, in-band state). Here each replica runs on two worker
// processes of its own (dcaaSaturationWhere: its sources; its operators
// and sink) pinned to a CPU of its own (sched_setaffinity of every
// thread): replica 0 on the first allowed CPU, replica 1 on the second.
//
// The k = 1 side runs two independent copies of the one-replica query at
// once, copy 0 where replica 0 runs and copy 1 where replica 1 runs. So
// both sides keep both CPUs busy with the same placement, and the only
// difference is replication: other work on the machine (which a pinned
// process does not keep off its CPU) and the shared caches weigh on both
// alike. (One copy alone left the second CPU to other work in the k = 1
// run only: on a loaded machine the pinned k = 1 replica got 0.93 of its
// CPU and the k = 2 replicas 0.71, and the sink figure measured that.)
//
// Throughput is measured the same way on both sides, at the sinks
// (sinkThroughput): every input record over the time from the start of
// the run to a sink's final boundary, the slower of the two sinks (the
// two copies; the two replicas). The two sides alternate, SaturationRounds
// pairs in the order k1 k2, k2 k1, ... so that a drift of the machine's
// load weighs on both alike, and the figure is the median of the pairs'
// overheads (OverheadRounds). Without pinning the figure falls back to
// the CPU time of the worker processes per record and copy
// (OverheadCPUTime); both are reported either way. Every sink's stable
// output must equal the first k = 1 copy's (SaturationOutputsMatch):
// every replica really processes every tuple.
func (b *dcaaBench) overhead(ctx context.Context, res *DCAAResult) error {
	n := b.cfg.SaturationRecords
	if b.cfg.ProfileDir != "" {
		if err := os.MkdirAll(b.cfg.ProfileDir, 0o755); err != nil {
			return fmt.Errorf("%w: profiles: %w", ErrDCAABench, err)
		}
	}
	res.OverheadMethod = OverheadPinned
	cpus, err := b.pin()
	if err != nil {
		res.OverheadMethod = OverheadCPUTime
		res.OverheadNote = fmt.Sprintf("not pinned (%v): overhead from CPU time per record and copy; the copies shared the CPUs", err)
		b.cfg.Progress.Note("%s", res.OverheadNote)
	} else {
		res.OverheadNote = fmt.Sprintf("replica (k=1: copy) 0's worker processes pinned to CPU %d, replica 1's to CPU %d; throughput at the sinks", cpus[0], cpus[1])
		b.cfg.Progress.Note("%s", res.OverheadNote)
		defer b.unpin(cpus)
	}
	var (
		runs [3][]saturationRun // by k
		ref  []string
	)
	match := true
	res.SaturationOutputsMatch = &match
	for round := 1; round <= b.cfg.SaturationRounds; round++ {
		order := []int{1, 2}
		if round%2 == 0 {
			order = []int{2, 1}
		}
		for _, k := range order {
			r, err := b.saturation(ctx, k, n, round)
			if err != nil {
				return err
			}
			res.SaturationTentative += r.tentative
			res.SaturationUndos += r.undos
			runs[k] = append(runs[k], r)
			for i, rows := range r.rows {
				switch {
				case ref == nil && k == 1:
					ref = rows
				case ref != nil:
					if d := compareStable(rows, ref); d != "" && match {
						match = false
						res.SaturationMismatch = fmt.Sprintf("round %d, k = %d, sink %d: %s", round, k, i, d)
					}
				}
			}
			b.cfg.Progress.Step(fmt.Sprintf("saturation k=%d", k), round, b.cfg.SaturationRounds,
				fmt.Sprintf("%s at the slower sink, %s per CPU-second per copy, CPU use %.2f per copy, %d tentative results, %d UNDO", benchreport.Rate(r.perSec, "records"), benchreport.Rate(r.perCPU, "records"), r.cpuUse, r.tentative, r.undos))
		}
	}
	if !match {
		b.cfg.Progress.Note("saturation outputs differ: %s", res.SaturationMismatch)
	}
	res.SaturationResults = len(ref)
	ratio := func(k2, k1 float64) float64 { return math.Round((1-k2/k1)*1000) / 1000 }
	var sinkPairs, cpuPairs []float64
	for i := range min(len(runs[1]), len(runs[2])) {
		sinkPairs = append(sinkPairs, ratio(runs[2][i].perSec, runs[1][i].perSec))
		cpuPairs = append(cpuPairs, ratio(runs[2][i].perCPU, runs[1][i].perCPU))
	}
	res.OverheadRounds, res.CPUOverheadRounds = sinkPairs, cpuPairs
	field := func(k int, f func(saturationRun) float64) float64 {
		var v []float64
		for _, r := range runs[k] {
			v = append(v, f(r))
		}
		return median(v)
	}
	perSec := func(r saturationRun) float64 { return r.perSec }
	perCPU := func(r saturationRun) float64 { return r.perCPU }
	use := func(r saturationRun) float64 { return r.cpuUse }
	res.K1RecordsPerCPUSec, res.K2RecordsPerCPUSec = math.Round(field(1, perCPU)), math.Round(field(2, perCPU))
	res.K1RecordsPerSec, res.K2RecordsPerSec = math.Round(field(1, perSec)), math.Round(field(2, perSec))
	res.K1CPUUse, res.K2CPUUse = math.Round(field(1, use)*100)/100, math.Round(field(2, use)*100)/100
	if res.OverheadMethod == OverheadPinned && min(res.K1CPUUse, res.K2CPUUse) < minPinnedCPUUse {
		res.OverheadNote += fmt.Sprintf("; the pinned processes did not get their CPUs (CPU use per replica %.2f with k=1, %.2f with k=2: other work on the machine); both sides ran on both CPUs, so that work weighs on both, but the figures vary more: compare cpu_overhead",
			res.K1CPUUse, res.K2CPUUse)
	}
	res.CPUOverhead = median(cpuPairs)
	res.SinkOverhead = median(sinkPairs)
	res.ReplicationOverhead = res.SinkOverhead
	if res.OverheadMethod == OverheadCPUTime {
		res.ReplicationOverhead = res.CPUOverhead
	}
	return nil
}

// LoadAverage is the first three fields of /proc/loadavg ("" where there
// is none): benchmarks report it next to their figures.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// pin pins the worker processes for the overhead runs (see overhead):
// srcR0 and measured to the first allowed CPU, srcR1 and peer to the
// second. It returns those two CPUs, or why it could not pin (then
// nothing stays pinned).
func (b *dcaaBench) pin() ([]int, error) {
	cpus, err := allowedCPUs()
	if err != nil {
		return nil, err
	}
	if len(cpus) < 2 {
		return nil, fmt.Errorf("%d CPU allowed, two needed", len(cpus))
	}
	for i, w := range b.w {
		if w.proc.Pid == 0 {
			return nil, fmt.Errorf("worker %s runs in this process", w.name)
		}
		cpu := cpus[0]
		if i == srcR1 || i == peer {
			cpu = cpus[1]
		}
		if err := setAffinity(w.proc.Pid, []int{cpu}); err != nil {
			b.unpin(cpus)
			return nil, err
		}
	}
	return cpus[:2], nil
}

// unpin lets every worker process run on every CPU this process may use
// again (the failure runs that follow are not pinned).
func (b *dcaaBench) unpin([]int) {
	all, err := allowedCPUs()
	if err != nil {
		b.cfg.Logger.Warn("bench dcaa: unpin", "err", err)
		return
	}
	for _, w := range b.w {
		if w.proc.Pid != 0 {
			if err := setAffinity(w.proc.Pid, all); err != nil {
				b.cfg.Logger.Warn("bench dcaa: unpin", "worker", w.name, "err", err)
			}
		}
	}
}

// saturationRun is one overhead run: records per CPU-second of the
// worker processes per copy (replica or k = 1 copy), records per second
// at the slower sink, what its sinks emitted beyond stable results, and
// each sink's stable output.
type saturationRun struct {
	perCPU, perSec float64
	// cpuUse is the CPU time of the worker processes per second of the
	// run and per copy.
	cpuUse           float64
	tentative, undos int
	rows             [][]string
}

// saturationCopies is how many copies of the query's work each
// saturation run does: k = 2 its two replicas, k = 1 two independent
// one-replica queries (see overhead).
const saturationCopies = 2

// saturation runs, on n records per source partition as fast as
// possible, the query with two replicas (k = 2), or two independent
// copies of it with one replica each (k = 1), every copy placed where
// that replica number runs (see overhead).
func (b *dcaaBench) saturation(ctx context.Context, k int, n int64, round int) (saturationRun, error) {
	var r saturationRun
	addrs := make([]string, len(b.w))
	for i, w := range b.w {
		addrs[i] = w.addr
	}
	// sinks[c] is the task id of copy c's sink; its worker is measured
	// for copy 0, peer for copy 1 (dcaaSaturationWhere).
	var (
		specs [dcaaProcesses][]runtime.TaskSpec
		sinks []string
	)
	add := func(q *queryspec.Query, where func(n *queryspec.Node, partition, replica int) int) error {
		s, err := specsFor(q, where, addrs)
		if err != nil {
			return err
		}
		for i := range specs {
			specs[i] = append(specs[i], s[i]...)
		}
		return nil
	}
	if k == 2 {
		q, err := dcaaQuery(b.nextName("dcaasat"), 2, b.cfg.X.String(), 0, n)
		if err != nil {
			return r, err
		}
		if err := add(q, dcaaSaturationWhere); err != nil {
			return r, err
		}
		sinks = []string{queryspec.TaskID(q.Name, "alerts", 0, 0), queryspec.TaskID(q.Name, "alerts", 0, 1)}
	} else {
		for c := range saturationCopies {
			q, err := dcaaQuery(b.nextName("dcaasat"), 1, b.cfg.X.String(), 0, n)
			if err != nil {
				return r, err
			}
			if err := add(q, func(n *queryspec.Node, p, _ int) int { return dcaaSaturationWhere(n, p, c) }); err != nil {
				return r, err
			}
			sinks = append(sinks, queryspec.TaskID(q.Name, "alerts", 0, 0))
		}
	}
	sinkWorkers := []int{measured, peer}
	cpu := func() (int64, error) {
		var sum int64
		for _, w := range b.w {
			r, err := w.call(ctx, request{Op: opCPU})
			if err != nil {
				return 0, err
			}
			sum += r.CPUNanos
		}
		return sum, nil
	}
	if b.cfg.ProfileDir != "" {
		for i, w := range b.w {
			path := filepath.Join(b.cfg.ProfileDir, fmt.Sprintf("k%d-round%d-%s.cpu", k, round, dcaaSaturationRoles[i]))
			if _, err := w.call(ctx, request{Op: opProfileStart, Spec: path}); err != nil {
				return r, err
			}
		}
	}
	before, err := cpu()
	if err != nil {
		return r, err
	}
	start := time.Now()
	for _, i := range []int{measured, peer, srcR1, srcR0} {
		b.specs[i] = specs[i]
		if _, err := b.w[i].call(ctx, request{Op: opApply, Tasks: specs[i]}); err != nil {
			return r, err
		}
	}
	for c, id := range sinks {
		if _, err := b.w[sinkWorkers[c]].call(ctx, request{Op: opEventsStart, Task: id}); err != nil {
			return r, err
		}
	}
	// A run that does not end is a finding, not a reason to wait forever.
	wctx, cancel := context.WithTimeout(ctx, dcaaSaturationTimeout)
	defer cancel()
	evs, err := b.wait(wctx, sinkWorkers...)
	if err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			return r, fmt.Errorf("%w: saturation run with %d replicas: the sinks did not see the end of the input within %v (%w)", ErrDCAABench, k, dcaaSaturationTimeout, err)
		}
		return r, err
	}
	after, err := cpu()
	if err != nil {
		return r, err
	}
	elapsed := time.Since(start)
	if b.cfg.ProfileDir != "" {
		for _, w := range b.w {
			if _, err := w.call(ctx, request{Op: opProfileStop}); err != nil {
				return r, err
			}
		}
	}
	for i, e := range evs {
		rate, err := sinkThroughput(e, n, start)
		if err != nil {
			return r, fmt.Errorf("%w: saturation run with %d replicas, sink %d: %w", ErrDCAABench, k, i, err)
		}
		if i == 0 || rate < r.perSec {
			r.perSec = rate
		}
		v, err := stableRows(e)
		if err != nil {
			return r, fmt.Errorf("%w: saturation run with %d replicas, sink %d: %w", ErrDCAABench, k, i, err)
		}
		r.tentative += v.tentative
		r.undos += v.undos
		r.rows = append(r.rows, v.rows)
	}
	if used := time.Duration(after - before); used > 0 {
		r.perCPU = saturationCopies * float64(n*dcaaMonitors) / used.Seconds()
		r.cpuUse = used.Seconds() / elapsed.Seconds() / saturationCopies
	}
	return r, nil
}

// dcaaSaturationRoles names the bench's worker processes in the
// saturation runs (profile file names): src0 and ops0 run replica (copy)
// 0, src1 and ops1 replica 1.
var dcaaSaturationRoles = [dcaaProcesses]string{srcR0: "src0", srcR1: "src1", peer: "ops1", measured: "ops0"}

// sinkThroughput is the input records per second a sink's stream shows
// in a saturation run of n records per source partition started at
// start: every record of the three source partitions over the time from
// the start to the sink's final boundary. (A window starting later in the
// run would be skewed by the output buffers, which let the sources run
// ahead of the sink by up to a buffer; the start-up, a few tens of
// milliseconds, is the same in both runs and small against the run.)
func sinkThroughput(evs []streamEvent, n int64, start time.Time) (float64, error) {
	for i := len(evs) - 1; i >= 0; i-- {
		if ev := evs[i]; ev.Type == tuple.Boundary && ev.STime == finalBoundary {
			d := time.Duration(ev.Nanos - start.UnixNano())
			if d <= 0 {
				return 0, fmt.Errorf("the final boundary came %v after the start", d)
			}
			return float64(n*dcaaMonitors) / d.Seconds(), nil
		}
	}
	return 0, errors.New("no final boundary")
}

func (b *dcaaBench) stop() {
	for _, w := range b.w {
		if w != nil {
			if err := w.proc.Stop(); err != nil {
				b.cfg.Logger.Warn("bench worker stop", "worker", w.name, "err", err)
			}
		}
	}
}

// stableView is what a run's events make of a sink's stream: the rows
// of its stable view in order (dcaa.StableView), and what else it carried.
type stableView struct {
	rows                       []string
	tentative, undos, recDones int
}

func stableRows(evs []streamEvent) (stableView, error) {
	var (
		v  dcaa.StableView
		sv stableView
	)
	for _, ev := range evs {
		t := tuple.Tuple{ID: ev.ID, Type: ev.Type, STime: ev.STime}
		if err := v.Add(&t); err != nil {
			sv.tentative, sv.undos, sv.recDones = v.Tentative, v.Undos, v.RecDones
			return sv, err
		}
	}
	sv.tentative, sv.undos, sv.recDones = v.Tentative, v.Undos, v.RecDones
	for _, i := range v.Stable() {
		if evs[i].Type == tuple.Stable {
			sv.rows = append(sv.rows, evs[i].Row)
		}
	}
	return sv, nil
}

// compareStable says where got first differs from want ("" when equal).
func compareStable(got, want []string) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("stable result %d: %s, reference %s", i, got[i], want[i])
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d stable results, reference %d", len(got), len(want))
	}
	return ""
}

// maxAddedLatency is the largest added latency of a run (see RunDCAA):
// over the reference's result stream times s, the largest lag(s) −
// normal, where lag(s) = answer(s) − s is how long after its stream time
// the measured sink first answered s, and normal is the median lag of
// the stream times answered before the failure began (at cut). Stream
// times are the generators' (record n at n/rate seconds), and the
// sources run at their rate from their start, so the lag is the start
// offset plus the pipeline's latency, steady without failures. A stream
// time never answered counts until the sink's last event; without any
// answer before the failure, the smallest lag of the run is the normal
// one.
func maxAddedLatency(evs []streamEvent, ref []string, cut time.Time) time.Duration {
	var stimes []int64
	for _, r := range ref {
		s, _, _ := strings.Cut(r, "|")
		var v int64
		if _, err := fmt.Sscan(s, &v); err == nil {
			stimes = append(stimes, v)
		}
	}
	sort.Slice(stimes, func(i, j int) bool { return stimes[i] < stimes[j] })
	stimes = slices.Compact(stimes)
	if len(evs) == 0 || len(stimes) == 0 {
		return 0
	}
	at := answers(evs, stimes)
	var before, all []int64
	for i, s := range stimes {
		if at[i] == 0 {
			continue
		}
		all = append(all, at[i]-s)
		if at[i] < cut.UnixNano() {
			before = append(before, at[i]-s)
		}
	}
	if len(all) == 0 {
		return time.Duration(evs[len(evs)-1].Nanos - evs[0].Nanos)
	}
	// Without answers before the failure (the output was stalled from
	// the start), the smallest lag of the run stands for the normal one:
	// that can only make the added latency larger.
	normal := slices.Min(all)
	if len(before) > 0 {
		slices.Sort(before)
		normal = before[len(before)/2]
	}
	var worst time.Duration
	for i, s := range stimes {
		a := at[i]
		if a == 0 {
			a = evs[len(evs)-1].Nanos
		}
		worst = max(worst, time.Duration(a-s-normal))
	}
	return worst
}

// answers returns, for each of the increasing stream times, the wall time
// of the first result (stable or tentative) in evs with a stream time at
// or above it (0: none).
func answers(evs []streamEvent, stimes []int64) []int64 {
	out := make([]int64, len(stimes))
	i := 0
	for _, ev := range evs {
		if !ev.Type.IsData() {
			continue
		}
		for i < len(stimes) && stimes[i] <= ev.STime {
			out[i] = ev.Nanos
			i++
		}
	}
	return out
}

// dcaaFloors checks issue 10's floors on a result.
func dcaaFloors(res *DCAAResult, failures, switched, overhead bool) []DCAAFloor {
	var floors []DCAAFloor
	add := func(name string, holds bool, format string, args ...any) {
		floors = append(floors, DCAAFloor{Name: name, Holds: holds, Detail: fmt.Sprintf(format, args...)})
	}
	zero, bound, latency, stable := true, true, true, true
	var zeroD, boundD, latD, stableD []string
	for _, r := range res.Rows {
		if !r.StableMatchesReference {
			stable = false
			stableD = append(stableD, fmt.Sprintf("%s %gX", r.Strategy, r.DOverX))
		}
		if r.Strategy != StrategyDCAA {
			continue
		}
		if r.DOverX < 0.9 {
			zero = zero && r.Tentative == 0
			zeroD = append(zeroD, fmt.Sprintf("%gX: %d", r.DOverX, r.Tentative))
		}
		if r.DOverX > 1 {
			bound = bound && float64(r.Tentative) <= r.TentativeBound
			boundD = append(boundD, fmt.Sprintf("%gX: %d <= %.0f", r.DOverX, r.Tentative, r.TentativeBound))
		}
		latency = latency && r.MaxAddedLatencyMs <= res.XMs+res.BoundaryMs
		latD = append(latD, fmt.Sprintf("%gX: %.0f", r.DOverX, r.MaxAddedLatencyMs))
	}
	if failures {
		add("zero tentative for D < 0.9X (dcaa)", zero, "%s", strings.Join(zeroD, ", "))
		add("tentative <= 1.1 x rate x (D - 0.9X) for D > X (dcaa)", bound, "%s", strings.Join(boundD, ", "))
		add("max added latency <= X + one boundary interval (dcaa)", latency, "bound %.0f ms; %s", res.XMs+res.BoundaryMs, strings.Join(latD, ", "))
		add("stable output matches the reference in every row", stable, "rows differing: %d %s", len(stableD), strings.Join(stableD, ", "))
	}
	if switched {
		add("switch_ms <= 2 boundary intervals", res.SwitchMs <= 2*res.BoundaryMs, "%.0f ms, bound %.0f ms", res.SwitchMs, 2*res.BoundaryMs)
	}
	if overhead {
		switch {
		case res.OverheadMethod == OverheadDCAAPaired:
			busy, why := min(res.K1CPUUse, res.K2CPUUse) < minSideCPUUse, ""
			if busy {
				why = fmt.Sprintf(", below %g: the machine was too busy, not shown", minSideCPUUse)
			}
			decided := "the interval holds 10%: undecided"
			switch lo, hi := res.ReplicationOverhead-res.ReplicationOverheadCI95, res.ReplicationOverhead+res.ReplicationOverheadCI95; {
			case res.ReplicationOverheadCI95 < 0:
			case hi <= 0.10:
				decided = "the interval lies below 10%"
			case lo > 0.10:
				decided = "the interval lies above 10%"
			}
			add("replication overhead <= 10%", res.ReplicationOverhead <= 0.10 && !busy && *res.SaturationOutputsMatch, "%.1f%% +- %.1f%% (95%% interval, %s; %s, %d rounds; CPU use per copy %.2f and %.2f%s; outputs match: %t)",
				res.ReplicationOverhead*100, res.ReplicationOverheadCI95*100, decided, res.OverheadMethod, len(res.OverheadPairedRounds), res.K1CPUUse, res.K2CPUUse, why, *res.SaturationOutputsMatch)
		case res.SaturationOutputsMatch == nil:
			// Side by side, a figure from sides that did not get their
			// CPU says nothing either way (see overheadSide): not shown.
			busy, why := min(res.K1CPUUse, res.K2CPUUse) < minSideCPUUse, ""
			if busy {
				why = fmt.Sprintf(", below %g: the machine was too busy, not shown", minSideCPUUse)
			}
			add("replication overhead <= 10%", res.ReplicationOverhead <= 0.10 && !busy, "%.1f%% +- %.1f%% (95%% interval; %s, %d windows; CPU use per copy %.2f and %.2f%s)",
				res.ReplicationOverhead*100, res.ReplicationOverheadCI95*100, res.OverheadMethod, len(res.OverheadWindows), res.K1CPUUse, res.K2CPUUse, why)
		default:
			add("replication overhead <= 10%", res.ReplicationOverhead <= 0.10 && *res.SaturationOutputsMatch, "%.1f%% (%s; outputs match: %t)", res.ReplicationOverhead*100, res.OverheadMethod, *res.SaturationOutputsMatch)
		}
	}
	return floors
}
