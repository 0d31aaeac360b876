package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

func quietRuntime(t *testing.T) *Runtime {
	t.Helper()
	r := New(Options{Logger: slog.New(slog.DiscardHandler), BoundaryInterval: time.Millisecond})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("close runtime: %v", err)
		}
	})
	return r
}

// routedTo emits one tuple with the given word through the task and
// returns the partition of "counts" it went to.
func routedTo(t *testing.T, tk *task, word string) int {
	t.Helper()
	parts := tk.byConsumer["counts"]
	before := make([]uint64, len(parts))
	for i, o := range parts {
		before[i] = o.buf.Stats().LastID
	}
	values := make([]tuple.Value, len(tk.node.Schema.Fields))
	for i, f := range tk.node.Schema.Fields {
		if f.Name == "word" {
			values[i] = tuple.Str(word)
		} else {
			values[i] = tuple.Value{Kind: f.Kind}
		}
	}
	ctx := context.Background()
	tk.emitData(ctx, &tuple.Tuple{Values: values})
	if err := tk.flush(ctx); err != nil || tk.emitErr != nil {
		t.Fatalf("emit %q: %v / %v", word, err, tk.emitErr)
	}
	got := -1
	for i, o := range parts {
		if o.buf.Stats().LastID != before[i] {
			if got >= 0 {
				t.Fatalf("%q went to partitions %d and %d", word, got, i)
			}
			got = i
		}
	}
	if got < 0 {
		t.Fatalf("%q went nowhere", word)
	}
	return got
}

