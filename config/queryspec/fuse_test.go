package queryspec

import (
	"reflect"
	"strings"
	"testing"
)

func TestFusedPlan(t *testing.T) {
	const y = `name: f
sources:
  - {name: lines, generator: {kind: words, seed: 1}}
  - {name: other, generator: {kind: words, seed: 2}}
operators:
  - {name: tok, type: split, input: lines, field: line, as: word}
  - {name: long, type: filter, input: tok, where: "len(word) > 3"}
  - {name: counts, type: aggregate, input: long, window: {size: 1s}, group_by: [word], aggregates: {n: "count()"}, parallelism: 2}
  - {name: big, type: filter, input: counts, where: "n > 1", parallelism: 2}
  - {name: up, type: map, input: big, fields: {word: "upper(word)", n: "n"}}
  - {name: o1, type: filter, input: other, where: "true"}
  - {name: o2, type: filter, input: other, where: "false"}
sinks:
  - {name: out, input: up}
  - {name: out1, input: o1}
  - {name: out2, input: o2}
`
	q, err := Parse("f.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	p, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	type frag struct {
		members, inputs, outputs string
		partitions               int
	}
	got := map[string]frag{}
	for _, n := range p.Nodes {
		got[n.Name] = frag{strings.Join(n.Members, ","), strings.Join(n.Inputs, ","), strings.Join(n.Outputs, ","), n.Partitions}
		if len(n.Chain) != len(n.Members)-1 || len(n.ChainInputs) != len(n.Chain) {
			t.Errorf("%s: chain %d, chain inputs %d, members %v", n.Name, len(n.Chain), len(n.ChainInputs), n.Members)
		}
	}
	want := map[string]frag{
		// split and filter run in the source's fragment.
		"lines": {"lines,tok,long", "", "counts", 1},
		// a filter with the aggregate's parallelism joins it; the map with
		// parallelism 1 does not.
		"counts": {"counts,big", "lines", "up", 2},
		"up":     {"up", "counts", "out", 1},
		// other feeds two operators: neither is fused.
		"other": {"other", "", "o1,o2", 1},
		"o1":    {"o1", "other", "out1", 1},
		"o2":    {"o2", "other", "out2", 1},
		"out":   {"out", "up", "", 1},
		"out1":  {"out1", "o1", "", 1},
		"out2":  {"out2", "o2", "", 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("fragments:\n%v\nwant\n%v", got, want)
	}
	if p.Node("long") != p.Node("lines") || p.Node("big").Name != "counts" {
		t.Error("Node(member) must return the member's fragment")
	}
	if s := p.Node("lines").Schema; s.Index("word") < 0 || s.Index("line") >= 0 {
		t.Errorf("fragment schema is not the chain's output: %v", s.Fields)
	}
	// The logical plan is untouched.
	lp, _ := q.Plan()
	if len(lp.Nodes) != 12 || len(lp.Node("lines").Outputs) != 1 || lp.Node("lines").Outputs[0] != "tok" {
		t.Errorf("logical plan changed: %d nodes", len(lp.Nodes))
	}
}
