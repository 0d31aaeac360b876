package queryspec

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fedstream/fedstream/worker/tuple"
)

func readExample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readExampleFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func exampleFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("examples: %v (found %d)", err, len(files))
	}
	return files
}

func TestExamplesParse(t *testing.T) {
	for _, f := range exampleFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			q, err := Parse(filepath.Base(f), b)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if _, err := q.Plan(); err != nil {
				t.Fatalf("Plan: %v", err)
			}
		})
	}
}

// base is a valid query that the bad-input cases below break one way each.
const base = `
name: q
sources:
  - name: conns
    schema: {time: timestamp, src: string, dst: string, port: int}
    generator: {kind: netmon, monitors: 3, rate: 5000, seed: 7}
operators:
  - name: per_src
    type: aggregate
    input: conns
    window: {size: 60s}
    group_by: [src]
    aggregates: {conns: "count()", ports: "count_distinct(port)"}
  - {name: busy, type: filter, input: per_src, where: "conns > 100"}
sinks:
  - {name: alerts, input: busy}
`

func TestBaseIsValid(t *testing.T) {
	if _, err := Parse("q.yaml", []byte(base)); err != nil {
		t.Fatal(err)
	}
}

func TestValidationErrors(t *testing.T) {
	type edit struct{ old, new string }
	cases := []struct {
		name  string
		yaml  string // full document; empty means base with edits applied
		edits []edit
		want  []string // substrings the error must contain
	}{
		{name: "missing name", edits: []edit{{"name: q\n", ""}}, want: []string{"q.yaml: name: required"}},
		{name: "bad name", edits: []edit{{"name: q\n", "name: My Query\n"}}, want: []string{"line 2: name:", `"My Query" is not a valid name`}},
		{name: "replicas too many", edits: []edit{{"name: q\n", "name: q\nreplicas: 6\n"}}, want: []string{"line 3: replicas: 6 is out of range (want 1..5)"}},
		{name: "replicas negative", edits: []edit{{"name: q\n", "name: q\nreplicas: -1\n"}}, want: []string{"replicas: -1 is out of range"}},
		{name: "bad max_delay", edits: []edit{{"name: q\n", "name: q\navailability: {max_delay: soon}\n"}}, want: []string{"availability.max_delay:", `"soon" is not a duration`}},
		{name: "slo without a rate", edits: []edit{{"name: q\n", "name: q\nslo: {throughput: 0}\n"}}, want: []string{"slo.throughput: 0: want a positive rate"}},
		{name: "bad operator cost", edits: []edit{{"where: \"conns > 100\"", "where: \"conns > 100\", cost: 1s"}}, want: []string{"operators[1] (busy).cost: \"1s\" is not a duration in 0..100ms"}},
		{name: "negative max_delay", edits: []edit{{"name: q\n", "name: q\navailability: {max_delay: -1s}\n"}}, want: []string{"availability.max_delay:", "negative"}},
		{name: "unknown top field", edits: []edit{{"name: q\n", "name: q\nreplica: 2\n"}}, want: []string{"q.yaml: line 3: replica: unknown field \"replica\"", "want one of:", "replicas"}},
		{name: "unknown operator field", edits: []edit{{"where: \"conns > 100\"", "wher: \"conns > 100\""}}, want: []string{"line 14: operators[1] (busy).wher: unknown field \"wher\""}},
		{name: "unknown type", edits: []edit{{"port: int}", "port: integr}"}}, want: []string{"q.yaml: line 5: sources[0] (conns).schema.port: unknown type \"integr\" (want int, float, string, bool, timestamp, bytes)"}},
		{name: "schema mismatch generator", edits: []edit{{"port: int}", "port: string}"}}, want: []string{"sources[0] (conns).schema: does not match the netmon generator's schema"}},
		{name: "both generator and ingest", edits: []edit{{"rate: 5000, seed: 7}", "rate: 5000, seed: 7}\n    ingest: true"}}, want: []string{"sources[0] (conns): set exactly one of generator, ingest and kafka"}},
		{name: "neither generator nor ingest", edits: []edit{{"    generator: {kind: netmon, monitors: 3, rate: 5000, seed: 7}\n", ""}}, want: []string{"sources[0] (conns): set exactly one of"}},
		{name: "unknown generator", edits: []edit{{"kind: netmon", "kind: netmonx"}}, want: []string{"sources[0] (conns).generator.kind: unknown generator kind \"netmonx\""}},
		{name: "negative rate", edits: []edit{{"rate: 5000", "rate: -5"}}, want: []string{"generator.rate: -5 is negative"}},
		{name: "too many monitors", edits: []edit{{"monitors: 3", "monitors: 65"}}, want: []string{"generator.monitors: 65 is out of range"}},
		{name: "size on netmon", edits: []edit{{"monitors: 3", "monitors: 3, size: 10"}}, want: []string{"generator.size: only the blob generator has size"}},
		{name: "blob size too large", edits: []edit{{"kind: netmon, monitors: 3", "kind: blob, size: 65537"}, {"{time: timestamp, src: string, dst: string, port: int}", "{seq: int, payload: string}"}}, want: []string{"generator.size: 65537 is out of range (want 1..65536"}},
		{name: "blob size negative", edits: []edit{{"kind: netmon, monitors: 3", "kind: blob, size: -1"}, {"{time: timestamp, src: string, dst: string, port: int}", "{seq: int, payload: string}"}}, want: []string{"generator.size: -1 is out of range"}},
		{name: "bad start", edits: []edit{{"seed: 7}", "seed: 7, start: yesterday}"}}, want: []string{"generator.start:", "RFC 3339"}},
		{name: "duplicate node name", edits: []edit{{"name: busy", "name: conns"}}, want: []string{"operators[1] (conns).name: duplicate node name \"conns\" (also sources[0] (conns))"}},
		{name: "unknown input", edits: []edit{{"input: per_src, where", "input: per_sr, where"}}, want: []string{"operators[1] (busy).input: unknown node \"per_sr\" (have: conns, per_src, busy)"}},
		{name: "input is sink", edits: []edit{{"input: per_src, where", "input: alerts, where"}}, want: []string{"operators[1] (busy).input: \"alerts\" is a sink"}},
		{name: "unknown field in where", edits: []edit{{"conns > 100", "conn > 100"}}, want: []string{"q.yaml: line 14: operators[1] (busy).where: unknown field \"conn\" (input per_src has: src, conns, ports, window_end)"}},
		{name: "where not bool", edits: []edit{{"conns > 100", "conns + 1"}}, want: []string{"operators[1] (busy).where:", "bool"}},
		{name: "where uses now", edits: []edit{{"conns > 100", "now() > 0"}}, want: []string{"operators[1] (busy).where: now() is not available"}},
		{name: "where syntax", edits: []edit{{"conns > 100", "conns >"}}, want: []string{"operators[1] (busy).where:"}},
		{name: "unknown operator type", edits: []edit{{"type: filter", "type: filtre"}}, want: []string{"operators[1] (busy).type: unknown operator type \"filtre\""}},
		{name: "field not for type", edits: []edit{{"where: \"conns > 100\"}", "where: \"conns > 100\", group_by: [src]}"}}, want: []string{"operators[1] (busy).group_by: not used by a filter operator"}},
		{name: "missing window", edits: []edit{{"    window: {size: 60s}\n", ""}}, want: []string{"operators[0] (per_src).window: required"}},
		{name: "bad window size", edits: []edit{{"size: 60s", "size: 1 minute"}}, want: []string{"operators[0] (per_src).window.size: \"1 minute\" is not a duration"}},
		{name: "slide larger than size", edits: []edit{{"size: 60s", "size: 60s, slide: 90s"}}, want: []string{"window.slide: 90s is larger than the window size 60s"}},
		{name: "slide not dividing", edits: []edit{{"size: 60s", "size: 60s, slide: 7s"}}, want: []string{"window.slide: 7s does not divide the window size 60s"}},
		{name: "unknown group_by", edits: []edit{{"group_by: [src]", "group_by: [source]"}}, want: []string{"operators[0] (per_src).group_by[0]: unknown field \"source\" (input conns has: time, src, dst, port)"}},
		{name: "sum of string", edits: []edit{{`ports: "count_distinct(port)"`, `ports: "sum(dst)"`}}, want: []string{"operators[0] (per_src).aggregates.ports:", "needs int or float"}},
		{name: "unknown aggregate fn", edits: []edit{{`ports: "count_distinct(port)"`, `ports: "median(port)"`}}, want: []string{"aggregates.ports: unknown aggregate function \"median\""}},
		{name: "aggregate unknown field", edits: []edit{{`ports: "count_distinct(port)"`, `ports: "avg(prot)"`}}, want: []string{"aggregates.ports: avg(prot): unknown field \"prot\""}},
		{name: "parallelism too high", edits: []edit{{"group_by: [src]", "group_by: [src]\n    parallelism: 65"}}, want: []string{"operators[0] (per_src).parallelism: 65 is out of range (want 1..64)"}},
		{name: "ungrouped partitioned aggregate", edits: []edit{{"group_by: [src]", "parallelism: 2"}}, want: []string{"operators[0] (per_src).parallelism:", "without group_by"}},
		{name: "unused operator", edits: []edit{{"input: busy}", "input: per_src}"}}, want: []string{"operators[1] (busy): output of \"busy\" is not used"}},
		{name: "no sinks", edits: []edit{{"sinks:\n  - {name: alerts, input: busy}\n", ""}}, want: []string{"sinks: required"}},
		{name: "sink without input", edits: []edit{{"{name: alerts, input: busy}", "{name: alerts}"}}, want: []string{"sinks[0] (alerts).input: required"}},
		{name: "bad schema field name", edits: []edit{{"dst: string", "2dst: string"}}, want: []string{"schema.2dst: \"2dst\" is not a valid field name"}},
		{name: "cycle", yaml: `
name: q
sources:
  - {name: s, generator: {kind: words}}
operators:
  - {name: a, type: union, inputs: [s, b]}
  - {name: b, type: filter, input: a, where: "true"}
sinks:
  - {name: out, input: b}
`, want: []string{"operators[0] (a): the graph has a cycle: a -> b -> a"}},
		{name: "union schemas differ", yaml: `
name: q
sources:
  - {name: s, generator: {kind: words}}
  - {name: t, generator: {kind: vitals}}
operators:
  - {name: u, type: union, inputs: [s, t]}
sinks:
  - {name: out, input: u}
`, want: []string{"operators[0] (u).inputs[1]: schema of \"t\"", "identical schemas"}},
		{name: "union one input", yaml: `
name: q
sources:
  - {name: s, generator: {kind: words}}
operators:
  - {name: u, type: union, inputs: [s]}
sinks:
  - {name: out, input: u}
`, want: []string{"operators[0] (u).inputs: a union needs at least 2 inputs, got 1"}},
		{name: "join key type mismatch", yaml: `
name: q
sources:
  - {name: a, schema: {k: int, x: int}, ingest: true}
  - {name: b, schema: {k: string, y: int}, ingest: true}
operators:
  - {name: j, type: join, left: a, right: b, on: [k], window: {size: 10s}}
sinks:
  - {name: out, input: j}
`, want: []string{"operators[0] (j).on[0]: field \"k\" is int on the left (a) but string on the right (b)"}},
		{name: "join missing key and sliding", yaml: `
name: q
sources:
  - {name: a, schema: {k: int, x: int}, ingest: true}
  - {name: b, schema: {k: int, y: int}, ingest: true}
operators:
  - {name: j, type: join, left: a, right: b, on: [z], window: {size: 10s, slide: 5s}}
sinks:
  - {name: out, input: j}
`, want: []string{"operators[0] (j).on[0]: unknown field \"z\" on the left", "operators[0] (j).window.slide: join windows are tumbling"}},
		{name: "join where over an unknown field", yaml: `
name: q
sources:
  - {name: a, schema: {k: int, x: int}, ingest: true}
  - {name: b, schema: {k: int, y: int}, ingest: true}
operators:
  - {name: j, type: join, left: a, right: b, on: [k], window: {size: 10s}, where: "x > z"}
sinks:
  - {name: out, input: j}
`, want: []string{"operators[0] (j).where:"}},
		{name: "map expression type", yaml: `
name: q
sources:
  - {name: a, schema: {k: int, s: string}, ingest: true}
operators:
  - name: m
    type: map
    input: a
    fields:
      parts: split(s, ",")
sinks:
  - {name: out, input: m}
`, want: []string{"line 10: operators[0] (m).fields.parts:", "want one that yields int, float, string or bool"}},
		{name: "ingest parallelism", yaml: `
name: q
sources:
  - {name: a, schema: {k: int}, ingest: true, parallelism: 2}
sinks:
  - {name: out, input: a}
`, want: []string{"sources[0] (a).parallelism: ingest sources have one partition"}},
		{name: "ingest without schema", yaml: `
name: q
sources:
  - {name: a, ingest: true}
sinks:
  - {name: out, input: a}
`, want: []string{"sources[0] (a).schema: required"}},
		{name: "reserved field name", yaml: `
name: q
sources:
  - {name: a, schema: {in: int}, ingest: true}
sinks:
  - {name: out, input: a}
`, want: []string{"sources[0] (a).schema.in: \"in\" is a reserved word"}},
		{name: "wrong value shape", edits: []edit{{"seed: 7}", "seed: seven}"}}, want: []string{"q.yaml: line 6:", "seven"}},
		{name: "schema is a list of scalars", edits: []edit{{"schema: {time: timestamp, src: string, dst: string, port: int}", "schema: [time]"}}, want: []string{"q.yaml"}},
		{name: "malformed yaml", yaml: "name: q\nsources: [\n", want: []string{"q.yaml: line"}},
		{name: "tabs", yaml: "name: q\n\tsources: []\n", want: []string{"q.yaml: line 2"}},
		{name: "not a mapping", yaml: "- a\n- b\n", want: []string{"q.yaml: line 1: a query must be a mapping"}},
		{name: "empty", yaml: "# nothing here\n", want: []string{"q.yaml: empty document"}},
		{name: "two documents", yaml: base + "---\nname: other\n", want: []string{"more than one YAML document"}},
		{name: "duplicate key", edits: []edit{{"name: q\n", "name: q\nname: r\n"}}, want: []string{"q.yaml: line 3:", "already defined"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := c.yaml
			if doc == "" {
				doc = base
				for _, e := range c.edits {
					if !strings.Contains(doc, e.old) {
						t.Fatalf("bad test: %q not in base", e.old)
					}
					doc = strings.Replace(doc, e.old, e.new, 1)
				}
			}
			q, err := Parse("q.yaml", []byte(doc))
			if err == nil {
				t.Fatalf("Parse succeeded, want error containing %q\n%+v", c.want, q)
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

func TestAllProblemsReported(t *testing.T) {
	doc := strings.NewReplacer("replicas: 2", "replicas: 9", "conns > 100", "conn > 100", "ports > 10", "prts > 10").
		Replace(string(readExample(t, "netmon.yaml")))
	_, err := Parse("netmon.yaml", []byte(doc))
	if err == nil {
		t.Fatal("want errors")
	}
	for _, w := range []string{"replicas: 9 is out of range", `operators[1] (busy).where: unknown field "conn"`, `operators[2] (probing).where: unknown field "prts"`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 3 {
		t.Errorf("got %d problems, want 3:\n%v", n, err)
	}
}

func TestOrderPreserved(t *testing.T) {
	doc := `
name: order
sources:
  - name: s
    schema: {zeta: int, alpha: string, mid: float, beta: bool}
    ingest: true
operators:
  - name: m
    type: map
    input: s
    fields:
      z: zeta * 2
      a: alpha
      y: mid > 1.5
      b: beta
sinks:
  - {name: out, input: m}
`
	q, err := Parse("order.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range q.Sources[0].Schema {
		names = append(names, f.Name)
	}
	if got := strings.Join(names, ","); got != "zeta,alpha,mid,beta" {
		t.Errorf("schema order %s", got)
	}
	out, err := q.OutputSchema("m")
	if err != nil {
		t.Fatal(err)
	}
	want := []tuple.Field{fld("z", tuple.KindInt), fld("a", tuple.KindString), fld("y", tuple.KindBool), fld("b", tuple.KindBool)}
	if !reflect.DeepEqual(out.Fields, want) {
		t.Errorf("map output %v, want %v", out.Fields, want)
	}
	// YAML round trip keeps the mapping form and the order.
	y, err := yaml.Marshal(q)
	if err != nil {
		t.Fatal(err)
	}
	q2, err := Parse("again.yaml", y)
	if err != nil {
		t.Fatalf("re-parse of\n%s: %v", y, err)
	}
	if !reflect.DeepEqual(q2.Operators[0].Fields, q.Operators[0].Fields) || !reflect.DeepEqual(q2.Sources[0].Schema, q.Sources[0].Schema) {
		t.Errorf("YAML round trip changed order:\n%s", y)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	for _, f := range exampleFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, _ := os.ReadFile(f)
			q, err := Parse(f, b)
			if err != nil {
				t.Fatal(err)
			}
			j1, err := q.CanonicalJSON()
			if err != nil {
				t.Fatal(err)
			}
			q2, err := FromJSON(j1)
			if err != nil {
				t.Fatalf("FromJSON: %v\n%s", err, j1)
			}
			j2, err := q2.CanonicalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if string(j1) != string(j2) {
				t.Errorf("canonical JSON not stable:\n%s\n%s", j1, j2)
			}
			q.lines = nil
			if !reflect.DeepEqual(q, q2) {
				t.Errorf("round trip differs:\n%+v\n%+v", q, q2)
			}
			if !strings.Contains(string(j1), `"schema":[{"name":`) {
				t.Errorf("schema is not a JSON list: %s", j1)
			}
		})
	}
}

func TestFromJSONRejects(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"name":"q","bogus":1}`, `unknown field "bogus"`},
		{`{"name":"q"`, "query JSON"},
		{`{"name":"q","sources":[{"name":"s","schema":[{"name":"a","type":"nope"}],"ingest":true}],"sinks":[{"name":"o","input":"s"}]}`,
			`sources[0] (s).schema[0] (a): unknown type "nope"`},
		{`{"name":"q"} {}`, "trailing data"},
	} {
		_, err := FromJSON([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("FromJSON(%s) = %v, want %q", c.in, err, c.want)
		}
	}
}

func TestDefaults(t *testing.T) {
	doc := `
name: d
sources:
  - {name: w, generator: {kind: words}}
operators:
  - {name: f, type: filter, input: w, where: 'line != ""'}
sinks:
  - {name: out, input: f}
`
	q, err := Parse("d.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if q.Replicas != 1 || q.Availability.MaxDelay != "2s" || q.Operators[0].Parallelism != 1 || q.Sources[0].Parallelism != 1 {
		t.Errorf("defaults not applied: %+v", q)
	}
	if len(q.Sources[0].Schema) != 1 || q.Sources[0].Schema[0] != (Field{"line", "string"}) {
		t.Errorf("generator schema not filled in: %v", q.Sources[0].Schema)
	}
	if d, strict := q.MaxDelayDuration(); d != 2*time.Second || strict {
		t.Errorf("MaxDelayDuration = %v, %v", d, strict)
	}
}

func TestBlobDefaults(t *testing.T) {
	for _, c := range []struct {
		gen  string
		size int
	}{
		{"{kind: blob}", DefaultBlobSize},
		{"{kind: blob, size: 7}", 7},
		{"{kind: blob, size: 65536}", MaxBlobSize},
	} {
		doc := "name: b\nsources:\n  - {name: r, generator: " + c.gen + "}\nsinks:\n  - {name: out, input: r}\n"
		q, err := Parse("b.yaml", []byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", c.gen, err)
		}
		if got := q.Sources[0].Gen.Size; got != c.size {
			t.Errorf("%s: size %d, want %d", c.gen, got, c.size)
		}
		want := Schema{{"seq", "int"}, {"payload", "string"}}
		if !slices.Equal(q.Sources[0].Schema, want) {
			t.Errorf("%s: schema %v, want %v", c.gen, q.Sources[0].Schema, want)
		}
	}
}

func TestMaxDelayDuration(t *testing.T) {
	for _, c := range []struct {
		in     string
		d      time.Duration
		strict bool
	}{
		{"", 2 * time.Second, false},
		{"0", 0, false},
		{"0s", 0, false},
		{"500ms", 500 * time.Millisecond, false},
		{"strict", time.Duration(1<<63 - 1), true},
		{"garbage", 2 * time.Second, false},
	} {
		q := &Query{Availability: Availability{MaxDelay: c.in}}
		d, strict := q.MaxDelayDuration()
		if d != c.d || strict != c.strict {
			t.Errorf("%q: got %v %v, want %v %v", c.in, d, strict, c.d, c.strict)
		}
	}
}

func TestTypeAliasesCanonical(t *testing.T) {
	doc := `
name: alias
sources:
  - {name: s, schema: {a: integer, b: double, c: boolean, d: time}, ingest: true}
sinks:
  - {name: out, input: s}
`
	q, err := Parse("a.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := Schema{{"a", "int"}, {"b", "float"}, {"c", "bool"}, {"d", "timestamp"}}
	if !reflect.DeepEqual(q.Sources[0].Schema, want) {
		t.Errorf("got %v, want %v", q.Sources[0].Schema, want)
	}
}
