package health

import (
	"math"
	"testing"
	"time"
)

// The noise scenario of bench scaling (issue 14, d) on a real org: the
// word count at 10 splitters + 20 counters, 60% of its load +-20%, its
// sensor window and policy interval compressed to 33 ms. Recorded
// windows of the counter (per 33 ms sample and partition: input rate,
// busy share, queue with what its upstream holds for it) and of its one
// upstream, words (per sample: output rate, blocked ms/s, tuples held
// per instance), from the debug log's "window behind the action".
//
// noiseTookNothing (run of 2026-12-01 11:25, load 22, sensors counting a
// release's busy time when it ends): partition 3, which holds the most
// hot key slots, took nothing for the whole window with the largest
// queue (a release longer than the window under way, or its merge
// waiting on an input); the others took their tuples. It was diagnosed a
// slow instance (slower cannot tell its rate, and said yes) and moved,
// not improved.
var noiseTookNothing = [][20][3]float64{
	{{0, 0.000, 22}, {0, 0.000, 35}, {0, 0.000, 19}, {0, 0.000, 41}, {0, 0.000, 19}, {0, 0.000, 15}, {0, 0.000, 41}, {0, 0.000, 14}, {0, 0.000, 9}, {0, 0.000, 9}, {0, 0.000, 31}, {0, 0.000, 18}, {0, 0.000, 10}, {0, 0.000, 12}, {0, 0.000, 10}, {0, 0.000, 4}, {0, 0.000, 2011}, {0, 0.000, 18}, {0, 0.000, 23}, {0, 0.000, 5}},                                                                             // 11:27:04.850
	{{0, 0.000, 22}, {0, 0.000, 35}, {0, 0.000, 19}, {0, 0.000, 41}, {0, 0.000, 19}, {0, 0.000, 15}, {0, 0.000, 41}, {0, 0.000, 14}, {0, 0.000, 9}, {0, 0.000, 9}, {0, 0.000, 31}, {0, 0.000, 18}, {0, 0.000, 10}, {0, 0.000, 12}, {0, 0.000, 10}, {0, 0.000, 4}, {0, 0.000, 2011}, {0, 0.000, 18}, {0, 0.000, 23}, {0, 0.000, 5}},                                                                             // 11:27:04.884
	{{0, 0.000, 2487}, {0, 0.000, 3946}, {0, 0.000, 1976}, {0, 0.000, 3956}, {0, 0.000, 2486}, {0, 0.000, 2624}, {0, 0.000, 3946}, {0, 0.000, 1410}, {0, 0.000, 1454}, {0, 0.000, 1832}, {0, 0.000, 3172}, {0, 0.000, 2158}, {0, 0.000, 1282}, {0, 0.000, 1345}, {0, 0.000, 1501}, {0, 0.000, 1523}, {1863, 1.000, 2462}, {0, 0.000, 2778}, {0, 0.000, 3752}, {214, 0.245, 1017}},                              // 11:27:04.916
	{{0, 0.000, 2487}, {0, 0.000, 3946}, {0, 0.000, 1976}, {0, 0.000, 3956}, {0, 0.000, 2486}, {557, 1.000, 2601}, {0, 0.000, 3946}, {416, 0.830, 1397}, {264, 0.568, 1436}, {318, 0.627, 1808}, {0, 0.000, 3172}, {0, 0.000, 2158}, {289, 0.588, 1266}, {446, 0.880, 1335}, {381, 0.797, 1493}, {202, 0.475, 1512}, {0, 0.000, 2462}, {528, 1.000, 2751}, {0, 0.000, 3752}, {0, 0.000, 1017}},                 // 11:27:04.951
	{{0, 0.000, 2399}, {0, 0.000, 3857}, {1691, 1.000, 1875}, {0, 0.000, 3899}, {6663, 1.000, 2391}, {7062, 1.000, 2531}, {0, 0.000, 3866}, {0, 0.000, 1317}, {0, 0.000, 1360}, {0, 0.000, 1740}, {0, 0.000, 3088}, {2188, 1.000, 2055}, {0, 0.000, 1184}, {0, 0.000, 1255}, {0, 0.000, 1405}, {0, 0.000, 1426}, {0, 0.000, 2400}, {6764, 1.000, 2691}, {0, 0.000, 3654}, {882, 0.905, 918}},                   // 11:27:05.116
	{{925, 1.000, 2358}, {2503, 1.000, 3822}, {555, 1.000, 1848}, {0, 0.000, 3844}, {621, 1.000, 2350}, {786, 1.000, 2490}, {2061, 1.000, 3825}, {458, 0.432, 1269}, {648, 1.000, 1319}, {491, 1.000, 1696}, {0, 0.000, 3067}, {0, 0.000, 2033}, {638, 0.801, 1146}, {327, 0.418, 1211}, {601, 0.772, 1362}, {1031, 1.000, 1386}, {0, 0.000, 2332}, {1342, 1.000, 2642}, {1619, 1.000, 3603}, {0, 0.000, 896}}, // 11:27:05.185
	{{523, 1.000, 2330}, {0, 0.000, 3822}, {374, 0.906, 1824}, {0, 0.000, 3844}, {768, 1.000, 2326}, {598, 1.000, 2468}, {0, 0.000, 3825}, {977, 1.000, 1248}, {349, 0.811, 1309}, {315, 0.624, 1681}, {0, 0.000, 3041}, {548, 1.000, 2008}, {315, 0.570, 1134}, {488, 1.000, 1183}, {424, 1.000, 1347}, {194, 0.516, 1372}, {0, 0.000, 2332}, {499, 1.000, 2622}, {0, 0.000, 3603}, {384, 0.837, 856}},        // 11:27:05.253
	{{761, 1.000, 2307}, {704, 1.000, 3783}, {0, 0.000, 1801}, {0, 0.000, 3784}, {476, 0.896, 2298}, {1060, 1.000, 2423}, {0, 0.000, 3788}, {456, 1.000, 1221}, {408, 0.946, 1250}, {382, 0.729, 1644}, {516, 1.000, 3006}, {0, 0.000, 1991}, {684, 1.000, 1090}, {278, 0.600, 1169}, {245, 0.399, 1329}, {322, 0.878, 1340}, {1348, 1.000, 2270}, {544, 1.000, 2594}, {1026, 1.000, 3579}, {317, 1.000, 832}}, // 11:27:05.305
	{{916, 1.000, 2285}, {0, 0.000, 3783}, {916, 1.000, 1783}, {0, 0.000, 3784}, {0, 0.000, 2298}, {0, 0.000, 2423}, {0, 0.000, 3788}, {918, 0.996, 1210}, {0, 0.000, 1250}, {951, 1.000, 1628}, {1890, 1.000, 2973}, {1115, 1.000, 1962}, {528, 0.596, 1080}, {1404, 1.000, 1149}, {876, 1.000, 1304}, {845, 1.000, 1325}, {0, 0.000, 2270}, {1115, 1.000, 2579}, {0, 0.000, 3579}, {918, 0.653, 825}},        // 11:27:05.330
	{{824, 1.000, 2265}, {1102, 1.000, 3747}, {0, 0.000, 1752}, {0, 0.000, 3784}, {781, 1.000, 2280}, {1049, 1.000, 2400}, {1046, 1.000, 3744}, {614, 1.000, 1188}, {449, 0.980, 1224}, {452, 1.000, 1613}, {0, 0.000, 2973}, {637, 0.873, 1930}, {537, 1.000, 1058}, {223, 0.227, 1134}, {0, 0.000, 1286}, {594, 0.792, 1305}, {0, 0.000, 2270}, {0, 0.000, 2556}, {678, 1.000, 3554}, {586, 1.000, 799}},     // 11:27:05.385
}

