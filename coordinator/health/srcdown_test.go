package health

import (
	"strings"
	"testing"
	"time"
)

// overSource is a generator source of parts partitions of 100 records/s
// each (configured) into a keyed operator, whose output reaches the sink
// one for one; rate gives the records per second the source takes in
// sample k (the throughput), shared evenly by its partitions.
func overSource(parts int, slo float64, rate func(k int) float64, op gen) *Query {
	src := func(k, _ int) Instance {
		r := rate(k) / float64(parts)
		return Instance{InRate: r, OutRate: r, Busy: 0.05}
	}
	return &Query{Name: "q", SLO: slo, Fragments: []Fragment{
		{Name: "src", Source: true, SourceRate: float64(100 * parts), SourceScalable: true, Parallelism: parts,
			Downstreams: []string{"op"}, Samples: window(8, parts, src)},
		{Name: "op", Scalable: true, Parallelism: 1, Upstreams: []string{"src"}, Downstreams: []string{"out"}, Samples: window(8, 1, op)},
		{Name: "out", Sink: true, Parallelism: 1, Upstreams: []string{"op"},
			Samples: window(8, 1, func(k, _ int) Instance { return Instance{InRate: rate(k), Busy: 0.01} })},
	}}
}

func constRate(v float64) func(int) float64 { return func(int) float64 { return v } }

// TestSourceScaleDown: a generator source sending more than the SLO needs
// gives up partitions, to the fewest that keep the lowest throughput of
// the window above the SLO plus its margin; never in a backlog, never
// when the window saw a throughput that would not allow it, never with
// several sources or a source that cannot be rescaled.
func TestSourceScaleDown(t *testing.T) {
	c := DefaultConfig()
	op := steady(Instance{InRate: 300, OutRate: 300, Busy: 0.3, Queue: 5})
	cases := []struct {
		name string
		q    *Query
		to   int // 0: no scale-down
	}{
		{"SLO half of what flows: 3 -> 2", overSource(3, 150, constRate(300), op), 2},
		{"SLO a third: 3 -> 2 (1 would give 100/s, below 105)", overSource(3, 100, constRate(300), op), 2},
		{"SLO low: 4 -> 1", overSource(4, 60, constRate(400), op), 1},
		{"SLO needs every partition", overSource(3, 250, constRate(300), op), 0},
		{"within the margin: 2 of 3 give 200/s, below 210", overSource(3, 200, constRate(300), op), 0},
		{"one low sample in the window", overSource(3, 150, func(k int) float64 {
			if k == 5 {
				return 200 // 2 partitions would give 133/s: below 157.5
			}
			return 300
		}, op), 0},
		{"no throughput yet in part of the window", overSource(3, 150, func(k int) float64 {
			if k < 2 {
				return 0
			}
			return 300
		}, op), 0},
		{"backlog below: no scale-down", overSource(3, 150, constRate(300), steady(Instance{InRate: 300, OutRate: 300, Busy: 1, Queue: 5000})), 0},
		{"SLO missed", overSource(3, 400, constRate(300), op), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			syms, below, why := Detect(tc.q, c)
			ds := Diagnose(tc.q, syms, below, why, c)
			dec, alerts := Choose(tc.q, ds, c, allowAll)
			var src *Diagnosis
			for i := range ds {
				if ds[i].Fragment == "src" {
					src = &ds[i]
				}
			}
			if tc.to == 0 {
				if src != nil || dec != nil && dec.Action == ActScaleSources && dec.Diagnosis.Name == DiagOverProvisioned {
					t.Fatalf("source diagnosed %+v, decision %+v: want no scale-down", src, dec)
				}
				for _, a := range alerts {
					if a.Diagnosis.Name == DiagOverProvisioned {
						t.Fatalf("alert %+v: a source that cannot give up a partition raises none", a)
					}
				}
				return
			}
			if src == nil || src.Name != DiagOverProvisioned || !hasName(src.Symptoms, SymAboveSLO) {
				t.Fatalf("source diagnosis %+v (symptoms %+v), want over_provisioned from throughput_above_slo", src, syms)
			}
			if dec == nil || dec.Action != ActScaleSources || dec.Target != "src" || dec.From != tc.q.Fragments[0].Parallelism || dec.To != tc.to {
				t.Fatalf("decision %+v, want scale_sources of src to %d", dec, tc.to)
			}
			if !strings.Contains(strings.Join(dec.Skipped, ";"), "scale_down: not a keyed operator") {
				t.Fatalf("skipped %v: the operator scale-down is tried first and does not apply to a source", dec.Skipped)
			}
		})
	}

	// The sources a scale-down must leave alone.
	refuse := func(name string, mod func(q *Query), want string) {
		q := overSource(3, 150, constRate(300), op)
		mod(q)
		if _, _, why, ok := SourceDown(q, &q.Fragments[0], c); ok || !strings.Contains(why, want) {
			t.Errorf("%s: SourceDown ok=%v why %q, want a refusal naming %q", name, ok, why, want)
		}
		syms, _, _ := Detect(q, c)
		if got := symptomsOf(syms, "src"); len(got) > 0 {
			t.Errorf("%s: source symptoms %v, want none", name, got)
		}
	}
	refuse("two sources", func(q *Query) {
		q.Fragments = append(q.Fragments, Fragment{Name: "src2", Source: true, Parallelism: 1, Samples: window(8, 1, steady(Instance{OutRate: 1}))})
	}, "several sources")
	refuse("not rescalable", func(q *Query) { q.Fragments[0].SourceScalable = false }, "generator source")
	refuse("no rate", func(q *Query) { q.Fragments[0].SourceRate = 0 }, "generator source")
	refuse("no SLO", func(q *Query) { q.SLO = 0 }, "no throughput SLO")
	refuse("held back", func(q *Query) {
		q.Fragments[0].Samples = window(8, 3, steady(Instance{OutRate: 100, BlockedMs: 500}))
	}, "held back")
}

