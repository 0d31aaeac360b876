package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/runtime"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrReconfigBench means the reconfiguration benchmark could not produce
// a measurement (a task failed, a plan did not complete in time).
var ErrReconfigBench = errors.New("benchmark: reconfig")

// The hospital scenario: patient vitals from Sources partitions (32
// patients each) at Rate records/s each. scored (fused into the sources)
// scores sepsis, flag (its own task, reading every partition) labels
// the result. Version N of scored uses the SIRS criteria when N is odd,
// qSOFA when even, and marks its output cN; version N of flag expects cN
// and labels the tuple vN, MIXED otherwise: the two depend on each other,
// so a tuple that met scored and flag of different versions shows.
const reconfigBenchYAML = `name: %s
sources:
  - name: ward
    parallelism: %d
    schema: {time: timestamp, patient: string, temperature: float, heart_rate: int, resp_rate: int, bp_sys: int, bp_dia: int}
    generator: {kind: vitals, rate: %d, seed: 11, limit: %d}
operators:
  - name: scored
    type: map
    input: ward
    parallelism: %d
    fields: {time: time, patient: patient, score: "%s", crit: "'c%d'"}
  - name: flag
    type: map
    input: scored
    fields: {time: time, patient: patient, score: score, sepsis: "score >= 2", path: "crit == 'c%d' ? 'v%d' : 'MIXED'"}
sinks:
  - {name: alerts, input: flag}
`

const (
	sirsScore  = "(temperature > 38.0 || temperature < 36.0 ? 1 : 0) + (heart_rate > 90 ? 1 : 0) + (resp_rate > 20 ? 1 : 0)"
	qsofaScore = "(resp_rate >= 22 ? 1 : 0) + (bp_sys <= 100 ? 1 : 0)"
)

func reconfigBenchQuery(sources, rate int, limit int64, v int) string {
	return ReconfigQuery("sepsis", sources, rate, limit, v)
}

// ReconfigQuery is the hospital scenario's query named name in version
// v of its two dependent operators: sources partitions of 32 patients,
// rate vitals/s each (0: as fast as possible), limit records each.
func ReconfigQuery(name string, sources, rate int, limit int64, v int) string {
	score := sirsScore
	if v%2 == 0 {
		score = qsofaScore
	}
	return fmt.Sprintf(reconfigBenchYAML, name, sources, rate, limit, sources, score, v, v, v)
}

// ReconfigConfig configures RunReconfig.
type ReconfigConfig struct {
	// Sources and Rate: source partitions and records/s each (default
	// 10 x 1500 = 15,000/s, 320 patients).
	Sources int
	Rate    int
	// Updates per strategy (default 3), one every Spacing (default 1.5s)
	// after a Warmup (default 2s).
	Updates int
	Spacing time.Duration
	Warmup  time.Duration
	// Margin is the live strategy's switch margin (default 100ms).
	Margin time.Duration
	// OverheadRecords per source partition in each unpaced overhead run
	// (default 40,000).
	OverheadRecords int64
	// ThroughputRuns runs of each tracking mode (default 3); in an org
	// (the default of `bench reconfig`) each measures CPU time per result
	// over ThroughputWindow (default 3s) after ThroughputSettle (default
	// 1s).
	ThroughputRuns   int
	ThroughputWindow time.Duration
	ThroughputSettle time.Duration
	Logger           *slog.Logger
	Progress         io.Writer
	// Around, when set, is called just before the first live update
	// with how long before it that is, and returns a function called
	// about a second after it (the org benchmark's --trace: an
	// execution trace of the update).
	Around func(lead time.Duration) (end func())
	// Stalls (org runs) samples every task and the process every 10 ms
	// and reports each gap of 100 ms or more at the sink
	// (StrategyResult.Stalls); StallTrace, when set, also keeps a flight
	// recorder and writes the first such gap's execution trace there.
	Stalls     bool
	StallTrace string
	// DipWindow is the window of the dip statistic at fine resolution
	// (StrategyResult.DipWindow; default 1s, at most a third of Spacing).
	DipWindow time.Duration
	// WakeAB (org runs): every other live update runs with the paced
	// sources' wake for a plan off (runtime.SetReconfigWake), so that one
	// run measures what it saves (ReconfigResult.WakeAB).
	WakeAB bool
	// SecondRate (org runs), when not 0, runs both strategies again with
	// each source partition at this rate; SecondRateFraction, when not 0,
	// at this fraction of the scenario's unpaced throughput measured
	// first (ReconfigResult.SecondRate).
	SecondRate         int
	SecondRateFraction float64
	// Only (org runs), when not empty, names the parts to run (live,
	// quiescent, overhead, reconnect); the others are left out of the
	// result. OverheadProfile, when set, is the prefix of a CPU profile
	// of each tracking mode's first overhead window (PREFIX-off.pprof,
	// PREFIX-static.pprof, PREFIX-dynamic.pprof).
	Only            []string
	OverheadProfile string
	// OverheadMethod (org runs) is how the tracking overhead is measured:
	// OverheadSideBySide (the default) or OverheadSequential.
	// OverheadWindows windows of ThroughputWindow each make a side-by-side
	// round (default 8).
	OverheadMethod  string
	OverheadWindows int
}

// The org benchmark's ways of measuring the tracking overhead.
const (
	// OverheadSideBySide runs the three modes at once, as three copies
	// of the query in the same org, and splits the process's CPU by
	// query with a labelled CPU profile: the machine's and the process's
	// changes hit the three alike.
	OverheadSideBySide = "side-by-side"
	// OverheadSequential runs the modes one after the other and compares
	// the process's CPU time per result (CostRun).
	OverheadSequential = "sequential"
)

// dipWindow is the dip statistic's window for a spacing of the updates.
func (c *ReconfigConfig) dipWindow() time.Duration {
	w := c.DipWindow
	if w <= 0 {
		w = time.Second
	}
	return min(w, c.Spacing/3)
}

// DipWindowFor is the window the dip statistic uses with cfg (its
// defaults filled).
func DipWindowFor(cfg ReconfigConfig) time.Duration { return cfg.dipWindow() }

