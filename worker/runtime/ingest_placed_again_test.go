package runtime

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestIngestSourcePlacedAgainReachesItsConsumer: an ingest source whose
// worker is lost is placed again without a snapshot (a source copy is
// snapshotted only to move). It does not replay: what it produces are
// the records its clients send (or send again) to it, the next records
// of its consumers' streams. Its consumer (a sink on a worker that
// stays) resumes after the ids it took from the lost copy, so the new
// copy numbers its output after that position (alignRestartedOutputs)
// and the sink gets every record sent to it. Before, the copy numbered
// from 1 again and the sink skipped as many of its first tuples as it had
// taken from the lost copy: records the copy accepted and acknowledged
// never reached the sink.
func TestIngestSourcePlacedAgainReachesItsConsumer(t *testing.T) {
	const src, sink = "ing/events/p0/r0", "ing/out/p0/r0"
	place := func(node string, _, _ int) int {
		if node == "events" {
			return 0
		}
		return 1
	}
	q := mustParse(t, ingestQuery)
	c := newClusterEach(t, q, place, Options{BoundaryInterval: 5 * time.Millisecond},
		Options{BoundaryInterval: 5 * time.Millisecond}, Options{BoundaryInterval: 5 * time.Millisecond})
	defer c.close(t)
	c.apply()
	lost, next := c.workers[0], c.workers[2]
	rec := func(sec int, user string) string { return userRec(int64(sec)*int64(time.Second), user) }
	resp, err := ingestReqs(t, c, lost.addr, linesReq(1, rec(1, "a"), rec(2, "b"), rec(3, "c")))
	if err != nil || resp.Accepted != 3 {
		t.Fatalf("ingest into the first copy: %+v %v", resp, err)
	}
	first := lost.rt.task(src)
	if first == nil {
		t.Fatal("the source does not run on worker 0")
	}
	// The sink took everything the lost copy produced: nothing of what the
	// first copy acknowledged is lost with it.
	waitUntil(t, "the sink took the first copy's output", func() bool {
		st := first.outs[0].buf.Stats()
		return st.LastID > 0 && st.LaggardAck == st.LastID
	})
	took := first.outs[0].buf.Stats().LastID

	spec := c.loseWorker(lost, src)
	c.placeAgainFromNothing(t, lost, spec, next)
	// The client sends the next records (and any it had no answer for) to
	// where the source runs now, on a session of its own: the new copy
	// knows none of the lost copy's producers.
	resp, err = ingestReqs(t, c, next.addr, linesReq(1, rec(3, "c"), rec(4, "d"), rec(5, "e"), rec(6, "f")),
		&fedstreampb.IngestRequest{Close: true})
	if err != nil || resp.Accepted != 4 || !resp.Closed {
		t.Fatalf("ingest into the copy placed again: %+v %v", resp, err)
	}
	var users []string
	for _, tp := range sinkData(t, c, sink) {
		users = append(users, tp.Values[1].S)
	}
	if want := []string{"a", "b", "c", "c", "d", "e", "f"}; !slices.Equal(users, want) {
		t.Fatalf("the sink got %v, want %v (every record either copy accepted; the lost copy had produced %d tuples)", users, want, took)
	}
}

// TestIngestSourcePlacedAgainReachesALateConsumer: as
// TestIngestSourcePlacedAgainReachesItsConsumer, but the sink's worker
// learns where the source runs now only after the new copy stopped
// waiting for it (restartAlignWait) and took records. The sink resumes
// after the ids it took from the lost copy; the copy's stream, numbered
// from 1 while no consumer had come, is renumbered after that position
// when the sink first subscribes (OutputBuffer.RebaseOnFirstResume), so
// the sink gets every record sent to the new copy. Before, it skipped as
// many of them as it had taken from the lost copy.
func TestIngestSourcePlacedAgainReachesALateConsumer(t *testing.T) {
	const src, sink = "ing/events/p0/r0", "ing/out/p0/r0"
	place := func(node string, _, _ int) int {
		if node == "events" {
			return 0
		}
		return 1
	}
	q := mustParse(t, ingestQuery)
	c := newClusterEach(t, q, place, Options{BoundaryInterval: 5 * time.Millisecond},
		Options{BoundaryInterval: 5 * time.Millisecond}, Options{BoundaryInterval: 5 * time.Millisecond})
	defer c.close(t)
	c.apply()
	lost, sinkW, next := c.workers[0], c.workers[1], c.workers[2]
	rec := func(sec int, user string) string { return userRec(int64(sec)*int64(time.Second), user) }
	resp, err := ingestReqs(t, c, lost.addr, linesReq(1, rec(1, "a"), rec(2, "b"), rec(3, "c")))
	if err != nil || resp.Accepted != 3 {
		t.Fatalf("ingest into the first copy: %+v %v", resp, err)
	}
	first := lost.rt.task(src)
	if first == nil {
		t.Fatal("the source does not run on worker 0")
	}
	waitUntil(t, "the sink took the first copy's output", func() bool {
		st := first.outs[0].buf.Stats()
		return st.LastID > 0 && st.LaggardAck == st.LastID
	})

	// The new copy is placed, but only its own worker is told so far.
	spec := c.loseWorker(lost, src)
	var pls []Placement
	for _, pl := range spec.Placements {
		if pl.TaskID == spec.TaskID {
			pl.WorkerAddr, pl.Generation = next.addr, 2
		}
		pls = append(pls, pl)
	}
	spec.Generation, spec.Placements = 2, pls
	c.specs[next] = append(c.specs[next], spec)
	next.rt.Apply(context.Background(), c.specs[next])
	again := next.rt.task(src)
	if again == nil || again.restored || again.aligned == nil {
		t.Fatalf("the new copy did not start afresh (states %v)", c.states())
	}
	// It waits for its consumer at most restartAlignWait, then takes lines.
	waitUntil(t, "the new copy stopped waiting for its consumer", func() bool {
		select {
		case <-again.aligned:
			return true
		default:
			return false
		}
	})
	resp, err = ingestReqs(t, c, next.addr, linesReq(1, rec(3, "c"), rec(4, "d"), rec(5, "e"), rec(6, "f")))
	if err != nil || resp.Accepted != 4 {
		t.Fatalf("ingest into the copy placed again: %+v %v", resp, err)
	}
	// Now the sink's worker learns where the source runs.
	for i := range c.specs[sinkW] {
		c.specs[sinkW][i].Placements = pls
	}
	sinkW.rt.Apply(context.Background(), c.specs[sinkW])
	resp, err = ingestReqs(t, c, next.addr, linesReq(5, rec(7, "g")), &fedstreampb.IngestRequest{Close: true})
	if err != nil || resp.Accepted != 1 || !resp.Closed {
		t.Fatalf("the last line and close: %+v %v", resp, err)
	}
	var users []string
	for _, tp := range sinkData(t, c, sink) {
		users = append(users, tp.Values[1].S)
	}
	if want := []string{"a", "b", "c", "c", "d", "e", "f", "g"}; !slices.Equal(users, want) {
		t.Fatalf("the sink got %v, want %v", users, want)
	}
}
