package operator

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/slots"
	"github.com/fedstream/fedstream/worker/tuple"
)

// keyedCases are the snapshot cases whose state is split by slot.
func keyedCases() []snapshotCase {
	var out []snapshotCase
	for _, sc := range snapshotCases() {
		if sc.def.Type == "join" || (sc.def.Type == "aggregate" && len(sc.def.GroupBy) > 0) {
			out = append(out, sc)
		}
	}
	return out
}

// slotOf returns the hash slot of a tuple arriving on port, keyed as the
// upstream routes it (group_by, or the join's on fields).
func slotOf(sc snapshotCase, port int, tp *tuple.Tuple) int {
	names := sc.def.GroupBy
	if sc.def.Type == "join" {
		names = sc.def.On
	}
	var key []tuple.Value
	for _, n := range names {
		key = append(key, tp.Values[sc.inputs[port].Index(n)])
	}
	return queryspec.Slot(key)
}

// route keeps the data events whose slot is in s, and every watermark.
func route(sc snapshotCase, events []event, s slots.Set) []event {
	var out []event
	for _, ev := range events {
		if ev.tup == nil || s.Has(slotOf(sc, ev.port, ev.tup)) {
			out = append(out, ev)
		}
	}
	return out
}

// randomHalf is a random set of about half the slots.
func randomHalf(r *rand.Rand) slots.Set {
	var s slots.Set
	for x := range slots.Count {
		if r.IntN(2) == 0 {
			s.Add(x)
		}
	}
	return s
}

// TestSlotSplitAndMerge: an operator fed a prefix of a stream hands the
// state of a random half of the slots to a new copy (SnapshotSlots,
// RestoreSlots) and drops it (DropSlots); each then gets the routed rest
// of the stream. Together they emit exactly, row for row, what one
// operator fed everything emits, and count the same late tuples. The
// reverse, two partitions' state merged into one new operator, too.
func TestSlotSplitAndMerge(t *testing.T) {
	for _, sc := range keyedCases() {
		t.Run(sc.name, func(t *testing.T) {
			for seed := range uint64(4) {
				r := rand.New(rand.NewPCG(seed, 99))
				events := randomStream(r, sc.inputs, 300)
				var f feeder
				whole := mustNew(t, sc.def, sc.inputs...)
				full := Collect()
				f.feed(t, whole, events, full)
				if len(full.Tuples) == 0 {
					t.Fatalf("seed %d: no output; the test would prove nothing", seed)
				}
				want := sortedRows(full.Tuples)
				s1 := randomHalf(r)
				s2 := slots.All().Minus(s1)
				split := 0
				for cut := 0; cut <= len(events); cut += 11 {
					// Split: one operator up to the cut, then slots s1 move.
					old := mustNew(t, sc.def, sc.inputs...)
					got := Collect()
					f.feed(t, old, events[:cut], got)
					st, ok := SlotStateOf(old)
					if !ok {
						t.Fatal("keyed operator has no slot state")
					}
					held := st.HeldSlots()
					data, err := st.SnapshotSlots(s1)
					if err != nil {
						t.Fatal(err)
					}
					st.DropSlots(s1)
					if st.HeldSlots() != held.Minus(s1) {
						t.Fatalf("cut %d: after dropping, holds %s, want %s", cut, st.HeldSlots(), held.Minus(s1))
					}
					if held.Overlaps(s1) {
						split++
					}
					moved := mustNew(t, sc.def, sc.inputs...)
					mst, _ := SlotStateOf(moved)
					if err := mst.RestoreSlots(data); err != nil {
						t.Fatalf("seed %d cut %d: restore: %v", seed, cut, err)
					}
					if mst.HeldSlots() != held.Intersect(s1) {
						t.Fatalf("cut %d: restored copy holds %s, want %s", cut, mst.HeldSlots(), held.Intersect(s1))
					}
					lateBefore := lateOf(old)
					f.feed(t, old, route(sc, events[cut:], s2), got)
					f.feed(t, moved, route(sc, events[cut:], s1), got)
					if g := sortedRows(got.Tuples); !slices.Equal(g, want) {
						t.Fatalf("seed %d cut %d: split output differs\n got: %s\nwant: %s", seed, cut, strings.Join(g, " "), strings.Join(want, " "))
					}
					if late := lateOf(old) + lateOf(moved); late != lateOf(whole) {
						t.Fatalf("seed %d cut %d: split late = %d (%d before the cut), want %d", seed, cut, late, lateBefore, lateOf(whole))
					}

					// Merge: two partitions (s1, s2) up to the cut, then one.
					p1, p2 := mustNew(t, sc.def, sc.inputs...), mustNew(t, sc.def, sc.inputs...)
					got = Collect()
					f.feed(t, p1, route(sc, events[:cut], s1), got)
					f.feed(t, p2, route(sc, events[:cut], s2), got)
					merged := mustNew(t, sc.def, sc.inputs...)
					mst, _ = SlotStateOf(merged)
					for _, p := range []struct {
						op Operator
						s  slots.Set
					}{{p1, s1}, {p2, s2}} {
						pst, _ := SlotStateOf(p.op)
						data, err := pst.SnapshotSlots(p.s)
						if err != nil {
							t.Fatal(err)
						}
						if err := mst.RestoreSlots(data); err != nil {
							t.Fatalf("seed %d cut %d: merge restore: %v", seed, cut, err)
						}
					}
					f.feed(t, merged, events[cut:], got)
					if g := sortedRows(got.Tuples); !slices.Equal(g, want) {
						t.Fatalf("seed %d cut %d: merged output differs\n got: %s\nwant: %s", seed, cut, strings.Join(g, " "), strings.Join(want, " "))
					}
				}
				if split == 0 {
					t.Fatalf("seed %d: no cut moved any state; the test would prove nothing", seed)
				}
			}
		})
	}
}

