package queryspec

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestUnknownFieldDoesNotHideOtherProblems: an unknown field (a typo) and
// a wrong-shaped value are reported together with every validation
// problem of the rest of the query, each naming file, line and field, in
// line order. Before, the first unknown field was the only error.
func TestUnknownFieldDoesNotHideOtherProblems(t *testing.T) {
	doc := strings.NewReplacer(
		"replicas: 2", "replicas: 9",
		"conns > 100", "conn > 100",
		"input: per_src, where: \"ports > 10\"", "input: per_src, wher: \"ports > 10\"",
		"monitors: 3", "monitors: [3]",
	).Replace(string(readExample(t, "netmon.yaml")))
	_, err := Parse("netmon.yaml", []byte(doc))
	if err == nil {
		t.Fatal("want errors")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		"replicas: 9 is out of range",
		`sources[0] (conns).generator.monitors: cannot use`,
		`operators[1] (busy).where: unknown field "conn"`,
		`operators[2] (probing).wher: unknown field "wher"`,
	}
	for _, w := range want {
		found := false
		for _, l := range lines {
			found = found || strings.Contains(l, w) && strings.HasPrefix(l, "netmon.yaml: line ")
		}
		if !found {
			t.Errorf("missing %q (with file and line) in:\n%v", w, err)
		}
	}
	last := 0
	for _, l := range lines {
		var n int
		if _, err := fmtSscanLine(l, &n); err == nil {
			if n < last {
				t.Errorf("problems out of line order:\n%v", err)
			}
			last = n
		}
	}
}

// TestAllowedLateness: ingest sources take a non-negative duration,
// default 0; generators refuse it.
func TestAllowedLateness(t *testing.T) {
	base := `name: q
sources:
  - name: s
    schema: {time: timestamp, x: int}
    ingest: true
    allowed_lateness: %s
sinks:
  - {name: out, input: s}
`
	q, err := Parse("q.yaml", []byte(strings.Replace(base, "%s", "90s", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if d := q.Sources[0].Lateness(); d != 90*time.Second {
		t.Fatalf("lateness %v", d)
	}
	q, err = Parse("q.yaml", []byte(strings.Replace(base, "    allowed_lateness: %s\n", "", 1)))
	if err != nil || q.Sources[0].Lateness() != 0 {
		t.Fatalf("default: %v %v", err, q)
	}
	for v, want := range map[string]string{
		"-1s":  `q.yaml: line 6: sources[0] (s).allowed_lateness: "-1s" is negative`,
		"soon": `q.yaml: line 6: sources[0] (s).allowed_lateness: "soon" is not a duration`,
	} {
		_, err := Parse("q.yaml", []byte(strings.Replace(base, "%s", v, 1)))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", v, err, want)
		}
	}
	gen := `name: q
sources:
  - {name: s, generator: {kind: words}, allowed_lateness: 1s}
sinks:
  - {name: out, input: s}
`
	if _, err := Parse("q.yaml", []byte(gen)); err == nil || !strings.Contains(err.Error(), "only ingest sources have allowed_lateness") {
		t.Errorf("generator with allowed_lateness: %v", err)
	}
}

func fmtSscanLine(l string, n *int) (int, error) {
	_, rest, ok := strings.Cut(l, ": line ")
	if !ok {
		return 0, errNoLine
	}
	return fmt.Sscanf(rest, "%d", n)
}

var errNoLine = errors.New("no line")
