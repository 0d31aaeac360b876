package mpasim

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
)

func TestRunComparesStrategies(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Orgs, cfg.Runs, cfg.NoisePeriods, cfg.Load = 60, 4, 10, 0.8
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Strategies {
		s, ok := res.Strategies[name]
		if !ok {
			t.Fatalf("strategy %q missing", name)
		}
		if s.AcceptableShare < 0 || s.AcceptableShare > 1 {
			t.Fatalf("%s: acceptable share %v", name, s.AcceptableShare)
		}
	}
	none, bounded, optimal := res.Strategies[StrategyNone], res.Strategies[StrategyBounded], res.Strategies[StrategyOptimal]
	if none.Moves != 0 || none.NoiseMovesPerOrgPeriod != 0 {
		t.Fatalf("no sharing moved: %+v", none)
	}
	if bounded.AcceptableShare > optimal.AcceptableShare {
		t.Fatalf("bounded %v beats the bound %v: the bound is not one", bounded.AcceptableShare, optimal.AcceptableShare)
	}
	if bounded.Moves == 0 || bounded.OverCapacityShare >= none.OverCapacityShare {
		t.Fatalf("bounded contracts did not relieve anything: %+v vs none %+v", bounded, none)
	}
	// The JSON keys scripts rely on.
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	st := m["strategies"].(map[string]any)
	for _, name := range Strategies {
		for _, k := range []string{"acceptable_share", "rounds_p50", "rounds_max", "moves", "noise_moves_per_org_period"} {
			if _, ok := st[name].(map[string]any)[k]; !ok {
				t.Fatalf("%s lacks %q", name, k)
			}
		}
	}
}

func TestRunIsDeterministic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Orgs, cfg.Runs, cfg.NoisePeriods = 40, 2, 5
	a, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Run(context.Background(), cfg)
	for _, name := range Strategies {
		if a.Strategies[name] != b.Strategies[name] {
			t.Fatalf("%s differs between runs with one seed: %+v vs %+v", name, a.Strategies[name], b.Strategies[name])
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, edit := range []func(*Config){
		func(c *Config) { c.Orgs = 1 },
		func(c *Config) { c.Contracts = 0 },
		func(c *Config) { c.Contracts = c.Orgs },
		func(c *Config) { c.Load = 0 },
		func(c *Config) { c.Load = math.NaN() },
		func(c *Config) { c.Runs = 0 },
		func(c *Config) { c.Noise = 1 },
		func(c *Config) { c.SharePriceMin = c.ShareOffer + 0.01 },
		func(c *Config) { c.MaxLoadShare = 0 },
		func(c *Config) { c.MaxLoadShare = math.NaN() },
		func(c *Config) { c.OverloadFactor = -1 },
		func(c *Config) { c.OverloadFactor = math.Inf(1) },
	} {
		c := DefaultConfig()
		edit(&c)
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: Validate = %v, want ErrBadConfig", c, err)
		}
	}
}

// The max-flow bound on a tiny graph worked by hand: a -> b -> c in a
// line, a over by 3, c under by 5, each contract carrying at most 2.
func TestOptimalIsAFlow(t *testing.T) {
	g := newFlowNet(5)
	s, tt := 3, 4
	g.addEdge(s, 0, 3)
	g.addEdge(0, 1, 2)
	g.addEdge(1, 2, 2)
	g.addEdge(2, tt, 5)
	if got := g.maxFlow(s, tt); math.Abs(got-2) > 1e-9 {
		t.Fatalf("max flow %v, want 2 (limited by the contracts)", got)
	}
}

// The default scenario is one where the contract graph can carry the
// overload (the central bound reaches it in every run), so the share of
// runs the bounded rules reach measures the rules, not the graph: at load
// 0.9 with 4 contracts per org they must reach it in every run here, well
// within 10 rounds, and keep noise moves under 0.1 per org and period;
// no sharing and fixed prices must not (the gaps the table shows). With
// the earlier default (contracts' max load 30% of the smaller partner's
// capacity) the bound itself failed in some runs.
func TestDefaultScenarioMeetsTheFloor(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Orgs, cfg.Runs, cfg.Load, cfg.Contracts, cfg.NoisePeriods = 200, 4, 0.9, 4, 10
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	none, fixed, bounded, optimal := res.Strategies[StrategyNone], res.Strategies[StrategyFixed], res.Strategies[StrategyBounded], res.Strategies[StrategyOptimal]
	if optimal.AcceptableShare != 1 {
		t.Fatalf("the bound fails in the default scenario: %+v", optimal)
	}
	if bounded.AcceptableShare != 1 || bounded.AcceptableRoundsP50 > cfg.Within || bounded.NoiseMovesPerOrgPeriod > 0.1 {
		t.Fatalf("bounded below the floor: %+v", bounded)
	}
	if none.AcceptableShare != 0 || fixed.AcceptableShare >= bounded.AcceptableShare {
		t.Fatalf("no gap: none %+v, fixed %+v", none, fixed)
	}
	if res.OverloadPenalty <= res.MigrationCost {
		t.Fatalf("overload step %v does not exceed the migration cost %v", res.OverloadPenalty, res.MigrationCost)
	}
}
