package health

import (
	"testing"
	"time"
)

// startupCounter is a recorded window of `bench scaling`'s noise scenario
// (the word count at 10 splitters + 20 counters, 60% load, sensor windows
// and policy interval of 33 ms; 2026-12-01 04:52:13 UTC, load average
// about 30 on 2 cores), 6 s after the query was submitted: the counters
// work through the backlog built while the 31 tasks started, the single
// task of the split (words) holding about 7000 words for them. Per 33 ms
// window and counter partition: input rate, busy share, queue (with what
// words holds for it). A counter releases its input one boundary step at
// a time, often longer than a window, so a window shows a partition idle
// or at 100% busy with the tuples of a whole release. Partition 19 holds
// the largest queue (it had just been given the slot of the most
// frequent word); its rate over the window is near the others' median,
// so Dhalion's table read a slow instance and the loop moved it (judged
// not improved). Per useful second it took 1858 tuples, more than twice
// the others' median: nothing is slow, there is more to do in front of
// it.
var startupCounter = [][20][3]float64{
	{{1132, 1.000, 333}, {0, 0.000, 835}, {536, 1.000, 261}, {0, 0.000, 1303}, {625, 1.000, 333}, {715, 1.000, 300}, {0, 0.000, 0}, {357, 0.709, 0}, {0, 0.000, 0}, {533, 1.000, 53}, {1220, 1.000, 480}, {775, 1.000, 283}, {740, 1.000, 8}, {804, 1.000, 0}, {417, 0.843, 12}, {474, 0.941, 27}, {863, 1.000, 134}, {0, 0.000, 431}, {0, 0.000, 1772}, {0, 0.000, 2282}},      // 04:52:13.250
	{{513, 1.000, 309}, {0, 0.000, 835}, {543, 1.000, 82}, {0, 0.000, 1303}, {422, 0.831, 305}, {0, 0.000, 300}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 34}, {633, 1.000, 454}, {0, 0.000, 283}, {213, 0.442, 0}, {0, 0.000, 0}, {332, 0.687, 0}, {274, 0.561, 17}, {0, 0.000, 134}, {906, 1.000, 403}, {0, 0.000, 1772}, {0, 0.000, 2282}},                    // 04:52:13.283
	{{0, 0.000, 329}, {1051, 1.000, 820}, {450, 0.899, 85}, {1498, 1.000, 1302}, {0, 0.000, 330}, {650, 1.000, 122}, {263, 0.610, 0}, {253, 0.509, 0}, {350, 0.665, 0}, {841, 1.000, 20}, {0, 0.000, 479}, {450, 0.903, 112}, {237, 0.463, 0}, {253, 0.482, 0}, {300, 0.590, 0}, {420, 0.869, 16}, {936, 1.000, 111}, {700, 1.000, 406}, {0, 0.000, 1845}, {1593, 1.000, 2268}}, // 04:52:13.323
	{{716, 1.000, 120}, {0, 0.000, 820}, {686, 1.000, 85}, {0, 0.000, 1302}, {826, 1.000, 211}, {656, 1.000, 122}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 0}, {532, 1.000, 20}, {767, 1.000, 448}, {716, 1.000, 87}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 0}, {420, 0.921, 0}, {0, 0.000, 111}, {0, 0.000, 406}, {0, 0.000, 1845}, {0, 0.000, 2268}},                      // 04:52:13.357
	{{993, 1.000, 118}, {0, 0.000, 871}, {535, 0.839, 64}, {0, 0.000, 1356}, {919, 1.000, 217}, {0, 0.000, 117}, {387, 0.681, 0}, {0, 0.000, 16}, {0, 0.000, 16}, {0, 0.000, 24}, {0, 0.000, 477}, {955, 1.000, 112}, {387, 0.815, 0}, {268, 0.684, 0}, {0, 0.000, 18}, {194, 0.501, 0}, {0, 0.000, 125}, {917, 1.000, 413}, {2749, 1.000, 1832}, {0, 0.000, 2326}},             // 04:52:13.383
	{{529, 1.000, 99}, {1585, 1.000, 826}, {0, 0.000, 64}, {0, 0.000, 1356}, {461, 0.924, 191}, {823, 1.000, 88}, {0, 0.000, 0}, {432, 0.848, 0}, {441, 0.891, 0}, {663, 1.000, 0}, {893, 1.000, 440}, {0, 0.000, 86}, {0, 0.000, 0}, {0, 0.000, 0}, {500, 0.990, 0}, {0, 0.000, 0}, {893, 1.000, 52}, {705, 1.000, 161}, {0, 0.000, 1832}, {0, 0.000, 2326}},                   // 04:52:13.418
	{{0, 0.000, 118}, {0, 0.000, 871}, {707, 1.000, 51}, {2059, 1.000, 1342}, {0, 0.000, 211}, {0, 0.000, 109}, {0, 0.000, 11}, {0, 0.000, 16}, {0, 0.000, 12}, {0, 0.000, 17}, {0, 0.000, 467}, {707, 1.000, 85}, {0, 0.000, 14}, {0, 0.000, 13}, {0, 0.000, 14}, {156, 0.089, 0}, {739, 1.000, 55}, {0, 0.000, 183}, {0, 0.000, 1906}, {2124, 1.000, 2323}},                   // 04:52:13.450
	{{801, 1.000, 90}, {0, 0.000, 871}, {623, 1.000, 29}, {0, 0.000, 1342}, {785, 1.000, 186}, {771, 1.000, 82}, {299, 0.584, 0}, {453, 0.904, 0}, {326, 0.662, 0}, {478, 0.961, 0}, {1117, 1.000, 343}, {564, 1.000, 65}, {389, 0.747, 0}, {362, 0.610, 0}, {386, 0.770, 0}, {0, 0.000, 0}, {393, 0.796, 16}, {712, 1.000, 158}, {0, 0.000, 1906}, {0, 0.000, 2323}},           // 04:52:13.483
	{{0, 0.000, 90}, {1362, 1.000, 833}, {512, 1.000, 11}, {0, 0.000, 1342}, {756, 1.000, 162}, {723, 1.000, 57}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 343}, {482, 0.934, 48}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 0}, {0, 0.000, 0}, {454, 0.905, 0}, {693, 1.000, 134}, {2027, 1.000, 1838}, {0, 0.000, 2323}},                         // 04:52:13.516
	{{746, 1.000, 82}, {0, 0.000, 873}, {298, 0.605, 17}, {1709, 1.000, 1346}, {0, 0.000, 182}, {507, 1.000, 78}, {0, 0.000, 14}, {0, 0.000, 16}, {0, 0.000, 21}, {0, 0.000, 14}, {902, 1.000, 351}, {716, 1.000, 60}, {0, 0.000, 17}, {0, 0.000, 12}, {0, 0.000, 14}, {0, 0.000, 14}, {0, 0.000, 28}, {0, 0.000, 159}, {0, 0.000, 1916}, {0, 0.000, 2385}},                     // 04:52:13.550
}

