package operator

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

func TestMap(t *testing.T) {
	input := []event{
		in(0, conn(5, "a", 22, 0.5, true)),
		in(0, tentative(conn(6, "bb", 7, 2, false))),
		adv(100),
	}
	cases := []struct {
		name   string
		fields queryspec.Exprs
		schema string
		want   []string
	}{
		{
			name: "types follow expressions",
			fields: queryspec.Exprs{
				{Name: "next", Expr: "port + 1"},
				{Name: "half", Expr: "load / 2"},
				{Name: "tag", Expr: `src + ":" + string(port)`},
				{Name: "web", Expr: "port == 22 || port == 80"},
				{Name: "n", Expr: "len(src)"},
			},
			schema: "{next:int,half:float,tag:string,web:bool,n:int}",
			want: []string{
				`STABLE@5[23 0.25 "a:22" true 1]`,
				`TENTATIVE@6[8 1 "bb:7" false 2]`,
			},
		},
		{
			name:   "bare fields are copied, kinds as expressions see them",
			fields: queryspec.Exprs{{Name: "t", Expr: " time "}, {Name: "who", Expr: "src"}, {Name: "ok", Expr: "ok"}},
			schema: "{t:int,who:string,ok:bool}",
			want:   []string{`STABLE@5[5 "a" true]`, `TENTATIVE@6[6 "bb" false]`},
		},
		{
			name:   "conditional and float conversion",
			fields: queryspec.Exprs{{Name: "cls", Expr: `port < 1024 ? "system" : "user"`}, {Name: "f", Expr: "float(port)"}},
			schema: "{cls:string,f:float}",
			want:   []string{`STABLE@5["system" 22]`, `TENTATIVE@6["system" 7]`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op := mustNew(t, &queryspec.Operator{Name: "m", Type: "map", Fields: tc.fields}, connSchema)
			if got := schemaString(op.OutputSchema()); got != tc.schema {
				t.Errorf("schema = %s, want %s", got, tc.schema)
			}
			equalRows(t, run(t, op, input), tc.want)
		})
	}
}

func TestMapNewErrors(t *testing.T) {
	cases := []struct {
		name     string
		fields   queryspec.Exprs
		sentinel error
		mention  string
	}{
		{"unknown field", queryspec.Exprs{{Name: "x", Expr: "nope * 2"}}, ErrBadExpression, "unknown name nope"},
		{"wrong operand type", queryspec.Exprs{{Name: "x", Expr: "src - 1"}}, ErrBadExpression, "mismatched types"},
		{"untyped result", queryspec.Exprs{{Name: "x", Expr: `ok ? 1 : "one"`}}, ErrTypeMismatch, "want int, float, string or bool"},
		{"unsupported result", queryspec.Exprs{{Name: "x", Expr: "[port]"}}, ErrTypeMismatch, "want int, float, string or bool"},
		{"duplicate name", queryspec.Exprs{{Name: "x", Expr: "port"}, {Name: "x", Expr: "src"}}, ErrBadDefinition, "twice"},
		{"empty name", queryspec.Exprs{{Name: "", Expr: "port"}}, ErrBadDefinition, "no name"},
		{"no fields", nil, ErrBadDefinition, "fields is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(&queryspec.Operator{Name: "proj", Type: "map", Fields: tc.fields}, []*tuple.Schema{connSchema})
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q should mention %q", err, tc.mention)
			}
		})
	}
}

