package runtime

import (
	"fmt"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// TestRescaleUnderBacklog rescales a keyed aggregate 1 -> 4 while its only
// partition has a backlog below the cut far larger than every buffer
// between it and its reader (the sink), and while the added partitions
// can send nothing: their worker's links to the source's worker are cut
// until the old partition has passed the cut. The source, on a worker
// with ample output buffers, runs ahead of the slow aggregate (a
// calibrated cost); the aggregate's output buffer and the sink's merge
// hold a few tuples each. The old partition reaches the cut only by
// sending that backlog's results to the sink, so the sink must release
// them without a word from the added partitions: they carry nothing below
// the cut. Waiting for their first boundary instead was a cycle (the
// live rescale's stall under a backlog): an added partition emits it only
// when its own inputs reach the cut, which a source blocked on the old
// partition's full buffer never lets happen. Results are exact, window by
// window and word by word.
func TestRescaleUnderBacklog(t *testing.T) {
	const rate, limit = 20000, 4000
	yaml := fmt.Sprintf(wordsQuery, 1, rate)
	yaml = replaceOnce(t, yaml, "parallelism: 2", "parallelism: 1\n    cost: 300us")
	// The source ends soon after the cut: the backlog is below it.
	yaml = replaceOnce(t, yaml, "limit: 20000", fmt.Sprintf("limit: %d", limit))
	q, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	faults := dataplane.NewFaults()
	faulty := dataplane.NewPool(faults.DialOption())
	defer func() { _ = faulty.Close() }()
	roomy := Options{BoundaryInterval: time.Millisecond, Buffer: dataplane.BufferOptions{MaxTuples: 1500}}
	tight := Options{BoundaryInterval: time.Millisecond, InputPendingTuples: 8,
		Buffer: dataplane.BufferOptions{MaxTuples: 16}}
	cutOff := tight
	cutOff.Pool = faulty
	// The source on worker 0; the aggregate and the sink on worker 1; the
	// added partitions on worker 2, whose subscriptions to worker 0 hang.
	c := newClusterEach(t, q, func(node string, p, r int) int {
		if node == "lines" {
			return 0
		}
		return 1
	}, roomy, tight, cutOff)
	defer c.close(t)
	faults.CutOutgoing(c.workers[0].addr, dataplane.Hold)
	defer faults.HealAll()
	rs := &rescaler{c: c, frag: "counts", partitions: 1, epoch: 1, owner: contiguous(1),
		place: func(int, int) int { return 2 }}
	rs.setMaps(&SlotMap{Epoch: 1, Partitions: 1, Owner: rs.owner})
	c.apply()
	counts := queryspec.TaskID("wc", "counts", 0, 0)
	var backlog int64
	waitUntil(t, "the aggregate has a backlog", func() bool {
		tk := c.workers[1].rt.task(counts)
		src := c.workers[0].rt.task(queryspec.TaskID("wc", "lines", 0, 0))
		if tk == nil || src == nil || tk.outs[0].buf.Stats().LastID < 50 {
			return false
		}
		backlog = int64(src.outs[0].buf.Stats().LastID) - int64(tk.merge.inputLastID(0))
		return backlog > 1000
	})
	t.Logf("backlog in front of the aggregate: %d tuples", backlog)
	// Heal the added partitions' links once the old partition passed the
	// cut (it must, with them silent).
	done := make(chan struct{})
	healed := make(chan struct{})
	go func() {
		defer close(healed)
		for {
			if st := rs.state(counts); st.CutDone == 2 {
				faults.HealAll()
				return
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	cut := rs.scale(t, 4)
	close(done)
	<-healed
	got := c.tail(t, queryspec.TaskID("wc", "out", 0, 0))
	sameResults(t, results(t, got, sinkSchema(t, c.query)), referenceOf(t, rate, limit))
	below, after := 0, 0
	for _, tp := range got {
		if tp.Type.IsData() {
			if tp.STime < cut {
				below++
			} else {
				after++
			}
		}
	}
	// Far more results below the cut than the buffers between hold.
	if below < 200 || after == 0 {
		t.Fatalf("%d results below the cut %d, %d at or after it: the rescale did not happen under a backlog", below, cut, after)
	}
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

// TestRescaleDownUnderBacklog removes partitions (4 -> 2) of a keyed
// aggregate whose partitions all have a backlog larger than the buffers
// between them and the sink: the kept partitions gain the removed ones'
// slots, and the sink, held for the prepare, must not hold back a
// partition ahead of the others while it holds (that partition could then
// never finish the release it is in, nor hold). Results are exact.
func TestRescaleDownUnderBacklog(t *testing.T) {
	const rate, limit = 20000, 6000
	yaml := fmt.Sprintf(wordsQuery, 1, rate)
	yaml = replaceOnce(t, yaml, "parallelism: 2", "parallelism: 4\n    cost: 1ms")
	yaml = replaceOnce(t, yaml, "limit: 20000", fmt.Sprintf("limit: %d", limit))
	q, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	roomy := Options{BoundaryInterval: time.Millisecond, Buffer: dataplane.BufferOptions{MaxTuples: 1500}}
	tight := Options{BoundaryInterval: time.Millisecond, InputPendingTuples: 8,
		Buffer: dataplane.BufferOptions{MaxTuples: 16}}
	c := newClusterEach(t, q, func(node string, p, r int) int {
		if node == "lines" {
			return 0
		}
		return 1
	}, roomy, tight)
	defer c.close(t)
	rs := &rescaler{c: c, frag: "counts", partitions: 4, epoch: 1, owner: contiguous(4)}
	rs.setMaps(&SlotMap{Epoch: 1, Partitions: 4, Owner: rs.owner})
	c.apply()
	waitUntil(t, "every partition has a backlog", func() bool {
		src := c.workers[0].rt.task(queryspec.TaskID("wc", "lines", 0, 0))
		if src == nil {
			return false
		}
		for p := range 4 {
			tk := c.workers[1].rt.task(queryspec.TaskID("wc", "counts", p, 0))
			if tk == nil || tk.outs[0].buf.Stats().LastID < 20 {
				return false
			}
		}
		return src.outs[0].buf.Stats().Tuples > 400
	})
	cut := rs.scale(t, 2)
	got := c.tail(t, queryspec.TaskID("wc", "out", 0, 0))
	sameResults(t, results(t, got, sinkSchema(t, c.query)), referenceOf(t, rate, limit))
	after := 0
	for _, tp := range got {
		if tp.Type.IsData() && tp.STime >= cut {
			after++
		}
	}
	if after == 0 {
		t.Fatalf("no result at or after the cut %d: the rescale did not happen under load", cut)
	}
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}