// TestRestoreSlotsRefuses: a slot already held, a snapshot at another
// watermark, a whole-operator snapshot given to RestoreSlots (and the
// reverse), and corrupt slot snapshots are refused, changing nothing.
func TestRestoreSlotsRefuses(t *testing.T) {
	for _, sc := range keyedCases() {
		t.Run(sc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 5))
			events := randomStream(r, sc.inputs, 200)
			var f feeder
			op := mustNew(t, sc.def, sc.inputs...)
			f.feed(t, op, events[:len(events)-1], Collect()) // windows stay open
			st, _ := SlotStateOf(op)
			held := st.HeldSlots()
			if held.IsEmpty() {
				t.Fatal("no state held; the test would prove nothing")
			}
			data, err := st.SnapshotSlots(slots.All())
			if err != nil {
				t.Fatal(err)
			}
			before, _ := op.Snapshot()

			if err := st.RestoreSlots(data); !errors.Is(err, ErrSlotConflict) {
				t.Fatalf("restoring held slots: %v, want ErrSlotConflict", err)
			}
			other := mustNew(t, sc.def, sc.inputs...)
			if err := other.Advance(-12345, Collect()); err != nil {
				t.Fatal(err)
			}
			ost, _ := SlotStateOf(other)
			if err := ost.RestoreSlots(data); !errors.Is(err, ErrWatermarkMismatch) {
				t.Fatalf("restoring at another watermark: %v, want ErrWatermarkMismatch", err)
			}
			if err := ost.RestoreSlots(before); !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("RestoreSlots of a whole snapshot: %v, want ErrBadSnapshot", err)
			}
			if err := other.Restore(data); !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("Restore of a slot snapshot: %v, want ErrBadSnapshot", err)
			}
			for n := range len(data) {
				fresh := mustNew(t, sc.def, sc.inputs...)
				fst, _ := SlotStateOf(fresh)
				if err := fst.RestoreSlots(data[:n]); !errors.Is(err, ErrBadSnapshot) {
					t.Fatalf("restore of %d/%d bytes: %v, want ErrBadSnapshot", n, len(data), err)
				}
				if !fst.HeldSlots().IsEmpty() {
					t.Fatalf("a refused restore of %d bytes left state behind", n)
				}
			}
			var first int
			for first = range held.Slots() {
				break
			}
			st.DropSlots(slots.All().Minus(slots.Of(first)))
			if after, _ := op.Snapshot(); len(after) >= len(before) {
				t.Fatalf("dropping slots did not shrink the state")
			}
			if after := st.HeldSlots(); after != slots.Of(first) {
				t.Fatalf("after dropping all but slot %d, holds %s", first, after)
			}
		})
	}
}

func TestNonKeyedStateIsWholeOnly(t *testing.T) {
	for _, sc := range snapshotCases() {
		if sc.def.Type == "join" || (sc.def.Type == "aggregate" && len(sc.def.GroupBy) > 0) {
			continue
		}
		if _, ok := SlotStateOf(mustNew(t, sc.def, sc.inputs...)); ok {
			t.Errorf("%s: has slot state, want whole-only", sc.name)
		}
	}
	global := mustNew(t, aggDef("7ns", "", nil, "n=count()"), connSchema).(*aggregate)
	if _, err := global.SnapshotSlots(slots.All()); !errors.Is(err, ErrNotKeyed) {
		t.Fatalf("global aggregate SnapshotSlots: %v, want ErrNotKeyed", err)
	}
}

// sortedRows is rows in sorted order: partitions emit a window's rows in
// different interleavings, the same rows.
func sortedRows(ts []tuple.Tuple) []string {
	r := rows(ts)
	slices.Sort(r)
	return r
}

// TestSlotIndexAddFrom: lists carved from a restore's room hold the same
// keys as lists built by add, a slot with several keys too, and a key
// added after the room is used up still lands in its slot.
func TestSlotIndexAddFrom(t *testing.T) {
	adds := []struct {
		slot int
		key  string
	}{{7, "a"}, {9, "b"}, {7, "c"}, {4095, "d"}, {9, "e"}}
	want, got := slotIndex{}, slotIndex{}
	room := make([]string, 3)
	for _, a := range adds {
		want.add(a.slot, a.key)
		got.addFrom(a.slot, a.key, &room)
	}
	got.addFrom(12, "f", &room) // the room is used up
	want.add(12, "f")
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("index = %v, want %v", got, want)
	}
}