func hasName(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestEvaluateSourceScaleDown: a source scale-down lowers the throughput
// on purpose; it improved things when the SLO is still met.
func TestEvaluateSourceScaleDown(t *testing.T) {
	c := DefaultConfig()
	before := Metrics{Throughput: 300}
	if ok, why := Evaluate(ActScaleSources, DiagOverProvisioned, before, Metrics{Throughput: 198}, 150, c); !ok {
		t.Fatalf("SLO met after the scale-down judged a failure: %s", why)
	}
	if ok, _ := Evaluate(ActScaleSources, DiagOverProvisioned, before, Metrics{Throughput: 140}, 150, c); ok {
		t.Fatal("SLO missed after the scale-down judged an improvement")
	}
	if ok, _ := Evaluate(ActScaleSources, DiagOverProvisioned, before, Metrics{Throughput: 198, Queue: 5000}, 150, c); ok {
		t.Fatal("a backlog after the scale-down judged an improvement")
	}
}

// TestRecentScaleUp: the scale-down guard sees the last scale-up of the
// fragment within the gap, of any action that was carried out.
func TestRecentScaleUp(t *testing.T) {
	now := time.Unix(10000, 0)
	log := []Scaling{
		{Fragment: "src", At: now.Add(-400 * time.Second), From: 1, To: 3, Outcome: OutcomeImproved},
		{Fragment: "op", At: now.Add(-100 * time.Second), From: 1, To: 4, Outcome: OutcomeImproved},
		{Fragment: "src", At: now.Add(-50 * time.Second), From: 3, To: 5, Outcome: OutcomeFailed},
		{Fragment: "op", At: now.Add(-20 * time.Second), From: 4, To: 4, Outcome: OutcomeImproved}, // a rebalance
		{Fragment: "agg", At: now.Add(-30 * time.Second), From: 4, To: 2, Outcome: OutcomeImproved},
	}
	gap := 300 * time.Second
	for _, tc := range []struct {
		frag string
		want bool
		at   time.Time
	}{
		{"src", false, time.Time{}}, // the scale-up is older than the gap, the recent one failed
		{"op", true, now.Add(-100 * time.Second)},
		{"agg", false, time.Time{}}, // scaled down, not up
		{"other", false, time.Time{}},
	} {
		at, ok := RecentScaleUp(log, tc.frag, now, gap)
		if ok != tc.want || !at.Equal(tc.at) {
			t.Errorf("%s: %v %v, want %v %v", tc.frag, at, ok, tc.at, tc.want)
		}
	}
}
