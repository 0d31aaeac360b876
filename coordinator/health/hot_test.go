package health

import (
	"testing"
	"time"
)

// skew10 is a recorded window of a real org (`bench scaling
// --real-faults`, 10% skew, 9.6% reached; load average about 9 on 2
// cores): a keyed aggregate of 4 partitions of 500 tuples/s each (2 ms a
// tuple) at 95% of its capacity, partition 2 owning the key that 10% of
// the lines carry. Per second and partition: input rate, busy share,
// queue (with what its upstream holds for it). Partition 2 is 1.7% over
// its capacity: its queue grows by about 20 tuples/s, under the queue
// detectors' thresholds for most of a minute, while its rate and busy
// share show it from the first seconds.
var skew10 = [][4][3]float64{
	{{431, 0.864, 42}, {471, 0.945, 22}, {506, 1.000, 80}, {461, 0.924, 50}},  // 23:56:08
	{{485, 0.971, 14}, {466, 0.932, 41}, {497, 0.995, 81}, {463, 0.926, 55}},  // 23:56:09
	{{479, 0.959, 15}, {467, 0.935, 22}, {483, 0.967, 77}, {481, 0.964, 42}},  // 23:56:10
	{{422, 0.845, 17}, {491, 0.983, 26}, {507, 1.000, 85}, {471, 0.943, 20}},  // 23:56:11
	{{472, 0.946, 19}, {441, 0.884, 19}, {501, 1.000, 129}, {446, 0.895, 23}}, // 23:56:12
	{{488, 0.977, 52}, {450, 0.901, 13}, {492, 0.983, 158}, {458, 0.916, 13}}, // 23:56:13
	{{483, 0.967, 35}, {473, 0.947, 56}, {497, 0.996, 150}, {457, 0.916, 36}}, // 23:56:14
	{{470, 0.941, 46}, {473, 0.946, 32}, {514, 1.000, 144}, {469, 0.939, 44}}, // 23:56:15
	{{478, 0.959, 14}, {438, 0.878, 23}, {482, 0.966, 188}, {478, 0.958, 39}}, // 23:56:16
	{{452, 0.909, 12}, {460, 0.922, 41}, {517, 1.000, 150}, {481, 0.964, 46}}, // 23:56:17
	{{444, 0.886, 19}, {471, 0.942, 24}, {485, 0.971, 175}, {477, 0.954, 27}}, // 23:56:18
	{{457, 0.916, 46}, {487, 0.977, 13}, {502, 1.000, 257}, {437, 0.877, 18}}, // 23:56:19
	{{463, 0.927, 40}, {463, 0.927, 13}, {507, 1.000, 265}, {475, 0.951, 22}}, // 23:56:20
	{{482, 0.965, 43}, {455, 0.913, 37}, {477, 0.956, 311}, {428, 0.857, 22}}, // 23:56:21
	{{470, 0.944, 14}, {451, 0.904, 58}, {522, 1.000, 301}, {485, 0.972, 40}}, // 23:56:22
	{{436, 0.873, 18}, {456, 0.913, 44}, {497, 0.995, 282}, {513, 1.000, 56}}, // 23:56:23
	{{445, 0.893, 40}, {473, 0.949, 36}, {497, 0.997, 316}, {444, 0.890, 46}}, // 23:56:24
	{{483, 0.967, 43}, {446, 0.893, 43}, {484, 0.969, 455}, {438, 0.877, 20}}, // 23:56:25
	{{454, 0.910, 19}, {459, 0.919, 19}, {508, 1.000, 504}, {458, 0.919, 52}}, // 23:56:26
	{{447, 0.895, 42}, {474, 0.949, 21}, {488, 0.978, 500}, {488, 0.977, 50}}, // 23:56:27
	{{466, 0.933, 47}, {442, 0.886, 33}, {501, 1.000, 537}, {482, 0.966, 36}}, // 23:56:28
	{{482, 0.966, 21}, {477, 0.956, 39}, {506, 1.000, 499}, {441, 0.884, 38}}, // 23:56:29
	{{418, 0.837, 19}, {486, 0.974, 46}, {481, 0.964, 615}, {451, 0.904, 15}}, // 23:56:30
	{{499, 1.000, 36}, {435, 0.872, 16}, {503, 1.000, 655}, {447, 0.896, 26}}, // 23:56:31
	{{482, 0.965, 26}, {463, 0.927, 18}, {504, 1.000, 634}, {468, 0.936, 18}}, // 23:56:32
	{{475, 0.953, 23}, {484, 0.974, 34}, {508, 1.000, 596}, {459, 0.921, 13}}, // 23:56:33
	{{491, 0.983, 56}, {474, 0.945, 13}, {496, 0.993, 617}, {451, 0.903, 15}}, // 23:56:34
	{{473, 0.947, 37}, {427, 0.856, 16}, {500, 1.000, 670}, {456, 0.914, 18}}, // 23:56:35
	{{450, 0.902, 47}, {461, 0.923, 18}, {488, 0.979, 620}, {483, 0.967, 48}}, // 23:56:36
	{{465, 0.931, 21}, {469, 0.939, 33}, {505, 1.000, 725}, {437, 0.876, 25}}, // 23:56:37
	{{457, 0.917, 26}, {446, 0.893, 10}, {495, 0.992, 758}, {471, 0.943, 18}}, // 23:56:38
	{{451, 0.904, 16}, {457, 0.916, 48}, {493, 0.987, 775}, {505, 1.000, 38}}, // 23:56:39
	{{463, 0.929, 21}, {490, 0.984, 36}, {511, 1.000, 775}, {449, 0.901, 18}}, // 23:56:40
	{{478, 0.958, 20}, {447, 0.895, 42}, {481, 0.965, 530}, {446, 0.893, 39}}, // 23:56:41
	{{482, 0.966, 44}, {445, 0.892, 18}, {507, 1.000, 879}, {460, 0.922, 20}}, // 23:56:42
	{{480, 0.962, 32}, {439, 0.880, 32}, {505, 1.000, 782}, {479, 0.960, 47}}, // 23:56:43
	{{471, 0.943, 12}, {454, 0.909, 56}, {496, 0.994, 890}, {491, 0.984, 53}}, // 23:56:44
}