func TestUnion(t *testing.T) {
	def := &queryspec.Operator{Name: "u", Type: "union", Inputs: []string{"a", "b", "c"}}
	op := mustNew(t, def, connSchema, connSchema, connSchema)
	got := run(t, op, []event{
		in(2, conn(1, "c", 1, 0, true)),
		in(0, conn(2, "a", 2, 0, true)),
		in(1, tentative(conn(2, "b", 3, 0, true))),
		adv(5),
	})
	equalRows(t, got, []string{
		`STABLE@1[t1 "c" 1 0 true]`, `STABLE@2[t2 "a" 2 0 true]`, `TENTATIVE@2[t2 "b" 3 0 true]`,
	})
	if err := op.Process(3, conn(3, "a", 1, 0, true), Collect()); !errors.Is(err, ErrBadPort) {
		t.Errorf("port 3: err = %v, want ErrBadPort", err)
	}

	other := tuple.NewSchema([]tuple.Field{{Name: "time", Kind: tuple.KindTimestamp}})
	if _, err := New(&queryspec.Operator{Name: "u", Type: "union"}, []*tuple.Schema{connSchema, other}); !errors.Is(err, ErrTypeMismatch) {
		t.Errorf("different schemas: err = %v, want ErrTypeMismatch", err)
	}
	if _, err := New(def, []*tuple.Schema{connSchema}); !errors.Is(err, ErrBadDefinition) {
		t.Errorf("3 inputs, 1 schema: err = %v, want ErrBadDefinition", err)
	}
	if _, err := New(&queryspec.Operator{Name: "u", Type: "union"}, nil); !errors.Is(err, ErrBadDefinition) {
		t.Errorf("no schema: err = %v, want ErrBadDefinition", err)
	}
}

// TestMapKindMismatch: a value whose kind differs from the schema is
// rejected naming the field, both by a pure projection (which skips the
// expression environment) and by a map that also computes expressions.
func TestMapKindMismatch(t *testing.T) {
	cases := []struct {
		name   string
		fields queryspec.Exprs
		after  string // output for a good tuple after the bad one
	}{
		{"projection", queryspec.Exprs{{Name: "a", Expr: "time"}, {Name: "b", Expr: "port"}, {Name: "c", Expr: "port"}}, `STABLE@6[6 7 7]`},
		{"projection and expression", queryspec.Exprs{{Name: "a", Expr: "time"}, {Name: "b", Expr: "port"}, {Name: "c", Expr: "port + 1"}}, `STABLE@6[6 7 8]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op := mustNew(t, &queryspec.Operator{Name: "m", Type: "map", Fields: tc.fields}, connSchema)
			bad := conn(5, "a", 22, 0.5, true)
			bad.Values[2] = tuple.Str("22")
			err := op.Process(0, bad, Collect())
			if !errors.Is(err, ErrTypeMismatch) || !strings.Contains(err.Error(), `"port"`) {
				t.Fatalf("err = %v, want ErrTypeMismatch naming port", err)
			}
			// The operator still works after the rejected tuple.
			equalRows(t, run(t, op, []event{in(0, conn(6, "b", 7, 1, false))}), []string{tc.after})
		})
	}
}

// TestProjectionCopiesEveryValueField: the projection fast path copies a
// value field by field (see mapOp.project); every field of tuple.Value,
// including any added later, must reach the output. Each field of each
// input value is set (through reflection, so a new field is covered
// too) and the output must equal the input but for the kind.
func TestProjectionCopiesEveryValueField(t *testing.T) {
	op := mustNew(t, &queryspec.Operator{Name: "m", Type: "map", Fields: queryspec.Exprs{
		{Name: "a", Expr: "load"}, {Name: "b", Expr: "src"}, {Name: "c", Expr: "time"},
	}}, connSchema)
	in := conn(5, "a", 22, 0.5, true)
	for i := range in.Values {
		v := reflect.ValueOf(&in.Values[i]).Elem()
		for f := range v.NumField() {
			if v.Type().Field(f).Name == "Kind" {
				continue
			}
			switch fv := v.Field(f); fv.Kind() {
			case reflect.Int64:
				fv.SetInt(int64(100*i + f))
			case reflect.Float64:
				fv.SetFloat(float64(100*i+f) + 0.5)
			case reflect.String:
				fv.SetString(fmt.Sprintf("field %d of value %d", f, i))
			default:
				t.Fatalf("tuple.Value field %s has kind %s: extend this test and mapOp.project", v.Type().Field(f).Name, fv.Kind())
			}
		}
	}
	c := Collect()
	if err := op.Process(0, in, c); err != nil {
		t.Fatal(err)
	}
	if len(c.Tuples) != 1 {
		t.Fatalf("%d outputs, want 1", len(c.Tuples))
	}
	got := c.Tuples[0].Values
	for i, from := range []int{3, 1, 0} {
		want := in.Values[from]
		want.Kind = op.OutputSchema().Fields[i].Kind
		if got[i] != want {
			t.Errorf("output field %d = %+v, want %+v", i, got[i], want)
		}
	}
}
