package health

import "testing"

// TestBackpressureBelongsToTheBottleneck: DS2's word count from 1 splitter
// and 1 counter (here "tally", so that it sorts after the splitter):
// both are too small, the source blocked on the splitter and the splitter
// on the counter, which caps the throughput. Only the counter is
// diagnosed and scaled while the splitter blocks on it: widening the
// splitter first could not raise the throughput, its scale-up was judged
// a failure and the pair blacklisted (the real-org run of bench scaling,
// with the counter then left alone). Once the counter keeps up, the
// splitter is diagnosed and sized in its turn.
func TestBackpressureBelongsToTheBottleneck(t *testing.T) {
	c := DefaultConfig()
	q := &Query{Name: "wc", Fragments: []Fragment{
		{Name: "lines", Source: true, SourceRate: 1000, Parallelism: 1, Downstreams: []string{"splitter"},
			Samples: window(6, 1, steady(Instance{OutRate: 50, Busy: 0.05, BlockedMs: 900, Unacked: 5000}))},
		{Name: "splitter", Scalable: true, Parallelism: 1, Upstreams: []string{"lines"}, Downstreams: []string{"tally"},
			Samples: window(6, 1, steady(Instance{InRate: 50, OutRate: 500, Busy: 0.5, BlockedMs: 500, Unacked: 5000}))},
		{Name: "tally", Scalable: true, Parallelism: 1, Upstreams: []string{"splitter"}, Downstreams: []string{"out"},
			Samples: window(6, 1, steady(Instance{InRate: 500, OutRate: 5, Busy: 1, Queue: 3000}))},
		{Name: "out", Sink: true, Parallelism: 1, Upstreams: []string{"tally"}, Samples: window(6, 1, steady(Instance{InRate: 5, Busy: 0.01}))},
	}}
	syms, below, why := Detect(q, c)
	ds := Diagnose(q, syms, below, why, c)
	if len(ds) != 1 || ds[0].Fragment != "tally" || ds[0].Name != DiagUnderProvisioned {
		t.Fatalf("diagnoses %+v, want the counter alone under-provisioned", ds)
	}
	dec, _ := Choose(q, ds, c, allowAll)
	if dec == nil || dec.Diagnosis.Fragment != "tally" || dec.Action != ActScaleUp || dec.To != 21 {
		t.Fatalf("decision %+v, want the counter scaled up to 21 first", dec)
	}
	// The counter keeps up now; the splitter, no longer blocked, holds
	// the source back.
	q.Fragments[2].Parallelism = 21
	q.Fragments[1].Samples = window(6, 1, steady(Instance{InRate: 100, OutRate: 1000, Busy: 1, Unacked: 100}))
	q.Fragments[2].Samples = window(6, 21, steady(Instance{InRate: 1000.0 / 21, OutRate: 1, Busy: 0.1, Queue: 10}))
	syms, below, why = Detect(q, c)
	ds = Diagnose(q, syms, below, why, c)
	dec, _ = Choose(q, ds, c, allowAll)
	if dec == nil || dec.Diagnosis.Fragment != "splitter" || dec.Action != ActScaleUp || dec.To != 11 {
		t.Fatalf("decision %+v (diagnoses %+v), want the splitter scaled up to 11", dec, ds)
	}
}

// TestDrainingQueueIsNoSlowInstance: one partition's larger queue that is
// shrinking sample after sample (the backlog a rescale left in front of
// it, worked off) is no queue skew, so no slow instance is diagnosed and
// moved (bench scaling's real-org word count moved a splitter so after
// its rescale); the same queue holding is one.
func TestDrainingQueueIsNoSlowInstance(t *testing.T) {
	c := DefaultConfig()
	op := func(q func(k int) float64) gen {
		return func(k, p int) Instance {
			if p == 1 {
				return Instance{InRate: 330, OutRate: 330, Busy: 1, Queue: q(k)}
			}
			return Instance{InRate: 340, OutRate: 340, Busy: 0.6, Queue: 100}
		}
	}
	drain := pipeline(6, 3, blocked, op(func(k int) float64 { return 3000 - 300*float64(k) }), calmSink)
	syms, _, _ := Detect(drain, c)
	for _, sy := range symptomsOf(syms, "op") {
		if sy == SymQueueSkew {
			t.Fatalf("draining queue taken for queue skew: %v", symptomsOf(syms, "op"))
		}
	}
	hold := pipeline(6, 3, blocked, op(func(int) float64 { return 3000 }), calmSink)
	syms, below, why := Detect(hold, c)
	ds := Diagnose(hold, syms, below, why, c)
	if len(ds) != 1 || ds[0].Name != DiagSlowInstance || ds[0].Partition != 1 {
		t.Fatalf("holding queue: %+v, want partition 1 slow", ds)
	}
}
