package operator

import (
	"fmt"
	"testing"

	"github.com/fedstream/fedstream/slots"
	"github.com/fedstream/fedstream/worker/tuple"
)

// stateOp builds a keyed aggregate holding about mb MB of snapshot: one
// open window with as many groups (distinct src keys) as that takes.
func stateOp(b *testing.B, mb int) (Operator, []byte) {
	b.Helper()
	op, err := New(aggDef("1s", "", []string{"src"}, "n=count()", "s=sum(port)", "a=avg(load)", "hi=max(port)"), []*tuple.Schema{connSchema})
	if err != nil {
		b.Fatal(err)
	}
	var out discard
	add := func(from, to int) {
		for k := from; k < to; k++ {
			key := fmt.Sprintf("10.%d.%d.%d", k>>16, k>>8&255, k&255)
			if err := op.Process(0, conn(1, key, int64(k), 0.5, true), &out); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Size one group's share of the snapshot, then add the groups for mb.
	add(0, 10000)
	snap, err := op.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	add(10000, (mb<<20)/(len(snap)/10000))
	if snap, err = op.Snapshot(); err != nil {
		b.Fatal(err)
	}
	return op, snap
}

// stateMB is the size of the state the snapshot benchmarks move.
const stateMB = 8

// The snapshot benchmarks report MB/s of encoded state (SetBytes): the
// cost of moving an operator's state is its size divided by that.
func BenchmarkStateSnapshot(b *testing.B) {
	op, snap := stateOp(b, stateMB)
	groups := 0
	for _, w := range op.(*aggregate).windows {
		groups += len(w.groups)
	}
	b.SetBytes(int64(len(snap)))
	b.ResetTimer()
	for range b.N {
		if _, err := op.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(groups), "groups")
}

func BenchmarkStateRestore(b *testing.B) {
	op, snap := stateOp(b, stateMB)
	b.SetBytes(int64(len(snap)))
	b.ResetTimer()
	for range b.N {
		if err := op.Restore(snap); err != nil {
			b.Fatal(err)
		}
	}
}

// Half of the slots: what a split of one partition into two moves.
func BenchmarkStateSnapshotSlots(b *testing.B) {
	op, _ := stateOp(b, stateMB)
	st, _ := SlotStateOf(op)
	half := slots.Range(0, slots.Count/2)
	data, err := st.SnapshotSlots(half)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		if _, err := st.SnapshotSlots(half); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStateRestoreSlots(b *testing.B) {
	op, _ := stateOp(b, stateMB)
	st, _ := SlotStateOf(op)
	half := slots.Range(0, slots.Count/2)
	data, err := st.SnapshotSlots(half)
	if err != nil {
		b.Fatal(err)
	}
	def := op.(*aggregate)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		fresh := &aggregate{}
		*fresh = *def
		fresh.windows = map[int64]*aggWindow{}
		fresh.watermark = -1 << 63
		b.StartTimer()
		if err := fresh.RestoreSlots(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAggregateNewGroups is the worst case for the slot index: every
// tuple starts a group (a new key), so each pays one slot hash.
func BenchmarkAggregateNewGroups(b *testing.B) {
	op, err := New(aggDef("1ms", "", []string{"src"}, "n=count()"), []*tuple.Schema{connSchema})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i>>8, i&255)
	}
	var out discard
	t := conn(0, "", 1, 0.5, true)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t.STime = int64(i) // a window per 1e6 tuples: keys repeat only after 65536
		t.Values[1] = tuple.Str(keys[i%len(keys)])
		if err := op.Process(0, t, &out); err != nil {
			b.Fatal(err)
		}
		if i%100000 == 99999 {
			if err := op.Advance(int64(i), &out); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkStateCopyBaseline copies the snapshot's bytes once: the memory
// bandwidth baseline the snapshot rates compare with, measured in the same
// run.
func BenchmarkStateCopyBaseline(b *testing.B) {
	_, snap := stateOp(b, stateMB)
	b.SetBytes(int64(len(snap)))
	b.ResetTimer()
	for range b.N {
		_ = append([]byte(nil), snap...)
	}
}

// BenchmarkStateFreeze is what a live snapshot costs the task itself
// (Freezer): capturing the state, without encoding it. MB/s of the
// snapshot it stands for.
func BenchmarkStateFreeze(b *testing.B) {
	op, snap := stateOp(b, stateMB)
	b.SetBytes(int64(len(snap)))
	b.ResetTimer()
	for range b.N {
		_ = op.(Freezer).Freeze()
	}
}

// memberOp builds the state bench move moves: count_distinct of
// 1000-byte members per key (16 keys) over 40 sliding windows, about mb
// MB of snapshot.
func memberOp(b *testing.B, mb int) (Operator, []byte) {
	b.Helper()
	op, err := New(aggDef("40ns", "1ns", []string{"src"}, "n=count()", "d=count_distinct(src2)"), []*tuple.Schema{memberSchema})
	if err != nil {
		b.Fatal(err)
	}
	pad := string(make([]byte, 990))
	var out discard
	n := (mb << 20) / (1010 * 20) // each member is in 40 windows, half full on average
	for i := range n {
		t := &tuple.Tuple{Type: tuple.Stable, STime: int64(i * 40 / n), Values: []tuple.Value{
			tuple.Str(fmt.Sprintf("k%d", i%16)), tuple.Str(fmt.Sprintf("%010d", i) + pad)}}
		if err := op.Process(0, t, &out); err != nil {
			b.Fatal(err)
		}
	}
	snap, err := op.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	return op, snap
}

var memberSchema = tuple.NewSchema([]tuple.Field{{Name: "src", Kind: tuple.KindString}, {Name: "src2", Kind: tuple.KindString}})

func BenchmarkMemberStateSnapshot(b *testing.B) {
	op, snap := memberOp(b, stateMB)
	b.SetBytes(int64(len(snap)))
	b.ResetTimer()
	for range b.N {
		if _, err := op.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemberStateRestore(b *testing.B) {
	op, snap := memberOp(b, stateMB)
	b.SetBytes(int64(len(snap)))
	b.ResetTimer()
	for range b.N {
		if err := op.Restore(snap); err != nil {
			b.Fatal(err)
		}
	}
}
