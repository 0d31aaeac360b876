package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// TestSourceLagGrowsWhenHeldBack: a generator source held back by its
// consumer (2000 records/s into an aggregate that takes at most 500 a
// second, small buffers) falls behind its schedule, and its SourceLag
// says by how much, growing while it lasts. The health manager's warm-up
// reads it (a source that catches up, or one that falls behind).
func TestSourceLagGrowsWhenHeldBack(t *testing.T) {
	const yaml = `
name: lag
sources:
  - name: lines
    generator: {kind: words, seed: 42, rate: 2000}
operators:
  - name: counts
    type: aggregate
    input: lines
    window: {size: 10ms}
    group_by: [line]
    aggregates: {cnt: "count()"}
    cost: 2ms
sinks:
  - {name: out, input: counts}
`
	q, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	tight := Options{BoundaryInterval: time.Millisecond, InputPendingTuples: 8, Buffer: dataplane.BufferOptions{MaxTuples: 16}}
	c := newClusterEach(t, q, func(string, int, int) int { return 0 }, tight)
	defer c.close(t)
	lag := func() (src, op time.Duration) {
		for _, s := range c.workers[0].rt.Stats() {
			switch s.TaskID {
			case "lag/lines/p0/r0":
				src = s.SourceLag
			case "lag/counts/p0/r0":
				op = s.SourceLag
			}
		}
		return src, op
	}
	c.apply()
	waitUntil(t, "the source half a second behind its schedule", func() bool { l, _ := lag(); return l > 500*time.Millisecond })
	first, op := lag()
	if op != 0 {
		t.Errorf("an operator reports a source lag of %s", op)
	}
	waitUntil(t, "the source further behind", func() bool { l, _ := lag(); return l > first+300*time.Millisecond })
}
