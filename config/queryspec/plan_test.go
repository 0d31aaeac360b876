package queryspec

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

func TestPlanNetmon(t *testing.T) {
	q, err := Parse("netmon.yaml", readExample(t, "netmon.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := q.Plan()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, n := range p.Nodes {
		order = append(order, n.Name)
	}
	if got := strings.Join(order, " "); got != "conns per_src busy probing both alerts" {
		t.Errorf("topological order %q", got)
	}
	type want struct {
		kind       NodeKind
		inputs     []string
		outputs    []string
		partitions int
		keys       []string
	}
	for name, w := range map[string]want{
		"conns":   {KindSource, nil, []string{"per_src"}, 1, nil},
		"per_src": {KindOperator, []string{"conns"}, []string{"busy", "probing"}, 2, []string{"src"}},
		"busy":    {KindOperator, []string{"per_src"}, []string{"both"}, 1, nil},
		"both":    {KindOperator, []string{"busy", "probing"}, []string{"alerts"}, 1, []string{"src"}},
		"alerts":  {KindSink, []string{"both"}, nil, 1, nil},
	} {
		n := p.Node(name)
		if n == nil {
			t.Fatalf("no node %s", name)
		}
		got := want{n.Kind, n.Inputs, n.Outputs, n.Partitions, n.KeyFields}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s: got %+v, want %+v", name, got, w)
		}
		if (n.Kind == KindOperator) != (n.Op != nil) || (n.Kind == KindSource) != (n.Source != nil) || (n.Kind == KindSink) != (n.Sink != nil) {
			t.Errorf("%s: definition pointers do not match kind", name)
		}
	}
	if p.Node("nope") != nil {
		t.Error("Node(unknown) should be nil")
	}
	both := p.Node("both").Schema
	wantBoth := []tuple.Field{
		fld("src", tuple.KindString), fld("conns", tuple.KindInt), fld("ports", tuple.KindInt), fld("window_end", tuple.KindTimestamp),
		fld("right_conns", tuple.KindInt), fld("right_ports", tuple.KindInt), fld("right_window_end", tuple.KindTimestamp),
	}
	if !reflect.DeepEqual(both.Fields, wantBoth) {
		t.Errorf("join schema %v", both.Fields)
	}
	if p.Node("alerts").Schema != both {
		t.Error("sink schema should be its input's")
	}
}

func TestPlanTopoOrderFollowsEdgesNotDeclaration(t *testing.T) {
	doc := `
name: late
sources:
  - {name: s, schema: {k: int, v: float}, ingest: true, parallelism: 1}
operators:
  - {name: c, type: filter, input: b, where: "v > 0"}
  - {name: b, type: map, input: a, fields: {k: k, v: v * 2.0}}
  - {name: a, type: aggregate, input: s, window: {size: 10s, slide: 5s}, group_by: [k], aggregates: {v: sum(v)}, parallelism: 4}
sinks:
  - {name: out, input: c}
`
	q, err := Parse("late.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p, err := q.Plan()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, n := range p.Nodes {
		order = append(order, n.Name)
	}
	if got := strings.Join(order, " "); got != "s a b c out" {
		t.Errorf("order %q", got)
	}
	if n := p.Node("a"); n.Partitions != 4 || !reflect.DeepEqual(n.KeyFields, []string{"k"}) {
		t.Errorf("a: %+v", n)
	}
	wantA := []tuple.Field{fld("k", tuple.KindInt), fld("v", tuple.KindFloat), fld("window_end", tuple.KindTimestamp)}
	if !reflect.DeepEqual(p.Node("a").Schema.Fields, wantA) {
		t.Errorf("a schema %v", p.Node("a").Schema.Fields)
	}
}