// Defaults fills the zero fields with their defaults.
func (c *ReconfigConfig) Defaults() {
	if c.ThroughputRuns <= 0 {
		c.ThroughputRuns = 3
	}
	if c.ThroughputWindow <= 0 {
		c.ThroughputWindow = 3 * time.Second
	}
	if c.ThroughputSettle <= 0 {
		c.ThroughputSettle = time.Second
	}
	if c.OverheadMethod == "" {
		c.OverheadMethod = OverheadSideBySide
	}
	if c.OverheadWindows <= 0 {
		c.OverheadWindows = 8
	}
	if c.Sources <= 0 {
		c.Sources = 10
	}
	if c.Rate <= 0 {
		c.Rate = 1500
	}
	if c.Updates <= 0 {
		c.Updates = 3
	}
	if c.Spacing <= 0 {
		c.Spacing = 1500 * time.Millisecond
	}
	if c.Warmup <= 0 {
		c.Warmup = 2 * time.Second
	}
	if c.Margin <= 0 {
		c.Margin = 100 * time.Millisecond
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.OverheadRecords <= 0 {
		c.OverheadRecords = 40000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// StrategyResult is one strategy's figures. Times are milliseconds.
type StrategyResult struct {
	// UpdateMs: live, plan given to the tasks -> every task acknowledged
	// (versions loaded beside the old ones; in an org, the leader holds
	// every acknowledgement, the Raft write recording them follows);
	// quiescent, in an org, plan
	// committed -> the first result of the new configuration at the sink
	// (paused, drained, swapped and resumed: ResumedMs), in process, pause
	// -> resume.
	UpdateMsP50 float64 `json:"update_ms_p50"`
	UpdateMsMax float64 `json:"update_ms_max"`
	// ThroughputDip is 1 - (worst 100 ms bucket of sink results in the
	// second after an update) / (mean bucket of the second before), the
	// worst over the updates.
	ThroughputDip float64 `json:"throughput_dip"`
	// ThroughputDipControl is the same statistic taken a second before
	// each update (where the spacing leaves room), where nothing changes:
	// the noise of 100 ms buckets on this machine (-1: not measured).
	ThroughputDipControl float64 `json:"throughput_dip_control"`
	LatencyP99MsDuring   float64 `json:"latency_p99_ms_during"`
	LatencyP99MsBefore   float64 `json:"latency_p99_ms_before"`
	// Per update in an org, from the plan's commit in Raft: when the
	// first task's acknowledgement was applied, when the last one's was
	// (the plan switched), and when the plan completed.
	FirstAckMs []float64 `json:"first_ack_ms,omitempty"`
	SwitchedMs []float64 `json:"switched_ms,omitempty"`
	CompleteMs []float64 `json:"complete_ms,omitempty"`
	// AcksReceivedMs (in an org), per update: from the plan's commit in
	// Raft until the leader had received every task's acknowledgement,
	// before the Raft write recording the last of them (SwitchedMs is
	// when that write was applied).
	AcksReceivedMs []float64 `json:"acks_received_ms,omitempty"`
	// AckWriteMs (in an org), per update: from the plan's commit until
	// the first Raft write of reports began after every acknowledgement
	// was received (SwitchedMs - AckWriteMs is that write: a log append
	// with its fsync, then the state machine).
	AckWriteMs []float64 `json:"ack_write_ms,omitempty"`
	// LearnedMs and AppliedMs (in an org), per update: from the plan's
	// commit in Raft until the last worker began, and finished, handing
	// its tasks the plan (Apply: the configuration parsed, the changed
	// versions built, installed in the idle tasks); ApplyMs is the
	// longest such Apply.
	LearnedMs []float64 `json:"learned_ms,omitempty"`
	AppliedMs []float64 `json:"applied_ms,omitempty"`
	ApplyMs   []float64 `json:"apply_ms,omitempty"`
	// RequestMs (in an org), per update: from the benchmark's UpdateQuery
	// call until the plan's commit in Raft (validation and the plan's
	// Raft write; not part of the update time).
	RequestMs []float64 `json:"request_ms,omitempty"`
	// ResumedMs (quiescent, in an org), per update: from the plan's
	// commit in Raft until the first result of the new configuration
	// reached the sink: the sources paused, the stream drained, the
	// versions swapped and the stream resumed under them, as the
	// consumer sees it. It is the quiescent update_ms.
	ResumedMs []float64 `json:"resumed_ms,omitempty"`
	// SourcesPausedMs, SourcesStoppedMs and SourcesResumedMs (quiescent,
	// in an org), per update, from the plan's commit in Raft: when the
	// last source paused (it learned the plan while it loaded), when the
	// last one held at its marker (it produced up to the cut; nothing
	// more enters the stream) and when the last one resumed under the
	// new versions (the plan complete: every task had every marker, so
	// everything produced before was processed through the sinks, and
	// the old versions were removed). SourcesResumedMs is the quiescent
	// update_ms: the textbook span pause, drain, swap, resume, over the
	// same span as the live one (plan committed -> every task runs the
	// new versions).
	SourcesPausedMs  []float64 `json:"sources_paused_ms,omitempty"`
	SourcesStoppedMs []float64 `json:"sources_stopped_ms,omitempty"`
	SourcesResumedMs []float64 `json:"sources_resumed_ms,omitempty"`
	// InFlight (quiescent, in an org), per update: the results of the old
	// configuration that reached the benchmark's consumer after the last
	// source paused: what the pause had to drain (each source tuple gives
	// one result in this scenario); DrainMs how long after the last
	// source paused the last of them arrived.
	InFlight []int     `json:"in_flight_results,omitempty"`
	DrainMs  []float64 `json:"drain_ms,omitempty"`
	// ReceivedMs and ReportedMs (in an org), per update, from the plan's
	// commit in Raft: when the last worker's assignment watch returned
	// the plan, and when the last worker sent the report carrying its
	// last task's acknowledgement of it.
	ReceivedMs []float64 `json:"received_ms,omitempty"`
	ReportedMs []float64 `json:"reported_ms,omitempty"`
	// WatchWokeMs and WatchBuiltMs (in an org), per update, from the
	// plan's commit in Raft: when the coordinator's assignment watch of
	// the last worker it served the plan to woke, and when it had built
	// that response (its transfer to the worker is ReceivedMs -
	// WatchBuiltMs, about).
	WatchWokeMs  []float64 `json:"watch_woke_ms,omitempty"`
	WatchBuiltMs []float64 `json:"watch_built_ms,omitempty"`
	// InstalledMs (in an org), per update, from the plan's commit in
	// Raft: when the last task had installed the plan's versions (ready
	// for the new configuration's tuples), before its acknowledgement
	// was reported and written to Raft.
	InstalledMs []float64 `json:"installed_ms,omitempty"`
	// SourceWake (org runs with --wake-ab), per update: whether paced
	// sources were woken to install the plan (see ReconfigResult.WakeAB).
	SourceWake []bool `json:"source_wake,omitempty"`
	// DipWindow is the throughput dip over longer windows, averaged over
	// the updates with a confidence interval (see ReconfigDip): the
	// figure with a resolution finer than the 0.2 % target, beside
	// ThroughputDip, the 100 ms statistic.
	DipWindow *ReconfigDip `json:"dip_window,omitempty"`
	// LongestGapMs is the longest time without a result at the sink
	// from an update until a second after its plan completed, the worst
	// over the updates (org runs only).
	LongestGapMs float64 `json:"longest_gap_ms,omitempty"`
	// Buckets are the results per 100 ms and their p99 latency, for the
	// plot; UpdatesAtMs when each update began (ms from the run's start).
	Buckets     []ReconfigBucket `json:"buckets,omitempty"`
	UpdatesAtMs []float64        `json:"updates_at_ms,omitempty"`
	Mixed       int              `json:"mixed_version_tuples"`
	// LostOrDup: results duplicated, not in the reference, or missing
	// at the consumer beyond Undelivered (see LostOrDuplicated).
	LostOrDup int `json:"lost_or_duplicated"`
	// MissingAtConsumer is how many results of the reference the
	// consumer did not receive, and Undelivered how many tuples of the
	// sink's result stream it never read (its ring dropped them while
	// the consumer was behind: the stream produced them). Both are 0
	// when the consumer kept up.
	MissingAtConsumer int            `json:"missing_at_consumer,omitempty"`
	Undelivered       int            `json:"undelivered,omitempty"`
	Paths             map[string]int `json:"paths"`
	// Stalls (org runs with --stalls) are the gaps of 100 ms or more
	// between two sink arrivals over the whole run, each with what the
	// process and every task did meanwhile.
	Stalls []ReconfigStall `json:"stalls,omitempty"`
	// The steady condition the strategy's query was in before its first
	// update (org runs), so that the strategies compare fairly: a
	// quiescent update drains what is in flight. LagBeforeMs* are the
	// median and p99 over the second before the first update of each
	// result's arrival at the consumer after the wall-clock time its
	// stream time was due (the query's pacing origin + stime: the
	// pipeline's lag); PaceSpreadMs is the spread of the source
	// partitions' pacing anchors (TaskStats.PaceOrigin), 0 when they
	// share the query's origin.
	LagBeforeMsP50 float64 `json:"lag_before_ms_p50,omitempty"`
	LagBeforeMsP99 float64 `json:"lag_before_ms_p99,omitempty"`
	PaceSpreadMs   float64 `json:"pace_spread_ms"`
	// FirstResultMs is when the first result reached the consumer, from
	// the query's submission (about its pacing origin): how late its
	// tasks started, which its sources then catch up on.
	FirstResultMs float64 `json:"first_result_ms,omitempty"`
	// Breakdown (org runs): the medians over the updates of the phases
	// of an update, from the plan's commit in Raft.
	Breakdown *UpdateBreakdown `json:"breakdown,omitempty"`
}

// UpdateBreakdown is where an update's time goes (org runs): medians
// over the updates, milliseconds from the plan's commit in Raft (as the
// benchmark's watch of the coordinator's state saw it).
type UpdateBreakdown struct {
	// Received: the last worker's assignment watch returned the plan
	// (the coordinator's watch fired, the view built and sent);
	// Learned: the last worker began handing its tasks the plan (the
	// view parsed); Installed: the last task had installed the plan's
	// versions; Reported: the last worker sent the report carrying its
	// last task's acknowledgement; AcksReceived: the leader had every
	// task's acknowledgement (the live update_ms); Switched: the Raft
	// write recording the last of them applied. RaftWrite is the median
	// of Switched - AcksReceived per update, split into RaftWaitMs (until
	// the write began: AckWriteMs - AcksReceived) and RaftCommitMs (the
	// write: Switched - AckWriteMs).
	// WatchWoke and WatchBuilt: the coordinator's assignment watch of
	// the last worker served woke, and had built the response, with the
	// plan (before Received).
	WatchWokeMs  float64 `json:"watch_woke_ms"`
	WatchBuiltMs float64 `json:"watch_built_ms"`
	ReceivedMs   float64 `json:"received_ms"`
	LearnedMs    float64 `json:"learned_ms"`
	InstalledMs  float64 `json:"installed_ms"`
	ReportedMs   float64 `json:"reported_ms"`
	// RequestMs: from the UpdateQuery call to the commit (not part of
	// the update time).
	RequestMs      float64 `json:"request_ms"`
	AcksReceivedMs float64 `json:"acks_received_ms"`
	SwitchedMs     float64 `json:"switched_ms"`
	RaftWriteMs    float64 `json:"raft_write_ms"`
	RaftWaitMs     float64 `json:"raft_wait_ms"`
	RaftCommitMs   float64 `json:"raft_commit_ms"`
}

// ReconfigStall is a gap at the sink and what happened during it, from
// samples every 10 ms (times in ms since the run's start).
type ReconfigStall struct {
	AtMs  float64 `json:"at_ms"`
	GapMs float64 `json:"gap_ms"`
	// SampledMs is the time the CPU figures below cover (read every 50
	// ms and after a late tick: from the last reading before the gap to
	// the first after it); SamplerLateMs the longest delay of the
	// sampler's own 10 ms tick during the gap: a goroutine that only
	// sleeps and reads counters, late only when the process got no CPU.
	SampledMs     float64 `json:"sampled_ms"`
	SamplerLateMs float64 `json:"sampler_late_ms"`
	// ProcessCPUMs is the CPU time the process's threads got, and
	// RunQueueWaitMs the time they were runnable but waiting for a CPU
	// (summed over threads; schedstat); MachineIdleMs and MachineStealMs
	// the idle time of all CPUs and the time the hypervisor ran something
	// else on them.
	ProcessCPUMs   float64 `json:"process_cpu_ms"`
	RunQueueWaitMs float64 `json:"run_queue_wait_ms"`
	MachineIdleMs  float64 `json:"machine_idle_ms"`
	MachineStealMs float64 `json:"machine_steal_ms"`
	// GCCycles is the number of garbage collections the process
	// completed meanwhile.
	GCCycles int `json:"gc_cycles"`
	// Starved: the process waited for a CPU (its sampler late by half
	// the gap or more, or on average two of its threads runnable but
	// waiting the whole time while the machine had no idle time to speak
	// of), rather than a stage of the stream waiting on another.
	Starved bool                `json:"starved"`
	Tasks   []ReconfigStallTask `json:"tasks,omitempty"`
	Note    string              `json:"note,omitempty"`
}

// ReconfigStallTask is one task during a stall: its longest stretch
// without emitting a tuple (a sink: without taking one) and when it
// began, the time it was blocked on a full output, its largest input
// queue and, merging several inputs, the one it waited for.
type ReconfigStallTask struct {
	Task       string  `json:"task"`
	FlatFromMs float64 `json:"flat_from_ms"`
	FlatMs     float64 `json:"flat_ms"`
	BlockedMs  float64 `json:"blocked_ms"`
	QueueMax   int     `json:"queue_max"`
	// GateSpreadMs (a merging task) is the widest spread, in stream
	// time, between its inputs' latest boundaries during the gap, and
	// GateInput the input then lowest: the one the release waited for.
	GateSpreadMs float64 `json:"gate_spread_ms,omitempty"`
	GateInput    string  `json:"gate_input,omitempty"`
}

// ReconfigBucket is 100 ms of sink results.
type ReconfigBucket struct {
	AtMs      float64 `json:"at_ms"`
	Tuples    int     `json:"tuples"`
	LatencyMs float64 `json:"latency_p99_ms"`
}

// ReconfigResult is what `bench reconfig --json` prints.
type ReconfigResult struct {
	Live      StrategyResult `json:"live"`
	Quiescent StrategyResult `json:"quiescent"`
	// Overheads: 1 - throughput with tracking (a completed plan, every
	// stateless operator versioned) / throughput without, unpaced sources.
	OverheadStatic  float64 `json:"overhead_static"`
	OverheadDynamic float64 `json:"overhead_dynamic"`
	// OverheadBasis says how the overheads were measured. In an org:
	// the process's CPU time per sink result at the scenario's paced
	// rate, CPUMicrosPerResultOff with tracking off (the overhead is 1 -
	// that over the same with tracking: the throughput lost when the CPU
	// is the limit), which a machine shared with other work measures far
	// more steadily than an unpaced run's throughput.
	OverheadBasis         string  `json:"overhead_basis,omitempty"`
	CPUMicrosPerResultOff float64 `json:"cpu_us_per_result_off,omitempty"`
	// OverheadRuns (org runs) is every measured run, in order;
	// OverheadStaticRounds and OverheadDynamicRounds each round's own
	// overhead (1 - off/tracking of the round's last run of each mode).
	OverheadRuns          []CostRun `json:"overhead_runs,omitempty"`
	OverheadStaticRounds  []float64 `json:"overhead_static_rounds,omitempty"`
	OverheadDynamicRounds []float64 `json:"overhead_dynamic_rounds,omitempty"`
	// OverheadStaticCI95 and OverheadDynamicCI95 (side by side) are the
	// half-widths of the overheads' 95 % confidence intervals (-1 with
	// fewer than two windows);
	// OverheadWindows every window, OverheadPlacements each round's
	// placement of each mode's tasks.
	OverheadStaticCI95  float64      `json:"overhead_static_ci95,omitempty"`
	OverheadDynamicCI95 float64      `json:"overhead_dynamic_ci95,omitempty"`
	OverheadWindows     []SideWindow `json:"overhead_windows,omitempty"`
	OverheadPlacements  []string     `json:"overhead_placements,omitempty"`
	// OverheadWarmupWindows (side by side) counts the leading windows
	// left out because some process had not kept pace yet.
	OverheadWarmupWindows int `json:"overhead_warmup_windows"`
	// OverheadSteadyRounds counts the rounds whose three runs were
	// steady (CostRun.Steady): the overheads are the median over those,
	// or over every round when there is none.
	OverheadSteadyRounds int `json:"overhead_steady_rounds"`
	// ReconnectMs: an upstream cut off during an update is healed; from
	// then until the task behind the cut has all its markers.
	ReconnectMs float64 `json:"reconnect_ms"`
	// ReconnectCutMs is how long the link was cut (org runs): what piled
	// up meanwhile is processed within ReconnectMs.
	ReconnectCutMs float64 `json:"reconnect_cut_ms,omitempty"`
	// Reconnect (org runs) is where the reconnect's time went.
	Reconnect *ReconnectPhases `json:"reconnect,omitempty"`
	// SecondRate (org runs with --second-rate) is both strategies again
	// at another rate, near the pipeline's capacity: the data in flight,
	// which a quiescent pause has to drain, grows with the load.
	SecondRate *ReconfigSecondRate `json:"second_rate,omitempty"`
	// WakeAB (org runs with --wake-ab) compares the live updates with the
	// paced sources' wake for a plan on and off, in the same run.
	WakeAB *ReconfigWakeAB `json:"wake_ab,omitempty"`
	// Over both strategies' runs (and the second rate's).
	MixedVersionTuples int `json:"mixed_version_tuples"`
	LostOrDuplicated   int `json:"lost_or_duplicated"`
	// Undelivered: tuples of the sink's results the benchmark's consumer
	// never read (it fell behind and the sink's ring dropped them); not
	// counted as lost (StrategyResult.Undelivered). 0 when it kept up.
	Undelivered int `json:"undelivered"`
	// FsyncMsP50 (org runs) is the median of 200 4-KiB writes each
	// followed by an fsync in the org's data directory, measured in the
	// run: the floor of one Raft write on this disk (a bbolt commit
	// syncs twice).
	FsyncMsP50 float64 `json:"fsync_ms_p50,omitempty"`
	// HopLive (org runs) is the floor of a live update's two messages,
	// measured in this process while the live strategy's stream ran
	// (see HopBaseline).
	HopLive *HopBaseline `json:"hop_baseline_live,omitempty"`
	// Scope says what the figures measure (in-process runtimes, plan
	// phases driven directly, no Raft).
	Scope string `json:"scope"`
}

// ReconnectPhases is the org benchmark's reconnect: the link from the
// worker running flag to one running source partitions was cut for
// CutMs (the plan committed, loaded and switched meanwhile, every source
// past its marker); from when it returned: FirstBytesMs until flag's
// worker read from the sources' worker again (redialled, subscribed),
// FlagMs until every flag task had the plan's markers, CompleteMs until
// every task had (ReconnectMs), each read once a millisecond.
type ReconnectPhases struct {
	CutMs        float64 `json:"cut_ms"`
	FirstBytesMs float64 `json:"first_bytes_ms"`
	FlagMs       float64 `json:"flag_ms"`
	CompleteMs   float64 `json:"complete_ms"`
	// ObserverMs is the time the benchmark spent reading the tasks'
	// levels meanwhile (once a millisecond).
	ObserverMs    float64 `json:"observer_ms"`
	ObserverReads int     `json:"observer_reads"`
}

// CostRun is one run of the org benchmark's tracking overhead: Mode
// (off, static, dynamic) measured Order-th in round Round. Its window is
// a stretch of stream time at the sink (ThroughputWindow long): Results
// of that stretch, WindowMs the wall time they took to arrive, CPUMs the
// process's CPU time meanwhile (getrusage), IdleGCMs the part of it the
// garbage collector's idle mark workers took (the Go runtime's estimate:
// marking on a core with nothing else to run, which a process short of
// CPU does not do, and which varies with how idle the process was), and
// MicrosPerResult (CPUMs - IdleGCMs) / Results, the figure the overheads
// compare. Steady: the window's wall time was within 5 % of its stretch
// of stream time (the pipeline kept pace). What could explain an outlier: GCCycles in the window,
// AllocBytesPerResult, IdleCPUPct the process's CPU (percent of one core)
// while the org ran no query just before the run (the tail of the
// previous run's teardown), OtherTasks tasks of other queries running at
// the window's start, and Placement the worker of each task (per
// fragment, in task id order).
type CostRun struct {
	Mode  string `json:"mode"`
	Round int    `json:"round"`
	Order int    `json:"order"`
	// Attempt counts the runs of the mode in the round before this one
	// (a run that was not Steady is run again, up to three times; the
	// round uses the last).
	Attempt         int     `json:"attempt"`
	Steady          bool    `json:"steady"`
	Results         int     `json:"results"`
	WindowMs        float64 `json:"window_ms"`
	CPUMs           float64 `json:"cpu_ms"`
	IdleGCMs        float64 `json:"idle_gc_ms"`
	MicrosPerResult float64 `json:"cpu_us_per_result"`
	GCCycles        int     `json:"gc_cycles"`
	// AllocBytesPerResult is the bytes the process allocated per result.
	AllocBytesPerResult float64 `json:"alloc_bytes_per_result"`
	IdleCPUPct          float64 `json:"idle_cpu_pct"`
	OtherTasks          int     `json:"other_tasks"`
	Placement           string  `json:"placement"`
}

// SideWindow is one window of wall time of a side-by-side overhead
// round (Windows consecutive windows merged, until every process had kept
// pace): per mode (off, static, dynamic), the CPU time its process took
// (CPUMs), the results its sink delivered to the benchmark (Results),
// MicrosPerResult the one over the other, AllocPerResult the bytes the
// process allocated per result; Static and Dynamic the window's overheads
// (1 - off's MicrosPerResult / the mode's).
type SideWindow struct {
	Round           int                `json:"round"`
	Windows         int                `json:"windows"`
	AllocPerResult  map[string]float64 `json:"alloc_bytes_per_result"`
	CPUMs           map[string]float64 `json:"cpu_ms"`
	Results         map[string]int     `json:"results"`
	MicrosPerResult map[string]float64 `json:"cpu_us_per_result"`
	Static          float64            `json:"static"`
	Dynamic         float64            `json:"dynamic"`
}

// ReconfigSecondRate is the comparison at a second rate.
type ReconfigSecondRate struct {
	// RatePerSource is the vitals/s of each source partition, ResultsPerS
	// the scenario's total; CapacityResultsPerS the capacity it was
	// derived from (0 when the rate was given): the highest paced rate
	// the pipeline sustained end to end, found by CapacityProbe's steps
	// (JudgeCapacityStep).
	RatePerSource       int            `json:"rate_per_source"`
	ResultsPerS         int            `json:"results_per_s"`
	CapacityResultsPerS float64        `json:"capacity_results_per_s,omitempty"`
	CapacityProbe       []CapacityStep `json:"capacity_probe,omitempty"`
	Live                StrategyResult `json:"live"`
	Quiescent           StrategyResult `json:"quiescent"`
	// Error says why the second rate's runs did not finish (the first
	// rate's figures stand).
	Error string `json:"error,omitempty"`
}

// ReconfigWakeAB is the live update with the paced sources' wake for a
// plan on and off, alternating in one run: medians (ms) of each half and
// their ratio on/off.
type ReconfigWakeAB struct {
	UpdatesOn        int     `json:"updates_on"`
	UpdatesOff       int     `json:"updates_off"`
	UpdateMsP50On    float64 `json:"update_ms_p50_on"`
	UpdateMsP50Off   float64 `json:"update_ms_p50_off"`
	UpdateRatio      float64 `json:"update_ratio"`
	InstalledMsP50On float64 `json:"installed_ms_p50_on"`
	InstalledP50Off  float64 `json:"installed_ms_p50_off"`
	InstalledRatio   float64 `json:"installed_ratio"`
}

// WakeABOf summarises a live result run with --wake-ab (nil without):
// its update time is SwitchedMs.
func WakeABOf(s StrategyResult) *ReconfigWakeAB {
	took := s.SwitchedMs
	if len(s.SourceWake) == 0 || len(s.SourceWake) != len(took) {
		return nil
	}
	var on, off, ion, ioff []float64
	for i, w := range s.SourceWake {
		if w {
			on = append(on, took[i])
		} else {
			off = append(off, took[i])
		}
		if i < len(s.InstalledMs) {
			if w {
				ion = append(ion, s.InstalledMs[i])
			} else {
				ioff = append(ioff, s.InstalledMs[i])
			}
		}
	}
	ab := &ReconfigWakeAB{UpdatesOn: len(on), UpdatesOff: len(off), UpdateMsP50On: median(on), UpdateMsP50Off: median(off),
		InstalledMsP50On: median(ion), InstalledP50Off: median(ioff)}
	if ab.UpdateMsP50Off > 0 {
		ab.UpdateRatio = ab.UpdateMsP50On / ab.UpdateMsP50Off
	}
	if ab.InstalledP50Off > 0 {
		ab.InstalledRatio = ab.InstalledMsP50On / ab.InstalledP50Off
	}
	return ab
}

// reconfigCluster runs the scenario's tasks on three in-process runtimes
// with data-plane servers on loopback: source partitions alternate
// between workers 0 and 1, flag and the sink on worker 2, which dials
// through faults.
type reconfigCluster struct {
	cfg     ReconfigConfig
	limit   int64
	q       *queryspec.Query
	plan    *queryspec.Plan
	rts     [3]*runtime.Runtime
	addrs   [3]string
	srvs    [3]*grpc.Server
	pools   [2]*dataplane.Pool
	faults  *dataplane.Faults
	specs   [3][]runtime.TaskSpec
	rc      fsm.QueryReconfig
	started time.Time

	mu       sync.Mutex
	recv     []ReconfigRecord
	boundary int64
	// lastID is the newest id of the sink's stream the tail received,
	// undelivered the ids it skipped (DeliveryGap).
	lastID      uint64
	undelivered int
	tailDone    chan struct{}
	tailErr     error
}

// ReconfigRecord is one result the sink produced: when it arrived (since
// the run's start), its stream time, its key (time/patient/score), the
// version path its operators wrote and its version tag.
type ReconfigRecord struct {
	At      time.Duration
	STime   int64
	Key     string
	Path    string
	Version uint64
}

// ReconfigRecorder turns the sink's tuples (schema sch) into records.
func ReconfigRecorder(sch *tuple.Schema) func(at time.Duration, tp *tuple.Tuple) ReconfigRecord {
	ti, pi, sc, pa := sch.Index("time"), sch.Index("patient"), sch.Index("score"), sch.Index("path")
	return func(at time.Duration, tp *tuple.Tuple) ReconfigRecord {
		return ReconfigRecord{At: at, STime: tp.STime, Path: tp.Values[pa].S, Version: tp.Version,
			Key: fmt.Sprintf("%d/%s/%d", tp.Values[ti].I, tp.Values[pi].S, tp.Values[sc].I)}
	}
}

func startReconfigCluster(ctx context.Context, cfg ReconfigConfig, rate int, limit int64, tracking string) (*reconfigCluster, error) {
	q, err := queryspec.Parse("sepsis.yaml", []byte(reconfigBenchQuery(cfg.Sources, rate, limit, 1)))
	if err != nil {
		return nil, err
	}
	plan, err := q.FusedPlan()
	if err != nil {
		return nil, err
	}
	c := &reconfigCluster{cfg: cfg, limit: limit, q: q, plan: plan, faults: dataplane.NewFaults(), rc: fsm.QueryReconfig{Tracking: tracking}, boundary: math.MinInt64}
	c.pools = [2]*dataplane.Pool{dataplane.NewPool(), dataplane.NewPool(c.faults.DialOption())}
	for i := range c.rts {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.close()
			return nil, err
		}
		pool := c.pools[0]
		if i == 2 {
			pool = c.pools[1]
		}
		c.rts[i] = runtime.New(runtime.Options{Logger: cfg.Logger, Pool: pool, BoundaryInterval: 5 * time.Millisecond,
			RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond})
		c.addrs[i] = lis.Addr().String()
		c.srvs[i] = grpc.NewServer(dataplane.ServerOptions()...)
		fedstreampb.RegisterDataPlaneServer(c.srvs[i], c.rts[i].Server())
		go func() { _ = c.srvs[i].Serve(lis) }()
	}
	var pls []runtime.Placement
	at := map[string]int{}
	for _, n := range plan.Nodes {
		for p := range n.Partitions {
			w := 2
			if n.Kind == queryspec.KindSource {
				w = p % 2
			}
			id := queryspec.TaskID(q.Name, n.Name, p, 0)
			pls = append(pls, runtime.Placement{TaskID: id, Fragment: n.Name, Partition: p, WorkerAddr: c.addrs[w]})
			at[id] = w
		}
	}
	for _, pl := range pls {
		c.specs[at[pl.TaskID]] = append(c.specs[at[pl.TaskID]], runtime.TaskSpec{TaskID: pl.TaskID, Query: q.Name,
			Fragment: pl.Fragment, Partition: pl.Partition, QueryIndex: 1, Spec: q, Placements: pls})
	}
	return c, nil
}

// begin starts the tasks and the tail.
func (c *reconfigCluster) begin(ctx context.Context) {
	c.started = time.Now()
	c.apply(ctx)
	c.tailDone = make(chan struct{})
	go c.tail(ctx)
}

func (c *reconfigCluster) apply(ctx context.Context) {
	for i, rt := range c.rts {
		rt.Apply(ctx, c.specs[i])
	}
}

func (c *reconfigCluster) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, rt := range c.rts {
		if rt != nil {
			_ = rt.Close(ctx)
		}
		if c.srvs[i] != nil {
			c.srvs[i].Stop()
		}
	}
	for _, p := range c.pools {
		if p != nil {
			_ = p.Close()
		}
	}
}

// tail reads the sink's results to the final boundary.
func (c *reconfigCluster) tail(ctx context.Context) {
	defer close(c.tailDone)
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: c.q.Name, TaskId: c.q.Name + "/alerts/p0/r0"}, "", true, 0)
	record := ReconfigRecorder(c.plan.Node("alerts").Schema)
	for ctx.Err() == nil {
		conn, err := c.pools[0].Conn(c.addrs[2])
		if err != nil {
			c.tailErr = err
			return
		}
		err = sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
			now := time.Since(c.started)
			c.mu.Lock()
			defer c.mu.Unlock()
			if b.Len() > 0 {
				c.undelivered += DeliveryGap(c.lastID, b.FirstID)
				c.lastID = max(c.lastID, b.LastID)
			}
			for _, tp := range b.Tuples {
				if tp.Type == tuple.Boundary {
					if tp.STime == math.MaxInt64 {
						return dataplane.ErrStopSubscription
					}
					c.boundary = max(c.boundary, tp.STime)
					continue
				}
				if !tp.Type.IsData() {
					continue
				}
				c.recv = append(c.recv, record(now, &tp))
			}
			return nil
		})
		if err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// publish hands every task the reconfiguration state.
