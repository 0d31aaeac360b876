package operator

import (
	"bytes"
	"errors"
	"fmt"
	goruntime "runtime"
	"sync/atomic"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// canonical is the snapshot (Snapshot: count_distinct members sorted) of
// an operator from fresh restored from state, which a live snapshot's
// encoding writes with members in their sets' order.
func canonical(t *testing.T, fresh func() Operator, state []byte) []byte {
	t.Helper()
	op := fresh()
	if err := op.Restore(state); err != nil {
		t.Fatalf("restore the frozen encoding: %v", err)
	}
	b, err := op.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFreezeIsSnapshotAtFreeze: the encoding a Freeze returns is the
// snapshot of the state at the Freeze (byte for byte once restored: its
// count_distinct members are in set order), however the
// operator changes before the encoding runs (new groups, updated
// accumulators and count_distinct sets in the same windows, windows
// closed by Advance), for a lone aggregate and for a chain headed by one.
func TestFreezeIsSnapshotAtFreeze(t *testing.T) {
	defs := map[string][]string{
		"keyed":   {"n=count()", "s=sum(port)", "a=avg(load)", "hi=max(src)", "d=count_distinct(port)"},
		"unkeyed": {"n=count()", "d=count_distinct(src)"},
	}
	for name, aggs := range defs {
		t.Run(name, func(t *testing.T) {
			groupBy := []string{"src"}
			if name == "unkeyed" {
				groupBy = nil
			}
			fresh := func() Operator {
				op, err := New(aggDef("10ns", "5ns", groupBy, aggs...), []*tuple.Schema{connSchema})
				if err != nil {
					t.Fatal(err)
				}
				return op
			}
			op := fresh()
			var out discard
			feed := func(from, to int64) {
				for i := from; i < to; i++ {
					src := fmt.Sprintf("10.0.0.%d", i%7)
					if err := op.Process(0, conn(i/3, src, i%11, float64(i), true), &out); err != nil {
						t.Fatal(err)
					}
				}
			}
			feed(0, 60)
			want, err := op.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			encode := FreezeOf(op)
			feed(60, 120) // the same windows and groups, and new ones
			if err := op.Advance(25, &out); err != nil {
				t.Fatal(err)
			}
			got, err := encode()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) || !bytes.Equal(canonical(t, fresh, got), want) {
				t.Fatalf("the frozen encoding (%d bytes) is not the snapshot at the freeze (%d bytes)", len(got), len(want))
			}
			if now, _ := op.Snapshot(); bytes.Equal(now, want) {
				t.Fatal("the operator did not change after the freeze: the test proves nothing")
			}
		})
	}
}

// TestRestoreOfSmallStateAllocatesLittle: restored groups come from
// blocks (groupSlab), but a block is never larger than its window's
// groups: restoring 40 windows of a few groups allocates kilobytes, not
// a 4096-group block per window (tens of MB, as it did at first).
func TestRestoreOfSmallStateAllocatesLittle(t *testing.T) {
	op, err := New(aggDef("40ns", "1ns", []string{"src"}, "n=count()", "s=sum(port)"), []*tuple.Schema{connSchema})
	if err != nil {
		t.Fatal(err)
	}
	var out discard
	for i := range int64(120) {
		if err := op.Process(0, conn(i/3, fmt.Sprintf("10.0.0.%d", i%3), i, 0, true), &out); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := op.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	if err := op.Restore(snap); err != nil {
		t.Fatal(err)
	}
	goruntime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("restoring %d bytes of snapshot (%d windows) allocated %d bytes", len(snap), len(op.(*aggregate).windows), n)
	}
}

// TestEncodingIsSizedExactly: a frozen state's Encoding announces its
// size before it is written, and the parts Write emits add up to exactly
// that size and to the snapshot at the freeze, for values whose varints
// and strings vary in length (negative and large sums, min/max of strings
// and numbers, long count_distinct members), alone and in a chain. A
// state restored with RestoreOwned from those bytes equals one restored
// with Restore.
func TestEncodingIsSizedExactly(t *testing.T) {
	aggs := []string{"n=count()", "s=sum(port)", "a=avg(load)", "hi=max(src)", "lo=min(port)", "d=count_distinct(src)", "p=count_distinct(port)"}
	for _, chained := range []bool{false, true} {
		fresh := func() Operator {
			op, err := New(aggDef("10ns", "5ns", []string{"ok"}, aggs...), []*tuple.Schema{connSchema})
			if err != nil {
				t.Fatal(err)
			}
			if chained {
				second, err := New(aggDef("10ns", "5ns", []string{"ok"}, "n=count()"), []*tuple.Schema{connSchema})
				if err != nil {
					t.Fatal(err)
				}
				op = Chain(second, op)
			}
			return op
		}
		op := fresh()
		var out discard
		long := string(bytes.Repeat([]byte("m"), 300))
		for i := int64(0); i < 200; i++ {
			port := i * i * i * 1_000_003 // varints of 1 to 10 bytes
			if i%2 == 1 {
				port = -port
			}
			src := fmt.Sprintf("%d", i) + long[:i%300]
			if err := op.Process(0, conn(i/7, src, port, float64(i)/3, i%3 == 0), &out); err != nil {
				t.Fatal(err)
			}
		}
		want, err := op.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		prepare := FreezeEncodingOf(op)
		prepareTransient := FreezeEncodingOf(op)
		if err := op.Process(0, conn(30, "later", 1, 1, true), &out); err != nil {
			t.Fatal(err)
		}
		enc, err := prepare()
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		parts := 0
		if err := enc.Write(func(p []byte) error { got = append(got, p...); parts++; return nil }); err != nil {
			t.Fatal(err)
		}
		if enc.Size != len(want) || len(got) != len(want) || !bytes.Equal(canonical(t, fresh, got), want) {
			t.Fatalf("chained %v: encoding sized %d, wrote %d bytes in %d parts, snapshot at the freeze %d bytes",
				chained, enc.Size, len(got), parts, len(want))
		}
		if parts < 3 {
			t.Fatalf("chained %v: %d parts: the windows were not written one by one", chained, parts)
		}
		// Written with transient parts (buffers reused): the same state.
		encT, err := prepareTransient()
		if err != nil {
			t.Fatal(err)
		}
		var gotT []byte
		if err := encT.WriteTransient(func(p []byte) error { gotT = append(gotT, p...); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(gotT) != len(want) || !bytes.Equal(canonical(t, fresh, gotT), want) {
			t.Fatalf("chained %v: transient encoding of %d bytes differs from the snapshot at the freeze (%d bytes)", chained, len(gotT), len(want))
		}
		copied, err := New(aggDef("10ns", "5ns", []string{"ok"}, aggs...), []*tuple.Schema{connSchema})
		if err != nil {
			t.Fatal(err)
		}
		owned, err := New(aggDef("10ns", "5ns", []string{"ok"}, aggs...), []*tuple.Schema{connSchema})
		if err != nil {
			t.Fatal(err)
		}
		if chained {
			for _, p := range []*Operator{&copied, &owned} {
				second, _ := New(aggDef("10ns", "5ns", []string{"ok"}, "n=count()"), []*tuple.Schema{connSchema})
				*p = Chain(second, *p)
			}
		}
		if err := copied.Restore(want); err != nil {
			t.Fatal(err)
		}
		if err := RestoreOwned(owned, bytes.Clone(want)); err != nil {
			t.Fatal(err)
		}
		a, _ := copied.Snapshot()
		b, _ := owned.Snapshot()
		if !bytes.Equal(a, want) || !bytes.Equal(b, want) {
			t.Fatalf("chained %v: restored states differ from the snapshot (Restore %v, RestoreOwned %v)", chained, bytes.Equal(a, want), bytes.Equal(b, want))
		}
	}
}

// TestWriteParallelStopsAtEmitError: parts are emitted in index order
// however the encoders finish, and an emit error (a snapshot stream that
// broke off) ends Write with that error: nothing is emitted after it, and
// no encoder runs once Write has returned. With reuse (transient parts),
// the same holds and the parts are encoded into a few buffers that go
// round instead of one each.
func TestWriteParallelStopsAtEmitError(t *testing.T) {
	for _, reuse := range []bool{false, true} {
		const n = 64
		var encoded atomic.Int64
		encode := func(i int, buf []byte) []byte {
			encoded.Add(1)
			if i%3 == 0 {
				goruntime.Gosched() // finish out of order
			}
			return append(buf[:0], byte(i), byte(i))
		}
		var got []byte
		buffers := map[*byte]bool{}
		if err := writeParallel(n, reuse, encode, func(p []byte) error {
			got = append(got, p[0])
			if p[1] != p[0] {
				t.Errorf("reuse %v: part %d overwritten before it was emitted", reuse, p[0])
			}
			buffers[&p[0]] = true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for i, b := range got {
			if int(b) != i {
				t.Fatalf("reuse %v: part %d emitted at position %d", reuse, b, i)
			}
		}
		if len(got) != n {
			t.Fatalf("reuse %v: %d parts emitted, want %d", reuse, len(got), n)
		}
		if most := goruntime.GOMAXPROCS(0) + 1; reuse && len(buffers) > most {
			t.Fatalf("%d buffers for %d transient parts, want at most %d", len(buffers), n, most)
		}
		broken := errors.New("stream broke off")
		encoded.Store(0)
		emitted := 0
		err := writeParallel(n, reuse, encode, func([]byte) error {
			if emitted++; emitted == 3 {
				return broken
			}
			return nil
		})
		if !errors.Is(err, broken) {
			t.Fatalf("reuse %v: Write after an emit error: %v, want it", reuse, err)
		}
		if emitted != 3 {
			t.Fatalf("reuse %v: %d parts emitted, want the emit error to end it at 3", reuse, emitted)
		}
		after := encoded.Load()
		goruntime.Gosched()
		if encoded.Load() != after {
			t.Fatalf("reuse %v: encoders still ran after Write returned", reuse)
		}
	}
}

// TestFreezeSharesDistinctSets: freezing an aggregate (which holds its
// task) copies no count_distinct set; the task clones a set before it
// adds to it, so the frozen encoding is still the state at the freeze
// after members were added to every group.
func TestFreezeSharesDistinctSets(t *testing.T) {
	const groups = 500
	fresh := func() Operator {
		op, err := New(aggDef("1h", "", []string{"port"}, "d=count_distinct(src)"), []*tuple.Schema{connSchema})
		if err != nil {
			t.Fatal(err)
		}
		return op
	}
	op := fresh()
	var out discard
	add := func(round int) {
		for g := range groups {
			if err := op.Process(0, conn(int64(round), fmt.Sprintf("m%d-%d", round, g), int64(g), 0, true), &out); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(0)
	add(1)
	want, err := op.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(5, func() { FreezeEncodingOf(op) }); allocs > groups/10 {
		t.Fatalf("%.0f allocations to freeze %d groups: their count_distinct sets are copied", allocs, groups)
	}
	prepare := FreezeEncodingOf(op)
	// Encoded while the task goes on adding to every group's set (go
	// test -race: the task never writes a map the encoding reads).
	var got []byte
	encoded := make(chan error, 1)
	go func() {
		enc, err := prepare()
		if err == nil {
			err = enc.Write(func(p []byte) error { got = append(got, p...); return nil })
		}
		encoded <- err
	}()
	add(2)
	if err := <-encoded; err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || !bytes.Equal(canonical(t, fresh, got), want) {
		t.Fatalf("frozen encoding of %d bytes differs from the state at the freeze (%d bytes): a set shared with the frozen copy was written", len(got), len(want))
	}
	now, _ := op.Snapshot()
	if bytes.Equal(now, want) {
		t.Fatal("the members added after the freeze are missing from the live state")
	}
}
