package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/federation/mpasim"
)

// newSimCmd is `fedstream sim`, simulations without network.
func newSimCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate mechanisms at scale, without network",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newSimMPACmd())
	return cmd
}

func newSimMPACmd() *cobra.Command {
	cfg := mpasim.DefaultConfig()
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "mpa",
		Short: "Compare load sharing between orgs: none, fixed-price, bounded-price contracts and the central optimum",
		Long: `Simulates --runs random federations of --orgs orgs, each with --contracts contracts
to random partners (max load --max-load-share of the smaller partner's capacity),
random capacities, and loads spread +-spread around --load, scaled so that total
load / total capacity is --load. Each federation is run under four strategies:
  none     no sharing
  fixed    contracts with one fixed price, the federation/mpa decision rules
  bounded  contracts with a price range, the same rules (the load manager's)
  optimal  a central planner moving divisible load along the same contracts
           (a max-flow bound no mechanism can beat)
and prints, per strategy, the share of runs that reach an acceptable allocation
(every org at or under capacity; every org at or over it when the total is over)
within --within rounds, the rounds until nothing moves, the task moves made,
and the moves per org per period under +-noise load variation afterwards.`,
		Example: "  fedstream sim mpa --orgs 1000 --contracts 4 --load 0.9 --runs 20 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := mpasim.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%d orgs, %d contracts per org, load %.2f of capacity, %d runs, seed %d (bounded [%.3g, %.3g], fixed %.3g, migration cost %.3g; %.1fs)\n",
				cfg.Orgs, cfg.Contracts, cfg.Load, cfg.Runs, cfg.Seed, res.PriceMin, res.PriceMax, res.PriceFixed, res.MigrationCost, res.Seconds)
			fmt.Fprintf(out, "%-8s %10s %10s %10s %10s %10s %12s %10s\n", "strategy", "acceptable", "rounds_p50", "rounds_max", "acc_p50", "moves", "noise_moves", "over_cap")
			for _, name := range mpasim.Strategies {
				s := res.Strategies[name]
				fmt.Fprintf(out, "%-8s %10.3f %10d %10d %10d %10.1f %12.4f %10.4f\n", name, s.AcceptableShare, s.RoundsP50, s.RoundsMax, s.AcceptableRoundsP50, s.Moves, s.NoiseMovesPerOrgPeriod, s.OverCapacityShare)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Orgs, "orgs", cfg.Orgs, "number of orgs")
	f.IntVar(&cfg.Contracts, "contracts", cfg.Contracts, "contracts per org")
	f.Float64Var(&cfg.Load, "load", cfg.Load, "total load / total capacity (F)")
	f.IntVar(&cfg.Runs, "runs", cfg.Runs, "random federations to simulate")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (the same seed gives the same figures)")
	f.IntVar(&cfg.Within, "within", cfg.Within, "rounds an acceptable allocation must be reached in")
	f.IntVar(&cfg.MaxRounds, "max-rounds", cfg.MaxRounds, "load periods run to converge")
	f.Float64Var(&cfg.Noise, "noise", cfg.Noise, "load noise after convergence: each org's load x (1 +- noise) per period")
	f.IntVar(&cfg.NoisePeriods, "noise-periods", cfg.NoisePeriods, "periods run with noise after convergence")
	f.Float64Var(&cfg.Spread, "spread", cfg.Spread, "orgs' shares of capacity are drawn from load x (1 +- spread)")
	f.Float64Var(&cfg.SharePriceMin, "share-price-min", cfg.SharePriceMin, "p_min is the marginal cost at this share of capacity (fixed contracts use it as their price)")
	f.Float64Var(&cfg.SharePriceMax, "share-price-max", cfg.SharePriceMax, "p_max is the marginal cost at this share of capacity")
	f.Float64Var(&cfg.ShareOffer, "share-offer", cfg.ShareOffer, "the migration cost is set so that an org offers above this share of capacity at p_min")
	f.Float64Var(&cfg.ShareReturn, "share-return", cfg.ShareReturn, "a moved task comes home once its owner would be under this share of capacity with it")
	f.Float64Var(&cfg.ShareFixed, "share-fixed", cfg.ShareFixed, "fixed contracts' price is the marginal cost at this share of capacity")
	f.Float64Var(&cfg.Smoothing, "smoothing", cfg.Smoothing, "EWMA weight of a new load sample in the orgs' load measurement")
	f.Float64Var(&cfg.MaxLoadShare, "max-load-share", cfg.MaxLoadShare, "each contract's max load is this share of the smaller partner's capacity")
	f.Float64Var(&cfg.OverloadFactor, "overload-factor", cfg.OverloadFactor, "step of every org's marginal cost at its capacity, in migration costs (0: none)")
	f.BoolVar(&cfg.NoCeiling, "no-ceiling", cfg.NoCeiling, "partners accept without the ceiling of capacity plus what they could pass on (to measure the ceiling)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