func (c *reconfigCluster) publish(ctx context.Context) {
	c.setSpecs()
	c.apply(ctx)
}

// setSpecs puts the reconfiguration state into every task's spec.
func (c *reconfigCluster) setSpecs() {
	rc := c.rc
	rc.Plans = slices.Clone(c.rc.Plans)
	for w := range c.specs {
		for i := range c.specs[w] {
			n := 0
			for _, in := range c.plan.Node(c.specs[w][i].Fragment).Inputs {
				n += c.plan.Node(in).Partitions
			}
			c.specs[w][i].Reconfig, c.specs[w][i].MarkersExpected = &rc, n
		}
	}
}

// commit adds the plan giving scored and flag version v and publishes it.
func (c *reconfigCluster) commit(ctx context.Context, v int, phase string, cut int64) error {
	if err := c.addPlan(v, phase, cut); err != nil {
		return err
	}
	c.publish(ctx)
	return nil
}

func (c *reconfigCluster) addPlan(v int, phase string, cut int64) error {
	q, err := queryspec.Parse("sepsis.yaml", []byte(reconfigBenchQuery(c.cfg.Sources, c.q.Sources[0].Gen.Rate, c.limit, v)))
	if err != nil {
		return err
	}
	spec, err := q.CanonicalJSON()
	if err != nil {
		return err
	}
	// The margin the cluster's own switch rule uses (as the coordinator
	// would): a source holds at its acknowledged frontier plus it until
	// it learns the cut.
	p := fsm.ReconfigPlan{Epoch: uint64(len(c.rc.Plans) + 1), SpecJSON: spec, Phase: phase, Cut: cut, SwitchMargin: int64(c.cfg.Margin)}
	for _, op := range []string{"scored", "flag"} {
		def, err := json.Marshal(q.OperatorByName(op))
		if err != nil {
			return err
		}
		p.Changes = append(p.Changes, fsm.OperatorChange{Operator: op, Version: v, SpecJSON: def})
	}
	c.rc.Plans = append(c.rc.Plans, p)
	return nil
}

