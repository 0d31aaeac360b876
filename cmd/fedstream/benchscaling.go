package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator/health/sim"
)

// scalingReport is what `fedstream bench scaling --json` prints: the
// model's report, with the word count, the load change and the noise
// measured on real orgs in wordcount, load_change and noise (and the
// model's in wordcount_simulated, load_change_simulated and
// noise_simulated) unless --sim-only.
type scalingReport struct {
	Wordcount           any             `json:"wordcount"`
	WordcountSimulated  *sim.Wordcount  `json:"wordcount_simulated,omitempty"`
	LoadChange          any             `json:"load_change"`
	LoadChangeSimulated *sim.LoadChange `json:"load_change_simulated,omitempty"`
	Noise               any             `json:"noise"`
	NoiseSimulated      *sim.Noise      `json:"noise_simulated,omitempty"`
	Diagnoses           []sim.Diagnosed `json:"diagnoses"`
	DiagnosesReal       []RealDiagnosed `json:"diagnoses_real,omitempty"`
	Recovery            sim.Recovery    `json:"blacklist_recovery"`
	Model               string          `json:"model"`
}

func newBenchScalingCmd() *cobra.Command {
	var (
		asJSON    bool
		seed      int64
		simOnly   bool
		sentences int
		settle    time.Duration
		timeout   time.Duration
		logLevel  string
		faults    bool
		scenarios []string
		warmup    time.Duration
		phase     time.Duration
		ratio     int
	)
	cmd := &cobra.Command{
		Use:   "scaling",
		Short: "The health manager on DS2's word count on a real in-process org, and its policy on simulated scenarios (load changes, faults, noise)",
		Long: `Runs DS2's word count on a real org in this process (a coordinator with Raft
and its health manager, 3 workers over mutual TLS): a source of sentences, a
splitter and a counter whose per-tuple costs give them DS2's capacities scaled
to this machine (--sentences a second from the source, splitters of a tenth of
that, counters of a twentieth of its words: the optimum is 10 + 20), both
starting at parallelism 1, with the health loop's one-second sensors, policy
and live rescale. It stops once the manager has acted and stayed quiet for a
settling time and more after its last evaluation (about a minute and a half
with the default --real-settle), or after --real-timeout. --real-faults adds
scenario (c) on real orgs of 4 workers (diagnoses_real): one instance of a
keyed operator at 95% load on a worker whose costs are 25/50/100% higher,
then data skew of 5-50%, 45-60 s each.

Then, on new orgs of the same shape, the word count submitted at the
optimum (10 + 20) with its source's real rate changed while it runs (every
worker's generators paced by a factor): load_change runs full load for
--load-warmup, 80% for --load-phase, then 104% as long, counting actions
and oscillations (a scale-down after a scale-up of the same operator);
noise runs an hour of 60% load +-20% (60% of the capacity of the counter
partition that gets the most words, about a fifth of full load, at 10 +
20) compressed --noise-ratio times
(sensor window, policy interval and settling divided by it), after 15 s
at the mean load. Both count every action from the query's submission
on (warmup_actions says how many of them came before the load changed). --real-scenarios picks which of wordcount, load_change and noise
run (six to seven minutes for all three on a quiet machine).

Then runs the policy (detectors, diagnosers, resolver choice, DS2 sizing,
settling, evaluation and blacklist) against a fluid model of a query, one
sample per simulated second, with the loop's defaults (10-sample window, 30 s
settling), which measures the policy, not the runtime (a rescale takes effect
at once in the model):

  wordcount    the same word count in the model (wordcount_simulated in the JSON
               unless --sim-only)
  load_change  the same converged, then the load drops 20% for 10 minutes and
               rises 30% for 10 minutes (load_change_simulated unless --sim-only)
  diagnoses    a keyed operator of 4 instances at 95% load with one instance slowed
               by 25/50/100% or receiving 5-50% more keys; last, the blacklist
               recovery below (then: what followed the first action)
  noise        an hour of +-20% noise around 60% of capacity (noise_simulated
               unless --sim-only)
  blacklist_recovery  a slow instance whose slowness follows its data: the move does
               not help, is blacklisted, and scaling is used instead`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := sim.RunAll(seed)
			out := scalingReport{Wordcount: r.Wordcount, LoadChange: r.LoadChange, Noise: r.Noise, Diagnoses: r.Diagnoses, Recovery: r.Recovery, Model: r.Model}
			var (
				real     *RealWordcount
				realLoad *RealLoadChange
				realNois *RealNoise
			)
			if !simOnly {
				if sentences <= 0 || settle <= 0 || timeout <= 0 || warmup <= 0 || phase <= 0 || ratio < 1 {
					return fmt.Errorf("--sentences, --real-settle, --real-timeout, --load-warmup, --load-phase and --noise-ratio must be positive")
				}
				ro := realOptions{sentences: sentences, settle: settle, timeout: timeout, logger: logging.Stderr(logLevel), progress: cmd.ErrOrStderr()}
				lo := loadOptions{realOptions: ro, warmup: warmup, phase: phase, ratio: ratio, seed: seed}
				for _, sc := range scenarios {
					var err error
					switch sc {
					case "wordcount":
						if real, err = runRealWordcount(cmd.Context(), ro); err != nil {
							return fmt.Errorf("real-org word count: %w", err)
						}
						out.Wordcount, out.WordcountSimulated = real, &r.Wordcount
					case "load_change":
						if realLoad, err = runRealLoadChange(cmd.Context(), lo); err != nil {
							return fmt.Errorf("real-org load change: %w", err)
						}
						out.LoadChange, out.LoadChangeSimulated = realLoad, &r.LoadChange
					case "noise":
						if realNois, err = runRealNoise(cmd.Context(), lo); err != nil {
							return fmt.Errorf("real-org noise: %w", err)
						}
						out.Noise, out.NoiseSimulated = realNois, &r.Noise
					default:
						return fmt.Errorf("--real-scenarios: unknown scenario %q (want wordcount, load_change, noise)", sc)
					}
				}
			}
			if faults {
				for _, slow := range []float64{0.25, 0.5, 1} {
					d, err := runRealSlowInstance(cmd.Context(), realOptions{settle: settle, timeout: 2 * time.Minute,
						logger: logging.Stderr(logLevel), progress: cmd.ErrOrStderr()}, slow)
					if err != nil {
						return fmt.Errorf("real-org %s: %w", d.Injected, err)
					}
					out.DiagnosesReal = append(out.DiagnosesReal, d)
				}
				for _, skew := range []float64{0.05, 0.1, 0.2, 0.5} {
					d, err := runRealSkew(cmd.Context(), realOptions{settle: settle, timeout: time.Minute,
						logger: logging.Stderr(logLevel), progress: cmd.ErrOrStderr()}, skew)
					if err != nil {
						return fmt.Errorf("real-org %s: %w", d.Injected, err)
					}
					out.DiagnosesReal = append(out.DiagnosesReal, d)
				}
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			w := cmd.OutOrStdout()
			if real != nil {
				var fin []string
				for _, op := range []string{"counter", "splitter"} {
					fin = append(fin, fmt.Sprintf("%s %d (optimum %d)", op, real.Final[op], real.Optimal[op]))
				}
				fmt.Fprintf(w, "wordcount (real org): %d scaling steps, last at %.1f s: %s, over-provisioned %.1f%%, converged %v; %d slot rebalances\n", real.Steps, real.Seconds, strings.Join(fin, ", "), real.Overprovision*100, real.Converged, real.Rebalances)
				for _, a := range real.Actions {
					fmt.Fprintf(w, "  %6.1f s  %-8s %-18s %-10s %d -> %d  true rate %.0f/s  %s (judged at %.1f s)\n", a.AtS, a.Fragment, a.Diagnosis, a.Action, a.From, a.To, a.TrueRate, a.Outcome, a.EvaluatedS)
				}
				fmt.Fprintf(w, "  calibration: %s\n  load average at start %s, at end %s\n", real.Calibration.Note, real.LoadAvg["start"], real.LoadAvg["end"])
			}
			wc := r.Wordcount
			var ops []string
			for op := range wc.Optimal {
				ops = append(ops, op)
			}
			sort.Strings(ops)
			var fin []string
			for _, op := range ops {
				fin = append(fin, fmt.Sprintf("%s %d (optimum %d)", op, wc.Final[op], wc.Optimal[op]))
			}
			fmt.Fprintf(w, "wordcount (model): %d steps, last at %d s: %s, over-provisioned %.1f%%\n", wc.Steps, wc.Seconds, strings.Join(fin, ", "), wc.Overprovision*100)
			if realLoad != nil {
				fmt.Fprintf(w, "load change (real org): %d actions from the submission on (%d of them in the warm-up at full load), %d oscillations (scale-up then scale-down), %d reversals\n",
					realLoad.Actions, realLoad.WarmupActions, realLoad.Oscillations, realLoad.Reversals)
				for _, p := range realLoad.Phases {
					fmt.Fprintf(w, "  %5.0f-%5.0f s  %-9s pace %.2f: source %.0f/s measured (%.0f/s expected), %d actions, splitter %d, counter %d\n",
						p.FromS, p.ToS, p.Name, p.Factor, p.SourceRate, p.ExpectedRate, p.ActionsInIt, p.Parallelism["splitter"], p.Parallelism["counter"])
				}
				for _, a := range realLoad.Log {
					fmt.Fprintf(w, "  %6.1f s  %-8s %-18s %-10s %d -> %d  %s\n", a.AtS, a.Fragment, a.Diagnosis, a.Action, a.From, a.To, a.Outcome)
				}
			}
			if realNois != nil {
				fmt.Fprintf(w, "noise (real org): %d actions from the submission on, over %d s of stationary load compressed %dx into %.0f s and its warm-up (%d of them in the warm-up); source %.0f/s measured on average; splitter %d, counter %d at the end\n",
					realNois.Actions, realNois.SimulatedS, realNois.Ratio, realNois.WallS, realNois.WarmupActions, realNois.MeasuredMeanRate, realNois.Parallelism["splitter"], realNois.Parallelism["counter"])
				for _, a := range realNois.Log {
					fmt.Fprintf(w, "  %6.1f s  %-8s %-18s %-10s %d -> %d  %s\n", a.AtS, a.Fragment, a.Diagnosis, a.Action, a.From, a.To, a.Outcome)
				}
			}
			fmt.Fprintf(w, "load change (model): %d actions after converging, %d oscillations\n", r.LoadChange.Actions, r.LoadChange.Oscillations)
			fmt.Fprintf(w, "noise (model): %d actions over %d simulated seconds\n", r.Noise.Actions, r.Noise.SimulatedS)
			for _, d := range r.Diagnoses {
				got := d.Diagnosed
				if got == "" {
					got = "nothing (no backlog)"
				}
				if d.Recovered != nil {
					fmt.Fprintf(w, "diagnosis:   %-20s -> %s, %s, then %s (recovered: %v)\n", d.Injected, got, d.Action, strings.Join(d.Then, ", "), *d.Recovered)
					continue
				}
				fmt.Fprintf(w, "diagnosis:   %-20s -> %s\n", d.Injected, got)
			}
			for _, d := range out.DiagnosesReal {
				fmt.Fprintf(w, "diagnosis (real org): %-20s -> %s of partition %d (injected at %d), %s: %s at %.1f s\n", d.Injected, d.Diagnosed, d.DiagnosedPartition, d.SlowPartition, d.Action, d.Outcome, d.AtS)
			}
			fmt.Fprintf(w, "blacklist:   %s (recovered: %v)\n", strings.Join(r.Recovery.Actions, ", "), r.Recovery.Recovered)
			fmt.Fprintf(w, "model:       %s\n", r.Model)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().Int64Var(&seed, "seed", 1, "seed of the noise scenario")
	cmd.Flags().BoolVar(&simOnly, "sim-only", false, "skip the real-org scenarios (the model alone runs in under a second; --real-faults still runs its real orgs)")
	cmd.Flags().IntVar(&sentences, "sentences", defaultRealSentences, "real org: sentences per second from the source (DS2's rates are scaled by this over 1M/min)")
	cmd.Flags().DurationVar(&settle, "real-settle", defaultRealSettle, "real org: the health manager's settling time after an action")
	cmd.Flags().DurationVar(&timeout, "real-timeout", defaultRealTimeout, "real org: give up after this long")
	cmd.Flags().BoolVar(&faults, "real-faults", false, "also run scenario (c) on real orgs of 4 workers: slow instances (25/50/100%, one worker slow) and data skew (5-50%), about 45 s each")
	cmd.Flags().StringSliceVar(&scenarios, "real-scenarios", []string{"wordcount", "load_change", "noise"}, "real org: the scenarios to run (wordcount, load_change, noise)")
	cmd.Flags().DurationVar(&warmup, "load-warmup", defaultLoadWarmup, "real org, load change: how long the full load runs before it drops")
	cmd.Flags().DurationVar(&phase, "load-phase", defaultLoadPhase, "real org, load change: how long the 80% and then the 104% load run")
	cmd.Flags().IntVar(&ratio, "noise-ratio", defaultNoiseRatio, "real org, noise: the hour of stationary load compressed this many times (sensor window, policy interval and settling divided by it)")
	cmd.Flags().StringVar(&logLevel, "log-level", "error", "real org: log level of its processes (logs go to stderr)")
	return cmd
}