var noiseTookNothingUp = [][3]float64{
	{0, 0, 2000},           // 11:27:04.850
	{0, 0, 2000},           // 11:27:04.884
	{862146, 89797, 24875}, // 11:27:04.916
	{0, 0, 24875},          // 11:27:04.951
	{0, 1, 24875},          // 11:27:05.116
	{0, 0, 24875},          // 11:27:05.185
	{0, 0, 24875},          // 11:27:05.253
	{0, 0, 24875},          // 11:27:05.305
	{0, 0, 24875},          // 11:27:05.330
	{0, 0, 24875},          // 11:27:05.385
}

// noiseQuery builds the word count's query from a recorded window: a
// source, words (one instance), the counter (keyed, 20 partitions) and a
// sink. open, when not nil, gives each counter sample's OpenBusyS per
// partition (and the samples their 33 ms windows).
func noiseQuery(rows [][20][3]float64, up [][3]float64, open func(k, p int) float64) *Query {
	t0 := time.Unix(1000, 0)
	const win = time.Second / 30
	var cs, us []Sample
	for k, r := range rows {
		s := Sample{At: t0.Add(time.Duration(k) * win)}
		for p := range r {
			in := Instance{Partition: p, InRate: r[p][0], OutRate: r[p][0] / 10, Busy: r[p][1], Queue: r[p][2]}
			if open != nil {
				in.WindowS, in.OpenBusyS = win.Seconds(), open(k, p)
			}
			s.Instances = append(s.Instances, in)
		}
		cs = append(cs, s)
		us = append(us, Sample{At: s.At, Instances: []Instance{{Partition: 0, InRate: up[k][0] / 10, OutRate: up[k][0], BlockedMs: up[k][1], Unacked: up[k][2]}}})
	}
	n := len(rows)
	return &Query{Name: "wordcount", Fragments: []Fragment{
		{Name: "lines", Source: true, Parallelism: 1, Downstreams: []string{"words"}, Samples: window(n, 1, steady(Instance{InRate: 600, OutRate: 600, Busy: 0.02}))},
		{Name: "words", Parallelism: 1, Upstreams: []string{"lines"}, Downstreams: []string{"op"}, Samples: us},
		{Name: "op", Scalable: true, Parallelism: 20, Upstreams: []string{"words"}, Downstreams: []string{"out"}, Samples: cs},
		{Name: "out", Sink: true, Parallelism: 1, Upstreams: []string{"op"}, Samples: window(n, 1, steady(Instance{InRate: 400, Busy: 0.01}))},
	}}
}

