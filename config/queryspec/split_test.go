package queryspec

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// splitBase is a valid query with a split; the cases below break it.
const splitBase = `
name: q
sources:
  - {name: docs, schema: {id: int, line: string, n: float, raw: bytes}, ingest: true}
operators:
  - {name: tok, type: split, input: docs, field: line, as: word, lower: true, parallelism: 2}
sinks:
  - {name: out, input: tok}
`

func TestSplitSchemaAndPlan(t *testing.T) {
	cases := []struct {
		name  string
		edits []string // old, new pairs applied to splitBase
		want  []tuple.Field
		as    string
	}{
		{
			name: "explicit as",
			want: []tuple.Field{fld("id", tuple.KindInt), fld("n", tuple.KindFloat), fld("raw", tuple.KindBytes), fld("word", tuple.KindString)},
			as:   "word",
		},
		{
			name:  "default as",
			edits: []string{"as: word, ", ""},
			want:  []tuple.Field{fld("id", tuple.KindInt), fld("n", tuple.KindFloat), fld("raw", tuple.KindBytes), fld(DefaultSplitAs, tuple.KindString)},
			as:    DefaultSplitAs,
		},
		{
			name:  "as may reuse the split field's name",
			edits: []string{"as: word", "as: line"},
			want:  []tuple.Field{fld("id", tuple.KindInt), fld("n", tuple.KindFloat), fld("raw", tuple.KindBytes), fld("line", tuple.KindString)},
			as:    "line",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := strings.NewReplacer(c.edits...).Replace(splitBase)
			q, err := Parse("q.yaml", []byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			s, err := q.OutputSchema("tok")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s.Fields, c.want) {
				t.Errorf("schema %v, want %v", s.Fields, c.want)
			}
			p, err := q.Plan()
			if err != nil {
				t.Fatal(err)
			}
			n := p.Node("tok")
			if n.KeyFields != nil || n.Partitions != 2 || !reflect.DeepEqual(n.Inputs, []string{"docs"}) {
				t.Errorf("node keys %v partitions %d inputs %v; want unkeyed, 2, [docs]", n.KeyFields, n.Partitions, n.Inputs)
			}
			if n.Op.As != c.as || !n.Op.Lower {
				t.Errorf("as %q lower %v, want %q true", n.Op.As, n.Op.Lower, c.as)
			}
			// The canonical form spells the default out and survives a round trip.
			j, err := q.CanonicalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if want := `"field":"line","as":"` + c.as + `","lower":true`; !strings.Contains(string(j), want) {
				t.Errorf("canonical JSON lacks %s:\n%s", want, j)
			}
			q2, err := FromJSON(j)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(q2.Operators[0], q.Operators[0]) {
				t.Errorf("round trip: %+v, want %+v", q2.Operators[0], q.Operators[0])
			}
		})
	}
}

func TestSplitValidationErrors(t *testing.T) {
	cases := []struct {
		name  string
		edits []string // old, new pairs applied to splitBase
		want  []string
	}{
		{"missing field", []string{"field: line, ", ""},
			[]string{"q.yaml: line 6: operators[0] (tok).field: required: the string field to split"}},
		{"unknown field", []string{"field: line", "field: text"},
			[]string{`q.yaml: line 6: operators[0] (tok).field: unknown field "text" (input docs has: id, line, n, raw)`}},
		{"int field", []string{"field: line", "field: id"},
			[]string{`operators[0] (tok).field: field "id" is int; split needs a string`}},
		{"bytes field", []string{"field: line", "field: raw"},
			[]string{`operators[0] (tok).field: field "raw" is bytes; split needs a string`}},
		{"as collides", []string{"as: word", "as: id"},
			[]string{`q.yaml: line 6: operators[0] (tok).as: "id" is already a field of input docs`}},
		{"as invalid", []string{"as: word", "as: 2x"},
			[]string{`operators[0] (tok).as: "2x" is not a valid field name`}},
		{"as reserved", []string{"as: word", "as: in"},
			[]string{`operators[0] (tok).as: "in" is a reserved word`}},
		{"missing input", []string{"input: docs, ", ""},
			[]string{"operators[0] (tok).input: required"}},
		{"field of another type", []string{"lower: true", "lower: true, where: \"true\""},
			[]string{"operators[0] (tok).where: not used by a split operator (it takes input, field, as, lower)"}},
		{"split fields on a filter", []string{
			"type: split, input: docs, field: line, as: word, lower: true, parallelism: 2",
			`type: filter, input: docs, where: "id > 1", field: line, lower: true`},
			[]string{"operators[0] (tok).field: not used by a filter operator", "operators[0] (tok).lower: not used by a filter operator"}},
		{"lower not bool", []string{"lower: true", "lower: yes please"},
			[]string{"q.yaml: line 6:", "yes please"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := splitBase
			for i := 0; i < len(c.edits); i += 2 {
				if !strings.Contains(doc, c.edits[i]) {
					t.Fatalf("bad test: %q not in splitBase", c.edits[i])
				}
				doc = strings.Replace(doc, c.edits[i], c.edits[i+1], 1)
			}
			_, err := Parse("q.yaml", []byte(doc))
			if err == nil {
				t.Fatalf("Parse succeeded, want errors %q", c.want)
			}
			if !errors.Is(err, ErrInvalidQuery) && !errors.Is(err, ErrSyntax) {
				t.Errorf("error does not wrap ErrInvalidQuery or ErrSyntax: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}
