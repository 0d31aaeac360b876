package mpasim

import "math"

// flowNet is a max-flow network with real capacities (Dinic's algorithm:
// BFS levels, then blocking flows by DFS). Small and private: the optimal
// strategy is its only user.
type flowNet struct {
	head  []int
	next  []int
	to    []int
	cap   []float64
	level []int
	iter  []int
}

const flowEps = 1e-9

func newFlowNet(n int) *flowNet {
	h := make([]int, n)
	for i := range h {
		h[i] = -1
	}
	return &flowNet{head: h, level: make([]int, n), iter: make([]int, n)}
}

// addEdge adds u->v with capacity c and returns the edge's index (its
// flow is the reverse edge's capacity, cap[idx^1]).
func (g *flowNet) addEdge(u, v int, c float64) int {
	idx := len(g.to)
	g.to = append(g.to, v, u)
	g.cap = append(g.cap, c, 0)
	g.next = append(g.next, g.head[u], g.head[v])
	g.head[u], g.head[v] = idx, idx+1
	return idx
}

func (g *flowNet) flow(idx int) float64 { return g.cap[idx^1] }

func (g *flowNet) bfs(s, t int) bool {
	for i := range g.level {
		g.level[i] = -1
	}
	g.level[s] = 0
	q := []int{s}
	for len(q) > 0 {
		u := q[0]
		q = q[1:]
		for e := g.head[u]; e >= 0; e = g.next[e] {
			if g.cap[e] > flowEps && g.level[g.to[e]] < 0 {
				g.level[g.to[e]] = g.level[u] + 1
				q = append(q, g.to[e])
			}
		}
	}
	return g.level[t] >= 0
}

func (g *flowNet) dfs(u, t int, f float64) float64 {
	if u == t {
		return f
	}
	for ; g.iter[u] >= 0; g.iter[u] = g.next[g.iter[u]] {
		e := g.iter[u]
		v := g.to[e]
		if g.cap[e] > flowEps && g.level[v] == g.level[u]+1 {
			if d := g.dfs(v, t, math.Min(f, g.cap[e])); d > flowEps {
				g.cap[e] -= d
				g.cap[e^1] += d
				return d
			}
		}
	}
	return 0
}

// maxFlow pushes as much as it can from s to t and returns the amount.
func (g *flowNet) maxFlow(s, t int) float64 {
	total := 0.0
	for g.bfs(s, t) {
		copy(g.iter, g.head)
		for {
			f := g.dfs(s, t, math.Inf(1))
			if f <= flowEps {
				break
			}
			total += f
		}
	}
	return total
}
