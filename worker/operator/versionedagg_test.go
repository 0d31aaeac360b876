package operator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

var vaggSchema = tuple.NewSchema([]tuple.Field{{Name: "g", Kind: tuple.KindInt}, {Name: "n", Kind: tuple.KindInt}, {Name: "w", Kind: tuple.KindString}})

func vaggDef(aggs ...string) *queryspec.Operator {
	def := &queryspec.Operator{Name: "agg", Type: "aggregate", Window: &queryspec.Window{Size: "100ns"}, GroupBy: []string{"g"}}
	for i := 0; i < len(aggs); i += 2 {
		def.Aggregates = append(def.Aggregates, queryspec.NamedExpr{Name: aggs[i], Expr: aggs[i+1]})
	}
	return def
}

func vaggBuild(def *queryspec.Operator) func() (Operator, error) {
	return func() (Operator, error) { return New(def, []*tuple.Schema{vaggSchema}) }
}

// vaggEvent is a tuple (tag, stime, g, n, w) or, with adv set, a watermark.
type vaggEvent struct {
	adv        bool
	stime      int64
	tag        uint64
	g, n       int64
	w          string
	floor      uint64 // with adv: SetFloor(floor) before advancing
	addVersion int    // with adv: AddEpoch(addVersion) before advancing
}

// vaggStream: tuples in stime order over windows of 100, two epochs
// interleaved around a switch at stime 250 (old-epoch tuples still
// arriving after it, as from a slower upstream), a watermark every 50,
// the floor raised to 1 at 400.
func vaggStream(seed uint64) []vaggEvent {
	rng := rand.New(rand.NewPCG(seed, 7))
	var ev []vaggEvent
	for s := int64(0); s < 700; s++ {
		if s%50 == 0 && s > 0 {
			e := vaggEvent{adv: true, stime: s}
			if s == 400 {
				e.floor = 1
			}
			ev = append(ev, e)
		}
		if rng.IntN(3) != 0 {
			continue
		}
		tag := uint64(0)
		if s >= 250 && (s >= 400 || rng.IntN(2) == 0) {
			tag = 1
		}
		g := int64(rng.IntN(4))
		if s >= 250 && s < 300 && g == 3 {
			tag = 0 // group 3 of the window at the switch meets only old tuples
		}
		ev = append(ev, vaggEvent{stime: s, tag: tag, g: g, n: int64(rng.IntN(50)), w: fmt.Sprint("w", rng.IntN(5))})
	}
	return append(ev, vaggEvent{adv: true, stime: 1000})
}