// startupWordsUnacked is what the words task (one instance) held, not yet
// taken by the counters, in the same windows.
var startupWordsUnacked = []float64{7772, 7544, 7472, 7012, 7309, 6823, 7188, 6653, 6485, 6924}

// startupQuery turns the recorded windows into the query the loop saw:
// words -> counter (20 partitions, keyed) -> counts.
func startupQuery() *Query {
	t0 := time.Unix(1000, 0)
	var words, counter, sink []Sample
	for k, r := range startupCounter {
		at := t0.Add(time.Duration(k) * 33 * time.Millisecond)
		s := Sample{At: at}
		total := 0.0
		for p, v := range r {
			s.Instances = append(s.Instances, Instance{Partition: p, InRate: v[0], OutRate: v[0], Busy: v[1], Queue: v[2]})
			total += v[0]
		}
		counter = append(counter, s)
		words = append(words, Sample{At: at, Instances: []Instance{{OutRate: total, Busy: 0.1, Unacked: startupWordsUnacked[k]}}})
		sink = append(sink, Sample{At: at, Instances: []Instance{{InRate: 300}}})
	}
	return &Query{Name: "wordcount", Fragments: []Fragment{
		{Name: "words", Parallelism: 1, Downstreams: []string{"counter"}, Samples: words},
		{Name: "counter", Scalable: true, Parallelism: 20, Upstreams: []string{"words"}, Downstreams: []string{"counts"}, Samples: counter},
		{Name: "counts", Sink: true, Parallelism: 1, Upstreams: []string{"counter"}, Samples: sink},
	}}
}

