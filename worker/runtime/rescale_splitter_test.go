package runtime

import (
	"fmt"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// splitterQuery is the shape of `fedstream bench scaling`'s word count: a
// keyed splitter (a pass-through grouped by the sentence, with a
// calibrated cost, the split into words fused into its fragment) read by
// a keyed counter of several partitions.
const splitterQuery = `
name: wc
sources:
  - name: lines
    generator: {kind: words, seed: 42, limit: %d, rate: %d}
operators:
  - name: splitter
    type: aggregate
    input: lines
    window: {size: 5ms}
    group_by: [line]
    aggregates: {n: "count()"}
    cost: %s
    parallelism: 1
  - name: words
    type: split
    input: splitter
    field: line
    as: word
  - name: counter
    type: aggregate
    input: words
    window: {size: 20ms}
    group_by: [word]
    aggregates: {cnt: "count()"}
    parallelism: 2
sinks:
  - {name: out, input: counter}
`

// sinkRows is a sink's data tuples as sorted strings: the results of two
// runs are equal when these are.
func sinkRows(out []tuple.Tuple) []string {
	var rows []string
	for _, tp := range out {
		if tp.Type.IsData() {
			rows = append(rows, fmt.Sprint(tp.STime, tp.Values))
		}
	}
	slices.Sort(rows)
	return rows
}

// TestRescaleSplitterUnderBacklog rescales the word count's splitter
// 1 -> 8 while its only partition has a backlog (the source's buffer to
// it full; the source draws ten times faster than the splitter takes).
// After the go the source stages what it draws at or above the cut, the
// boundary at the cut among it, for every splitter partition, and flushes
// a partition's staged batch only when it is full (a source behind its
// pace never flushes for being ahead). The old partition's outputs to the
// counters and the counters' queues hold a few tuples: once the old
// partition is past the cut, the counters, which merge every splitter
// partition, wait at the cut for the added ones, stop taking the old
// partition's output, and the old partition stops taking the source's. So
// the source, blocked on the old partition's full buffer, must not keep
// the boundary at the cut staged for the added partitions meanwhile (it
// did: without the change this test never finishes. The state an
// earlier stalled run of bench scaling logged, the old partition short of
// the cut and added ones waiting for its slots or silent, fits the same
// cycle with the roles swapped). Results equal those of a run without the
// rescale.
func TestRescaleSplitterUnderBacklog(t *testing.T) {
	const limit, rate = 8000, 20000
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(splitterQuery, limit, rate, "500us")))
	if err != nil {
		t.Fatal(err)
	}
	// The reference: the same query, unrescaled, on one worker.
	ref := newClusterEach(t, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: time.Millisecond})
	ref.apply()
	want := sinkRows(ref.tail(t, queryspec.TaskID("wc", "out", 0, 0)))
	ref.close(t)

	src := Options{BoundaryInterval: time.Millisecond, Buffer: dataplane.BufferOptions{MaxTuples: 200}}
	old := Options{BoundaryInterval: time.Millisecond, InputPendingTuples: 8,
		Buffer: dataplane.BufferOptions{MaxTuples: 16}}
	added := Options{BoundaryInterval: time.Millisecond, InputPendingTuples: 8}
	c := newClusterEach(t, q, func(node string, p, r int) int {
		if node == "lines" {
			return 0
		}
		return 1
	}, src, old, added)
	defer c.close(t)
	rs := &rescaler{c: c, frag: "splitter", down: "counter", partitions: 1, epoch: 1, owner: contiguous(1),
		place: func(int, int) int { return 2 }}
	rs.setMaps(&SlotMap{Epoch: 1, Partitions: 1, Owner: rs.owner})
	c.apply()
	split := queryspec.TaskID("wc", "splitter", 0, 0)
	var pending, inBuf int64
	waitUntilOr(t, "the splitter has a backlog", func() bool {
		tk := c.workers[1].rt.task(split)
		lines := c.workers[0].rt.task(queryspec.TaskID("wc", "lines", 0, 0))
		if tk == nil || lines == nil || tk.outs[0].buf.Stats().LastID < 50 {
			return false
		}
		// What the source produced for the splitter that it has not
		// processed yet: its input's queue and the source's buffer.
		inBuf = int64(lines.outs[0].buf.Stats().LastID) - int64(tk.merge.inputLastID(0))
		n, _ := tk.merge.pendingTuples()
		pending = int64(n)
		return inBuf >= 150 && lines.outs[0].buf.Stats().LastID > 1000
	}, func() {
		t.Logf("backlog: %d queued at the splitter, %d in the source's buffer", pending, inBuf)
		for _, st := range c.states() {
			t.Logf("%+v", st)
		}
	})
	start := time.Now()
	cut := rs.scale(t, 8)
	t.Logf("rescaled in %v (backlog: source buffer %d)", time.Since(start), inBuf)
	got := sinkRows(c.tail(t, queryspec.TaskID("wc", "out", 0, 0)))
	if !slices.Equal(got, want) {
		t.Fatalf("%d results, %d without the rescale (cut %d): they differ", len(got), len(want), cut)
	}
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

// TestKickReleaseCoalesces: kicks of a task that processes its single
// input inline, while its processing is busy (here: proc held, as by a
// release blocked on a full output), leave one goroutine waiting, not one
// per kick (passCut kicks every 2 ms while the task works through a
// backlog below the cut), and a kick still makes the task look again.
func TestKickReleaseCoalesces(t *testing.T) {
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(splitterQuery, 300, 200, "1us")))
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterEach(t, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: time.Millisecond})
	defer c.close(t)
	c.apply()
	split := queryspec.TaskID("wc", "splitter", 0, 0)
	var tk *task
	waitUntil(t, "the splitter processes inline", func() bool {
		tk = c.workers[0].rt.task(split)
		return tk != nil && tk.inline() != nil && tk.merge.inputLastID(0) > 10
	})
	if err := tk.lockProc(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := goruntime.NumGoroutine()
	for range 200 {
		tk.kickRelease()
	}
	grown := goruntime.NumGoroutine() - before
	tk.unlockProc()
	if grown > 20 {
		t.Fatalf("200 kicks while processing was busy left %d more goroutines", grown)
	}
	waitUntil(t, "the kicks' goroutine ended", func() bool { return !tk.rs.lifting.Load() })
	sameLen := len(sinkRows(c.tail(t, queryspec.TaskID("wc", "out", 0, 0))))
	if sameLen == 0 {
		t.Fatal("no result")
	}
}
