package runtime

import (
	"context"
	"testing"
	"time"
)

const latenessQuery = `
name: ing
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    ingest: true
    allowed_lateness: 10s
sinks:
  - {name: out, input: events}
`

// TestPassThroughSinkFrontierIsItsHighest: a pass-through sink's
// received frontier (what it acknowledges a plan with, so that the cut
// goes above everything it passed on) is the highest stream time it
// received, also when its input is out of order within a batch: here
// the records at 10 s and 5 s (within the source's allowed_lateness) and
// the boundary at 0 s (newest - allowed_lateness) come in one batch.
// Before, it was the batch's last tuple's, 0 s.
func TestPassThroughSinkFrontierIsItsHighest(t *testing.T) {
	const sink = "ing/out/p0/r0"
	place := func(node string, _, _ int) int {
		if node == "events" {
			return 0
		}
		return 1
	}
	q := mustParse(t, latenessQuery)
	c := newClusterEach(t, q, place, Options{BoundaryInterval: time.Hour}, Options{BoundaryInterval: time.Hour})
	defer c.close(t)
	src, sinkW := c.workers[0], c.workers[1]
	src.rt.Apply(context.Background(), c.specs[src])
	rec := func(sec int, user string) string { return userRec(int64(sec)*int64(time.Second), user) }
	resp, err := ingestReqs(t, c, src.addr, linesReq(1, rec(10, "a"), rec(5, "b")))
	if err != nil || resp.Accepted != 2 {
		t.Fatalf("ingest: %+v %v", resp, err)
	}
	// The sink comes after both records and the boundary were produced:
	// it reads them in one batch.
	sinkW.rt.Apply(context.Background(), c.specs[sinkW])
	var st *task
	waitUntil(t, "the sink passed the records and the boundary on", func() bool {
		st = sinkW.rt.task(sink)
		return st != nil && st.outs[0].buf.Stats().LastID >= 3
	})
	if !st.passThrough {
		t.Fatal("the sink is not a pass-through sink")
	}
	if got, want := st.receivedFrontier(), int64(10*time.Second); got != want {
		t.Fatalf("received frontier %v, want %v (the highest record passed on)", time.Duration(got), time.Duration(want))
	}
}
