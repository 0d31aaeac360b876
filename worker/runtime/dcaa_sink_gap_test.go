package runtime

import (
	"math"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// The merging sink's counterpart of TestDCAAInputResumedOverAGapNamesIt
// (s15 diagnosis): a merging sink resuming by stable id on an upstream
// replica of the same numbering that no longer holds the ids after its
// own skips them and must name the stream times concerned.
func TestDCAAMergingSinkResumedOverAGapNamesIt(t *testing.T) {
	q := mustParse(t, `name: sgap
replicas: 2
availability: {max_delay: 5s}
sources:
  - {name: lines, generator: {kind: words, rate: 1000, seed: 1, limit: 10}}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 10ms}, group_by: [line], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`)
	fake, c, w := fakeUpstreamCluster(t, q, func(n *queryspec.Node) bool { return n.Name == "out" })
	up0, up1 := queryspec.TaskID(q.Name, "counts", 0, 0), queryspec.TaskID(q.Name, "counts", 0, 1)
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	var all []tuple.Tuple
	for at := int64(1); at <= 9; at++ {
		all = append(all, tuple.Tuple{Type: tuple.Stable, STime: ms(at * 10), Values: []tuple.Value{tuple.Int(at)}},
			tuple.Tuple{Type: tuple.Boundary, STime: ms(at*10 + 5)})
	}
	all = append(all, tuple.Tuple{Type: tuple.Boundary, STime: math.MaxInt64})
	hold := dataplane.BufferOptions{ExpectedSubscribers: 2, Lease: time.Hour}
	fake.put(t, up0, hold, 0, all[:6]...) // ids 1 to 6
	b1 := fake.put(t, up1, dataplane.BufferOptions{}, 0, all...)
	b1.Register("other")
	b1.Ack("other", 10) // ids 7 to 10 gone
	c.apply()
	sink := queryspec.TaskID(q.Name, "out", 0, 0)
	waitUntil(t, "the sink taking replica 0's stream", func() bool {
		tk := w.rt.task(sink)
		return tk != nil && tk.mv != nil && tk.inputs[0].stableTaken.Load() == 6
	})
	fake.kill(up0)
	got := viewOf(c.tail(t, sink))
	t.Logf("sink: %d stable, %d records", len(got.stable), len(got.uncorrectable))
	if len(got.uncorrectable) == 0 {
		t.Errorf("the sink skipped ids 7 to 10 of its input (a resumption over discarded tuples) and names nothing")
	}
}
