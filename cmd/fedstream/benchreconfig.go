package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"runtime/pprof"
	"runtime/trace"
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
commit in Raft until every task's acknowledgement is applied in Raft; the
quiescent one is from the plan's commit until the first result of the new
configuration reaches the sink (the sources pause from when they learn the plan
until it has loaded, the stream drained and the versions swapped, then resume
under the new versions); longest_gap_ms is the pause as the sink sees it. The tracking overheads compare the process's
CPU time per result at the paced rate with and without a completed plan.

--in-process runs the older variant instead: three runtimes over loopback gRPC
without TLS, the benchmark driving the plan phases as the coordinator's rules
do, without Raft or assignment watches.`,
		Example: "  fedstream bench reconfig --json --plot reconfig.png",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := benchmark.ReconfigConfig{
				Sources: sources, Rate: rate, Updates: updates, Spacing: spacing,
				Logger: logging.New(cmd.ErrOrStderr(), logLevel, false), Progress: cmd.ErrOrStderr(),
				Stalls: stalls || stallTr != "", StallTrace: stallTr,
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
			if res.OverheadBasis != "" {
				fmt.Fprintf(w, "tracking overhead basis: %s (off: %.1f µs per result)\n", res.OverheadBasis, res.CPUMicrosPerResultOff)
			}
			fmt.Fprintf(w, "tracking overhead: static %.1f%%, dynamic %.1f%%\nreconnect completion: %.1f ms\nmixed-version tuples: %d, lost or duplicated: %d\n(%s)\n",
				100*res.OverheadStatic, 100*res.OverheadDynamic, res.ReconnectMs, res.MixedVersionTuples, res.LostOrDuplicated, res.Scope)
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
