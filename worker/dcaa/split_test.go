package dcaa

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

func TestSplitDelay(t *testing.T) {
	const X = 1200 * time.Millisecond
	chain := []GraphNode{{Name: "src"}, {Name: "a", Inputs: []string{"src"}, Delays: true},
		{Name: "b", Inputs: []string{"a"}, Delays: true}, {Name: "sink", Inputs: []string{"b"}}}
	// src1 -> a -> b -> c -> join ; src2 -> join: the short branch's
	// join is on the long path too, so it gets X/4 like the others.
	diamond := []GraphNode{{Name: "s1"}, {Name: "s2"},
		{Name: "a", Inputs: []string{"s1"}, Delays: true}, {Name: "b", Inputs: []string{"a"}, Delays: true},
		{Name: "c", Inputs: []string{"b"}, Delays: true}, {Name: "j", Inputs: []string{"c", "s2"}, Delays: true},
		// A side branch off s2 with one delaying fragment: X/1.
		{Name: "side", Inputs: []string{"s2"}, Delays: true}}
	for _, tc := range []struct {
		name  string
		x     time.Duration
		nodes []GraphNode
		want  map[string]time.Duration
	}{
		{"chain", X, chain, map[string]time.Duration{"src": 0, "a": X / 2, "b": X / 2, "sink": 0}},
		{"zero", 0, chain, map[string]time.Duration{"src": 0, "a": 0, "b": 0, "sink": 0}},
		{"strict", Strict, chain, map[string]time.Duration{"src": 0, "a": Strict, "b": Strict, "sink": 0}},
		{"branches", X, diamond, map[string]time.Duration{"s1": 0, "s2": 0, "a": X / 4, "b": X / 4, "c": X / 4, "j": X / 4, "side": X}},
		{"rounds down", 1000 * time.Nanosecond, []GraphNode{{Name: "s"}, {Name: "a", Inputs: []string{"s"}, Delays: true},
			{Name: "b", Inputs: []string{"a"}, Delays: true}, {Name: "c", Inputs: []string{"b"}, Delays: true}},
			map[string]time.Duration{"s": 0, "a": 333, "b": 333, "c": 333}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SplitDelay(tc.x, tc.nodes)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// A fragment's budget is the X spent up to and including it on the
// longest path to it: its share times the delaying fragments on that
// path, never more than X.
func TestSplitBudgets(t *testing.T) {
	const X = 1200 * time.Millisecond
	diamond := []GraphNode{{Name: "s1"}, {Name: "s2"},
		{Name: "a", Inputs: []string{"s1"}, Delays: true}, {Name: "b", Inputs: []string{"a"}, Delays: true},
		{Name: "c", Inputs: []string{"b"}, Delays: true}, {Name: "j", Inputs: []string{"c", "s2"}, Delays: true},
		{Name: "side", Inputs: []string{"s2"}, Delays: true}}
	got, err := SplitBudgets(X, diamond)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{"s1": 0, "s2": 0, "a": X / 4, "b": X / 2, "c": 3 * X / 4, "j": X, "side": X}
	if !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got, _ := SplitBudgets(Strict, diamond); got["j"] != Strict {
		t.Fatalf("strict: %v", got)
	}
}

// Every source-to-sink path's shares add up to at most X, on a graph
// where a naive per-node split (by each node's own depth) would not.
func TestSplitDelayPathsWithinX(t *testing.T) {
	const X = time.Second
	nodes := []GraphNode{{Name: "s"}, {Name: "a", Inputs: []string{"s"}, Delays: true},
		{Name: "b", Inputs: []string{"s"}, Delays: true}, {Name: "c", Inputs: []string{"b"}, Delays: true},
		{Name: "d", Inputs: []string{"a", "c"}, Delays: true}, {Name: "e", Inputs: []string{"a"}, Delays: true}}
	shares, err := SplitDelay(X, nodes)
	if err != nil {
		t.Fatal(err)
	}
	paths := [][]string{{"a", "d"}, {"b", "c", "d"}, {"a", "e"}}
	for _, p := range paths {
		var sum time.Duration
		for _, n := range p {
			sum += shares[n]
		}
		if sum > X {
			t.Fatalf("path %v: shares %v add up to %v > X", p, shares, sum)
		}
	}
	if shares["e"] <= X/3 {
		t.Fatalf("e is on a 2-fragment path only, got %v", shares["e"])
	}
}

func TestSplitDelayBadGraph(t *testing.T) {
	for _, nodes := range [][]GraphNode{
		{{Name: "a", Inputs: []string{"b"}, Delays: true}, {Name: "b", Inputs: []string{"a"}, Delays: true}},
		{{Name: "a", Inputs: []string{"nowhere"}}},
		{{Name: "a"}, {Name: "a"}},
		{{Name: ""}},
	} {
		if _, err := SplitDelay(time.Second, nodes); !errors.Is(err, ErrGraph) {
			t.Fatalf("%v: err %v, want ErrGraph", nodes, err)
		}
	}
}

func TestPlanShares(t *testing.T) {
	q, err := queryspec.Parse("netmon.yaml", []byte(`
name: netmon
replicas: 2
availability: {max_delay: 3s}
sources:
  - name: conns
    schema: {time: timestamp, src: string, dst: string, port: int}
    generator: {kind: netmon, monitors: 3, rate: 100, seed: 7}
operators:
  - {name: per_src, type: aggregate, input: conns, window: {size: 60s}, group_by: [src], aggregates: {conns: "count()"}, parallelism: 2}
  - {name: busy, type: filter, input: per_src, where: "conns > 100"}
  - {name: top, type: aggregate, input: busy, window: {size: 60s}, aggregates: {n: "count()"}}
sinks:
  - {name: alerts, input: top}
  - {name: raw, input: per_src}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	shares, err := PlanShares(p)
	if err != nil {
		t.Fatal(err)
	}
	// conns -> per_src -> busy -> top -> alerts (busy is not fused: per_src
	// feeds two fragments; alerts reads one partition: pass-through);
	// per_src -> raw merges per_src's two partitions.
	want := map[string]time.Duration{"conns": 0, "per_src": time.Second, "busy": time.Second, "top": time.Second,
		"alerts": 0, "raw": 1500 * time.Millisecond}
	for n, w := range want {
		if shares[n] != w {
			t.Fatalf("share of %s = %v, want %v (all: %v)", n, shares[n], w, shares)
		}
	}
}

func TestStateProtoRoundTrip(t *testing.T) {
	for _, s := range []State{Unknown, Stable, UpFailure, Stabilization} {
		if got := StateFromProto(s.Proto()); got != s {
			t.Fatalf("%v -> %v -> %v", s, s.Proto(), got)
		}
		if int32(s.Proto()) != int32(s) {
			t.Fatalf("%v is %d in the proto, %d here", s, s.Proto(), s)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	ok := Config{ID: 0, Replicas: 2, Inputs: []int{2}, Share: time.Second, Detect: time.Second}
	if _, err := New(ok); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(c *Config){
		"id out of range":        func(c *Config) { c.ID = 2 },
		"no replicas":            func(c *Config) { c.Replicas = 0 },
		"no detection":           func(c *Config) { c.Detect = 0 },
		"negative share":         func(c *Config) { c.Share = -1 },
		"no inputs":              func(c *Config) { c.Inputs = nil },
		"input without replicas": func(c *Config) { c.Inputs = []int{0} },
	} {
		c := ok
		mod(&c)
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Fatalf("%s: err %v, want ErrConfig", name, err)
		}
	}
}

func TestDetectTimeout(t *testing.T) {
	for _, tc := range []struct{ interval, want time.Duration }{
		{50 * time.Millisecond, 200 * time.Millisecond},
		{time.Second, 4 * time.Second},
		{time.Millisecond, MinDetect},
		{0, MinDetect},
	} {
		if got := DetectTimeout(tc.interval); got != tc.want {
			t.Fatalf("DetectTimeout(%v) = %v, want %v", tc.interval, got, tc.want)
		}
	}
}