func (c *reconfigCluster) states() ([]runtime.TaskState, error) {
	var all []runtime.TaskState
	for _, rt := range c.rts {
		for _, st := range rt.States() {
			if st.State == runtime.StateFailed {
				return nil, fmt.Errorf("%w: task %s failed: %s", ErrReconfigBench, st.TaskID, st.Message)
			}
			all = append(all, st)
		}
	}
	return all, nil
}

// waitTasks polls the tasks' states until cond holds for all of them.
func (c *reconfigCluster) waitTasks(ctx context.Context, what string, cond func(runtime.TaskState) bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		sts, err := c.states()
		if err != nil {
			return err
		}
		ok := len(sts) > 0
		for _, st := range sts {
			ok = ok && cond(st)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w: timed out waiting for %s", ErrReconfigBench, what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// liveUpdate runs one live plan and returns its update time.
func (c *reconfigCluster) liveUpdate(ctx context.Context, v int) (time.Duration, error) {
	start := time.Now()
	if err := c.commit(ctx, v, fsm.ReconfigLoading, 0); err != nil {
		return 0, err
	}
	e := uint64(len(c.rc.Plans))
	frontier := int64(math.MinInt64)
	if err := c.waitTasks(ctx, "acknowledgements", func(st runtime.TaskState) bool {
		frontier = max(frontier, st.ReconfigFrontier)
		return st.Reconfig && st.ReconfigAcked >= e
	}); err != nil {
		return 0, err
	}
	took := time.Since(start)
	c.rc.Plans[e-1].Phase, c.rc.Plans[e-1].Cut = fsm.ReconfigSwitched, frontier+int64(c.cfg.Margin)
	c.publish(ctx)
	if err := c.waitTasks(ctx, "markers", func(st runtime.TaskState) bool { return st.ReconfigLevel >= e }); err != nil {
		return 0, err
	}
	c.rc.Plans[e-1].Phase = fsm.ReconfigComplete
	c.publish(ctx)
	return took, nil
}

// quiescentUpdate pauses the sources, waits until the sink has everything
// they sent up to their last boundary, swaps the versions (switching at
// the pause point) and resumes.
func (c *reconfigCluster) quiescentUpdate(ctx context.Context, v int) (time.Duration, error) {
	start := time.Now()
	low, frontier := int64(math.MaxInt64), int64(math.MinInt64)
	var resumes []func()
	for _, rt := range c.rts[:2] {
		lo, hi, resume := rt.PauseSources(ctx, c.q.Name)
		low, frontier = min(low, lo), max(frontier, hi)
		resumes = append(resumes, resume)
	}
	resume := func() {
		for _, r := range resumes {
			r()
		}
	}
	// Every source's last boundary is at or above the lowest frontier's
	// boundary: the sink releases up to it once everything sent is
	// processed.
	last := low / int64(5*time.Millisecond) * int64(5*time.Millisecond)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		b := c.boundary
		c.mu.Unlock()
		if b >= last {
			break
		}
		if time.Now().After(deadline) {
			resume()
			return 0, fmt.Errorf("%w: the sink did not drain", ErrReconfigBench)
		}
		time.Sleep(200 * time.Microsecond)
	}
	if err := c.commit(ctx, v, fsm.ReconfigSwitched, frontier+1); err != nil {
		resume()
		return 0, err
	}
	e := uint64(len(c.rc.Plans))
	if err := c.waitTasks(ctx, "versions loaded", func(st runtime.TaskState) bool { return st.Reconfig && st.ReconfigAcked >= e }); err != nil {
		resume()
		return 0, err
	}
	resume()
	took := time.Since(start)
	if err := c.waitTasks(ctx, "markers", func(st runtime.TaskState) bool { return st.ReconfigLevel >= e }); err != nil {
		return 0, err
	}
	c.rc.Plans[e-1].Phase = fsm.ReconfigComplete
	c.publish(ctx)
	return took, nil
}

func (c *reconfigCluster) waitEnd(ctx context.Context) error {
	select {
	case <-c.tailDone:
		return c.tailErr
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("%w: the stream did not end", ErrReconfigBench)
	}
}

// ReconfigReference is the multiset of result keys (time/patient) the
// generators of query q (one source) make.
func ReconfigReference(q *queryspec.Query) (map[string]int, error) {
	want := map[string]int{}
	for p := range q.Sources[0].Parallelism {
		gen, err := source.NewGenerator(q.Sources[0].Gen, p)
		if err != nil {
			return nil, err
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			// The key is (time, patient, score); score depends on the
			// version, so it is compared without it below.
			want[fmt.Sprintf("%d/%s", tp.Values[0].I, tp.Values[1].S)]++
		}
	}
	return want, nil
}

func (c *reconfigCluster) analyse(updates []time.Duration, took []time.Duration) (StrategyResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want, err := ReconfigReference(c.q)
	if err != nil {
		return StrategyResult{}, err
	}
	return AnalyseReconfig(want, c.recv, 0, updates, took, c.undelivered), nil
}

// AnalyseReconfig fills a strategy's figures from the sink's records:
// want is the reference (ReconfigReference), origin the wall time (since
// the run's start) of stream time 0, so a record's latency is At - origin
// - STime; updates are when each update began and took how long each
// took.
//
// undelivered is how many tuples the sink's result stream numbered that
// the consumer never received (its ring dropped them before they were
// read: ids skipped, see DeliveryGap); the results among them are not
// lost by the stream, only not seen by the benchmark.
func AnalyseReconfig(want map[string]int, recv []ReconfigRecord, origin time.Duration, updates, took []time.Duration, undelivered int) StrategyResult {
	res := StrategyResult{Paths: map[string]int{}}
	got := map[string]int{}
	const bucket = 100 * time.Millisecond
	nb := 0
	for _, r := range recv {
		nb = max(nb, int(r.At/bucket)+1)
	}
	counts := make([]int, nb)
	lats := make([][]float64, nb)
	for _, r := range recv {
		k := r.Key[:strings.LastIndexByte(r.Key, '/')]
		got[k]++
		res.Paths[r.Path]++
		if r.Path == "MIXED" || r.Path != fmt.Sprintf("v%d", r.Version+1) {
			res.Mixed++
		}
		b := int(r.At / bucket)
		counts[b]++
		// Generators pace stime from their start: latency is arrival
		// minus the record's due time.
		lats[b] = append(lats[b], float64(r.At-origin-time.Duration(r.STime))/float64(time.Millisecond))
	}
	res.LostOrDup, res.MissingAtConsumer = LostOrDuplicated(want, got, undelivered)
	res.Undelivered = undelivered
	for b := range counts {
		res.Buckets = append(res.Buckets, ReconfigBucket{AtMs: float64(time.Duration(b) * bucket / time.Millisecond), Tuples: counts[b], LatencyMs: p99(lats[b])})
	}
	// dip is 1 - the worst bucket of the second from bucket ub on over
	// the mean bucket of the second before (-1: not enough buckets).
	dip := func(ub int) float64 {
		base, n := 0.0, 0
		for b := max(ub-10, 0); b < ub && b < len(counts); b++ {
			base += float64(counts[b])
			n++
		}
		worst := math.MaxFloat64
		for b := ub; b < ub+10 && b < len(counts); b++ {
			worst = min(worst, float64(counts[b]))
		}
		if n < 10 || base == 0 || worst == math.MaxFloat64 {
			return -1
		}
		return max(0, 1-worst/(base/float64(n)))
	}
	var during, before []float64
	prevEnd := time.Duration(0)
	res.ThroughputDipControl = -1
	for _, u := range updates {
		res.UpdatesAtMs = append(res.UpdatesAtMs, float64(u)/float64(time.Millisecond))
		ub := int(u / bucket)
		for b := max(ub-10, 0); b < ub && b < len(counts); b++ {
			before = append(before, lats[b]...)
		}
		for b := ub; b < ub+10 && b < len(counts); b++ {
			during = append(during, lats[b]...)
		}
		if d := dip(ub); d >= 0 {
			res.ThroughputDip = max(res.ThroughputDip, d)
		}
		// The same statistic a second before the update, where nothing
		// changes: the noise the dip is to be read against.
		if c := u - time.Second; c-time.Second >= prevEnd {
			if d := dip(int(c / bucket)); d >= 0 {
				res.ThroughputDipControl = max(res.ThroughputDipControl, d)
			}
		}
		prevEnd = u + time.Second
	}
	res.LatencyP99MsDuring, res.LatencyP99MsBefore = p99(during), p99(before)
	ms := make([]float64, len(took))
	for i, d := range took {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	res.UpdateMsP50 = median(ms)
	if len(ms) > 0 {
		res.UpdateMsMax = slices.Max(ms)
	}
	return res
}

// LostOrDuplicated compares the result keys the consumer got with the
// reference want (each key's count): missing is how many results of the
// reference the consumer did not get, and lostOrDup the results
// duplicated or not in the reference plus the missing ones that
// undelivered does not account for. undelivered is how many tuples the
// sink produced that the consumer never read (DeliveryGap: ids it
// skipped); a result among them was produced by the stream and so is not
// lost. The ids count boundaries too, so when undelivered is not 0
// lostOrDup is a lower bound of the loss (a boundary skipped may excuse
// one missing result), and missing is the upper one.
func LostOrDuplicated(want, got map[string]int, undelivered int) (lostOrDup, missing int) {
	extra := 0
	for k, n := range want {
		switch d := got[k] - n; {
		case d < 0:
			missing -= d
		case d > 0:
			extra += d
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			extra += n
		}
	}
	return extra + max(0, missing-max(0, undelivered)), missing
}

// DeliveryGap is how many tuples a consumer of a stream never received
// when, having received every id up to last (0: none yet), it receives
// a batch starting at first: a result ring drops its oldest tuples when
// a tail client falls too far behind, and the client then resumes at
// the oldest id still there.
func DeliveryGap(last, first uint64) int {
	if first <= last+1 {
		return 0
	}
	return int(first - last - 1)
}

func p99(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[min(len(s)-1, int(math.Ceil(0.99*float64(len(s))))-1)]
}

// runStrategy runs the paced scenario with Updates updates by one
// strategy.
func runStrategy(ctx context.Context, cfg ReconfigConfig, quiescent bool) (StrategyResult, error) {
	total := cfg.Warmup + time.Duration(cfg.Updates)*cfg.Spacing + time.Second
	limit := int64(total.Seconds() * float64(cfg.Rate))
	c, err := startReconfigCluster(ctx, cfg, cfg.Rate, limit, fsm.TrackingStatic)
	if err != nil {
		return StrategyResult{}, err
	}
	defer c.close()
	c.begin(ctx)
	var at, took []time.Duration
	for i := range cfg.Updates {
		due := cfg.Warmup + time.Duration(i)*cfg.Spacing
		if wait := due - time.Since(c.started); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return StrategyResult{}, ctx.Err()
			}
		}
		at = append(at, time.Since(c.started))
		var d time.Duration
		if quiescent {
			d, err = c.quiescentUpdate(ctx, i+2)
		} else {
			d, err = c.liveUpdate(ctx, i+2)
		}
		if err != nil {
			return StrategyResult{}, err
		}
		took = append(took, d)
	}
	if err := c.waitEnd(ctx); err != nil {
		return StrategyResult{}, err
	}
	res, err := c.analyse(at, took)
	if err == nil {
		c.mu.Lock()
		res.DipWindow = WindowDip(c.recv, at, cfg.dipWindow())
		c.mu.Unlock()
	}
	return res, err
}

