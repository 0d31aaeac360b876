package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// TestPartitionsShareThePaceOrigin: two partitions of a paced generator
// started at least 100 ms apart, and a copy of one moved to another
// worker, all place their stream on the query's pacing origin
// (TaskSpec.PaceOrigin), so their stream times keep step with each other.
// Anchored on its own start, the later partition ran 100 ms or more
// behind the first for the whole run, and a merge downstream held the
// first's records that long (the standing lag of `bench reconfig`).
func TestPartitionsShareThePaceOrigin(t *testing.T) {
	const yaml = `
name: po
sources:
  - name: lines
    parallelism: 2
    generator: {kind: words, seed: 42, rate: 1000}
sinks:
  - {name: out, input: lines}
`
	q, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	// p0 and the sink on worker 0, p1 on worker 1.
	c := newClusterOpts(t, 2, q, func(node string, p, _ int) int {
		if node == "lines" {
			return p
		}
		return 0
	}, Options{BoundaryInterval: time.Millisecond, PaceFromOrigin: true})
	defer c.close(t)
	origin := time.Now()
	for _, w := range c.workers {
		for i := range c.specs[w] {
			c.specs[w][i].PaceOrigin = origin
		}
	}
	stats := func(id string) (st TaskStats, ok bool) {
		for _, w := range c.workers {
			for _, s := range w.rt.Stats() {
				if s.TaskID == id {
					return s, true
				}
			}
		}
		return st, false
	}
	w0, w1 := c.workers[0], c.workers[1]
	w0.rt.Apply(context.Background(), c.specs[w0])
	// p1 starts once p0 has run 100 ms of its stream, and at least
	// 100 ms after the origin.
	waitUntil(t, "p0 100 ms into its stream", func() bool {
		s, ok := stats("po/lines/p0/r0")
		return ok && s.OutTuples >= 100 && time.Since(origin) >= 100*time.Millisecond
	})
	w1.rt.Apply(context.Background(), c.specs[w1])
	origins := func(what string) {
		t.Helper()
		for _, id := range []string{"po/lines/p0/r0", "po/lines/p1/r0"} {
			var s TaskStats
			waitUntil(t, id+"'s pacing anchored", func() bool {
				var ok bool
				s, ok = stats(id)
				return ok && !s.PaceOrigin.IsZero()
			})
			if !s.PaceOrigin.Equal(origin) {
				t.Errorf("%s: %s paces from %s, %s from the query's origin", what, id,
					s.PaceOrigin.Format(time.StampMicro), s.PaceOrigin.Sub(origin))
			}
		}
	}
	origins("started 100 ms apart")
	// A moved copy (started from a snapshot) keeps the origin.
	waitUntil(t, "p1 running its stream", func() bool {
		s, ok := stats("po/lines/p1/r0")
		return ok && s.OutTuples >= 50
	})
	c.move(t, "po/lines/p1/r0", w1, w0, false)
	origins("after p1 moved")
}
