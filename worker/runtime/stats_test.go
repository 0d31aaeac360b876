package runtime

import (
	"fmt"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestTaskStatsCountExactly: after a finite query has run to its end, the
// task counters agree with the stream exactly: the source drew every
// record of its generator, what it emitted is what the aggregate's
// partitions took, and the sink passed on what it took. A stopped task's
// figures are gone with it.
func TestTaskStatsCountExactly(t *testing.T) {
	c := newCluster(t, 2, fmt.Sprintf(wordsQuery, 1, 0), func(fragment string, p, r int) int {
		return map[string]int{"lines": 0, "counts": p, "out": 1}[fragment]
	})
	defer c.close(t)
	c.apply()
	out := c.tail(t, "wc/out/p0/r0")
	stats := map[string]TaskStats{}
	// The sink's result stream is complete; every task has processed its
	// last release once its state says so.
	waitUntil(t, "every task through its input", func() bool {
		for _, st := range c.states() {
			if st.TaskID != "wc/lines/p0/r0" && st.Message != "input exhausted" {
				return false
			}
		}
		return true
	})
	for _, w := range c.workers {
		for _, s := range w.rt.Stats() {
			stats[s.TaskID] = s
		}
	}
	src, p0, p1, sink := stats["wc/lines/p0/r0"], stats["wc/counts/p0/r0"], stats["wc/counts/p1/r0"], stats["wc/out/p0/r0"]
	// The source sampled one tuple in keySampleEvery of those it routed to
	// the keyed aggregate, and a second take finds nothing new.
	var samples []KeySamples
	for _, w := range c.workers {
		samples = append(samples, w.rt.TakeKeySamples()...)
	}
	if len(samples) != 1 || samples[0].TaskID != "wc/lines/p0/r0" || samples[0].Sampled["counts"] != src.OutTuples/keySampleEvery {
		t.Errorf("key samples %+v, want the source's %d sampled tuples to counts", samples, src.OutTuples/keySampleEvery)
	} else {
		top := samples[0].Top
		if len(top) == 0 || len(top) > keySampleTop || top[0].Fragment != "counts" {
			t.Errorf("top sampled slots %+v", top)
		}
		for i := 1; i < len(top); i++ {
			if top[i].Count > top[i-1].Count {
				t.Errorf("top sampled slots not by count: %+v", top)
			}
		}
	}
	for _, w := range c.workers {
		if again := w.rt.TakeKeySamples(); len(again) != 0 {
			t.Errorf("a second take found %+v", again)
		}
	}
	if src.InTuples != 20000 {
		t.Errorf("source drew %d records, the generator's limit is 20000", src.InTuples)
	}
	if src.OutTuples == 0 || src.OutTuples >= 20000 {
		t.Errorf("source (with its fused filter) emitted %d of 20000", src.OutTuples)
	}
	if p0.InTuples+p1.InTuples != src.OutTuples {
		t.Errorf("aggregate partitions took %d + %d, the source emitted %d", p0.InTuples, p1.InTuples, src.OutTuples)
	}
	data := uint64(0)
	for _, tp := range out {
		if tp.Type != tuple.Boundary {
			data++
		}
	}
	// The sink merges two inputs (one per aggregate partition): it takes
	// their data tuples, and its result holds exactly those.
	if p0.OutTuples+p1.OutTuples != data || sink.InTuples != data {
		t.Errorf("aggregates emitted %d + %d, sink took %d, result stream has %d data tuples", p0.OutTuples, p1.OutTuples, sink.InTuples, data)
	}
	if sink.OutTuples != sink.InTuples {
		t.Errorf("sink took %d and passed on %d", sink.InTuples, sink.OutTuples)
	}
	if p0.BusyNanos <= 0 || src.BusyNanos <= 0 {
		t.Errorf("busy time: source %d ns, aggregate %d ns", src.BusyNanos, p0.BusyNanos)
	}
	var held int64
	for _, h := range src.Held {
		if h.Fragment != "counts" || h.Partition < 0 || h.Partition > 1 || h.Tuples <= 0 {
			t.Errorf("held backlog %+v", h)
		}
		held += h.Tuples
	}
	if held != src.Unacked {
		t.Errorf("held stream by stream %d, unacked %d", held, src.Unacked)
	}
	if src.Unacked < 0 || p0.Queue != 0 {
		t.Errorf("levels after the end: source unacked %d, aggregate queue %d", src.Unacked, p0.Queue)
	}
	c.workers[0].rt.Apply(t.Context(), nil)
	if left := c.workers[0].rt.Stats(); len(left) != 0 {
		t.Errorf("stopped tasks still have figures: %v", left)
	}
}

// TestTaskStatsCountReplicated: with replicas 2 every operator and sink
// task runs a DCAA machine, which releases its input on its own path;
// its counters still agree with the stream (each replica took what the
// source emitted, the sink passed on what it took) and count busy time.
// Before they were counted there, every replicated operator reported 0
// tuples at 0% busy, and the health manager could not size one.
func TestTaskStatsCountReplicated(t *testing.T) {
	c := newCluster(t, 2, fmt.Sprintf(wordsQuery, 2, 0), func(fragment string, p, r int) int { return r })
	defer c.close(t)
	c.apply()
	out := c.tail(t, "wc/out/p0/r0")
	data := uint64(0)
	for _, tp := range out {
		if tp.Type != tuple.Boundary {
			data++
		}
	}
	stats := func() map[string]TaskStats {
		m := map[string]TaskStats{}
		for _, w := range c.workers {
			for _, s := range w.rt.Stats() {
				m[s.TaskID] = s
			}
		}
		return m
	}
	var st map[string]TaskStats
	waitUntil(t, "every replica's counters through the stream", func() bool {
		st = stats()
		src := st["wc/lines/p0/r0"]
		if src.InTuples != 20000 || src.OutTuples == 0 {
			return false
		}
		for r := range 2 {
			agg := st[fmt.Sprintf("wc/counts/p0/r%d", r)].InTuples + st[fmt.Sprintf("wc/counts/p1/r%d", r)].InTuples
			if agg != src.OutTuples || st[fmt.Sprintf("wc/out/p0/r%d", r)].InTuples != data {
				return false
			}
		}
		return true
	})
	for r := range 2 {
		sink := st[fmt.Sprintf("wc/out/p0/r%d", r)]
		if sink.OutTuples != sink.InTuples {
			t.Errorf("sink replica %d took %d and passed on %d", r, sink.InTuples, sink.OutTuples)
		}
		if b := st[fmt.Sprintf("wc/counts/p0/r%d", r)].BusyNanos; b <= 0 {
			t.Errorf("aggregate replica %d busy %d ns", r, b)
		}
	}
}
