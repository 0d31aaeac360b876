package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/config"
	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/worker/benchmark"
)

// newBenchCmd is `fedstream bench`, the benchmarks.
func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the engine on this machine",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newBenchDataplaneCmd(), newBenchMoveCmd(), newBenchReconfigCmd(), newBenchReconfigOverheadChildCmd(), newBenchScalingCmd(), newBenchDCAACmd())
	return cmd
}

func newBenchDataplaneCmd() *cobra.Command {
	var (
		asJSON   bool
		duration time.Duration
		logLevel string
		only     []string
		profiles string
		rounds   int
		plain    bool
		plotFile string
		quiet    bool
	)
	cmd := &cobra.Command{
		Use:   "dataplane",
		Short: "Data-plane throughput across two local worker processes vs raw TCP baselines",
		Long: `Runs, between two child worker processes on 127.0.0.1:
  raw_tcp                100-byte records made by the blob generator (as forward's) over one raw
                         TCP connection (256 KiB buffered writes)
  forward                engine query blob source -> map -> sink, source on worker 1, map and
                         sink on worker 2; the blob records encode to 100 bytes, as raw_tcp's
  wordcount              engine query words source -> split -> keyed exchange -> count() per
                         word (2 partitions on worker 2)
  handwritten_wordcount  the same word count written by hand over 2 raw TCP connections
  unbatched              the forward query with one tuple per data-plane message
and prints each throughput and the ratios. Both the data plane and the raw
TCP baselines run over mutual TLS 1.3 (certificates of a CA made for the run),
as inside an org; --plaintext runs both without TLS. Each scenario is first sized to
last about --duration, then all of them run --rounds times, interleaved: rates
are each scenario's median round, ratios the median of the ratios measured
round by round (this machine's speed drifts between minutes, not within a
round). The whole run usually takes about 5 x (rounds + 2) x --duration.

While it runs it prints one progress line per sizing run and per measured
round on stderr (scenario, round, elapsed time, rate); --quiet turns that
off. --plot FILE draws each scenario's rate per round and the ratios per
round, with their floors, into a PNG.

The JSON says how every scenario is timed (timing) and where the bench's
engines are configured unlike a production worker (engine_settings).`,
		Example: "  fedstream bench dataplane\n  fedstream bench dataplane --json --duration 2s --plot dataplane.png",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rounds <= 0 {
				return fmt.Errorf("--rounds %d: want at least 1", rounds)
			}
			if duration <= 0 {
				return fmt.Errorf("--duration %s: want a positive duration such as 5s", duration)
			}
			launch, err := benchmark.ProfilingLauncher(profiles)
			if err != nil {
				return err
			}
			var progress *benchreport.Progress
			if !quiet {
				progress = benchreport.NewProgress(cmd.ErrOrStderr(), "bench dataplane")
			}
			res, err := benchmark.Run(cmd.Context(), benchmark.Config{
				Duration:  duration,
				Launch:    launch,
				Logger:    logging.Stderr(logLevel),
				Only:      only,
				Rounds:    rounds,
				Plaintext: plain,
				Progress:  progress,
			})
			if err != nil {
				return err
			}
			if plotFile != "" {
				if err := benchreport.WritePNG(plotFile, res.Charts()...); err != nil {
					return err
				}
				progress.Note("plot written to %s", plotFile)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			return res.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of text")
	cmd.Flags().DurationVar(&duration, "duration", benchmark.DefaultDuration, "target time of one measured run of a scenario")
	cmd.Flags().IntVar(&rounds, "rounds", benchmark.DefaultRounds, "measured rounds of every scenario (medians are reported)")
	cmd.Flags().StringVar(&logLevel, "log-level", "warn", "log level of the benchmark and its workers (debug, info, warn, error)")
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these scenarios ("+strings.Join(benchmark.ScenarioNames, ", ")+")")
	cmd.Flags().BoolVar(&plain, "plaintext", false, "run the data plane and the raw TCP baselines without TLS (default: mutual TLS 1.3 for both)")
	cmd.Flags().StringVar(&profiles, "cpuprofile-dir", "", "write each worker's CPU profile to DIR/bench-worker-N.cpu")
	cmd.Flags().StringVar(&plotFile, "plot", "", "write a PNG plot of each scenario's rate and the ratios per round to this file")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "print no progress lines on stderr")
	return cmd
}

func newBenchMoveCmd() *cobra.Command {
	var (
		asJSON   bool
		stateMB  int
		duration time.Duration
		logLevel string
		plain    bool
		stream   bool
		profiles string
		traces   string
	)
	cmd := &cobra.Command{
		Use:   "move",
		Short: "Move a keyed aggregate holding --state-mb MB live and by stop-and-copy, and compare",
		Long: `Runs, on child worker processes on 127.0.0.1 (mutual TLS 1.3 unless
--plaintext), a query whose keyed aggregate (count_distinct over 2 s windows
sliding every 5 ms, sources' boundaries every 5 ms) holds about
--state-mb MB of state under steady generated load, and moves its task
  (a) live: the new copy starts from a snapshot of the running old copy, then
      consumers switch and the old copy stops, and
  (b) stop-and-copy: the old copy halts at its snapshot, the new copy starts
      from it, consumers switch,
in the same run. Results are compared row by row with an unmoved reference run of
the same input (lost, duplicated). Raw loopback TCP bandwidth is measured in the
same run over as many bytes as the state, over TLS like the data plane's unless
--plaintext (transfer_bound_ms). Progress goes to stderr; the result to stdout.`,
		Example: "  fedstream bench move --state-mb 64 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if stateMB <= 0 {
				return fmt.Errorf("--state-mb %d: want at least 1", stateMB)
			}
			launch, err := benchmark.ProfilingLauncher(profiles)
			if err != nil {
				return err
			}
			res, err := benchmark.RunMove(cmd.Context(), benchmark.MoveConfig{
				StateMB:         stateMB,
				Duration:        duration,
				Plaintext:       plain,
				StreamSnapshots: stream,
				TraceDir:        traces,
				Launch:          launch,
				Logger:          logging.Stderr(logLevel),
				Progress:        cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(res)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object on one line")
	cmd.Flags().IntVar(&stateMB, "state-mb", benchmark.DefaultMoveStateMB, "state held by the moved aggregate, in MB")
	cmd.Flags().DurationVar(&duration, "duration", 0, "length of the generated input (default: enough for both moves)")
	cmd.Flags().BoolVar(&plain, "plaintext", false, "run the data plane, the snapshot transfers and the raw TCP baseline without TLS (default: mutual TLS 1.3 for all)")
	cmd.Flags().StringVar(&profiles, "cpuprofile-dir", "", "write each worker's CPU profile to DIR/bench-move-worker-N.cpu (and bench-move-reference.cpu)")
	cmd.Flags().StringVar(&traces, "trace-dir", "", "run a flight recorder in each worker and write its execution trace of the live move and the 3 s before it to DIR/bench-move-worker-N.trace")
	cmd.Flags().BoolVar(&stream, "stream-snapshots", false, "fetch snapshots over the FetchSnapshot gRPC stream, not a connection of their own (for comparison)")
	cmd.Flags().StringVar(&logLevel, "log-level", "warn", "log level of the benchmark and its workers (debug, info, warn, error)")
	return cmd
}

// startCPUProfileFile starts a CPU profile written to path; stop ends it
// and closes the file.
func startCPUProfileFile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// newBenchWorkerCmd is the hidden `fedstream bench-worker`: one worker of
// `fedstream bench`, driven by JSON requests on stdin (answers on stdout).
// It exits when stdin closes.
func newBenchWorkerCmd() *cobra.Command {
	var logLevel, cpuProfile string
	cmd := &cobra.Command{
		Use:    "bench-worker",
		Short:  "One worker process of fedstream bench (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setWorkerGC(config.DefaultWorkerGCPercent)
			if cpuProfile != "" {
				stop, err := startCPUProfileFile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			return benchmark.ServeWorker(cmd.Context(), os.Stdin, os.Stdout, logging.Stderr(logLevel))
		},
	}
	cmd.Flags().StringVar(&logLevel, "log-level", "warn", "log level")
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the worker's life to this file")
	return cmd
}

func newBenchDCAACmd() *cobra.Command {
	var (
		asJSON   bool
		x        time.Duration
		dOverX   []float64
		logLevel string
		plotFile string
		profiles string
		quiet    bool
		strats   []string
		noSwitch bool
		noOver   bool
		only     []string
		rounds   int
		method   string
		windows  int
		window   time.Duration
		records  int64
	)
	cmd := &cobra.Command{
		Use:   "dcaa",
		Short: "Failures of every replica of one upstream for D = 0.5X..7X: tentative results, added latency, corrections",
		Long: `Runs the network-monitoring query (three monitor partitions, per-host counts
over 100 ms windows in two partitions, busy and probing filters joined on the
host) with replicas: 2 on child worker processes on 127.0.0.1 (plaintext):
  reference    the query with one replica and no failure: the reference results
  overhead     replication_overhead = 1 - throughput(k=2)/throughput(k=1) at
               saturation (sources as fast as they can), with k=2 the query
               with two replicas (DCAA with X: SUnion, boundaries, stable
               ids, acks to both replicas) and k=1 two independent copies of
               it with one replica each (stable merge): both sides do the
               work of two copies.
               --overhead-method paired (the default): --rounds rounds
               (default 12, after four warm-up rounds left out) in which both
               sides run at the same time, each on four worker processes
               of its own (unpinned; the sets swap every round), on the
               same fixed input (--overhead-records per source partition,
               drawn flat out) to its end; each side's CPU time over the
               round is read from its processes (getrusage) while they
               are idle, before and after, and a round's overhead is
               1 - k2's records per CPU-second / k1's = 1 - CPU(k1)/CPU(k2).
               The figure is the mean over the rounds
               (replication_overhead) with its 95% interval
               (replication_overhead_ci95); every sink's stable output
               must equal k=1's (saturation_outputs_match).
               --overhead-method side: both sides run at the
               same time, each on four worker processes of its own
               (unpinned), and in each --overhead-window the records each
               side's copies took in and its processes' CPU time are read;
               a window's overhead is 1 - k2's records per CPU-second / k1's.
               At saturation throughput is records per CPU-second times the
               CPU a side gets, so this is the throughput overhead on equal
               CPUs, and a burst of other work hits both sides in the same
               window. (Throughput at a sink, run after run, measured the
               machine: on a loaded machine the same run's CPU per record
               drifted 4x between rounds.) --rounds rounds of
               --overhead-windows windows after 1 s of settling, the process
               sets swapped each round; the figure is the mean over the
               windows (replication_overhead) with its 95% interval
               (replication_overhead_ci95), the median window and each
               round's mean beside it. A side that waits without using its
               CPU is not charged for it: compare k1/k2_records_per_s and
               k1/k2_cpu_use (per copy, side by side).
               --overhead-method sequential: the earlier method, k=1 and k=2
               run alternately (--rounds pairs), each replica's processes
               pinned to a CPU of their own, throughput at the slower sink,
               the median of the pairs; its runs go to the end and every
               sink's stable output must equal k=1's
               (saturation_outputs_match). The default with in-process
               workers.
  failures     for each strategy (dcaa: max_delay X; immediate: max_delay 0) and
               each D in --d-over-x: a fresh run in which the workers of both
               replicas lose both replicas of one source partition (links held)
               for D, then get them back:
               tentative results, the largest added latency of any answer, and
               whether the stable output (UNDOs applied) equals the reference
  switch       the worker of one source replica killed (SIGKILL): how long the
               downstream sink's output stalled (switch_ms)
and checks the floors of issue 10 (floors[]). Progress goes to stderr; the
result to stdout. --plot FILE draws tentative results against D/X for both
strategies into a PNG.`,
		Example: "  fedstream bench dcaa --json --plot dcaa.png\n  fedstream bench dcaa --only overhead --rounds 10 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if x <= 0 {
				return fmt.Errorf("--x %s: want a positive duration such as 500ms", x)
			}
			skipFailures := false
			if len(only) > 0 {
				want := map[string]bool{}
				for _, p := range only {
					switch p {
					case "overhead", "failures", "switch":
						want[p] = true
					default:
						return fmt.Errorf("--only %q: want overhead, failures or switch", p)
					}
				}
				noOver, noSwitch, skipFailures = noOver || !want["overhead"], noSwitch || !want["switch"], !want["failures"]
			}
			if rounds < 1 {
				return fmt.Errorf("--rounds %d: want at least 1", rounds)
			}
			if windows < 1 || window <= 0 {
				return fmt.Errorf("--overhead-windows %d, --overhead-window %s: want at least one window of a positive duration", windows, window)
			}
			overheadMethod := ""
			if records < 1 {
				return fmt.Errorf("--overhead-records %d: want at least 1", records)
			}
			switch method {
			case "paired":
				overheadMethod = benchmark.OverheadDCAAPaired
				if !cmd.Flags().Changed("rounds") {
					rounds = benchmark.DefaultDCAAPairedRounds
				}
			case "side":
				overheadMethod = benchmark.OverheadDCAASide
			case "sequential":
				overheadMethod = benchmark.OverheadSequential
			default:
				return fmt.Errorf("--overhead-method %q: want paired, side or sequential", method)
			}
			// With the saturation runs, profiles are taken per run
			// (ProfileDir); without them, over each worker's life.
			lifeProfiles, runProfiles := profiles, ""
			if !noOver && method == "sequential" {
				lifeProfiles, runProfiles = "", profiles
			}
			launch, err := benchmark.ProfilingLauncher(lifeProfiles)
			if err != nil {
				return err
			}
			var progress *benchreport.Progress
			if !quiet {
				progress = benchreport.NewProgress(cmd.ErrOrStderr(), "bench dcaa")
			}
			res, err := benchmark.RunDCAA(cmd.Context(), benchmark.DCAAConfig{
				X: x, DOverX: dOverX, Strategies: strats, SkipSwitch: noSwitch, SkipOverhead: noOver, SkipFailures: skipFailures,
				SaturationRounds: rounds, SaturationRecords: records, ProfileDir: runProfiles,
				OverheadMethod: overheadMethod, SideWindows: windows, SideWindow: window,
				Launch: launch, Logger: logging.Stderr(logLevel), Progress: progress,
			})
			if err != nil {
				return err
			}
			if plotFile != "" {
				if err := benchreport.WritePNG(plotFile, res.Charts()...); err != nil {
					return err
				}
				progress.Note("plot written to %s", plotFile)
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			return res.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of text")
	cmd.Flags().DurationVar(&x, "x", benchmark.DefaultDCAAX, "X: the DCAA strategy's max_delay")
	cmd.Flags().Float64SliceVar(&dOverX, "d-over-x", benchmark.DefaultDCAADOverX, "failure durations, as multiples of X")
	cmd.Flags().StringVar(&logLevel, "log-level", "error", "log level of the benchmark and its workers (debug, info, warn, error)")
	cmd.Flags().StringVar(&plotFile, "plot", "", "write a PNG of tentative results against D/X for both strategies to this file")
	cmd.Flags().StringSliceVar(&strats, "strategies", nil, "strategies to run (dcaa, immediate; default both)")
	cmd.Flags().BoolVar(&noSwitch, "no-switch", false, "leave out the kill run (switch_ms)")
	cmd.Flags().BoolVar(&noOver, "no-overhead", false, "leave out the saturation runs (replication_overhead)")
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these parts (overhead, failures, switch; default all)")
	cmd.Flags().StringVar(&profiles, "cpuprofile-dir", "", "write CPU profiles: with the sequential overhead runs, one per run and worker process, DIR/k<1|2>-round<N>-<src0|ops0|src1|ops1>.cpu (ops0: replica 0's operators and sink); otherwise each worker's whole life, DIR/bench-dcaa-[side-]worker-N.cpu")
	cmd.Flags().IntVar(&rounds, "rounds", 5, "overhead rounds: paired, measured rounds (default 12 with paired); side by side, rounds of --overhead-windows windows; sequential, pairs (k=1, k=2) in alternating order")
	cmd.Flags().StringVar(&method, "overhead-method", "paired", "how the replication overhead is measured: paired (k=1 and k=2 at once on the same fixed input, CPU per record round by round, mean and 95% interval), side (k=1 and k=2 at once, CPU per record window by window) or sequential (pinned pairs, sink throughput, median)")
	cmd.Flags().Int64Var(&records, "overhead-records", 300_000, "records per source partition in each paired or sequential overhead round")
	cmd.Flags().IntVar(&windows, "overhead-windows", benchmark.DefaultDCAASideWindows, "windows per side-by-side round")
	cmd.Flags().DurationVar(&window, "overhead-window", benchmark.DefaultDCAASideWindow, "each side-by-side window")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "print no progress lines on stderr")
	return cmd
}