// TestNoiseNoSlowInstance: on the recorded windows of the noise
// scenario, no counter partition is diagnosed a slow instance: one that
// completed no tuple in the window (a release longer than the window
// under way, or waiting for an input) has no rate to be slower by, and
// when the queue skew's partition is not the faster one, a data skew
// names the faster one. Before, partition 3 of noiseTookNothing was
// diagnosed slow_instance (and moved).
func TestNoiseNoSlowInstance(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct {
		name string
		q    *Query
	}{
		{"took nothing", noiseQuery(noiseTookNothing, noiseTookNothingUp, nil)},
		// The same window as the sensors now report it: partition 3
		// in a release through the whole window, busy, its tuples not
		// counted yet.
		{"took nothing, busy", noiseQuery(busyThrough(noiseTookNothing, 3), noiseTookNothingUp, func(k, p int) float64 {
			if p == 3 {
				return float64(k+1) / 30
			}
			return 0
		})},
	} {
		syms, below, why := Detect(tc.q, c)
		for _, d := range Diagnose(tc.q, syms, below, why, c) {
			t.Logf("%s: %s of %s partition %d: %v: %s", tc.name, d.Name, d.Fragment, d.Partition, d.Symptoms, d.Why)
			if d.Fragment == "op" && d.Name == DiagSlowInstance {
				t.Errorf("%s: slow instance %d diagnosed on the noise window", tc.name, d.Partition)
			}
		}
	}
}

// busyThrough returns rows with partition p busy through every sample.
func busyThrough(rows [][20][3]float64, p int) [][20][3]float64 {
	out := make([][20][3]float64, len(rows))
	copy(out, rows)
	for k := range out {
		out[k][p][1] = 1
	}
	return out
}

// TestTrueRatesCountCompletedReleases: a partition's true rate counts
// the releases that ended in the window with their own busy time: a
// release under way at the window's end (busy, its tuples not counted
// yet) is left out, and one under way at its start is counted whole. A
// partition that completed nothing has no rate. Without window lengths
// (older workers) the rate is the window's tuples over its busy shares.
func TestTrueRatesCountCompletedReleases(t *testing.T) {
	c := DefaultConfig()
	const w = 0.1 // 100 ms windows
	frag := func(rows ...[][3]float64) *Fragment {
		f := &Fragment{Name: "op", Scalable: true, Parallelism: len(rows)}
		for k := range rows[0] {
			s := Sample{}
			for p, r := range rows {
				s.Instances = append(s.Instances, Instance{Partition: p, InRate: r[k][0], Busy: r[k][1], OpenBusyS: r[k][2], WindowS: w})
			}
			f.Samples = append(f.Samples, s)
		}
		return f
	}
	// Partition 0: releases of 10 tuples of 5 ms (50 ms each), one per
	// window: 200 tuples per useful second. Partition 1: the same rate,
	// but a release of 40 tuples (200 ms) began 50 ms before the window's
	// end and another ended 50 ms into the second sample. Partition 2:
	// one release through the whole window.
	steady := [][3]float64{{100, 0.5, 0}, {100, 0.5, 0}, {100, 0.5, 0}, {100, 0.5, 0}}
	long := [][3]float64{{0, 1, 0.15}, {400, 0.5, 0}, {0, 0.5, 0.05}, {0, 1, 0.15}}
	through := [][3]float64{{0, 1, 0.1}, {0, 1, 0.2}, {0, 1, 0.3}, {0, 1, 0.4}}
	rates, took := trueRates(frag(steady, long, through), c)
	if math.Abs(rates[0]-200) > 1e-6 || math.Abs(rates[1]-200) > 1e-6 {
		t.Errorf("rates %v, want 200 for partitions 0 and 1", rates)
	}
	if _, ok := rates[2]; ok || took[2] || !took[0] || !took[1] {
		t.Errorf("partition in one release through the window: rate %v, took %v; want none, false", rates, took)
	}
	// Without window lengths: tuples over busy shares.
	f := frag(steady, long)
	for _, s := range f.Samples {
		for i := range s.Instances {
			s.Instances[i].WindowS = 0
		}
	}
	if rates, _ := trueRates(f, c); math.Abs(rates[0]-200) > 1e-6 || math.Abs(rates[1]-400.0/3) > 1e-6 {
		t.Errorf("rates without window lengths %v, want 200 and 133.3", rates)
	}
}
