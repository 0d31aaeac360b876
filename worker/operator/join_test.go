package operator

import (
	"errors"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Join inputs: left is busy sources, right is probing sources (the netmon
// example), each with a count and a shared "n" column name.
var (
	busySchema = tuple.NewSchema([]tuple.Field{
		{Name: "src", Kind: tuple.KindString}, {Name: "n", Kind: tuple.KindInt},
	})
	probeSchema = tuple.NewSchema([]tuple.Field{
		{Name: "src", Kind: tuple.KindString}, {Name: "n", Kind: tuple.KindInt}, {Name: "ports", Kind: tuple.KindInt},
	})
)

func busy(stime int64, src string, n int64) *tuple.Tuple {
	return &tuple.Tuple{Type: tuple.Stable, STime: stime, Values: []tuple.Value{tuple.Str(src), tuple.Int(n)}}
}

func probe(stime int64, src string, n, ports int64) *tuple.Tuple {
	return &tuple.Tuple{Type: tuple.Stable, STime: stime, Values: []tuple.Value{tuple.Str(src), tuple.Int(n), tuple.Int(ports)}}
}

func joinDef(size string, on ...string) *queryspec.Operator {
	return &queryspec.Operator{Name: "both", Type: "join", Left: "busy", Right: "probing", On: on, Window: &queryspec.Window{Size: size}}
}

func TestJoin(t *testing.T) {
	cases := []struct {
		name   string
		events []event
		want   []string
		late   uint64
	}{
		{
			name: "match within one window, emitted when the second arrives",
			events: []event{
				in(0, busy(1, "a", 10)),
				in(1, probe(3, "b", 1, 1)),
				in(1, probe(4, "a", 2, 20)),
				in(0, busy(9, "b", 11)),
			},
			want: []string{`STABLE@4["a" 10 2 20]`, `STABLE@9["b" 11 1 1]`},
		},
		{
			name: "no match across windows, boundary stime starts the next window",
			events: []event{
				in(0, busy(9, "a", 1)),
				in(1, probe(10, "a", 2, 2)), // window 1, left is in window 0
				in(0, busy(19, "a", 3)),     // matches the probe at 10
				in(1, probe(20, "a", 4, 4)), // window 2
			},
			want: []string{`STABLE@19["a" 3 2 2]`},
		},
		{
			name: "equal timestamps and many-to-many matches in arrival order",
			events: []event{
				in(0, busy(5, "a", 1)),
				in(0, busy(5, "a", 2)),
				in(1, probe(5, "a", 7, 7)),
				in(1, probe(5, "a", 8, 8)),
				in(0, busy(6, "a", 3)),
			},
			want: []string{
				`STABLE@5["a" 1 7 7]`, `STABLE@5["a" 2 7 7]`,
				`STABLE@5["a" 1 8 8]`, `STABLE@5["a" 2 8 8]`,
				`STABLE@6["a" 3 7 7]`, `STABLE@6["a" 3 8 8]`,
			},
		},
		{
			name: "tentative on either side makes the match tentative",
			events: []event{
				in(0, tentative(busy(1, "a", 1))),
				in(1, probe(2, "a", 2, 2)),
				in(0, busy(3, "b", 3)),
				in(1, tentative(probe(4, "b", 4, 4))),
				in(0, busy(5, "c", 5)),
				in(1, probe(6, "c", 6, 6)),
			},
			want: []string{`TENTATIVE@2["a" 1 2 2]`, `TENTATIVE@4["b" 3 4 4]`, `STABLE@6["c" 5 6 6]`},
		},
		{
			name: "advance drops ended windows, late tuples are counted",
			events: []event{
				in(0, busy(1, "a", 1)),
				adv(10),
				in(1, probe(5, "a", 2, 2)), // late
				in(1, probe(10, "a", 3, 3)),
				in(0, busy(12, "a", 4)),
			},
			want: []string{`STABLE@12["a" 4 3 3]`},
			late: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op := mustNew(t, joinDef("10ns", "src"), busySchema, probeSchema)
			if got, want := schemaString(op.OutputSchema()), "{src:string,n:int,right_n:int,ports:int}"; got != want {
				t.Errorf("schema = %s, want %s", got, want)
			}
			equalRows(t, run(t, op, tc.events), tc.want)
			if got := op.(LateCounter).LateTuples(); got != tc.late {
				t.Errorf("late = %d, want %d", got, tc.late)
			}
		})
	}
}

func TestJoinMultiKeyAndMemory(t *testing.T) {
	op := mustNew(t, joinDef("10ns", "src", "n"), busySchema, probeSchema)
	if got, want := schemaString(op.OutputSchema()), "{src:string,n:int,ports:int}"; got != want {
		t.Errorf("schema = %s, want %s", got, want)
	}
	got := run(t, op, []event{
		in(0, busy(1, "a", 1)),
		in(1, probe(2, "a", 2, 5)),
		in(1, probe(3, "a", 1, 6)),
	})
	equalRows(t, got, []string{`STABLE@3["a" 1 6]`})
	for i := range int64(50) {
		run(t, op, []event{in(0, busy(i*10, "a", 1)), adv(i*10 + 1)})
	}
	if n := len(op.(*join).windows); n != 1 {
		t.Errorf("join keeps %d windows after advancing, want 1", n)
	}
}

func TestJoinNewErrors(t *testing.T) {
	other := tuple.NewSchema([]tuple.Field{{Name: "src", Kind: tuple.KindInt}})
	clash := tuple.NewSchema([]tuple.Field{{Name: "src", Kind: tuple.KindString}, {Name: "right_n", Kind: tuple.KindInt}})
	cases := []struct {
		name        string
		def         *queryspec.Operator
		left, right *tuple.Schema
		sentinel    error
		mention     string
	}{
		{"no on", joinDef("1s"), busySchema, probeSchema, ErrBadDefinition, "on is required"},
		{"no window", &queryspec.Operator{Name: "j", Type: "join", On: []string{"src"}}, busySchema, probeSchema, ErrBadDefinition, "window.size"},
		{"sliding", &queryspec.Operator{Name: "j", Type: "join", On: []string{"src"}, Window: &queryspec.Window{Size: "10s", Slide: "5s"}}, busySchema, probeSchema, ErrBadDefinition, "tumbling"},
		{"key missing left", joinDef("1s", "ports"), busySchema, probeSchema, ErrUnknownField, "left"},
		{"key missing right", joinDef("1s", "src"), busySchema, tuple.NewSchema([]tuple.Field{{Name: "x", Kind: tuple.KindInt}}), ErrUnknownField, "right"},
		{"key kinds differ", joinDef("1s", "src"), busySchema, other, ErrTypeMismatch, "string on the left but int"},
		{"duplicate key", joinDef("1s", "src", "src"), busySchema, probeSchema, ErrBadDefinition, "twice"},
		{"renamed column clashes", joinDef("1s", "src"), tuple.NewSchema([]tuple.Field{{Name: "src", Kind: tuple.KindString}, {Name: "n", Kind: tuple.KindInt}, {Name: "right_n", Kind: tuple.KindInt}}), tuple.NewSchema([]tuple.Field{{Name: "src", Kind: tuple.KindString}, {Name: "n", Kind: tuple.KindInt}}), ErrBadDefinition, "already exists"},
		{"ok with clash-free right", joinDef("1s", "src"), busySchema, clash, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.def, []*tuple.Schema{tc.left, tc.right})
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			if err != nil && !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q should mention %q", err, tc.mention)
			}
		})
	}
}
