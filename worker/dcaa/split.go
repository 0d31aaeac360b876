package dcaa

import (
	"errors"
	"fmt"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// ErrGraph means the graph handed to SplitDelay is not a DAG of known
// nodes: an input names no node, or the inputs form a cycle.
var ErrGraph = errors.New("dcaa: bad graph")

// GraphNode is one fragment of a query graph for SplitDelay. Delays says
// the fragment's input merge (SUnion) may hold data back under a failure:
// every fragment with inputs does, except a sink that passes its single
// input through unchanged.
type GraphNode struct {
	Name   string
	Inputs []string
	Delays bool
}

// Strict is the share of a query that never emits tentative results: no
// timer ever expires.
const Strict = time.Duration(1<<63 - 1)

// SplitDelay divides the query's bound x among its delaying fragments so
// that, on every path from a source to a sink, the shares of the
// delaying fragments add up to at most x. A fragment gets
// x / (the number of delaying fragments on the longest path through it):
// every path p through it has at most that many, so each fragment on p
// gets at most x/len(p) and p's total stays within x, while a fragment
// off the longest path (a short branch) gets a larger share than the
// plain x/longest. Shares round down (never above x in total).
// Fragments that do not delay get 0. x == Strict gives every fragment
// Strict; x <= 0 gives 0 (process at once).
func SplitDelay(x time.Duration, nodes []GraphNode) (map[string]time.Duration, error) {
	shares, _, err := splitDelay(x, nodes)
	return shares, err
}

// SplitBudgets is SplitDelay's companion: each delaying fragment's
// budget, the part of x spent on the longest path from a source up to
// and including it (its share times the delaying fragments on that path;
// Config.Budget). Strict and 0 as in SplitDelay.
func SplitBudgets(x time.Duration, nodes []GraphNode) (map[string]time.Duration, error) {
	shares, up, err := splitDelay(x, nodes)
	if err != nil {
		return nil, err
	}
	budgets := make(map[string]time.Duration, len(shares))
	for name, sh := range shares {
		switch {
		case sh == Strict || sh == 0:
			budgets[name] = sh
		default:
			budgets[name] = sh * time.Duration(up[name])
		}
	}
	return budgets, nil
}

func splitDelay(x time.Duration, nodes []GraphNode) (map[string]time.Duration, map[string]int, error) {
	byName := make(map[string]*GraphNode, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		if n.Name == "" {
			return nil, nil, fmt.Errorf("%w: node %d has no name", ErrGraph, i)
		}
		if byName[n.Name] != nil {
			return nil, nil, fmt.Errorf("%w: node %q appears twice", ErrGraph, n.Name)
		}
		byName[n.Name] = n
	}
	outputs := map[string][]string{}
	for _, n := range nodes {
		for _, in := range n.Inputs {
			if byName[in] == nil {
				return nil, nil, fmt.Errorf("%w: node %q reads %q, which is not in the graph", ErrGraph, n.Name, in)
			}
			outputs[in] = append(outputs[in], n.Name)
		}
	}
	weight := func(n *GraphNode) int {
		if n.Delays {
			return 1
		}
		return 0
	}
	// up[n]: delaying fragments on the longest path from a source to n,
	// n included; down[n]: from n to a sink, n included.
	up, err := longest(nodes, byName, func(n *GraphNode) []string { return n.Inputs }, weight)
	if err != nil {
		return nil, nil, err
	}
	down, err := longest(nodes, byName, func(n *GraphNode) []string { return outputs[n.Name] }, weight)
	if err != nil {
		return nil, nil, err
	}
	shares := make(map[string]time.Duration, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		switch {
		case !n.Delays:
			shares[n.Name] = 0
		case x == Strict:
			shares[n.Name] = Strict
		case x <= 0:
			shares[n.Name] = 0
		default:
			// The path through n with the most delaying fragments has
			// up + down - 1 of them (n is counted in both).
			shares[n.Name] = x / time.Duration(up[n.Name]+down[n.Name]-1)
		}
	}
	return shares, up, nil
}

// longest computes, for every node, the largest total weight of a path
// ending at it following next (memoised depth-first search; a cycle is an
// error).
func longest(nodes []GraphNode, byName map[string]*GraphNode, next func(*GraphNode) []string, weight func(*GraphNode) int) (map[string]int, error) {
	const visiting = -1
	memo := make(map[string]int, len(nodes))
	var visit func(n *GraphNode) (int, error)
	visit = func(n *GraphNode) (int, error) {
		switch v, ok := memo[n.Name]; {
		case ok && v == visiting:
			return 0, fmt.Errorf("%w: cycle through %q", ErrGraph, n.Name)
		case ok:
			return v, nil
		}
		memo[n.Name] = visiting
		best := 0
		for _, m := range next(n) {
			v, err := visit(byName[m])
			if err != nil {
				return 0, err
			}
			best = max(best, v)
		}
		memo[n.Name] = best + weight(n)
		return memo[n.Name], nil
	}
	for i := range nodes {
		if _, err := visit(&nodes[i]); err != nil {
			return nil, err
		}
	}
	return memo, nil
}

// PlanShares is SplitDelay over a query's placed (fused) plan with the
// query's own bound: availability.max_delay, Strict for "strict".
func PlanShares(p *queryspec.Plan) (map[string]time.Duration, error) {
	x, nodes := planGraph(p)
	return SplitDelay(x, nodes)
}

// PlanBudgets is SplitBudgets over a query's plan (see PlanShares).
func PlanBudgets(p *queryspec.Plan) (map[string]time.Duration, error) {
	x, nodes := planGraph(p)
	return SplitBudgets(x, nodes)
}

// planGraph is a plan's bound and delaying graph.
func planGraph(p *queryspec.Plan) (time.Duration, []GraphNode) {
	x, strict := p.Query.MaxDelayDuration()
	if strict {
		x = Strict
	}
	nodes := make([]GraphNode, 0, len(p.Nodes))
	for _, n := range p.Nodes {
		// A sink reading one partition passes it through (no merge).
		passThrough := n.Kind == queryspec.KindSink && len(n.Inputs) == 1 && max(1, p.Node(n.Inputs[0]).Partitions) == 1
		delays := n.Kind != queryspec.KindSource && !passThrough
		nodes = append(nodes, GraphNode{Name: n.Name, Inputs: n.Inputs, Delays: delays})
	}
	return x, nodes
}

// MinDetect is the shortest detection timeout DetectTimeout gives: below
// it a loaded machine's scheduling hiccups would read as failures.
const MinDetect = 100 * time.Millisecond

// DetectTimeout is the silence after which an input counts as failed,
// from the boundary interval (boundaries are the heartbeats): four
// intervals, so that a batch or two arriving late (a pause for garbage
// collection, a busy CPU) is not a failure, and at least MinDetect.
func DetectTimeout(boundaryInterval time.Duration) time.Duration {
	return max(4*boundaryInterval, MinDetect)
}

// minStartGrace is the least StartGrace gives: how long the first batch
// of an upstream takes to come is the time a loaded machine takes to set
// up a subscription and start a task, not a multiple of the boundary
// interval. At load 30-50 on two cores (nine workers in one process,
// TestLossyReplicaRebootstrapsFromStablePeer) both replicas of one source
// partition delivered their first batch 3.3-3.5 s after their consumers
// started, while the other partition's came at once: with a 1 s grace
// the input counted as failed, buckets went tentative after the share
// and the replica kept more input than its bound for the correction,
// lossy from the start.
const minStartGrace = 3 * time.Second

// StartGrace is the Config.StartGrace of a task with detection timeout
// detect: ten detection timeouts, at least minStartGrace. Only an
// upstream silent from the start is given it: one that refuses (not
// running, killed) is left at once, and one that delivered and stops is
// detected within the detection timeout.
func StartGrace(detect time.Duration) time.Duration {
	return max(10*detect, minStartGrace)
}

// detectStretchMax is how many detection timeouts the detection timeout
// may stretch to under load (Config.DetectMax).
const detectStretchMax = 4

// DetectMax is the Config.DetectMax of a task with detection timeout
// detect and share of X share: four detection timeouts, but at most half
// the share, so that a task whose process is short of CPU still moves
// off a failed replica well before a bucket's wait runs out (P1: losing
// one replica gives no tentative result), and never below detect.
func DetectMax(detect, share time.Duration) time.Duration {
	d := detectStretchMax * detect
	if share > 0 && share != Strict {
		d = min(d, share/2)
	}
	return max(d, detect)
}
