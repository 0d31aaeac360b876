package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/coordinator/health/sim"
)

func newBenchScalingCmd() *cobra.Command {
	var (
		asJSON bool
		seed   int64
	)
	cmd := &cobra.Command{
		Use:   "scaling",
		Short: "The health manager's policy on simulated scaling scenarios (DS2 word count, load changes, faults, noise)",
		Long: `Runs the health manager's policy (detectors, diagnosers, resolver choice, DS2
sizing, settling, evaluation and blacklist) against a fluid model of a query,
one sample per simulated second, with the loop's defaults (10-sample window,
30 s settling). It measures the policy, not the runtime: a rescale takes
effect at once in the model.

  wordcount    DS2's word count: 1M sentences/min, splitters of 100K sentences/min,
               counters of 1M words/min, 20 words a sentence, from 1 splitter and
               1 counter; the optimum is 10 + 20
  load_change  the same converged, then the load drops 20% for 10 minutes and
               rises 30% for 10 minutes
  diagnoses    a keyed operator of 4 instances at 95% load with one instance slowed
               by 25/50/100% or receiving 5-50% more keys
  noise        an hour of +-20% noise around 60% of capacity
  blacklist_recovery  a slow instance whose slowness follows its data: the move does
               not help, is blacklisted, and scaling is used instead`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := sim.RunAll(seed)
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			w := cmd.OutOrStdout()
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
			fmt.Fprintf(w, "wordcount:   %d steps, last at %d s: %s, over-provisioned %.1f%%\n", wc.Steps, wc.Seconds, strings.Join(fin, ", "), wc.Overprovision*100)
			fmt.Fprintf(w, "load change: %d actions after converging, %d oscillations\n", r.LoadChange.Actions, r.LoadChange.Oscillations)
			fmt.Fprintf(w, "noise:       %d actions over %d simulated seconds\n", r.Noise.Actions, r.Noise.SimulatedS)
			for _, d := range r.Diagnoses {
				got := d.Diagnosed
				if got == "" {
					got = "nothing (no backlog)"
				}
				fmt.Fprintf(w, "diagnosis:   %-20s -> %s\n", d.Injected, got)
			}
			fmt.Fprintf(w, "blacklist:   %s (recovered: %v)\n", strings.Join(r.Recovery.Actions, ", "), r.Recovery.Recovered)
			fmt.Fprintf(w, "model:       %s\n", r.Model)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().Int64Var(&seed, "seed", 1, "seed of the noise scenario")
	return cmd
}
