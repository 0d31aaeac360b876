package health

import (
	"strings"
	"testing"
)

// windowedJoin is the demo query's shape at parallelism 1: sources (each
// a generator of 1 partition at rate records/s, taking what it is
// configured to) -> a keyed windowed aggregate -> a keyed windowed join ->
// the sink. The sink's rate is sinkRate: between the windows' ends, 0.
func windowedJoin(rate, sinkRate float64, sources ...string) *Query {
	q := &Query{Name: "netmon"}
	for _, s := range sources {
		q.Fragments = append(q.Fragments, Fragment{Name: s, Source: true, SourceRate: rate, SourceScalable: true, Parallelism: 1,
			Downstreams: []string{"per_src"}, Samples: window(6, 1, steady(Instance{InRate: rate, OutRate: rate, Busy: 0.1}))})
	}
	total := rate * float64(len(sources))
	q.Fragments = append(q.Fragments,
		Fragment{Name: "per_src", Scalable: true, Parallelism: 1, Upstreams: sources, Downstreams: []string{"both"},
			Samples: window(6, 1, steady(Instance{InRate: total, Busy: 0.4, Queue: 5}))},
		Fragment{Name: "both", Scalable: true, Parallelism: 1, Upstreams: []string{"per_src"}, Downstreams: []string{"alerts"},
			Samples: window(6, 1, steady(Instance{Busy: 0.01}))},
		Fragment{Name: "alerts", Sink: true, Parallelism: 1, Upstreams: []string{"both"},
			Samples: window(6, 1, steady(Instance{InRate: sinkRate}))})
	return q
}

// TestSLOOfAWindowedQuery: a windowed query whose sink sees nothing
// between its windows' ends is held to its SLO by the records its
// sources take. Below the SLO, its generator source is given the
// partitions the SLO needs in one step; met, nothing is done, however
// silent the sink. (When the SLO counted results at the sinks, the silent
// sink read as 0/s: the SLO was always missed and the resolver, measuring
// no throughput, could only alert.)
func TestSLOOfAWindowedQuery(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct {
		name     string
		q        *Query
		slo      float64
		src      string
		from, to int // 0: no action
	}{
		{"silent sink, SLO above the source: 1 -> 3", windowedJoin(5000, 0, "conns"), 12000, "conns", 1, 3},
		{"a burst at the sink changes nothing", windowedJoin(5000, 40000, "conns"), 12000, "conns", 1, 3},
		{"silent sink, SLO met", windowedJoin(5000, 0, "conns"), 5000, "", 0, 0},
		// Three sources of 2000/s for 10000/s: the 4000/s missing go to
		// the first in one step (3 partitions of 2000/s), not a share of
		// them to each source in turn.
		{"several sources: the first makes up the deficit", windowedJoin(2000, 0, "m1", "m2", "m3"), 10000, "m1", 1, 3},
		// A generator of 5000/s still catching up with its schedule
		// (6000/s now) sustains 5000/s: 12000 needs 3 partitions, not
		// the 2 that 6000/s would suggest.
		{"a source catching up is sized on its rate", func() *Query {
			q := windowedJoin(6000, 0, "conns")
			q.Fragments[0].SourceRate = 5000
			return q
		}(), 12000, "conns", 1, 3},
		// One that cannot keep its rate (busy) is sized on what it takes.
		{"a source short of its rate is sized on what it takes", func() *Query {
			q := windowedJoin(4000, 0, "conns")
			q.Fragments[0].SourceRate = 5000
			return q
		}(), 12000, "conns", 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.q.SLO = tc.slo
			syms, below, why := Detect(tc.q, c)
			ds := Diagnose(tc.q, syms, below, why, c)
			dec, alerts := Choose(tc.q, ds, c, allowAll)
			if tc.to == 0 {
				if below || dec != nil || len(alerts) != 0 {
					t.Fatalf("below %v, decision %+v, alerts %+v: want nothing (the SLO is met)", below, dec, alerts)
				}
				return
			}
			if dec == nil || dec.Diagnosis.Name != DiagSLOViolated || dec.Action != ActScaleSources || dec.Target != tc.src || dec.From != tc.from || dec.To != tc.to {
				t.Fatalf("decision %+v (alerts %+v), want slo_violated -> scale_sources of %s %d -> %d", dec, alerts, tc.src, tc.from, tc.to)
			}
			if !strings.Contains(dec.Why, "for an SLO of") {
				t.Fatalf("why %q does not give the figures", dec.Why)
			}
		})
	}
}

// TestEvaluateSLOOnInput: after a source scale-up for a missed SLO, the
// action is judged on the throughput the sources take (Measure), which
// the sink's silence does not lower.
func TestEvaluateSLOOnInput(t *testing.T) {
	c := DefaultConfig()
	before := windowedJoin(5000, 0, "conns")
	after := windowedJoin(15000, 0, "conns")
	after.Fragments[0].Parallelism = 3
	b, a := Measure(before, "conns", c), Measure(after, "conns", c)
	if b.Throughput != 5000 || a.Throughput != 15000 {
		t.Fatalf("throughput before %v after %v, want 5000 and 15000 (the sources' input)", b.Throughput, a.Throughput)
	}
	if ok, why := Evaluate(ActScaleSources, DiagSLOViolated, b, a, 12000, c); !ok {
		t.Fatalf("SLO met after the source scale-up judged a failure: %s", why)
	}
}
