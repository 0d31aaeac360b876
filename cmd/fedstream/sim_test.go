package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func runRoot(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// `sim mpa --json` prints one object whose strategies carry the keys the
// issue promises scripts, and the flags reach the simulation.
func TestSimMPAJSON(t *testing.T) {
	out, err := runRoot(t, "sim", "mpa", "--orgs", "60", "--contracts", "4", "--load", "0.9", "--runs", "2",
		"--noise-periods", "5", "--max-load-share", "0.4", "--overload-factor", "3", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Config struct {
			Orgs           int     `json:"orgs"`
			MaxLoadShare   float64 `json:"max_load_share"`
			OverloadFactor float64 `json:"overload_factor"`
		} `json:"config"`
		MigrationCost   float64                   `json:"migration_cost"`
		OverloadPenalty float64                   `json:"overload_penalty"`
		Strategies      map[string]map[string]any `json:"strategies"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if res.Config.Orgs != 60 || res.Config.MaxLoadShare != 0.4 || res.Config.OverloadFactor != 3 {
		t.Fatalf("flags not applied: %+v", res.Config)
	}
	if d := res.OverloadPenalty - 3*res.MigrationCost; d > 1e-9 || d < -1e-9 {
		t.Fatalf("overload penalty %v, want 3 x migration cost %v", res.OverloadPenalty, res.MigrationCost)
	}
	for _, name := range []string{"none", "fixed", "bounded", "optimal"} {
		for _, k := range []string{"acceptable_share", "rounds_p50", "rounds_max", "moves", "noise_moves_per_org_period"} {
			if _, ok := res.Strategies[name][k]; !ok {
				t.Fatalf("strategy %q lacks %q:\n%s", name, k, out)
			}
		}
	}
}

func TestSimMPARefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--orgs", "1"},
		{"--contracts", "0"},
		{"--load", "0"},
		{"--max-load-share", "0"},
		{"--overload-factor", "-1"},
	} {
		_, err := runRoot(t, append([]string{"sim", "mpa", "--runs", "1"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "invalid simulation parameters") {
			t.Errorf("%v: err = %v, want invalid simulation parameters", args, err)
		}
	}
}