// recorded turns rows of skew10 (partitions keep picks) into a fragment
// window feeding a pipeline.
func recorded(rows [][4][3]float64, keep []int) *Query {
	t0 := time.Unix(1000, 0)
	var ss []Sample
	for k, r := range rows {
		s := Sample{At: t0.Add(time.Duration(k) * time.Second)}
		for i, p := range keep {
			s.Instances = append(s.Instances, Instance{Partition: i, InRate: r[p][0], OutRate: r[p][0], Busy: r[p][1], Queue: r[p][2]})
		}
		ss = append(ss, s)
	}
	n := len(rows)
	return &Query{Name: "skew", Fragments: []Fragment{
		{Name: "src", Source: true, Parallelism: 1, Downstreams: []string{"op"}, Samples: window(n, 1, steady(Instance{OutRate: 1900, Busy: 0.1}))},
		{Name: "op", Scalable: true, Parallelism: len(keep), Upstreams: []string{"src"}, Downstreams: []string{"out"}, Samples: ss},
		{Name: "out", Sink: true, Parallelism: 1, Upstreams: []string{"op"}, Samples: window(n, 1, steady(Instance{InRate: 1900, Busy: 0.1}))},
	}}
}

func diagnosisOf(q *Query, c Config) *Diagnosis {
	syms, below, why := Detect(q, c)
	for _, d := range Diagnose(q, syms, below, why, c) {
		if d.Fragment == "op" {
			return &d
		}
	}
	return nil
}

// TestHotPartitionRecorded: on every window of the loop's length (10
// samples) and of the detector's minimum (8) over the recorded 10% skew,
// the hot partition is diagnosed data skew, from its rate and busy share,
// whatever its queue; with the hot partition left out, the other three
// (each with its busy seconds at 100%) never are.
func TestHotPartitionRecorded(t *testing.T) {
	c := DefaultConfig()
	for _, n := range []int{c.HotSamples, 10} {
		for start := 0; start+n <= len(skew10); start++ {
			rows := skew10[start : start+n]
			d := diagnosisOf(recorded(rows, []int{0, 1, 2, 3}), c)
			if d == nil || d.Name != DiagDataSkew || d.Partition != 2 {
				t.Errorf("window of %d from second %d: diagnosis %+v, want data_skew of partition 2", n, start, d)
			}
			if d := diagnosisOf(recorded(rows, []int{0, 1, 3}), c); d != nil {
				t.Errorf("window of %d from second %d without the hot partition: diagnosis %+v, want none", n, start, d)
			}
		}
	}
	// A window shorter than HotSamples says nothing yet (the first
	// recorded seconds have no backlog either).
	if d := diagnosisOf(recorded(skew10[:c.HotSamples-1], []int{0, 1, 2, 3}), c); d != nil {
		t.Errorf("window of %d samples: diagnosis %+v, want none yet", c.HotSamples-1, d)
	}
}