// throughput runs the scenario unpaced with tracking off ("") or with one
// completed plan under the given tracking, and returns results per second.
func throughput(ctx context.Context, cfg ReconfigConfig, tracking string, records int64) (float64, error) {
	c, err := startReconfigCluster(ctx, cfg, 0, records, tracking)
	if err != nil {
		return 0, err
	}
	defer c.close()
	if tracking != "" {
		// A plan already complete when the tasks start: every stateless
		// operator runs versioned, tags travel, nothing switches.
		if err := c.addPlan(2, fsm.ReconfigComplete, math.MinInt64+1); err != nil {
			return 0, err
		}
		c.setSpecs()
	}
	start := time.Now()
	c.begin(ctx)
	if err := c.waitEnd(ctx); err != nil {
		return 0, err
	}
	return float64(records*int64(cfg.Sources)) / time.Since(start).Seconds(), nil
}

// reconnect cuts source worker 1 off flag's worker, runs a live plan
// until both source workers passed the cut, heals, and measures until
// every task has the plan's markers.
func reconnect(ctx context.Context, cfg ReconfigConfig) (time.Duration, error) {
	limit := int64((cfg.Warmup + 2*cfg.Spacing + 2*time.Second).Seconds() * float64(cfg.Rate))
	c, err := startReconfigCluster(ctx, cfg, cfg.Rate, limit, fsm.TrackingStatic)
	if err != nil {
		return 0, err
	}
	defer c.close()
	c.begin(ctx)
	time.Sleep(cfg.Warmup / 2)
	c.faults.CutOutgoing(c.addrs[1], dataplane.Reset)
	if err := c.commit(ctx, 2, fsm.ReconfigLoading, 0); err != nil {
		return 0, err
	}
	frontier := int64(math.MinInt64)
	if err := c.waitTasks(ctx, "acknowledgements", func(st runtime.TaskState) bool {
		frontier = max(frontier, st.ReconfigFrontier)
		return st.Reconfig && st.ReconfigAcked >= 1
	}); err != nil {
		return 0, err
	}
	c.rc.Plans[0].Phase, c.rc.Plans[0].Cut = fsm.ReconfigSwitched, frontier+int64(cfg.Margin)
	c.publish(ctx)
	if err := c.waitTasks(ctx, "sources past the cut", func(st runtime.TaskState) bool {
		return !strings.Contains(st.TaskID, "/ward/") || st.ReconfigLevel >= 1
	}); err != nil {
		return 0, err
	}
	healed := time.Now()
	c.faults.HealAll()
	if err := c.waitTasks(ctx, "markers after the reconnect", func(st runtime.TaskState) bool { return st.ReconfigLevel >= 1 }); err != nil {
		return 0, err
	}
	return time.Since(healed), nil
}

