package queryspec

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

const reconfigBase = `name: r
sources:
  - {name: s, generator: {kind: words, rate: 10, seed: 1}}
operators:
  - {name: m, type: map, input: s, fields: {line: line, n: "len(line)"}}
  - {name: f, type: filter, input: m, where: "n > 3"}
  - {name: agg, type: aggregate, input: f, window: {size: 1s}, aggregates: {c: "count()"}}
sinks:
  - {name: out, input: agg}
`

func mustParse(t *testing.T, y string) *Query {
	t.Helper()
	q, err := Parse("r.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestReconfigChanges: changed stateless operators are listed; a change of
// a stateful operator, of the graph or of a fragment's output schema is
// refused with ErrNotReconfigurable, naming the operator.
func TestReconfigChanges(t *testing.T) {
	cur := mustParse(t, reconfigBase)
	got, err := ReconfigChanges(cur, mustParse(t, strings.NewReplacer(`"n > 3"`, `"n > 4"`, `"len(line)"`, `"len(line) + 1"`).Replace(reconfigBase)))
	if err != nil || !slices.Equal(got, []string{"m", "f"}) {
		t.Fatalf("changes = %v, %v", got, err)
	}
	for name, y := range map[string]string{
		"group_by":     strings.Replace(reconfigBase, "window: {size: 1s}", "window: {size: 1s}, group_by: [n]", 1),
		"schema":       strings.Replace(reconfigBase, `n: "len(line)"}`, `n: "len(line)", x: "1"}`, 1),
		"nothing":      reconfigBase,
		"parallelism":  strings.Replace(reconfigBase, `where: "n > 3"}`, `where: "n > 3", parallelism: 2}`, 1),
		"renamed":      strings.Replace(reconfigBase, "name: r\n", "name: r2\n", 1),
		"sink changed": strings.Replace(reconfigBase, "{name: out, input: agg}", "{name: out2, input: agg}", 1),
	} {
		_, err := ReconfigChanges(cur, mustParse(t, y))
		if !errors.Is(err, ErrNotReconfigurable) {
			t.Errorf("%s: %v, want ErrNotReconfigurable", name, err)
		}
	}
}

// TestReconfigChangesAggregateFunctions: an aggregate's functions may
// change (its versions share its windows and groups) as long as its
// fragment's output schema stays; its window and group_by may not, and
// the error names it.
func TestReconfigChangesAggregateFunctions(t *testing.T) {
	base := strings.Replace(reconfigBase, "{name: out, input: agg}", "{name: out, input: proj}", 1)
	base = strings.Replace(base, "sinks:", "  - {name: proj, type: map, input: agg, fields: {c: c}}\nsinks:", 1)
	cur := mustParse(t, base)
	next := strings.NewReplacer(`aggregates: {c: "count()"}`, `aggregates: {c: "count()", m: "max(n)"}`, "fields: {c: c}", "fields: {c: c + m}").Replace(base)
	got, err := ReconfigChanges(cur, mustParse(t, next))
	if err != nil || !slices.Equal(got, []string{"agg", "proj"}) {
		t.Fatalf("changes = %v, %v", got, err)
	}
	// Another window is a new state shape (operator.StagedAggregate).
	got, err = ReconfigChanges(cur, mustParse(t, strings.Replace(base, "size: 1s", "size: 2s", 1)))
	if err != nil || !slices.Equal(got, []string{"agg"}) {
		t.Fatalf("window change: %v, %v", got, err)
	}
	// Other groups: refused (group_by routes the input), naming the
	// operator.
	grouped := strings.Replace(base, "window: {size: 1s}", "window: {size: 1s}, group_by: [n]", 1)
	_, err = ReconfigChanges(mustParse(t, grouped), mustParse(t, strings.Replace(grouped, "group_by: [n]", "group_by: [line]", 1)))
	if err == nil || !strings.Contains(err.Error(), `"agg"`) || !strings.Contains(err.Error(), "group_by cannot change") {
		t.Fatalf("group_by change: %v", err)
	}
}

// TestReconfigChangesJoinRefused: a join's window or keys cannot change,
// and the error names it; its where can.
func TestReconfigChangesJoinRefused(t *testing.T) {
	base := `name: j
sources:
  - {name: s, generator: {kind: words, rate: 10, seed: 1}}
operators:
  - {name: m, type: map, input: s, fields: {line: line, n: "len(line)"}}
  - {name: both, type: join, left: m, right: m, on: [n], window: {size: 1s}}
sinks:
  - {name: out, input: both}
`
	cur := mustParse(t, base)
	_, err := ReconfigChanges(cur, mustParse(t, strings.Replace(base, "size: 1s", "size: 2s", 1)))
	if !errors.Is(err, ErrNotReconfigurable) || !strings.Contains(err.Error(), `"both"`) {
		t.Fatalf("join window change: %v", err)
	}
	// Its predicate may change: its versions share the buffers.
	got, err := ReconfigChanges(cur, mustParse(t, strings.Replace(base, "window: {size: 1s}}", `window: {size: 1s}, where: "line != right_line"}`, 1)))
	if err != nil || !slices.Equal(got, []string{"both"}) {
		t.Fatalf("join where change: %v, %v", got, err)
	}
}