// runVagg feeds the stream, adding epoch 1 (version 2, def2) when the
// stream reaches addAt, and returns the rows with their tags.
func runVagg(t *testing.T, v *VersionedAggregate, ev []vaggEvent, def2 *queryspec.Operator, addAt int64) []tuple.Tuple {
	t.Helper()
	var out []tuple.Tuple
	em := EmitFunc(func(tp *tuple.Tuple) {
		c := *tp
		c.Values = slices.Clone(tp.Values)
		out = append(out, c)
	})
	added := v.Latest() >= 1
	for _, e := range ev {
		if !added && e.stime >= addAt {
			if err := v.AddEpoch(2, vaggBuild(def2)); err != nil {
				t.Fatal(err)
			}
			added = true
		}
		if e.adv {
			if e.floor > 0 {
				v.SetFloor(e.floor)
			}
			if err := v.Advance(e.stime, em); err != nil {
				t.Fatal(err)
			}
			continue
		}
		tp := &tuple.Tuple{Type: tuple.Stable, STime: e.stime, Version: e.tag, Values: []tuple.Value{tuple.Int(e.g), tuple.Int(e.n), tuple.Str(e.w)}}
		if err := v.Process(0, tp, em); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func newVagg(t *testing.T, def *queryspec.Operator) *VersionedAggregate {
	t.Helper()
	op, err := vaggBuild(def)()
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVersionedAggregate("agg", op, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestVersionedAggregateSharedStateExact: version 2 renames, reorders
// and drops functions (no new state); upgraded mid-window, every
// window's totals equal those of one version run throughout.
func TestVersionedAggregateSharedStateExact(t *testing.T) {
	for _, slide := range []string{"", "25ns"} {
		t.Run("slide="+slide, func(t *testing.T) { testSharedStateExact(t, slide) })
	}
}

func testSharedStateExact(t *testing.T, slide string) {
	def1 := vaggDef("c", "count()", "s", "sum(n)", "hi", "max(n)")
	def2 := vaggDef("total", "sum(n)", "cnt", "count()")
	def1.Window.Slide, def2.Window.Slide = slide, slide
	ev := vaggStream(1)
	got := runVagg(t, newVagg(t, def1), ev, def2, 120)
	one := newVagg(t, def1)
	want := runVagg(t, one, ev, def1, 1<<62) // never upgraded
	if len(got) != len(want) {
		t.Fatalf("%d rows, one version gives %d", len(got), len(want))
	}
	tags := map[uint64]int{}
	for i := range got {
		g, w := got[i].Values, want[i].Values
		tags[got[i].Version]++
		switch got[i].Version {
		case 0: // version 1's shape
			if !slices.Equal(g, w) {
				t.Fatalf("row %d: %v, want %v", i, g, w)
			}
		case 1: // version 2: key, total, cnt, end
			if g[0] != w[0] || g[1] != w[2] || g[2] != w[1] || g[3] != w[4] {
				t.Fatalf("row %d: %v, one version gives %v", i, g, w)
			}
		}
	}
	if tags[0] == 0 || tags[1] == 0 {
		t.Fatalf("rows by tag %v: want both versions", tags)
	}
}

// TestVersionedAggregateMigration: version 2 adds max(n), avg(n) and
// count_distinct(w). Every row is checked against a reference computed
// from the stream by the documented rule: shared functions over every
// tuple; a window's rows from the version of its newest tag (at least the
// floor); added functions over the tuples tagged with the new epoch (0 or
// the zero value over none).
func TestVersionedAggregateMigration(t *testing.T) {
	def1 := vaggDef("c", "count()", "s", "sum(n)")
	def2 := vaggDef("s", "sum(n)", "hi", "max(n)", "c", "count()", "mean", "avg(n)", "words", "count_distinct(w)")
	ev := vaggStream(2)
	got := runVagg(t, newVagg(t, def1), ev, def2, 200)

	type ref struct {
		c, s, hi, newN, newSum int64
		words                  map[string]bool
	}
	type key struct{ end, g int64 }
	refs := map[key]*ref{}
	newest := map[int64]uint64{}
	floorAt := map[int64]uint64{} // window end -> floor when it closes
	floor := uint64(0)
	for _, e := range ev {
		if e.adv {
			floor = max(floor, e.floor)
			for end := range newest {
				if _, ok := floorAt[end]; !ok && end <= e.stime {
					floorAt[end] = floor
				}
			}
			continue
		}
		k := key{(e.stime/100 + 1) * 100, e.g}
		r := refs[k]
		if r == nil {
			r = &ref{words: map[string]bool{}}
			refs[k] = r
		}
		r.c++
		r.s += e.n
		newest[k.end] = max(newest[k.end], e.tag)
		if e.tag >= 1 {
			r.hi = max(r.hi, e.n)
			r.newN++
			r.newSum += e.n
			r.words[e.w] = true
		}
	}
	if len(got) != len(refs) {
		t.Fatalf("%d rows, want %d", len(got), len(refs))
	}
	emptyNew := 0
	for i, row := range got {
		vals := row.Values
		end := vals[len(vals)-1].I
		k := key{end, vals[0].I}
		r := refs[k]
		if r == nil {
			t.Fatalf("row %d %v: no such group", i, vals)
		}
		if wantTag := max(newest[end], floorAt[end]); row.Version != wantTag {
			t.Fatalf("row %d %v: tag %d, want %d", i, vals, row.Version, wantTag)
		}
		if row.Version == 0 {
			if len(vals) != 4 || vals[1].I != r.c || vals[2].I != r.s {
				t.Fatalf("row %d: %v, want version 1's c %d s %d", i, vals, r.c, r.s)
			}
			continue
		}
		mean := 0.0
		if r.newN > 0 {
			mean = float64(r.newSum) / float64(r.newN)
		} else {
			emptyNew++
		}
		want := []tuple.Value{tuple.Int(k.g), tuple.Int(r.s), tuple.Int(r.hi), tuple.Int(r.c), tuple.Float(mean), tuple.Int(int64(len(r.words))), tuple.Timestamp(end)}
		if !slices.Equal(vals, want) {
			t.Fatalf("row %d: %v, want %v", i, vals, want)
		}
	}
	if emptyNew == 0 {
		t.Fatal("no row of version 2 over a group its new functions saw no tuple of: the stream does not exercise the rule")
	}
}

// TestVersionedAggregateRefusesOtherState: a version with another window
// or group_by is refused (ErrNotMigratable) and nothing changes.
func TestVersionedAggregateRefusesOtherState(t *testing.T) {
	def1 := vaggDef("c", "count()")
	ev := vaggStream(3)
	want := runVagg(t, newVagg(t, def1), ev, nil, 1<<62)
	other := vaggDef("c", "count()")
	other.Window = &queryspec.Window{Size: "200ns"}
	regrouped := vaggDef("c", "count()")
	regrouped.GroupBy = []string{"w"}
	for name, def := range map[string]*queryspec.Operator{"window": other, "group_by": regrouped} {
		v := newVagg(t, def1)
		got := runVagg(t, v, ev[:len(ev)/2], nil, 1<<62)
		if err := v.AddEpoch(2, vaggBuild(def)); !errors.Is(err, ErrNotMigratable) {
			t.Fatalf("%s: %v, want ErrNotMigratable", name, err)
		}
		if v.Latest() != 0 || !slices.Equal(v.Versions(), []int{1}) {
			t.Fatalf("%s: latest %d versions %v after a refused version", name, v.Latest(), v.Versions())
		}
		got = append(got, runVagg(t, v, ev[len(ev)/2:], nil, 1<<62)...)
		if !slices.EqualFunc(got, want, func(a, b tuple.Tuple) bool { return slices.Equal(a.Values, b.Values) && a.Version == b.Version }) {
			t.Fatalf("%s: output changed after a refused version", name)
		}
	}
}

// TestVersionedAggregateReplicasAgree: replicas load a version at
// different moments (before the first tuple of its epoch), and a copy
// restored from a snapshot taken mid-stream continues; all produce the
// same rows, tags included.
func TestVersionedAggregateReplicasAgree(t *testing.T) {
	def1 := vaggDef("c", "count()", "s", "sum(n)")
	def2 := vaggDef("c", "count()", "hi", "max(n)", "words", "count_distinct(w)")
	ev := vaggStream(4)
	early := runVagg(t, newVagg(t, def1), ev, def2, 10)
	late := runVagg(t, newVagg(t, def1), ev, def2, 249)

	half := slices.IndexFunc(ev, func(e vaggEvent) bool { return e.stime >= 320 })
	a := newVagg(t, def1)
	first := runVagg(t, a, ev[:half], def2, 100)
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	b := newVagg(t, def1)
	if err := b.AddEpoch(2, vaggBuild(def2)); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	restored := append(first, runVagg(t, b, ev[half:], def2, 0)...)
	same := func(x, y []tuple.Tuple) bool {
		return slices.EqualFunc(x, y, func(a, b tuple.Tuple) bool { return slices.Equal(a.Values, b.Values) && a.Version == b.Version })
	}
	if !same(early, late) {
		t.Fatal("replicas loading version 2 at different moments disagree")
	}
	if !same(early, restored) {
		t.Fatal("a copy restored mid-stream disagrees with the original")
	}
	// A copy that did not load version 2 cannot take that state.
	if err := newVagg(t, def1).Restore(snap); err == nil {
		t.Fatal("a snapshot with version 2's columns restored into version 1 alone")
	}
}

// TestVersionedAggregateSlotState: an upgraded keyed aggregate still
// moves by slots (rescale): its shared state, every column, goes to a
// copy that loaded the same versions, which then emits what the original
// would.
func TestVersionedAggregateSlotState(t *testing.T) {
	def1 := vaggDef("c", "count()", "s", "sum(n)")
	def2 := vaggDef("c", "count()", "hi", "max(n)")
	ev := vaggStream(5)
	whole := runVagg(t, newVagg(t, def1), ev, def2, 100)

	half := slices.IndexFunc(ev, func(e vaggEvent) bool { return e.stime >= 600 })
	a := newVagg(t, def1)
	first := runVagg(t, a, ev[:half], def2, 100)
	ss, ok := SlotStateOf(a)
	if !ok {
		t.Fatal("an upgraded keyed aggregate has no slot state: it could not be rescaled")
	}
	data, err := ss.SnapshotSlots(ss.HeldSlots())
	if err != nil {
		t.Fatal(err)
	}
	b := newVagg(t, def1)
	if err := b.AddEpoch(2, vaggBuild(def2)); err != nil {
		t.Fatal(err)
	}
	b.SetFloor(1)
	bs, _ := SlotStateOf(b)
	if err := bs.RestoreSlots(data); err != nil {
		t.Fatal(err)
	}
	moved := append(first, runVagg(t, b, ev[half:], def2, 0)...)
	if !slices.EqualFunc(whole, moved, func(a, b tuple.Tuple) bool { return slices.Equal(a.Values, b.Values) && a.Version == b.Version }) {
		t.Fatal("the copy given the slots' state emits other rows than the original")
	}
}

// TestVersionedAggregateRestoresUnversioned: a copy that loaded a plan
// changing the aggregate restores a snapshot its original took before
// loading it (the unversioned aggregate), and continues exactly as a
// copy that loaded the plan at that point.
func TestVersionedAggregateRestoresUnversioned(t *testing.T) {
	def1 := vaggDef("c", "count()", "s", "sum(n)")
	def2 := vaggDef("c", "count()", "hi", "max(n)")
	ev := vaggStream(6)
	// Before the first tuple of epoch 1 (250), inside the window [200, 300).
	half := slices.IndexFunc(ev, func(e vaggEvent) bool { return e.stime >= 240 })
	want := runVagg(t, newVagg(t, def1), ev, def2, 240)

	plain := mustNew(t, def1, vaggSchema)
	var first []tuple.Tuple
	for _, e := range ev[:half] {
		em := EmitFunc(func(tp *tuple.Tuple) { c := *tp; c.Values = slices.Clone(tp.Values); first = append(first, c) })
		var err error
		if e.adv {
			err = plain.Advance(e.stime, em)
		} else {
			err = plain.Process(0, &tuple.Tuple{Type: tuple.Stable, STime: e.stime, Version: e.tag, Values: []tuple.Value{tuple.Int(e.g), tuple.Int(e.n), tuple.Str(e.w)}}, em)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	snap, err := plain.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	b := newVagg(t, def1)
	if err := b.AddEpoch(2, vaggBuild(def2)); err != nil {
		t.Fatal(err)
	}
	if err := b.Restore(snap); err != nil {
		t.Fatal(err)
	}
	got := append(first, runVagg(t, b, ev[half:], def2, 0)...)
	if !slices.EqualFunc(got, want, func(a, b tuple.Tuple) bool { return slices.Equal(a.Values, b.Values) && a.Version == b.Version }) {
		t.Fatal("restored from the unversioned snapshot, the copy emits other rows")
	}
}
