package operator

import (
	"errors"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/slots"
	"github.com/fedstream/fedstream/worker/tuple"
)

// stagedRun feeds a StagedAggregate over vaggSchema: version 1 (100ns
// windows, group_by g) for epoch 0, version 2 (200ns windows, no group)
// from epoch 1; tuples with stime below 400 are tagged 0, the others 1;
// a watermark every 50; the floor rises to 1 at 600. With snapAt > 0 the
// operator is snapshotted there and the run continues on a copy restored
// from it. It returns the rows.
func stagedRun(t *testing.T, snapAt int64) []tuple.Tuple {
	t.Helper()
	def1 := vaggDef("c", "count()", "s", "sum(n)")
	def2 := vaggDef("c", "count()", "s", "sum(n)")
	def2.Window, def2.GroupBy = &queryspec.Window{Size: "200ns"}, nil
	build := func() *StagedAggregate {
		op, err := vaggBuild(def1)()
		if err != nil {
			t.Fatal(err)
		}
		va, err := NewVersionedAggregate("agg", op, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := NewStagedAggregate(va)
		if err := s.AddEpoch(2, vaggBuild(def2)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := build()
	if s.Stages() != 2 || !slices.Equal(s.Versions(), []int{1, 2}) {
		t.Fatalf("%d stages, versions %v", s.Stages(), s.Versions())
	}
	var out []tuple.Tuple
	em := EmitFunc(func(tp *tuple.Tuple) {
		c := *tp
		c.Values = slices.Clone(tp.Values)
		out = append(out, c)
	})
	for st := int64(0); st < 1000; st++ {
		if st == snapAt {
			b, err := s.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			s = build()
			if err := s.Restore(b); err != nil {
				t.Fatal(err)
			}
		}
		if st%50 == 0 && st > 0 {
			if st == 600 {
				s.SetFloor(1)
			}
			if err := s.Advance(st, em); err != nil {
				t.Fatal(err)
			}
		}
		if st%3 != 0 {
			continue
		}
		tag := uint64(0)
		if st >= 400 {
			tag = 1
		}
		tp := tuple.Tuple{Type: tuple.Stable, STime: st, Version: tag, Values: []tuple.Value{tuple.Int(st % 2), tuple.Int(st % 7), tuple.Str("x")}}
		if err := s.Process(0, &tp, em); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Advance(2000, em); err != nil {
		t.Fatal(err)
	}
	if s.Stages() != 1 || !slices.Equal(s.Versions(), []int{2}) {
		t.Fatalf("after the floor passed the switch: %d stages, versions %v", s.Stages(), s.Versions())
	}
	return out
}

// TestStagedAggregateReshapes: a version with another window and
// group_by runs a state of its own. Tuples of epoch 0 (stime < 400) make
// the 100ns windows per group of version 1, tagged 0; those of epoch 1
// the 200ns windows of version 2 (one group), tagged 1; every count is
// exact, and a snapshot restored mid-run (while both stages run, and
// after the old one was dropped) gives the same rows.
func TestStagedAggregateReshapes(t *testing.T) {
	rows := stagedRun(t, 0)
	type key struct {
		tag      uint64
		end, g   int64
		hasGroup bool
	}
	want := map[key][2]int64{}
	for st := int64(0); st < 1000; st += 3 {
		k := key{end: (st/100 + 1) * 100, g: st % 2, hasGroup: true}
		if st >= 400 {
			k = key{tag: 1, end: (st/200 + 1) * 200}
		}
		w := want[k]
		want[k] = [2]int64{w[0] + 1, w[1] + st%7}
	}
	got := map[key][2]int64{}
	for _, r := range rows {
		var k key
		var c, s int64
		if len(r.Values) == 4 { // g, c, s, window_end
			k = key{tag: r.Version, end: r.Values[3].I, g: r.Values[0].I, hasGroup: true}
			c, s = r.Values[1].I, r.Values[2].I
		} else { // c, s, window_end
			k = key{tag: r.Version, end: r.Values[2].I}
			c, s = r.Values[0].I, r.Values[1].I
		}
		if _, dup := got[k]; dup {
			t.Fatalf("row %+v twice", k)
		}
		got[k] = [2]int64{c, s}
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for k, w := range want {
		if got[k] != w {
			t.Fatalf("row %+v: %v, want %v", k, got[k], w)
		}
	}
	for _, at := range []int64{450, 800} {
		if again := stagedRun(t, at); !slices.EqualFunc(again, rows, func(a, b tuple.Tuple) bool {
			return a.STime == b.STime && a.Version == b.Version && slices.Equal(a.Values, b.Values)
		}) {
			t.Fatalf("restored from a snapshot at %d: other rows", at)
		}
	}
}

// TestStagedAggregateRefusesAnotherInput: a version reading another input
// schema cannot share or start a state (ErrNotMigratable), and nothing
// changes.
func TestStagedAggregateRefusesAnotherInput(t *testing.T) {
	def := vaggDef("c", "count()")
	op, err := vaggBuild(def)()
	if err != nil {
		t.Fatal(err)
	}
	va, err := NewVersionedAggregate("agg", op, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStagedAggregate(va)
	other := tuple.NewSchema([]tuple.Field{{Name: "g", Kind: tuple.KindInt}, {Name: "n", Kind: tuple.KindFloat}})
	err = s.AddEpoch(2, func() (Operator, error) { return New(vaggDef("c", "count()"), []*tuple.Schema{other}) })
	if !errors.Is(err, ErrNotMigratable) || s.Latest() != 0 || s.Stages() != 1 {
		t.Fatalf("%v; latest %d, %d stages", err, s.Latest(), s.Stages())
	}
}

func TestAlignCut(t *testing.T) {
	for _, c := range []struct {
		cut    int64
		slides []int64
		want   int64
	}{
		{1234, nil, 1234},
		{1234, []int64{100, 400}, 1600},
		{1600, []int64{100, 400}, 1600},
		{-150, []int64{100}, -100},
		{10, []int64{6, 4}, 12},
	} {
		if got := AlignCut(c.cut, c.slides); got != c.want {
			t.Errorf("AlignCut(%d, %v) = %d, want %d", c.cut, c.slides, got, c.want)
		}
	}
}

// TestStagedAggregateSlotHandOver: while two window shapes run (a keyed
// aggregate whose window doubled), the state of half the slots moves to
// another copy (a rescale's hand-over, stage for stage); the rows of the
// two copies together are those of one copy that kept everything.
func TestStagedAggregateSlotHandOver(t *testing.T) {
	def1 := vaggDef("c", "count()", "s", "sum(n)")
	def2 := vaggDef("c", "count()", "s", "sum(n)")
	def2.Window = &queryspec.Window{Size: "200ns"}
	build := func() *StagedAggregate {
		op, err := vaggBuild(def1)()
		if err != nil {
			t.Fatal(err)
		}
		va, err := NewVersionedAggregate("agg", op, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := NewStagedAggregate(va)
		if err := s.AddEpoch(2, vaggBuild(def2)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	run := func(split bool) []string {
		a, b := build(), build()
		var out []string
		em := EmitFunc(func(tp *tuple.Tuple) { out = append(out, row(*tp)+"#"+string(rune('0'+tp.Version))) })
		moved := slots.Of(queryspec.Slot([]tuple.Value{tuple.Int(1)}))
		handed := false
		for st := int64(0); st < 1000; st++ {
			if st%50 == 0 && st > 0 {
				for _, x := range []*StagedAggregate{a, b} {
					if err := x.Advance(st, em); err != nil {
						t.Fatal(err)
					}
				}
				if split && st == 450 {
					// Both stages hold windows of the moved slot: the old
					// one [400, 500), the new one [400, 600).
					for i, stg := range a.stages {
						if !stg.va.st.HeldSlots().Contains(moved) {
							t.Fatalf("stage %d holds nothing of the moved slot", i)
						}
					}
					sa, _ := SlotStateOf(a)
					sb, _ := SlotStateOf(b)
					data, err := sa.SnapshotSlots(moved)
					if err != nil {
						t.Fatal(err)
					}
					if err := sb.RestoreSlots(data); err != nil {
						t.Fatal(err)
					}
					sa.DropSlots(moved)
					handed = true
				}
			}
			if st%3 != 0 {
				continue
			}
			tag := uint64(0)
			if st >= 480 || st >= 350 && st%2 == 0 {
				tag = 1
			}
			g := (st / 6) % 2
			tp := tuple.Tuple{Type: tuple.Stable, STime: st, Version: tag, Values: []tuple.Value{tuple.Int(g), tuple.Int(st % 7), tuple.Str("x")}}
			x := a
			if handed && g == 1 {
				x = b
			}
			if err := x.Process(0, &tp, em); err != nil {
				t.Fatal(err)
			}
		}
		for _, x := range []*StagedAggregate{a, b} {
			if err := x.Advance(2000, em); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(out)
		return out
	}
	one, two := run(false), run(true)
	if !slices.Equal(one, two) || len(one) == 0 {
		t.Fatalf("one copy:\n%v\ntwo copies after a hand-over:\n%v", one, two)
	}
}
