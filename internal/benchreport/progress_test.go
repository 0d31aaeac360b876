package benchreport

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestProgressLines(t *testing.T) {
	var out bytes.Buffer
	p := NewProgress(&out, "bench x")
	now := p.start
	p.now = func() time.Time { return now }
	now = now.Add(1500 * time.Millisecond)
	p.Step("forward", 2, 5, Rate(4.52e6, "records"))
	p.Step("forward", 0, 0, "sizing")
	p.Note("done in %d", 3)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), out.String())
	}
	for _, want := range []string{"bench x", "[   1.5s]", "forward", "round 2/5", "4.52 M records/s"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %q lacks %q", lines[0], want)
		}
	}
	if strings.Contains(lines[1], "round") || !strings.Contains(lines[1], "sizing") {
		t.Errorf("sizing line %q", lines[1])
	}
	if !strings.HasSuffix(lines[2], "done in 3") {
		t.Errorf("note %q", lines[2])
	}
	var nilP *Progress
	nilP.Step("x", 1, 1, "") // a nil Progress prints nothing and does not panic
	nilP.Note("x")
}

func TestRate(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{4.52e6, "4.52 M records/s"}, {441e3, "441.0 k records/s"}, {12, "12.0 records/s"}, {2.5e9, "2.50 G records/s"}} {
		if got := Rate(c.v, "records"); got != c.want {
			t.Errorf("Rate(%g) = %q, want %q", c.v, got, c.want)
		}
	}
}
