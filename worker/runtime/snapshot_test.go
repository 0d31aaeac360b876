package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/slots"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/tuple"
)

// moveTask re-places task id from one worker to another in the cluster's
// specs, the copy starting from snap, and applies: the old copy stops
// (its worker first), the new one starts, every other task learns the new
// placement.
func (c *cluster) moveTask(t *testing.T, id string, from, to *worker, snap *TaskSnapshot) {
	t.Helper()
	var moved TaskSpec
	keep := c.specs[from][:0]
	for _, s := range c.specs[from] {
		if s.TaskID == id {
			moved = s
			continue
		}
		keep = append(keep, s)
	}
	if moved.TaskID == "" {
		t.Fatalf("task %s is not on the worker it moves from", id)
	}
	c.specs[from] = keep
	moved.FromSnapshot = snap
	c.specs[to] = append(c.specs[to], moved)
	var pls []Placement
	for _, pl := range moved.Placements {
		if pl.TaskID == id {
			pl.WorkerAddr = to.addr
		}
		pls = append(pls, pl)
	}
	for _, w := range c.workers {
		for i := range c.specs[w] {
			c.specs[w][i].Placements = pls
		}
	}
	from.rt.Apply(context.Background(), c.specs[from])
	for _, w := range c.workers {
		if w != from {
			w.rt.Apply(context.Background(), c.specs[w])
		}
	}
}

