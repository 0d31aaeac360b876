package operator

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// docSchema puts the split field between two forwarded fields, so the tests
// see that forwarded fields keep their order and kinds around the gap.
var docSchema = tuple.NewSchema([]tuple.Field{
	{Name: "id", Kind: tuple.KindInt},
	{Name: "line", Kind: tuple.KindString},
	{Name: "time", Kind: tuple.KindTimestamp},
})

func doc(stime, id int64, line string) *tuple.Tuple {
	return &tuple.Tuple{
		Type:   tuple.Stable,
		STime:  stime,
		Values: []tuple.Value{tuple.Int(id), tuple.Str(line), tuple.Timestamp(stime)},
	}
}

func TestSplit(t *testing.T) {
	cases := []struct {
		name  string
		def   queryspec.Operator
		input []event
		want  []string
	}{
		{
			name:  "single spaces",
			def:   queryspec.Operator{Field: "line", As: "w"},
			input: []event{in(0, doc(5, 1, "the quick fox"))},
			want:  []string{`STABLE@5[1 t5 "the"]`, `STABLE@5[1 t5 "quick"]`, `STABLE@5[1 t5 "fox"]`},
		},
		{
			name:  "runs of ascii space, leading and trailing",
			def:   queryspec.Operator{Field: "line"},
			input: []event{in(0, doc(1, 2, " \t a\n\nb\v\fc\r  "))},
			want:  []string{`STABLE@1[2 t1 "a"]`, `STABLE@1[2 t1 "b"]`, `STABLE@1[2 t1 "c"]`},
		},
		{
			name:  "unicode space separates, other unicode does not",
			def:   queryspec.Operator{Field: "line"},
			input: []event{in(0, doc(1, 3, "naïve\u00a0café\u3000日本\u2003x\u0085y\u200bz"))},
			want:  []string{`STABLE@1[3 t1 "naïve"]`, `STABLE@1[3 t1 "café"]`, `STABLE@1[3 t1 "日本"]`, `STABLE@1[3 t1 "x"]`, `STABLE@1[3 t1 "y\u200bz"]`},
		},
		{
			name:  "invalid utf-8 is part of a token",
			def:   queryspec.Operator{Field: "line"},
			input: []event{in(0, doc(1, 4, "a\xff b\xc3"))},
			want:  []string{`STABLE@1[4 t1 "a\xff"]`, `STABLE@1[4 t1 "b\xc3"]`},
		},
		{
			name:  "empty and all-space strings emit nothing",
			def:   queryspec.Operator{Field: "line"},
			input: []event{in(0, doc(1, 5, "")), in(0, doc(2, 6, " \t\u00a0\n")), in(0, doc(3, 7, "x"))},
			want:  []string{`STABLE@3[7 t3 "x"]`},
		},
		{
			name:  "lower",
			def:   queryspec.Operator{Field: "line", Lower: true},
			input: []event{in(0, doc(1, 8, "The QUICK  Ünïcode fox")), in(0, doc(2, 9, "already lower"))},
			want: []string{`STABLE@1[8 t1 "the"]`, `STABLE@1[8 t1 "quick"]`, `STABLE@1[8 t1 "ünïcode"]`, `STABLE@1[8 t1 "fox"]`,
				`STABLE@2[9 t2 "already"]`, `STABLE@2[9 t2 "lower"]`},
		},
		{
			name:  "case kept without lower",
			def:   queryspec.Operator{Field: "line"},
			input: []event{in(0, doc(1, 8, "The FOX"))},
			want:  []string{`STABLE@1[8 t1 "The"]`, `STABLE@1[8 t1 "FOX"]`},
		},
		{
			name:  "tentative tuples stay tentative; advance emits nothing",
			def:   queryspec.Operator{Field: "line"},
			input: []event{in(0, tentative(doc(4, 1, "a b"))), adv(100), in(0, doc(100, 2, "c"))},
			want:  []string{`TENTATIVE@4[1 t4 "a"]`, `TENTATIVE@4[1 t4 "b"]`, `STABLE@100[2 t100 "c"]`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			def := tc.def
			def.Name, def.Type = "tok", "split"
			op := mustNew(t, &def, docSchema)
			as := def.As
			if as == "" {
				as = queryspec.DefaultSplitAs
			}
			if got, want := schemaString(op.OutputSchema()), "{id:int,time:timestamp,"+as+":string}"; got != want {
				t.Errorf("schema = %s, want %s", got, want)
			}
			equalRows(t, run(t, op, tc.input), tc.want)
		})
	}
}

// TestSplitMatchesStringsFields compares the tokeniser with strings.Fields
// (and lower with lowering each field) on random strings mixing ASCII and
// Unicode spaces, letters that change case, and invalid UTF-8.
func TestSplitMatchesStringsFields(t *testing.T) {
	pieces := []string{"a", "B", "xyz", " ", "  ", "\t", "\n", "\r", "\v", "\f", "\u00a0", "\u0085", "\u1680",
		"\u2000", "\u2028", "\u3000", "\u200b", "é", "Ü", "İ", "ß", "日本", "\xff", "\xc3", "\xe2\x80", "\x00"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var b strings.Builder
		for range r.IntN(12) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		checkTokens(t, b.String())
	}
}

