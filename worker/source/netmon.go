package source

import (
	"math/rand/v2"
	"strconv"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Shape of the simulated network. Background hosts talk to a few servers on
// a few well-known ports; scanners hit random hosts on random ports. With
// these numbers a one-minute per-src window at any rate >= 50/s shows each
// scanner with > 100 connections to > 10 ports while background hosts stay
// far below (about 0.9*rate*60/8192 connections, at most 8 ports).
const (
	netmonHosts        = 8192 // background sources 10.0.x.y
	netmonTargets      = 4096 // addresses per monitored subnet 10.<m+1>.x.y
	netmonServers      = 256  // the first targets are the servers background traffic uses
	netmonScanners     = 3
	netmonScanPercent  = 10
	netmonMaxScanPorts = 65535
)

var netmonPorts = [...]int64{443, 443, 443, 80, 80, 22, 53, 53, 8080, 25, 3306, 5432}

type netmon struct {
	clock
	schema   *tuple.Schema
	rng      *rand.Rand
	monitors int
	hosts    []string   // background and scanner source addresses
	targets  [][]string // per monitor, built on first use
	scanners []int      // indices into hosts
}

func newNetmon(c clock, schema *tuple.Schema, rng *rand.Rand, monitors int) *netmon {
	if monitors < 1 {
		monitors = 1
	}
	g := &netmon{clock: c, schema: schema, rng: rng, monitors: monitors,
		hosts: subnet(0, netmonHosts), targets: make([][]string, monitors)}
	for len(g.scanners) < netmonScanners {
		s := rng.IntN(netmonHosts)
		dup := false
		for _, x := range g.scanners {
			dup = dup || x == s
		}
		if !dup {
			g.scanners = append(g.scanners, s)
		}
	}
	return g
}

// subnet lists the first n addresses 10.<octet>.x.y.
func subnet(octet, n int) []string {
	out := make([]string, n)
	prefix := "10." + strconv.Itoa(octet) + "."
	for i := range out {
		out[i] = prefix + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff)
	}
	return out
}

// Scanners returns the addresses of the seeded scanner sources.
func (g *netmon) Scanners() []string {
	out := make([]string, len(g.scanners))
	for i, s := range g.scanners {
		out[i] = g.hosts[s]
	}
	return out
}

func (g *netmon) Schema() *tuple.Schema { return g.schema }

func (g *netmon) Next(t *tuple.Tuple) bool {
	n, stime, ok := g.tick()
	if !ok {
		return false
	}
	m := int(n % int64(g.monitors)) // monitors are interleaved record by record
	targets := g.targets[m]
	if targets == nil {
		targets = subnet(m+1, netmonTargets)
		g.targets[m] = targets
	}
	var src, dst string
	var port int64
	if g.rng.IntN(100) < netmonScanPercent {
		src = g.hosts[g.scanners[g.rng.IntN(len(g.scanners))]]
		dst = targets[g.rng.IntN(netmonTargets)]
		port = 1 + int64(g.rng.IntN(netmonMaxScanPorts))
	} else {
		src = g.hosts[g.rng.IntN(netmonHosts)]
		dst = targets[g.rng.IntN(netmonServers)]
		port = netmonPorts[g.rng.IntN(len(netmonPorts))]
	}
	t.STime = stime
	t.Values = append(t.Values[:0],
		tuple.Timestamp(stime), tuple.Str(src), tuple.Str(dst), tuple.Int(port))
	return true
}