// TestTaskMovesFromSnapshot runs a keyed aggregate (two partitions) under
// paced load, takes a stop-and-copy snapshot of one partition's task
// mid-stream, stops it and starts a copy on another worker from the
// snapshot (encoded and decoded on the way). The sink's result stream is
// identical, tuple for tuple (ids included), to a run without the move,
// and matches the reference window by window and word by word: nothing
// lost, nothing repeated.
func TestTaskMovesFromSnapshot(t *testing.T) {
	yaml := fmt.Sprintf(wordsQuery, 1, 20000) // about a second of paced input
	place := func(string, int, int) int { return 0 }
	const moving = "wc/counts/p0/r0"

	unmoved := newCluster(t, 2, yaml, place)
	unmoved.apply()
	want := unmoved.tail(t, "wc/out/p0/r0")
	unmoved.close(t)
	sameResults(t, results(t, want, sinkSchema(t, unmoved.query)), reference(t, 20000))

	c := newCluster(t, 2, yaml, place)
	defer c.close(t)
	c.apply()
	from, to := c.workers[0], c.workers[1]
	// Another subscriber holds the source's stream to the moving task, as
	// a downstream replica would: the stream keeps what the task took, so
	// the copy resumes from its position, not from what happens to be left.
	src := from.rt.task("wc/lines/p0/r0")
	held, err := src.output("counts", 0)
	if err != nil {
		t.Fatal(err)
	}
	held.Connect("holder")
	defer held.Disconnect("holder")
	waitUntil(t, "the aggregate emitted some windows", func() bool {
		tk := from.rt.task(moving)
		return tk != nil && tk.outs[0].buf.Stats().LastID > 300
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	snap, err := from.rt.SnapshotTask(ctx, moving, SnapshotOptions{Halt: true})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Released == math.MaxInt64 || len(snap.Operator) < 100 {
		t.Fatalf("snapshot at watermark %d with %d bytes of state: not mid-stream, the test would prove nothing", snap.Released, len(snap.Operator))
	}
	pending := 0
	for _, in := range snap.Inputs {
		pending += len(in.Pending)
	}
	enc, err := snap.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %d bytes (operator %d), watermark %d, inputs %+v, %d pending tuples, outputs %+v",
		len(enc), len(snap.Operator), snap.Released, positions(snap.Inputs), pending, snap.Outputs)
	var back TaskSnapshot
	if err := back.UnmarshalBinary(enc); err != nil {
		t.Fatal(err)
	}
	if err := from.rt.WaitTaken(ctx, moving, snap); err != nil {
		t.Fatal(err)
	}
	c.moveTask(t, moving, from, to, &back)
	got := c.tail(t, "wc/out/p0/r0")
	sameResults(t, results(t, got, sinkSchema(t, c.query)), reference(t, 20000))
	if !sameTuples(got, want) {
		t.Fatalf("the sink's stream differs from the unmoved run's (%d vs %d tuples)", len(got), len(want))
	}
	if tk := to.rt.task(moving); tk == nil || !tk.restored {
		t.Fatalf("the moved task does not run on the new worker from the snapshot")
	}
	for _, st := range c.states() {
		if st.State == StateFailed {
			t.Errorf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}

func positions(ins []InputPosition) []string {
	var out []string
	for _, in := range ins {
		out = append(out, fmt.Sprintf("%s[%d] after %d", in.Upstream, in.Partition, in.After))
	}
	return out
}

// TestSnapshotRefusals: sources cannot halt at a snapshot, unknown tasks are
// named, and a snapshot that does not fit the task it is to start (another
// partition) leaves that task failed with the reason.
func TestSnapshotRefusals(t *testing.T) {
	c := newCluster(t, 1, fmt.Sprintf(wordsQuery, 1, 0), func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	w := c.workers[0]
	ctx := context.Background()
	if _, err := w.rt.SnapshotTask(ctx, "wc/lines/p0/r0", SnapshotOptions{Halt: true}); !errors.Is(err, ErrNotSnapshottable) {
		t.Fatalf("stop-and-copy source snapshot: %v, want ErrNotSnapshottable", err)
	}
	if _, err := w.rt.SnapshotTask(ctx, "wc/nope/p0/r0", SnapshotOptions{}); !errors.Is(err, ErrUnknownTask) {
		t.Fatalf("unknown task: %v, want ErrUnknownTask", err)
	}
	c.tail(t, "wc/out/p0/r0")
	snap, err := w.rt.SnapshotTask(ctx, "wc/counts/p0/r0", SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var spec TaskSpec
	for _, s := range c.specs[w] {
		if s.TaskID == "wc/counts/p1/r0" {
			spec = s
		}
	}
	spec.FromSnapshot = snap
	if _, err := newTask(w.rt, spec); !errors.Is(err, ErrSnapshotMismatch) {
		t.Fatalf("start p1 from p0's snapshot: %v, want ErrSnapshotMismatch", err)
	}
	spec.Partition, spec.TaskID, spec.Replica = 0, "wc/counts/p0/r1", 1
	// A snapshot taken after the final boundary starts a task (another
	// replica: any replica's state fits) with nothing left to do.
	if snap.Released != math.MaxInt64 {
		t.Fatalf("snapshot after the end at watermark %d", snap.Released)
	}
	spec.FromSnapshot = snap
	done, err := newTask(w.rt, spec)
	if err != nil {
		t.Fatal(err)
	}
	done.start()
	if st := done.State(); st.State != StateRunning || st.Message != "input exhausted" {
		t.Fatalf("task restored after the end: %+v", st)
	}
	if st := done.outs[0].buf.Stats(); st.LastID != snap.Outputs[0].LastID {
		t.Fatalf("restored output resumes at %d, snapshot says %d", st.LastID, snap.Outputs[0].LastID)
	}
	done.stop()
	spec.FromSnapshot = &TaskSnapshot{Query: "wc", Fragment: "counts", Partition: 0, Operator: []byte("junk"), Inputs: snap.Inputs, Outputs: snap.Outputs}
	if _, err := newTask(w.rt, spec); !errors.Is(err, ErrSnapshotMismatch) {
		t.Fatalf("start from junk operator state: %v, want ErrSnapshotMismatch", err)
	}
}

// TestTaskSnapshotEncoding: the encoding round-trips, and truncated or
// corrupted bytes give ErrBadTaskSnapshot (or decode) without panicking.
func TestTaskSnapshotEncoding(t *testing.T) {
	s := &TaskSnapshot{TaskID: "q/f/p1/r0", Query: "q", Fragment: "f", Partition: 1, Operator: []byte("state"),
		Released: -5, Seq: 77,
		Inputs: []InputPosition{{Upstream: "up", Port: 1, Partition: 2, After: 99, Boundary: 40, Steps: []int64{30, 40},
			Pending: []tuple.Tuple{{ID: 98, Type: tuple.Stable, STime: 41, Values: []tuple.Value{tuple.Str("a\x00b"), tuple.Int(-3), tuple.Float(2.5)}}}}},
		Outputs: []OutputPosition{{Consumer: "", Partition: 1, LastID: 1234}, {Consumer: "down", Partition: 0}}}
	enc, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var back TaskSnapshot
	if err := back.UnmarshalBinary(enc); err != nil {
		t.Fatal(err)
	}
	again, _ := back.MarshalBinary()
	if !slices.Equal(enc, again) || back.TaskID != s.TaskID || back.Inputs[0].Pending[0].ID != 98 ||
		back.Inputs[0].Pending[0].Values[0].S != "a\x00b" || back.Outputs[0].LastID != 1234 {
		t.Fatalf("round trip changed the snapshot: %+v", back)
	}
	for n := range len(enc) {
		if err := new(TaskSnapshot).UnmarshalBinary(enc[:n]); !errors.Is(err, ErrBadTaskSnapshot) {
			t.Fatalf("%d of %d bytes: %v, want ErrBadTaskSnapshot", n, len(enc), err)
		}
	}
	// The optional trailing sections of a source's snapshot: its early
	// level and the cut floors of the plans it acknowledged.
	src := *s
	src.Inputs, src.SourceRecords, src.SourceLevel = nil, 12, 2
	src.CutFrontier, src.CutFloors = -7, []EpochFloor{{Epoch: 3, Floor: 2e9}, {Epoch: 4, Floor: math.MaxInt64}}
	srcEnc, err := src.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var srcBack TaskSnapshot
	if err := srcBack.UnmarshalBinary(srcEnc); err != nil {
		t.Fatal(err)
	}
	if srcBack.SourceLevel != 2 || srcBack.CutFrontier != -7 || !slices.Equal(srcBack.CutFloors, src.CutFloors) {
		t.Fatalf("round trip changed the source snapshot's sections: level %d frontier %d floors %v", srcBack.SourceLevel, srcBack.CutFrontier, srcBack.CutFloors)
	}
	newer := slices.Clone(enc)
	newer[len(taskSnapshotMagic)]++
	if err := new(TaskSnapshot).UnmarshalBinary(newer); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("unknown version: %v", err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	for range 2000 {
		bad := slices.Clone(enc)
		bad[r.IntN(len(bad))] ^= byte(1 + r.IntN(255))
		if err := new(TaskSnapshot).UnmarshalBinary(bad); err != nil && !errors.Is(err, ErrBadTaskSnapshot) {
			t.Fatalf("corrupt snapshot: %v", err)
		}
	}
}

// readStream reads a result stream at addr after id after, until the tuple
// with id upTo (0: until the final boundary).
func (c *cluster) readStream(t *testing.T, addr, task string, after, upTo uint64) []tuple.Tuple {
	t.Helper()
	conn, err := c.pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: c.query.Name, TaskId: task}, "", true, after)
	var out []tuple.Tuple
	for {
		err := sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
			for _, tp := range b.Tuples {
				tp.Values = slices.Clone(tp.Values)
				tuple.DetachStrings(tp.Values)
				out = append(out, tp)
				if tp.ID == upTo || upTo == 0 && tp.Type == tuple.Boundary && tp.STime == math.MaxInt64 {
					return dataplane.ErrStopSubscription
				}
			}
			return nil
		})
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("read %s after %d: %v (states %v)", task, after, err, c.states())
		}
		time.Sleep(10 * time.Millisecond) // not started yet: retry
	}
}

// TestSinkMovesFromSnapshot moves a sink mid-stream, a merging one (two
// input partitions) and a pass-through one (a single input, forwarded as
// it is): the old copy's result stream up to the snapshot followed by the
// new copy's after it is the unmoved run's stream, ids included.
func TestSinkMovesFromSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name        string
		parallelism string
	}{{"merging", "parallelism: 2"}, {"pass-through", "parallelism: 1"}} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := strings.Replace(fmt.Sprintf(wordsQuery, 1, 20000), "parallelism: 2", tc.parallelism, 1)
			if tc.parallelism == "parallelism: 1" {
				// A sink behind a keyed operator merges even from one
				// partition (a rescale may add more): pass-through needs
				// an unkeyed upstream.
				yaml = strings.Replace(yaml, "{name: out, input: counts}", "{name: out, input: long}\n  - {name: agg, input: counts}", 1)
			}
			place := func(string, int, int) int { return 0 }
			const sink = "wc/out/p0/r0"
			unmoved := newCluster(t, 2, yaml, place)
			unmoved.apply()
			want := unmoved.tail(t, sink)
			unmoved.close(t)

			c := newCluster(t, 2, yaml, place)
			defer c.close(t)
			c.apply()
			from, to := c.workers[0], c.workers[1]
			waitUntil(t, "the sink has results", func() bool {
				tk := from.rt.task(sink)
				return tk != nil && tk.outs[0].buf.Stats().LastID > 300
			})
			if tk := from.rt.task(sink); tk.passThrough != (tc.parallelism == "parallelism: 1") {
				t.Fatalf("sink pass-through %v: the test does not test what it says", tk.passThrough)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			snap, err := from.rt.SnapshotTask(ctx, sink, SnapshotOptions{Halt: true})
			if err != nil {
				t.Fatal(err)
			}
			last := snap.Outputs[0].LastID
			before := c.readStream(t, from.addr, sink, 0, last)
			enc, _ := snap.MarshalBinary()
			var back TaskSnapshot
			if err := back.UnmarshalBinary(enc); err != nil {
				t.Fatal(err)
			}
			t.Logf("sink snapshot at output id %d, inputs %v, %d bytes", last, positions(snap.Inputs), len(enc))
			c.moveTask(t, sink, from, to, &back)
			after := c.readStream(t, to.addr, sink, last, 0)
			got := append(before, after...)
			if !sameTuples(got, want) {
				t.Fatalf("the sink's stream around the move (%d + %d tuples) differs from the unmoved run's (%d)", len(before), len(after), len(want))
			}
		})
	}
}