func FuzzSplitTokens(f *testing.F) {
	for _, s := range []string{"", " ", "a b", " \tA\u00a0b\u3000C ", "\xff\xfe x", "İstanbul ÀÉ", "a\u0085b\u2029c"} {
		f.Add(s)
	}
	f.Fuzz(checkTokens)
}

func checkTokens(t *testing.T, s string) {
	for _, lower := range []bool{false, true} {
		op := mustNew(t, &queryspec.Operator{Name: "tok", Type: "split", Field: "line", Lower: lower}, docSchema)
		var got []string
		err := op.Process(0, doc(1, 1, s), EmitFunc(func(tp *tuple.Tuple) {
			got = append(got, tp.Values[2].S)
		}))
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Fields(s)
		if lower {
			for i := range want {
				want[i] = strings.ToLower(want[i])
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("split(%q, lower=%t) = %q, want %q", s, lower, got, want)
		}
	}
}

// TestSplitEmitterMayScribble: an emitter that overwrites the tuple it is
// given (the task assigns ids) does not change later tokens' tuples.
func TestSplitEmitterMayScribble(t *testing.T) {
	op := mustNew(t, &queryspec.Operator{Name: "tok", Type: "split", Field: "line"}, docSchema)
	c := Collect()
	scribble := EmitFunc(func(tp *tuple.Tuple) {
		c.Emit(tp)
		tp.ID, tp.Type, tp.STime = 99, tuple.Tentative, -1
		for i := range tp.Values {
			tp.Values[i] = tuple.Str("junk")
		}
	})
	src := doc(3, 7, "a b c")
	src.ID = 42
	if err := op.Process(0, src, scribble); err != nil {
		t.Fatal(err)
	}
	equalRows(t, c.Tuples, []string{`STABLE@3[7 t3 "a"]`, `STABLE@3[7 t3 "b"]`, `STABLE@3[7 t3 "c"]`})
	for _, tp := range c.Tuples {
		if tp.ID != 42 {
			t.Errorf("id = %d, want the input's 42", tp.ID)
		}
	}
}

// TestSplitDoesNotAllocate: tokens alias the input, so splitting allocates
// nothing; with lower, already lower-case ASCII costs nothing either.
func TestSplitDoesNotAllocate(t *testing.T) {
	for _, lower := range []bool{false, true} {
		op := mustNew(t, &queryspec.Operator{Name: "tok", Type: "split", Field: "line", Lower: lower}, docSchema)
		src := doc(1, 1, "the quick brown fox jumps over the lazy dog")
		var out discard
		allocs := testing.AllocsPerRun(100, func() {
			if err := op.Process(0, src, &out); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("lower=%t: %v allocations per tuple, want 0", lower, allocs)
		}
	}
}

func TestSplitNewErrors(t *testing.T) {
	cases := []struct {
		name     string
		def      queryspec.Operator
		inputs   []*tuple.Schema
		sentinel error
		mention  string
	}{
		{"no field", queryspec.Operator{}, []*tuple.Schema{docSchema}, ErrBadDefinition, "field is required"},
		{"unknown field", queryspec.Operator{Field: "text"}, []*tuple.Schema{docSchema}, ErrUnknownField, `field "text"`},
		{"int field", queryspec.Operator{Field: "id"}, []*tuple.Schema{docSchema}, ErrTypeMismatch, `"id" is int`},
		{"as collides", queryspec.Operator{Field: "line", As: "time"}, []*tuple.Schema{docSchema}, ErrBadDefinition, `as "time"`},
		{"two inputs", queryspec.Operator{Field: "line"}, []*tuple.Schema{docSchema, docSchema}, ErrBadDefinition, "want 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			def := tc.def
			def.Name, def.Type = "tok", "split"
			_, err := New(&def, tc.inputs)
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			if !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), `"tok" (split)`) {
				t.Errorf("error %q should name the operator and mention %q", err, tc.mention)
			}
		})
	}
}

// TestSplitSnapshotSignature: a split's snapshot only restores into a split
// of the same definition.
func TestSplitSnapshotSignature(t *testing.T) {
	base := &queryspec.Operator{Name: "tok", Type: "split", Field: "line"}
	snap, err := mustNew(t, base, docSchema).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := mustNew(t, base, docSchema).Restore(snap); err != nil {
		t.Fatalf("restore into the same definition: %v", err)
	}
	for _, other := range []*queryspec.Operator{
		{Name: "tok", Type: "split", Field: "line", Lower: true},
		{Name: "tok", Type: "split", Field: "line", As: "token"},
		{Name: "m", Type: "map", Fields: queryspec.Exprs{{Name: "line", Expr: "line"}}},
	} {
		if err := mustNew(t, other, docSchema).Restore(snap); !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("restore into %+v: err = %v, want ErrBadSnapshot", other, err)
		}
	}
}
