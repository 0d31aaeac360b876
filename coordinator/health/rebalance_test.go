package health

import (
	"strings"
	"testing"
)

// skewed is a window of op at 3 partitions under backpressure where
// partition 0 owns ten hot slots (0..9, each a sixteenth of the keys)
// and partitions 1 and 2 three each (slots 2000..2002 and 3000..3002):
// partition 0 runs at its capacity of 1000/s, the others at 300/s.
func skewed(n int) *Query {
	q := pipeline(n, 3, blocked, func(k, p int) Instance {
		if p == 0 {
			return Instance{InRate: 1000, OutRate: 1000, Busy: 1, Queue: 3000}
		}
		return Instance{InRate: 300, OutRate: 300, Busy: 0.3, Queue: 50}
	}, calmSink)
	op := &q.Fragments[1]
	op.Owners = make([]int, 4096)
	for s := range op.Owners {
		op.Owners[s] = s * 3 / 4096
	}
	for k := range op.Samples {
		keys := map[int]float64{}
		for i := range 10 {
			keys[i] = 10
		}
		for i := range 3 {
			keys[2000+i], keys[3000+i] = 10, 10
		}
		op.Samples[k].Keys, op.Samples[k].KeysSampled = keys, 160
	}
	return q
}

// TestRebalanceMovesHotSlots: data skew is resolved by giving the hot
// partition's sampled slots to the least loaded partitions, hottest first,
// until its estimated load is near the mean, and no further.
func TestRebalanceMovesHotSlots(t *testing.T) {
	c := DefaultConfig()
	q := skewed(6)
	syms, below, why := Detect(q, c)
	ds := Diagnose(q, syms, below, why, c)
	if len(ds) != 1 || ds[0].Name != DiagDataSkew || ds[0].Partition != 0 {
		t.Fatalf("diagnoses %+v, want data skew of partition 0", ds)
	}
	dec, _ := Choose(q, ds, c, allowAll)
	if dec == nil || dec.Action != ActRebalanceSlots || dec.From != 3 || dec.To != 3 {
		t.Fatalf("decision %+v, want rebalance_slots at 3 partitions", dec)
	}
	// Each slot carries 1600/16 = 100 tuples/s; loads 1000/300/300, mean
	// 533: four moves bring them to 600/500/500 and a fifth would make
	// another partition the hottest.
	if len(dec.Slots) != 4 {
		t.Fatalf("moves %+v, want 4", dec.Slots)
	}
	to := map[int]int{}
	for _, m := range dec.Slots {
		if m.From != 0 || m.Slot > 9 || m.Rate < 99 || m.Rate > 101 {
			t.Fatalf("move %+v: want a hot slot of partition 0 at 100/s", m)
		}
		to[m.To]++
	}
	if to[1] != 2 || to[2] != 2 {
		t.Fatalf("moves %+v: want two slots to each of partitions 1 and 2", dec.Slots)
	}
	if !strings.Contains(dec.Why, "p0 600/s") {
		t.Fatalf("why %q lacks the loads after", dec.Why)
	}
}