// TestNoSlowInstanceThatIsNotSlow: the recorded startup window has a
// backlog and one partition with a larger queue at the others' rate, but
// that partition is not slower per useful second than the others: no slow
// instance (nothing a move could cure). A partition that is slower, as
// the slow instances of the fault scenarios (25% to 100% more time per
// tuple), still is one.
func TestNoSlowInstanceThatIsNotSlow(t *testing.T) {
	c := DefaultConfig()
	q := startupQuery()
	syms, below, why := Detect(q, c)
	for _, d := range Diagnose(q, syms, below, why, c) {
		if d.Name == DiagSlowInstance {
			t.Fatalf("recorded startup window: %s of partition %d (%s), want no slow instance", d.Name, d.Partition, d.Why)
		}
	}
	// Partition 19 made slow: held to the others' pace, it needs all its
	// time for what they do in 80% of theirs divided by the slowdown.
	for _, slow := range []float64{1.25, 1.5, 2} {
		q := startupQuery()
		f := q.Fragment("counter")
		for k := range f.Samples {
			for i := range f.Samples[k].Instances {
				in := &f.Samples[k].Instances[i]
				in.InRate, in.Busy = 400/slow, 0.8/slow
				if in.Partition == 19 {
					in.Busy = 1
				}
			}
		}
		syms, below, why := Detect(q, c)
		ds := Diagnose(q, syms, below, why, c)
		if len(ds) != 1 || ds[0].Name != DiagSlowInstance || ds[0].Partition != 19 {
			t.Errorf("partition 19 slowed %.2fx: diagnoses %+v, want slow_instance of partition 19", slow, ds)
		}
	}
}

// TestSlowInstanceHeldByBackpressure: once the buffers in front of a
// keyed operator are full, a slow instance's queue is no larger than the
// others' (the fault scenario's slow worker at 100%, 13 s after the start:
// the source blocked 982 ms/s, no queue skew, read as under-provisioned):
// every partition runs at the slow one's pace, which alone is saturated
// and slower per useful second. Partitions all saturated at one true rate
// are an operator too small.
func TestSlowInstanceHeldByBackpressure(t *testing.T) {
	c := DefaultConfig()
	for _, slow := range []float64{1.25, 1.5, 2} {
		pace := 500 / slow // tuples/s of a partition at 2 ms a tuple, held to the slow one's pace
		q := pipeline(10, 4, blocked, func(k, p int) Instance {
			if p == 3 {
				return Instance{InRate: pace, OutRate: pace, Busy: 1, Queue: 2000}
			}
			return Instance{InRate: pace, OutRate: pace, Busy: pace / 500, Queue: 2000}
		}, calmSink)
		syms, below, why := Detect(q, c)
		ds := Diagnose(q, syms, below, why, c)
		if len(ds) != 1 || ds[0].Name != DiagSlowInstance || ds[0].Partition != 3 {
			t.Errorf("partition 3 slowed %.2fx under backpressure: diagnoses %+v, want slow_instance of partition 3", slow, ds)
		}
	}
	q := pipeline(10, 4, blocked, func(k, p int) Instance {
		return Instance{InRate: 500 - float64(p), OutRate: 500, Busy: 1, Queue: 2000}
	}, calmSink)
	syms, below, why := Detect(q, c)
	if ds := Diagnose(q, syms, below, why, c); len(ds) != 1 || ds[0].Name != DiagUnderProvisioned {
		t.Errorf("all saturated at one true rate: diagnoses %+v, want under_provisioned", ds)
	}
}