// RunReconfig runs the reconfiguration benchmark: the live and the
// quiescent strategy on the hospital scenario, the steady overhead of
// version tracking, and the completion time after a reconnect.
func RunReconfig(ctx context.Context, cfg ReconfigConfig) (*ReconfigResult, error) {
	cfg.Defaults()
	prog := benchreport.NewProgress(cfg.Progress, "reconfig")
	res := &ReconfigResult{Scope: "in-process runtimes over loopback gRPC without TLS; plan phases driven by the benchmark as the coordinator's rules do, without Raft or assignment watches (the default, without --in-process, runs a real org)"}
	var err error
	prog.Step("live", 1, 1, "")
	if res.Live, err = runStrategy(ctx, cfg, false); err != nil {
		return nil, err
	}
	prog.Step("quiescent", 1, 1, "")
	if res.Quiescent, err = runStrategy(ctx, cfg, true); err != nil {
		return nil, err
	}
	prog.Step("overhead", 1, 1, "")
	records := cfg.OverheadRecords
	var off, st, dyn []float64
	for range cfg.ThroughputRuns {
		for _, m := range []struct {
			tracking string
			into     *[]float64
		}{{"", &off}, {fsm.TrackingStatic, &st}, {fsm.TrackingDynamic, &dyn}} {
			r, err := throughput(ctx, cfg, m.tracking, records)
			if err != nil {
				return nil, err
			}
			*m.into = append(*m.into, r)
		}
	}
	res.OverheadStatic, res.OverheadDynamic = 1-median(st)/median(off), 1-median(dyn)/median(off)
	prog.Step("reconnect", 1, 1, "")
	d, err := reconnect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	res.ReconnectMs = float64(d) / float64(time.Millisecond)
	res.MixedVersionTuples = res.Live.Mixed + res.Quiescent.Mixed
	res.LostOrDuplicated = res.Live.LostOrDup + res.Quiescent.LostOrDup
	res.Undelivered = res.Live.Undelivered + res.Quiescent.Undelivered
	return res, nil
}