// TestHotPartitionIsNoSlowInstance: a saturated partition at the others'
// rate or below (a slow instance, before and after its upstream blocks)
// is no hot partition; nor is a partition faster than the others that
// has time to spare, nor partitions all saturated at similar rates, nor
// one catching up with a backlog (its queue shrinking).
func TestHotPartitionIsNoSlowInstance(t *testing.T) {
	c := DefaultConfig()
	mod := func(f func(k, p int, in *Instance)) *Query {
		q := recorded(skew10[:10], []int{0, 1, 2, 3})
		for k := range q.Fragments[1].Samples {
			for i := range q.Fragments[1].Samples[k].Instances {
				in := &q.Fragments[1].Samples[k].Instances[i]
				f(k, in.Partition, in)
			}
		}
		return q
	}
	cases := map[string]*Query{
		"slow partition at 400/s, saturated": mod(func(_, p int, in *Instance) {
			if p == 2 {
				in.InRate, in.Busy = 400, 1
			}
		}),
		"slow partition held to the others' pace": mod(func(_, p int, in *Instance) {
			if p == 2 {
				in.InRate, in.Busy = 465, 1
			}
		}),
		"faster partition with time to spare": mod(func(_, p int, in *Instance) {
			if p == 2 {
				in.Busy = 0.9
			}
		}),
		"all saturated, similar rates": mod(func(_, p int, in *Instance) {
			in.InRate, in.Busy = 500+float64(p), 1
		}),
		// Recorded in `bench scaling`'s load change before this rule: when
		// the load dropped 20%, the splitter partition with the most
		// backlog worked it off at full speed while the others idled, and
		// was taken for a hot one (and scaled up).
		"catching up with a backlog": mod(func(k, p int, in *Instance) {
			if p == 2 {
				in.Queue = 5000 - 400*float64(k)
			}
		}),
	}
	for name, q := range cases {
		syms, _, _ := Detect(q, c)
		for _, s := range syms {
			if s.Has(SymHotPartition) {
				t.Errorf("%s: hot partition %d detected: %v", name, s.Outlier, s.Why)
			}
		}
	}
}

// TestEvaluateDataSkew: a data-skew repair is judged by the hot partition,
// not by the backlog alone: a hot partition has none to begin with.
func TestEvaluateDataSkew(t *testing.T) {
	c := DefaultConfig()
	before := Metrics{Throughput: 1900}
	still := Metrics{Throughput: 1900, Instances: []InstanceMeans{
		{Partition: 0, InRate: 465, Busy: 0.93}, {Partition: 1, InRate: 463, Busy: 0.93}, {Partition: 2, InRate: 500, Busy: 0.99}, {Partition: 3, InRate: 466, Busy: 0.93}}}
	if ok, why := Evaluate(ActRebalanceSlots, DiagDataSkew, before, still, 0, c); ok {
		t.Fatalf("rebalance leaving partition 2 hot judged improved: %s", why)
	}
	even := Metrics{Throughput: 1900, Instances: []InstanceMeans{
		{Partition: 0, InRate: 475, Busy: 0.95}, {Partition: 1, InRate: 474, Busy: 0.95}, {Partition: 2, InRate: 477, Busy: 0.96}, {Partition: 3, InRate: 474, Busy: 0.95}}}
	if ok, why := Evaluate(ActRebalanceSlots, DiagDataSkew, before, even, 0, c); !ok {
		t.Fatalf("rebalance evening the partitions judged a failure: %s", why)
	}
	// Other diagnoses are judged as before: a calm window is improvement.
	if ok, _ := Evaluate(ActMove, DiagSlowInstance, before, still, 0, c); !ok {
		t.Fatal("a move judged by the hot-partition rule")
	}
}