// TestKeyedRoutingFollowsTheSlotMap: a task routes each key to the
// partition the replicated slot map gives its slot, not the formula; a new
// epoch takes effect on the running task; a map that does not fit is
// refused and routing stays as it was.
func TestKeyedRoutingFollowsTheSlotMap(t *testing.T) {
	q, err := queryspec.Parse("wc.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 1000)))
	if err != nil {
		t.Fatal(err)
	}
	words := []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"}
	slot := func(w string) int { return queryspec.Slot([]tuple.Value{tuple.Str(w)}) }
	// Not the formula: partition 1 owns everything except the slots of
	// the first four words, which partition 0 owns.
	owner := make([]int32, queryspec.NumSlots)
	for s := range owner {
		owner[s] = 1
	}
	for _, w := range words[:4] {
		owner[slot(w)] = 0
	}
	r := quietRuntime(t)
	tk, err := newTask(r, TaskSpec{TaskID: queryspec.TaskID("wc", "lines", 0, 0), Query: "wc", Fragment: "lines", Spec: q,
		Generation: 1, SlotMaps: map[string]*SlotMap{"counts": {Epoch: 2, Owner: owner}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tk.stop()
	differs := 0
	for _, w := range words {
		got := routedTo(t, tk, w)
		if want := int(owner[slot(w)]); got != want {
			t.Fatalf("%q (slot %d) routed to partition %d, the slot map says %d", w, slot(w), got, want)
		}
		if got != queryspec.PartitionOfSlot(slot(w), 2) {
			differs++
		}
	}
	if differs == 0 {
		t.Fatal("the test map routes every word as the formula would: it proves nothing")
	}

	// A new epoch: everything to partition 0.
	all0 := make([]int32, queryspec.NumSlots)
	tk.setSlotMaps(map[string]*SlotMap{"counts": {Epoch: 3, Owner: all0}})
	for _, w := range words {
		if got := routedTo(t, tk, w); got != 0 {
			t.Fatalf("after epoch 3, %q routed to %d, want 0", w, got)
		}
	}
	// A map naming a partition the fragment does not have is refused.
	bad := make([]int32, queryspec.NumSlots)
	bad[slot("alpha")] = 5
	tk.setSlotMaps(map[string]*SlotMap{"counts": {Epoch: 4, Owner: bad}})
	tk.setSlotMaps(map[string]*SlotMap{"counts": {Epoch: 4, Owner: all0[:10]}})
	if got := routedTo(t, tk, "beta"); got != 0 {
		t.Fatalf("after refused maps, beta routed to %d, want 0 (epoch 3 kept)", got)
	}
}

// TestNewGenerationIsANewCopy: a task whose generation changes is
// restarted, reports its generation, and later copies subscribe under a
// name of their own.
func TestNewGenerationIsANewCopy(t *testing.T) {
	q, err := queryspec.Parse("wc.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 1000)))
	if err != nil {
		t.Fatal(err)
	}
	r := quietRuntime(t)
	spec := TaskSpec{TaskID: queryspec.TaskID("wc", "lines", 0, 0), Query: "wc", Fragment: "lines", Spec: q, QueryIndex: 7, Generation: 1}
	ctx := context.Background()
	r.Apply(ctx, []TaskSpec{spec})
	first := r.task(spec.TaskID)
	if st := r.States(); len(st) != 1 || st[0].Generation != 1 {
		t.Fatalf("states = %+v", st)
	}
	r.Apply(ctx, []TaskSpec{spec}) // same copy: kept
	if r.task(spec.TaskID) != first {
		t.Fatal("an unchanged assignment restarted the task")
	}
	spec.Generation = 2
	r.Apply(ctx, []TaskSpec{spec})
	if r.task(spec.TaskID) == first {
		t.Fatal("generation 2 did not restart the task")
	}
	if st := r.States(); len(st) != 1 || st[0].Generation != 2 {
		t.Fatalf("states = %+v", st)
	}
	// The data plane serves the copy that runs here, and refuses a
	// subscriber that means another one.
	for gen, ok := range map[int32]bool{0: true, 1: false, 2: true, 3: false} {
		_, err := r.LocalStream(&fedstreampb.StreamRef{Query: "wc", TaskId: spec.TaskID, Consumer: "counts", Generation: gen})
		if ok != (err == nil) || (err != nil && !errors.Is(err, dataplane.ErrUnknownStream)) {
			t.Fatalf("stream of generation %d: %v", gen, err)
		}
	}
	if id := spec.CopyID(); id != "wc/lines/p0/r0@g2" {
		t.Fatalf("CopyID = %q", id)
	}
	spec.Generation = 1
	if id := spec.CopyID(); id != spec.TaskID {
		t.Fatalf("generation 1 CopyID = %q, want the task id", id)
	}
}

// BenchmarkPartitionOf compares routing a slot through the replicated map
// with the formula it replaced (the cost the hot path pays per tuple).
func BenchmarkPartitionOf(b *testing.B) {
	owner := make([]int32, queryspec.NumSlots)
	for s := range owner {
		owner[s] = int32(queryspec.PartitionOfSlot(s, 4))
	}
	withMap := route{slots: &routeSlots{}}
	withMap.slots.m.Store(&SlotMap{Epoch: 1, Owner: owner})
	formula := route{slots: &routeSlots{}}
	for _, bc := range []struct {
		name string
		rt   *route
	}{{"map", &withMap}, {"formula", &formula}} {
		b.Run(bc.name, func(b *testing.B) {
			sum := 0
			for i := range b.N {
				sum += bc.rt.partitionOf(i&(queryspec.NumSlots-1), 4, 0)
			}
			if sum < 0 {
				b.Fatal(sum)
			}
		})
	}
}

// TestSlotMapCheckPrepared: an upstream installs the map of a rescale's
// prepare (a next map with more partitions than its streams, which the
// go adds) without refusing it; from the go the next map must fit.
func TestSlotMapCheckPrepared(t *testing.T) {
	m := &SlotMap{Epoch: 1, Partitions: 1, Owner: contiguous(1),
		Next: &SlotMapNext{Epoch: 2, Partitions: 4, Owner: contiguous(4)}}
	if err := m.check(1); err != nil {
		t.Fatalf("prepared map refused with the current map's streams: %v", err)
	}
	m.Next.Go = true
	if err := m.check(1); err == nil {
		t.Fatal("a map past its go accepted with streams for its old partitions only")
	}
	if err := m.check(4); err != nil {
		t.Fatalf("a map past its go refused with every stream: %v", err)
	}
}

// TestRestartedSinkMarksItsStream: a sink copy placed again without a
// snapshot (generation above 1, no bootstrap: its query has one replica)
// numbers its results from 1 again, and its result stream says so
// (dataplane.BufferOptions.Restarted, the header tail reads); the first
// copy's stream does not.
func TestRestartedSinkMarksItsStream(t *testing.T) {
	q, err := queryspec.Parse("wc.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 1000)))
	if err != nil {
		t.Fatal(err)
	}
	r := quietRuntime(t)
	for gen, want := range map[int]bool{1: false, 2: true} {
		tk, err := newTask(r, TaskSpec{TaskID: queryspec.TaskID("wc", "out", 0, 0), Query: "wc", Fragment: "out", Spec: q, Generation: gen})
		if err != nil {
			t.Fatal(err)
		}
		if got := tk.single.buf.Restarted(); got != want {
			t.Errorf("generation %d without a snapshot: stream restarted %v, want %v", gen, got, want)
		}
		tk.stop()
	}
}