// TestAlignedSnapshotsForRescale cuts both partitions of a keyed aggregate
// at one stream time (aligned, stop-and-copy): their snapshots share the
// watermark, each holds state only in the slots its partition owns, and
// their slot states merge into one operator (what a rescale 2 -> 1 does)
// without conflict. Both copies then resume on another worker and the
// sink's stream is the unmoved run's, ids included.
func TestAlignedSnapshotsForRescale(t *testing.T) {
	yaml := fmt.Sprintf(wordsQuery, 1, 10000) // 20000 lines: 2 s of paced input
	place := func(string, int, int) int { return 0 }
	unmoved := newCluster(t, 2, yaml, place)
	unmoved.apply()
	want := unmoved.tail(t, "wc/out/p0/r0")
	unmoved.close(t)

	c := newCluster(t, 2, yaml, place)
	defer c.close(t)
	c.apply()
	from, to := c.workers[0], c.workers[1]
	// Stream time mid-stream, and mid-window (2 ms windows), so that the
	// open window holds state.
	const cut = int64(901 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := []string{"wc/counts/p0/r0", "wc/counts/p1/r0"}
	snaps := make([]*TaskSnapshot, len(ids))
	errs := make([]error, len(ids))
	done := make(chan int)
	for i, id := range ids {
		go func() {
			snaps[i], errs[i] = from.rt.SnapshotTask(ctx, id, SnapshotOptions{Halt: true, Aligned: true, At: cut})
			done <- i
		}()
	}
	for range ids {
		<-done
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", ids[i], err)
		}
	}
	if snaps[0].Released != snaps[1].Released || snaps[0].Released > cut || snaps[0].Released < cut-int64(time.Millisecond) {
		t.Fatalf("aligned snapshots at watermarks %d and %d, cut %d", snaps[0].Released, snaps[1].Released, cut)
	}

	// The partitions' slot states merge into one operator.
	plan, err := c.query.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	node := plan.Node("counts")
	schema := plan.Node(node.Inputs[0]).Schema
	merged, err := operator.New(node.Op, []*tuple.Schema{schema})
	if err != nil {
		t.Fatal(err)
	}
	mst, _ := operator.SlotStateOf(merged)
	for p, snap := range snaps {
		op, err := operator.New(node.Op, []*tuple.Schema{schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := op.Restore(snap.Operator); err != nil {
			t.Fatal(err)
		}
		st, ok := operator.SlotStateOf(op)
		if !ok {
			t.Fatal("the keyed aggregate has no slot state")
		}
		held := st.HeldSlots()
		if held.IsEmpty() || !slots.OfPartition(p, 2).Contains(held) {
			t.Fatalf("partition %d holds state in slots %s, owns %s", p, held, slots.OfPartition(p, 2))
		}
		data, err := st.SnapshotSlots(held)
		if err != nil {
			t.Fatal(err)
		}
		if err := mst.RestoreSlots(data); err != nil {
			t.Fatalf("merging partition %d's slots: %v", p, err)
		}
	}

	for i, id := range ids {
		if err := from.rt.WaitTaken(ctx, id, snaps[i]); err != nil {
			t.Fatal(err)
		}
		c.moveTask(t, id, from, to, snaps[i])
	}
	got := c.tail(t, "wc/out/p0/r0")
	if !sameTuples(got, want) {
		t.Fatalf("the sink's stream differs from the unmoved run's (%d vs %d tuples)", len(got), len(want))
	}
}
