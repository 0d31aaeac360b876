package queryspec

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Expressions whose loops run over ranges known at compile time are
// refused at validation when they need more than the per-tuple budget;
// ranges that only bound a comparison (x in 1..n) and loops over data are
// accepted.
func TestStaticCostLimit(t *testing.T) {
	in := tuple.NewSchema([]tuple.Field{{Name: "x", Kind: tuple.KindInt}, {Name: "s", Kind: tuple.KindString}})
	cases := []struct {
		where string
		ok    bool
	}{
		{`x > 5`, true},
		{`x in 1..100000000`, true},
		{`all(1..1000, {# > 0}) && x > 1`, true},
		{`any(split(s, ","), {# == "a"})`, true},
		{`all(1..100000000, {# > x})`, false},
		{`any(1..1000, {any(1..1000, {# == x})})`, false},
		{`len(map(1..200000, {#})) > 0`, false},
	}
	for _, tc := range cases {
		_, err := CompileWhere(tc.where, in)
		if tc.ok && err != nil {
			t.Errorf("%s: refused: %v", tc.where, err)
		}
		if !tc.ok {
			if err == nil {
				t.Errorf("%s: accepted; want refused as over the cost budget", tc.where)
				continue
			}
			if !errors.Is(err, ErrInvalidExpression) || !strings.Contains(err.Error(), "cost units") {
				t.Errorf("%s: error %q does not explain the cost limit", tc.where, err)
			}
		}
	}
}

// The meter wraps predicate bodies without changing their static types: a
// map expression built on a predicate builtin keeps its field kind.
func TestMeterKeepsTypes(t *testing.T) {
	in := tuple.NewSchema([]tuple.Field{{Name: "x", Kind: tuple.KindInt}, {Name: "s", Kind: tuple.KindString}})
	for expr, want := range map[string]tuple.Kind{
		`sum(1..10, {# * x})`:                 tuple.KindInt,
		`count(split(s, ","), {# != ""})`:     tuple.KindInt,
		`reduce(1..3, #acc + s, "")`:          tuple.KindInvalid, // reduce yields any
		`len(filter(split(s, ","), {# > s}))`: tuple.KindInt,
	} {
		_, k, err := CompileExpr(expr, in)
		if want == tuple.KindInvalid {
			continue
		}
		if err != nil || k != want {
			t.Errorf("%s: kind %v, err %v; want %v", expr, k, err, want)
		}
	}
}

func TestReservedFieldPrefix(t *testing.T) {
	if err := checkFieldName("__fs_cost"); err == nil {
		t.Error("field __fs_cost accepted; the prefix is reserved")
	}
}

func TestTooManyOperators(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: wide\nsources:\n  - {name: s, generator: {kind: words, seed: 1}}\noperators:\n")
	prev := "s"
	for i := range MaxOperators + 1 {
		name := fmt.Sprintf("f%d", i)
		b.WriteString("  - {name: " + name + ", type: filter, input: " + prev + ", where: 'len(line) > 1'}\n")
		prev = name
	}
	b.WriteString("sinks:\n  - {name: out, input: " + prev + "}\n")
	_, err := Parse("wide.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "a query may have at most 100") {
		t.Fatalf("Parse = %v, want the operator limit", err)
	}
}