func TestOutputSchemaAggregateKinds(t *testing.T) {
	doc := `
name: kinds
sources:
  - {name: s, schema: {g: string, i: int, f: float, ts: timestamp, name: string}, ingest: true}
operators:
  - name: agg
    type: aggregate
    input: s
    window: {size: 1m}
    group_by: [g]
    aggregates:
      n: count()
      si: sum(i)
      sf: sum(f)
      ai: avg(i)
      mi: min(i)
      mf: max(f)
      mt: max(ts)
      ms: min(name)
      d: count_distinct(name)
sinks:
  - {name: out, input: agg}
`
	q, err := Parse("k.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s, err := q.OutputSchema("agg")
	if err != nil {
		t.Fatal(err)
	}
	want := []tuple.Field{fld("g", tuple.KindString), fld("n", tuple.KindInt), fld("si", tuple.KindInt), fld("sf", tuple.KindFloat),
		fld("ai", tuple.KindFloat), fld("mi", tuple.KindInt), fld("mf", tuple.KindFloat), fld("mt", tuple.KindTimestamp),
		fld("ms", tuple.KindString), fld("d", tuple.KindInt), fld("window_end", tuple.KindTimestamp)}
	if !reflect.DeepEqual(s.Fields, want) {
		t.Errorf("got %v\nwant %v", s.Fields, want)
	}
	if _, err := q.OutputSchema("missing"); err == nil {
		t.Error("OutputSchema(missing) should fail")
	}
}

func TestTaskID(t *testing.T) {
	if got := TaskID("netmon", "per_src", 1, 0); got != "netmon/per_src/p1/r0" {
		t.Errorf("TaskID = %q", got)
	}
}

func TestSlotStable(t *testing.T) {
	// Golden values: Slot decides which partition owns a key's state, so its
	// output must never change across releases.
	cases := []struct {
		key  []tuple.Value
		slot int
	}{
		{[]tuple.Value{tuple.Str("10.0.0.1")}, -1},
		{[]tuple.Value{tuple.Int(42)}, -1},
		{[]tuple.Value{tuple.Str("a"), tuple.Int(1)}, -1},
		{[]tuple.Value{tuple.Float(1.5)}, -1},
		{nil, -1},
	}
	golden := goldenSlots
	for i, c := range cases {
		got := Slot(c.key)
		if got < 0 || got >= NumSlots {
			t.Fatalf("slot %d out of range", got)
		}
		if got != Slot(append([]tuple.Value(nil), c.key...)) {
			t.Errorf("case %d: not deterministic", i)
		}
		if got != golden[i] {
			t.Errorf("case %d: Slot = %d, golden %d", i, got, golden[i])
		}
	}
	if Slot([]tuple.Value{tuple.Int(1)}) == Slot([]tuple.Value{tuple.Timestamp(1)}) &&
		Slot([]tuple.Value{tuple.Int(2)}) == Slot([]tuple.Value{tuple.Timestamp(2)}) {
		t.Error("kind should be part of the key")
	}
	if Slot([]tuple.Value{tuple.Float(0)}) != Slot([]tuple.Value{tuple.Float(-1 * 0.0)}) {
		t.Error("+0 and -0 should share a slot")
	}
	if Slot([]tuple.Value{tuple.Str("ab"), tuple.Str("c")}) == Slot([]tuple.Value{tuple.Str("a"), tuple.Str("bc")}) {
		t.Error("string boundaries should matter")
	}
	// Spread: 40k distinct keys should touch nearly every slot.
	hit := make([]bool, NumSlots)
	for i := 0; i < 40000; i++ {
		hit[Slot([]tuple.Value{tuple.Int(int64(i))})] = true
	}
	n := 0
	for _, h := range hit {
		if h {
			n++
		}
	}
	if n < NumSlots*99/100 {
		t.Errorf("only %d of %d slots used", n, NumSlots)
	}
}

// goldenSlots were computed with hash/fnv (New64a) over the documented encoding.
var goldenSlots = []int{2098, 710, 2708, 2848, 805}

func TestPartitionOfSlot(t *testing.T) {
	for _, parts := range []int{1, 2, 3, 7, 64} {
		prev, counts := 0, make([]int, parts)
		for s := 0; s < NumSlots; s++ {
			p := PartitionOfSlot(s, parts)
			if p < prev || p >= parts {
				t.Fatalf("parts=%d slot=%d -> %d: ranges must be contiguous and in range", parts, s, p)
			}
			prev = p
			counts[p]++
		}
		for p, c := range counts {
			if c < NumSlots/parts-1 || c > NumSlots/parts+1 {
				t.Errorf("parts=%d: partition %d owns %d slots", parts, p, c)
			}
		}
	}
	if PartitionOfSlot(5, 0) != 0 {
		t.Error("partitions < 1 should map to 0")
	}
}

func BenchmarkSlot(b *testing.B) {
	key := []tuple.Value{tuple.Str("10.0.12.34"), tuple.Int(443)}
	b.ReportAllocs()
	for b.Loop() {
		Slot(key)
	}
}

func fld(name string, k tuple.Kind) tuple.Field { return tuple.Field{Name: name, Kind: k} }