// ProcessCPU is the CPU time (user and system) this process has used (0
// where the platform does not say).
func ProcessCPU() time.Duration { return time.Duration(processCPUNanos()) }

// Charts plots, for both strategies, sink results per second in each
// 100 ms bucket and their p99 latency against the time since the run's
// start (the updates begin at UpdatesAtMs, listed in the titles).
func (r *ReconfigResult) Charts() []benchreport.Chart {
	series := func(name string, s StrategyResult, lat bool) benchreport.Series {
		out := benchreport.Series{Name: name}
		for _, b := range s.Buckets {
			out.X = append(out.X, b.AtMs/1000)
			if lat {
				out.Y = append(out.Y, b.LatencyMs)
			} else {
				out.Y = append(out.Y, float64(b.Tuples)*10)
			}
		}
		return out
	}
	at := func(s StrategyResult) string {
		var parts []string
		for _, u := range s.UpdatesAtMs {
			parts = append(parts, fmt.Sprintf("%.1f", u/1000))
		}
		return strings.Join(parts, ", ")
	}
	updates := fmt.Sprintf("updates at %s s (live), %s s (quiescent)", at(r.Live), at(r.Quiescent))
	return []benchreport.Chart{
		{Title: "sink throughput per 100 ms; " + updates, YLabel: "results/s", XLabel: "s since the run's start",
			Series: []benchreport.Series{series("live", r.Live, false), series("quiescent", r.Quiescent, false)}},
		{Title: "p99 latency per 100 ms", YLabel: "ms", XLabel: "s since the run's start",
			Series: []benchreport.Series{series("live", r.Live, true), series("quiescent", r.Quiescent, true)}},
	}
}

// HopBaseline is the cheapest form of the messages a live update is made
// of (the plan to each worker, an acknowledgement back), measured in the
// benchmark's process while a strategy's stream runs there, every 13 ms:
// a raw loopback TCP write reaching a reader goroutine, and a plaintext
// gRPC unary round trip to a service with nothing to compute. A live
// update needs at least one message each way (over gRPC with mutual TLS,
// with Raft and the tasks' installs around them), so no design of it
// goes under these on the same machine at the same load.
type HopBaseline struct {
	TCPOneWayMsP50     float64 `json:"tcp_one_way_ms_p50"`
	GRPCRoundTripMsP50 float64 `json:"grpc_round_trip_ms_p50"`
	Samples            int     `json:"samples"`
}
