package operator

import (
	"errors"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

func TestFilter(t *testing.T) {
	input := []event{
		in(0, conn(1, "a", 22, 0.5, true)),
		in(0, conn(2, "b", 80, 1.5, false)),
		in(0, conn(2, "a", 443, 2.5, true)),
		in(0, tentative(conn(3, "c", 22, 0, false))),
		adv(10),
	}
	cases := []struct {
		name  string
		where string
		want  []string
	}{
		{"int compare", "port > 50", []string{
			`STABLE@2[t2 "b" 80 1.5 false]`, `STABLE@2[t2 "a" 443 2.5 true]`}},
		{"string equality", `src == "a"`, []string{
			`STABLE@1[t1 "a" 22 0.5 true]`, `STABLE@2[t2 "a" 443 2.5 true]`}},
		{"bool field", "ok", []string{
			`STABLE@1[t1 "a" 22 0.5 true]`, `STABLE@2[t2 "a" 443 2.5 true]`}},
		{"float and logic", "load >= 1.5 && !ok", []string{`STABLE@2[t2 "b" 80 1.5 false]`}},
		{"timestamp as int", "time == 3", []string{`TENTATIVE@3[t3 "c" 22 0 false]`}},
		{"membership", "port in [22, 80]", []string{
			`STABLE@1[t1 "a" 22 0.5 true]`, `STABLE@2[t2 "b" 80 1.5 false]`, `TENTATIVE@3[t3 "c" 22 0 false]`}},
		{"string functions", `src startsWith "b" or len(src) > 5`, []string{`STABLE@2[t2 "b" 80 1.5 false]`}},
		{"env access", `$env.port == 443`, []string{`STABLE@2[t2 "a" 443 2.5 true]`}},
		{"nothing passes", "false", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: tc.where}, connSchema)
			equalRows(t, run(t, op, input), tc.want)
			if op.OutputSchema() != connSchema {
				t.Errorf("output schema changed")
			}
		})
	}
}

// TestFilterReusedBuffers checks that the cached environment follows the
// tuple when the caller rewrites one tuple buffer in place.
func TestFilterReusedBuffers(t *testing.T) {
	op := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: `port == 7 && src == "x"`}, connSchema)
	c := Collect()
	buf := conn(0, "x", 7, 0, false)
	for i, p := range []int64{7, 8, 7, 7, 9} {
		buf.STime = int64(i)
		buf.Values[2] = tuple.Int(p)
		if i == 3 {
			buf.Values[1] = tuple.Str("y")
		}
		if err := op.Process(0, buf, c); err != nil {
			t.Fatal(err)
		}
	}
	equalRows(t, c.Tuples, []string{`STABLE@0[t0 "x" 7 0 false]`, `STABLE@2[t0 "x" 7 0 false]`})
}

func TestFilterNewErrors(t *testing.T) {
	cases := []struct {
		name     string
		where    string
		sentinel error
		mention  string
	}{
		{"unknown field", "nope > 1", ErrBadExpression, "unknown name nope"},
		{"wrong type", `port > "a"`, ErrBadExpression, "mismatched types"},
		{"non-bool where", "port + 1", ErrBadExpression, "expected bool"},
		{"syntax error", "port >", ErrBadExpression, "unexpected token"},
		{"nondeterministic now", "now() != nil", ErrBadExpression, "now"},
		{"empty where", "", ErrBadDefinition, "where is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(&queryspec.Operator{Name: "busy", Type: "filter", Where: tc.where}, []*tuple.Schema{connSchema})
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			if !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), `"busy"`) {
				t.Errorf("error %q should name the operator and mention %q", err, tc.mention)
			}
		})
	}
}

func TestProcessErrors(t *testing.T) {
	defs := []*queryspec.Operator{
		{Name: "f", Type: "filter", Where: "port > 1"},
		{Name: "m", Type: "map", Fields: queryspec.Exprs{{Name: "p", Expr: "port + 1"}}},
		{Name: "s", Type: "split", Field: "src"},
		{Name: "u", Type: "union", Inputs: []string{"a"}},
		{Name: "a", Type: "aggregate", Window: &queryspec.Window{Size: "10ns"}, Aggregates: queryspec.Exprs{{Name: "n", Expr: "sum(port)"}}},
	}
	wrongKind := conn(1, "a", 1, 0, true)
	wrongKind.Values[2] = tuple.Str("oops")
	cases := []struct {
		name     string
		port     int
		tup      *tuple.Tuple
		sentinel error
	}{
		{"bad port", 5, conn(1, "a", 1, 0, true), ErrBadPort},
		{"negative port", -1, conn(1, "a", 1, 0, true), ErrBadPort},
		{"boundary", 0, &tuple.Tuple{Type: tuple.Boundary, STime: 1}, ErrNotData},
		{"short tuple", 0, &tuple.Tuple{Type: tuple.Stable, Values: []tuple.Value{tuple.Int(1)}}, ErrTypeMismatch},
		{"kind mismatch", 0, wrongKind, ErrTypeMismatch},
	}
	for _, def := range defs {
		for _, tc := range cases {
			t.Run(def.Type+"/"+tc.name, func(t *testing.T) {
				op := mustNew(t, def, connSchema)
				if err := op.Process(tc.port, tc.tup, Collect()); !errors.Is(err, tc.sentinel) {
					t.Errorf("err = %v, want %v", err, tc.sentinel)
				}
			})
		}
	}
}

func TestFilterRuntimeError(t *testing.T) {
	op := mustNew(t, &queryspec.Operator{Name: "f", Type: "filter", Where: "port % (port - port) == 0"}, connSchema)
	if err := op.Process(0, conn(1, "a", 3, 0, true), Collect()); !errors.Is(err, ErrEval) {
		t.Fatalf("err = %v, want ErrEval", err)
	}
}

func TestNewErrors(t *testing.T) {
	cases := []struct {
		name     string
		def      *queryspec.Operator
		inputs   []*tuple.Schema
		sentinel error
	}{
		{"nil def", nil, []*tuple.Schema{connSchema}, ErrBadDefinition},
		{"unknown type", &queryspec.Operator{Name: "x", Type: "sort"}, []*tuple.Schema{connSchema}, ErrUnknownOperator},
		{"filter two inputs", &queryspec.Operator{Name: "x", Type: "filter", Where: "ok"}, []*tuple.Schema{connSchema, connSchema}, ErrBadDefinition},
		{"nil schema", &queryspec.Operator{Name: "x", Type: "filter", Where: "ok"}, []*tuple.Schema{nil}, ErrBadDefinition},
		{"join one input", &queryspec.Operator{Name: "x", Type: "join", On: []string{"src"}, Window: &queryspec.Window{Size: "1s"}}, []*tuple.Schema{connSchema}, ErrBadDefinition},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.def, tc.inputs); !errors.Is(err, tc.sentinel) {
				t.Errorf("err = %v, want %v", err, tc.sentinel)
			}
		})
	}
}