// TestRebalanceRefusals: no slot map, no key samples, or a single hot key
// hotter than the gap: nothing to move, and scale_up is the next resolver.
func TestRebalanceRefusals(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct {
		name string
		edit func(f *Fragment)
		want string
	}{
		{"no slot map", func(f *Fragment) { f.Owners = nil }, "no slot map"},
		{"no key samples", func(f *Fragment) {
			for k := range f.Samples {
				f.Samples[k].Keys, f.Samples[k].KeysSampled = nil, 0
			}
		}, "no key samples"},
		{"one key makes the skew", func(f *Fragment) {
			// Partitions 1 and 2 at 700/s: a gap of 300/s, less than
			// slot 7 carries (36/160 of 2400/s, 540/s), though slot 7
			// alone (36/160 of the 4000/s demand, 900/s) is within what
			// one instance processes (1000/s): not a key too hot.
			for k := range f.Samples {
				f.Samples[k].Keys = map[int]float64{7: 36, 2000: 30, 3000: 30}
				for i := range f.Samples[k].Instances {
					if in := &f.Samples[k].Instances[i]; in.Partition != 0 {
						in.InRate, in.OutRate, in.Busy = 700, 700, 0.7
					}
				}
			}
		}, "without making another partition as hot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := skewed(6)
			q.Fragments[0].SourceRate = 4000 // more than three instances take
			tc.edit(&q.Fragments[1])
			syms, below, why := Detect(q, c)
			dec, _ := Choose(q, Diagnose(q, syms, below, why, c), c, allowAll)
			if dec == nil || dec.Action != ActScaleUp || len(dec.Skipped) != 1 || !strings.Contains(dec.Skipped[0], tc.want) {
				t.Fatalf("decision %+v, want scale_up with rebalance skipped (%s)", dec, tc.want)
			}
		})
	}
}

// TestSLOSourcesAndOffload: a missed SLO with calm operators is the
// sources' doing: scaling an operator would not help, and the scale_sources
// resolver names what the sources would need (the alert says it when the
// loop cannot carry it out); offloading is never chosen for it. An
// under-provisioned fragment that cannot scale up is offloaded.
func TestSLOSourcesAndOffload(t *testing.T) {
	c := DefaultConfig()
	q := pipeline(6, 2, calmSrc, calmOp, calmSink)
	q.SLO = 3000
	q.Fragments[0].SourceRate = 1000
	syms, below, why := Detect(q, c)
	ds := Diagnose(q, syms, below, why, c)
	noSources := func(_, d, a string) (bool, string) {
		if a == ActScaleSources {
			return false, "sources cannot be rescaled live"
		}
		return true, ""
	}
	dec, alerts := Choose(q, ds, c, noSources)
	if dec != nil || len(alerts) != 1 {
		t.Fatalf("decision %+v alerts %+v, want one alert", dec, alerts)
	}
	skipped := strings.Join(alerts[0].Skipped, "; ")
	for _, want := range []string{"scale_up: demand", "sources cannot be rescaled live (needed: throughput 1000/s for an SLO of 3000/s: sources src from 1000 to 3000 tuples/s (1 -> 3 partitions", "offload: demand 1000 tuples/s needs 2 instances, it has 2: more capacity would not help"} {
		if !strings.Contains(skipped, want) {
			t.Fatalf("skipped %q lacks %q", skipped, want)
		}
	}
	// A source whose partitions cannot be added (ingest, kafka) leaves
	// the diagnosis an alert that says what it would need.
	dec, alerts = Choose(q, ds, c, allowAll)
	if dec != nil || len(alerts) != 1 || !strings.Contains(strings.Join(alerts[0].Skipped, "; "), "scale_sources: no generator source") {
		t.Fatalf("decision %+v alerts %+v, want an alert: the source cannot be rescaled", dec, alerts)
	}
	// A generator source gets the partitions the SLO needs, in one step.
	q.Fragments[0].SourceScalable = true
	dec, _ = Choose(q, ds, c, allowAll)
	if dec == nil || dec.Action != ActScaleSources || dec.Target != "src" || dec.From != 1 || dec.To != 3 {
		t.Fatalf("decision %+v, want scale_sources of src from 1 to 3 partitions", dec)
	}

	up := pipeline(6, 1, blocked, busyOp, calmSink)
	up.Fragments[0].SourceRate = 2000
	syms, below, why = Detect(up, c)
	noScale := func(_, d, a string) (bool, string) {
		if a == ActScaleUp {
			return false, "the org lacks capacity"
		}
		return true, ""
	}
	dec, _ = Choose(up, Diagnose(up, syms, below, why, c), c, noScale)
	if dec == nil || dec.Action != ActOffload || dec.To <= 1 || !strings.Contains(dec.Why, "contract partner") {
		t.Fatalf("decision %+v, want offload of op", dec)
	}
}
