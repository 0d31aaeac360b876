package health

import (
	"strings"
	"testing"
)

// heldWordcount is the word count of bench scaling around its splitter's
// scale-up, as recorded (session 11, 1 s sensor windows): the source
// "lines" (1000 sentences/s configured) is held back by the splitter, a
// 2000-tuple output buffer full. The splitter acknowledges a batch of its
// input only once it has processed all of it, so the source drew nothing
// in most seconds (InRate 0; blocked through the whole second, which
// reads as 0 ms/s: a wait's time is counted when it ends) and a buffer's
// worth in the second its wait ended. burst is the sample (from the
// start, -1: none) with that draw. The splitter takes splitter/s in all,
// over parts partitions, its queue (with what the source holds for it)
// at queue.
func heldWordcount(parts int, splitter, queue float64, burst int) *Query {
	src := func(k, _ int) Instance {
		if k == burst {
			return Instance{InRate: 2000, OutRate: 2000, Busy: 0.02, BlockedMs: 19000, Unacked: 2000}
		}
		return Instance{Unacked: 2000 * float64(parts)}
	}
	op := steady(Instance{InRate: splitter / float64(parts), OutRate: 9.8 * splitter / float64(parts), Busy: 1, Queue: queue})
	return &Query{Name: "wordcount", Fragments: []Fragment{
		{Name: "lines", Source: true, SourceRate: 1000, SourceScalable: true, Parallelism: 1, Downstreams: []string{"splitter"}, Samples: window(10, 1, src)},
		{Name: "splitter", Scalable: true, Parallelism: parts, Upstreams: []string{"lines"}, Downstreams: []string{"counter"}, Samples: window(10, parts, op)},
		{Name: "counter", Scalable: true, Parallelism: 21, Upstreams: []string{"splitter"}, Downstreams: []string{"counts"},
			Samples: window(10, 21, steady(Instance{InRate: 9.8 * splitter / 21, Busy: 0.4, Queue: 20}))},
		{Name: "counts", Sink: true, Parallelism: 1, Upstreams: []string{"counter"}, Samples: window(10, 1, steady(Instance{}))},
	}}
}

// TestThroughputOfAHeldBackSource: a source held back by its consumers
// is counted by what they take of it, not by its bursty draws, so the
// splitter's scale-up (100 -> 1000 sentences/s, the backlog from the long
// rescale still draining) is judged improved. Before, the throughput read
// 0/s before and after it and the step was judged not improved (bench
// scaling, session 10 end).
func TestThroughputOfAHeldBackSource(t *testing.T) {
	c := DefaultConfig()
	before := heldWordcount(1, 100, 11000, -1)
	after := heldWordcount(11, 1045, 2200, -1)
	if tp, _ := Throughput(before, 0); tp < 99 || tp > 101 {
		t.Errorf("throughput before %.0f/s, want the splitter's 100/s", tp)
	}
	mb, ma := Measure(before, "splitter", c), Measure(after, "splitter", c)
	if mb.Throughput < 99 || mb.Throughput > 101 || ma.Throughput < 1040 || ma.Throughput > 1050 {
		t.Errorf("measured throughput %.0f/s before, %.0f/s after, want 100 and 1045", mb.Throughput, ma.Throughput)
	}
	ok, why := Evaluate(ActScaleUp, DiagUnderProvisioned, mb, ma, 0, c)
	if !ok || !strings.Contains(why, "throughput rose") {
		t.Errorf("splitter scale-up judged %v (%s), want improved: the throughput rose", ok, why)
	}
	// The second its wait ended, the source drew a buffer's worth: that
	// burst is not the query's throughput either.
	if tp, _ := Throughput(heldWordcount(1, 100, 11000, 9), 0); tp < 99 || tp > 101 {
		t.Errorf("throughput in the burst %.0f/s, want the splitter's 100/s", tp)
	}
	// A source that keeps up (its consumers take what it draws, it holds
	// little) is counted by its draws, as before.
	calm := pipeline(6, 2, calmSrc, calmOp, calmSink)
	if tp, _ := Throughput(calm, 0); tp != 1000 {
		t.Errorf("throughput of a source that keeps up %.0f/s, want its 1000/s", tp)
	}
	// Held back, but no downstream reads it alone (a join of two
	// sources): its draws, for want of better.
	join := heldWordcount(1, 100, 11000, -1)
	join.Fragments[1].Upstreams = []string{"lines", "other"}
	if tp, _ := Throughput(join, 0); tp != 0 {
		t.Errorf("throughput with no consumer of the source alone %.0f/s, want its draws (0/s)", tp)
	}
}
