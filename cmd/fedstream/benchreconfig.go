package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/config"
	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/worker/benchmark"
)

func newBenchReconfigCmd() *cobra.Command {
	var (
		asJSON   bool
		plotFile string
		logLevel string
		sources  int
		rate     int
		updates  int
		spacing  time.Duration
		inProc   bool
		buckets  bool
		traceOut string
		stalls   bool
		stallTr  string
		dipWin   time.Duration
		wakeAB   bool
		second   string
		only     []string
		profile  string
		rounds   int
		ohMethod string
		ohWins   int
		ohWin    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "reconfig",
		Short: "Live reconfiguration vs the quiescent baseline on the hospital scenario",
		Long: `Runs the hospital scenario (--sources partitions of 32 patients, --rate vitals
per second each: 15,000/s by default) in an org started in this process (one
coordinator with its Raft log, three workers, mutual TLS everywhere) and upgrades
two dependent operators (sepsis by SIRS, then qSOFA, then SIRS again) --updates
times, once with the live strategy (versions side by side, no pause) and once with
the quiescent baseline (pause the sources, drain, swap, resume). It reports each
strategy's update time, the worst throughput dip (100 ms buckets against the
second before), p99 latency during the updates, the steady throughput overhead
of static and dynamic version tracking, the completion time after an upstream
cut off during an update reconnects, and the tuples processed by mixed versions
or lost or duplicated (both must be 0).

Each update is a plan committed through the coordinator (query update), learned by
the workers from their assignments. The live update time is from the plan's
commit in Raft until the leader holds every task's acknowledgement (every
task has the new versions; the Raft write recording them, which switches the
plan, follows: switched_ms); the quiescent one is from the plan's commit until
the last source resumed (the sources pause from when they learn the plan until
it has loaded, the stream drained through the sinks and the versions swapped,
then resume under the new versions); longest_gap_ms is the pause as the sink
sees it. dip_window is the throughput dip at a resolution finer than 100 ms
buckets: results per second over --dip-window after each update against the
same before, averaged over the --updates with a 95% confidence interval, and
the same one window earlier as the control (use --updates 10 or more). The
tracking overheads compare CPU time per result at the paced rate with and
without a completed plan: by default side by side, three processes (off, static,
dynamic) each running the query in an org of its own at once, window by window,
with a 95% confidence interval; --overhead-method sequential runs the modes one
after the other in this process. --second-rate runs both strategies again at
another rate (near capacity, the data a quiescent pause must drain grows);
--wake-ab measures the wake of paced sources for a plan within the run.

--in-process runs the older variant instead: three runtimes over loopback gRPC
without TLS, the benchmark driving the plan phases as the coordinator's rules
do, without Raft or assignment watches.`,
		Example: "  fedstream bench reconfig --json --plot reconfig.png",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := benchmark.ReconfigConfig{
				Sources: sources, Rate: rate, Updates: updates, Spacing: spacing,
				Logger: logging.New(cmd.ErrOrStderr(), logLevel, false), Progress: cmd.ErrOrStderr(),
				Stalls: stalls || stallTr != "", StallTrace: stallTr, DipWindow: dipWin, WakeAB: wakeAB,
				ThroughputRuns: rounds, OverheadProfile: profile,
				OverheadMethod: ohMethod, OverheadWindows: ohWins, ThroughputWindow: ohWin,
			}
			if ohMethod != benchmark.OverheadSideBySide && ohMethod != benchmark.OverheadSequential {
				return fmt.Errorf("--overhead-method %q: want %s or %s", ohMethod, benchmark.OverheadSideBySide, benchmark.OverheadSequential)
			}
			if ohWins < 0 || ohWin < 0 {
				return fmt.Errorf("--overhead-windows and --overhead-window must be positive")
			}
			for _, p := range only {
				if !slices.Contains(orgBenchParts, p) {
					return fmt.Errorf("--only %q: want some of %s", p, strings.Join(orgBenchParts, ","))
				}
			}
			if len(only) > 0 && (inProc || second != "") {
				return fmt.Errorf("--only runs in an org only and not with --second-rate")
			}
			cfg.Only = only
			if second != "" {
				if inProc {
					return fmt.Errorf("--second-rate runs in an org only (not with --in-process)")
				}
				var err error
				if cfg.SecondRate, cfg.SecondRateFraction, err = parseSecondRate(second); err != nil {
					return err
				}
			}
			if wakeAB && inProc {
				return fmt.Errorf("--wake-ab runs in an org only (not with --in-process)")
			}
			var (
				res *benchmark.ReconfigResult
				err error
			)
			if inProc {
				res, err = benchmark.RunReconfig(cmd.Context(), cfg)
			} else {
				if cfg.Spacing <= 0 {
					// A second before each update is the dip's
					// baseline, a second after it the dip, and the
					// second before that the noise control.
					cfg.Spacing = 3 * time.Second
				}
				if cfg.Warmup <= 0 {
					cfg.Warmup = 2500 * time.Millisecond
				}
				if cfg.ThroughputRuns <= 0 && ohMethod == benchmark.OverheadSequential {
					// Rounds of paired runs: the median of five
					// rounds' ratios stands an outlying round or two.
					cfg.ThroughputRuns = 5
				}
				if cfg.ThroughputRuns <= 0 {
					cfg.ThroughputRuns = sideRounds
				}
				// The org's workers share this process: collect garbage
				// as a deployed worker process does.
				setWorkerGC(config.DefaultWorkerGCPercent)
				if traceOut != "" {
					cfg.Around = traceAround(traceOut)
				}
				res, err = runReconfigOrg(cmd.Context(), cfg)
			}
			if err != nil {
				return err
			}
			if plotFile != "" {
				if err := benchreport.WritePNG(plotFile, res.Charts()...); err != nil {
					return err
				}
			}
			if asJSON {
				out := *res
				if !buckets {
					out.Live.Buckets, out.Quiescent.Buckets = nil, nil
					if out.SecondRate != nil {
						sr := *out.SecondRate
						sr.Live.Buckets, sr.Quiescent.Buckets = nil, nil
						out.SecondRate = &sr
					}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			w := cmd.OutOrStdout()
			for _, s := range []struct {
				name string
				r    benchmark.StrategyResult
			}{{"live", res.Live}, {"quiescent", res.Quiescent}} {
				fmt.Fprintf(w, "%-9s update p50 %7.1f ms  max %7.1f ms  throughput dip %5.1f%% (%5.1f%% without an update)  p99 latency %6.1f ms during (%6.1f before)\n",
					s.name, s.r.UpdateMsP50, s.r.UpdateMsMax, 100*s.r.ThroughputDip, 100*s.r.ThroughputDipControl, s.r.LatencyP99MsDuring, s.r.LatencyP99MsBefore)
				if d := s.r.DipWindow; d != nil {
					fmt.Fprintf(w, "%-9s throughput over %.0f ms after each update vs before, mean of %d: dip %+.3f%% ± %.3f%% (95%% CI); without an update %+.3f%% ± %.3f%% (the resolution)\n",
						"", d.WindowMs, len(d.PerUpdate), 100*d.Mean, 100*d.CI95, 100*d.ControlMu, 100*d.Resolution)
				}
				if len(s.r.SourcesResumedMs) > 0 {
					fmt.Fprintf(w, "%-9s sources paused %v ms, held at their markers %v ms, resumed %v ms after the commit; %v results in flight at the pause, drained in %v ms; first new result at the consumer %v ms\n",
						"", s.r.SourcesPausedMs, s.r.SourcesStoppedMs, s.r.SourcesResumedMs, s.r.InFlight, s.r.DrainMs, s.r.ResumedMs)
				}
				if s.r.LongestGapMs > 0 {
					fmt.Fprintf(w, "%-9s longest time without a result around an update: %.1f ms\n", "", s.r.LongestGapMs)
				}
				if stalls || stallTr != "" {
					starved, longest := 0, 0.0
					for _, st := range s.r.Stalls {
						longest = max(longest, st.GapMs)
						if st.Starved {
							starved++
						}
					}
					fmt.Fprintf(w, "%-9s gaps of 100 ms or more at the sink: %d (longest %.1f ms), %d of them with the process starved of CPU\n", "", len(s.r.Stalls), longest, starved)
				}
			}
			if h := res.HopLive; h != nil {
				fmt.Fprintf(w, "floor of a live update's messages, in this process during the live run (%d samples): loopback TCP one way %.3f ms, plaintext gRPC round trip %.3f ms (p50)\n",
					h.Samples, h.TCPOneWayMsP50, h.GRPCRoundTripMsP50)
			}
			if sr := res.SecondRate; sr != nil {
				fmt.Fprintf(w, "at %d results/s (%d/s per source; capacity sustained %.0f/s): live update p50 %.1f ms, quiescent %.1f ms (sources resumed; %v results in flight)\n",
					sr.ResultsPerS, sr.RatePerSource, sr.CapacityResultsPerS, sr.Live.UpdateMsP50, sr.Quiescent.UpdateMsP50, sr.Quiescent.InFlight)
			}
			if ab := res.WakeAB; ab != nil {
				fmt.Fprintf(w, "sources woken for a plan: live update p50 %.1f ms (%d updates) vs %.1f ms without (%d): ratio %.2f; last task installed %.1f vs %.1f ms: ratio %.2f\n",
					ab.UpdateMsP50On, ab.UpdatesOn, ab.UpdateMsP50Off, ab.UpdatesOff, ab.UpdateRatio, ab.InstalledMsP50On, ab.InstalledP50Off, ab.InstalledRatio)
			}
			if res.OverheadBasis != "" {
				fmt.Fprintf(w, "tracking overhead basis: %s (off: %.1f µs per result)\n", res.OverheadBasis, res.CPUMicrosPerResultOff)
			}
			if res.OverheadStaticCI95 > 0 {
				fmt.Fprintf(w, "tracking overhead 95%% interval: static ± %.1f%%, dynamic ± %.1f%% (%d windows)\n", 100*res.OverheadStaticCI95, 100*res.OverheadDynamicCI95, len(res.OverheadWindows))
			}
			fmt.Fprintf(w, "tracking overhead: static %.1f%%, dynamic %.1f%%\nreconnect completion: %.1f ms\nmixed-version tuples: %d, lost or duplicated: %d, not delivered to the benchmark's consumer (not counted as lost): %d\n(%s)\n",
				100*res.OverheadStatic, 100*res.OverheadDynamic, res.ReconnectMs, res.MixedVersionTuples, res.LostOrDuplicated, res.Undelivered, res.Scope)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object on one line")
	cmd.Flags().StringVar(&plotFile, "plot", "", "write throughput and latency over time for both strategies to this PNG")
	cmd.Flags().StringVar(&logLevel, "log-level", "error", "log level of the runtimes (logs go to stderr)")
	cmd.Flags().IntVar(&sources, "sources", 10, "source partitions (32 patients each)")
	cmd.Flags().IntVar(&rate, "rate", 1500, "vitals per second per source partition")
	cmd.Flags().IntVar(&updates, "updates", 3, "updates per strategy")
	cmd.Flags().DurationVar(&spacing, "spacing", 0, "time between two updates (default 3s in an org, 1.5s in process)")
	cmd.Flags().BoolVar(&buckets, "buckets", false, "with --json: include the 100 ms buckets (results and p99 latency) of both strategies")
	cmd.Flags().StringVar(&traceOut, "trace", "", "write an execution trace (with CPU samples) of the first live update, from 0.5 s before it to 1 s after, to this file (go tool trace)")
	cmd.Flags().BoolVar(&stalls, "stalls", false, "with --json: sample every task and the process every 10 ms and list each gap of 100 ms or more at the sink with what every task and the process did meanwhile (\"stalls\")")
	cmd.Flags().StringVar(&stallTr, "stall-trace", "", "keep a flight recorder (execution trace) and write, per strategy, the first gap of 100 ms or more at the sink and up to two more during which the process still ran to FILE-live.trace, FILE-live-2.trace, ... (implies --stalls)")
	cmd.Flags().DurationVar(&dipWin, "dip-window", time.Second, "window of the fine throughput-dip statistic (dip_window: results per second over this long after each update against before, averaged over the updates with a 95% confidence interval); at most a third of --spacing")
	cmd.Flags().BoolVar(&wakeAB, "wake-ab", false, "alternate the live updates with and without waking paced sources to install a plan, and compare (wake_ab)")
	cmd.Flags().StringVar(&second, "second-rate", "", "also run both strategies at a second rate: vitals/s per source partition (e.g. 4000), or a percentage of the highest paced rate the pipeline sustains end to end, found first by a probe (e.g. 80%)")
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these parts (comma-separated: "+strings.Join(orgBenchParts, ",")+"); the figures of the others are left at 0")
	cmd.Flags().IntVar(&rounds, "overhead-rounds", 0, "rounds of the tracking overhead: side by side, three fresh processes each round, started in a rotating order (default 3); sequential, one run per mode (off, static, dynamic) each (default 5)")
	cmd.Flags().StringVar(&ohMethod, "overhead-method", benchmark.OverheadSideBySide, "how the tracking overhead is measured in an org: side-by-side (the three modes at once, each in an org in a process of its own, CPU per result compared window by window) or sequential (one mode after the other in this process)")
	cmd.Flags().IntVar(&ohWins, "overhead-windows", 0, "side by side: windows per round, each --overhead-window long (default 8)")
	cmd.Flags().DurationVar(&ohWin, "overhead-window", 0, "the tracking overhead's window: side by side, each profile window; sequential, each run's stretch of stream time (default 3s)")
	cmd.Flags().StringVar(&profile, "overhead-profile", "", "write a CPU profile of each tracking mode's first overhead window to PREFIX-off.pprof, PREFIX-static.pprof, PREFIX-dynamic.pprof")
	cmd.Flags().BoolVar(&inProc, "in-process", false, "run three bare runtimes in process (no Raft, no TLS; the plan phases driven by the benchmark) instead of an org")
	return cmd
}

// traceAround starts an execution trace with CPU profile samples into
// file and returns the function that stops it (cfg.Around).
func traceAround(file string) func(time.Duration) func() {
	return func(time.Duration) func() {
		f, err := os.Create(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "trace:", err)
			return func() {}
		}
		// Samples every 0.5 ms: a plan's work lasts milliseconds.
		goruntime.SetCPUProfileRate(2000)
		_ = pprof.StartCPUProfile(io.Discard)
		if err := trace.Start(f); err != nil {
			fmt.Fprintln(os.Stderr, "trace:", err)
		}
		return func() {
			trace.Stop()
			pprof.StopCPUProfile()
			_ = f.Close()
		}
	}
}

// parseSecondRate reads --second-rate: a rate per source partition, or a
// percentage of the measured capacity.
func parseSecondRate(v string) (rate int, fraction float64, err error) {
	if p, ok := strings.CutSuffix(v, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f <= 0 || f > 100 {
			return 0, 0, fmt.Errorf("--second-rate %q: a percentage must be above 0 and at most 100", v)
		}
		return 0, f / 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, 0, fmt.Errorf("--second-rate %q: want vitals/s per source partition (a positive integer) or a percentage such as 80%%", v)
	}
	return n, 0, nil
}
