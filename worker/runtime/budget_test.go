package runtime

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// slowExprQuery makes every tuple's filter take seconds: the maps blow
// each line up to a few hundred kilobytes (string concatenation is not
// metered outside loops), and the filter upper-cases it 90 000 times,
// which is within the unit budget but not within the time limit.
const slowExprQuery = `
name: slow
sources:
  - name: lines
    generator: {kind: words, seed: 1, limit: 1000000}
operators:
  - {name: x8, type: map, input: lines, fields: {s: "line+line+line+line+line+line+line+line"}}
  - {name: x64, type: map, input: x8, fields: {s: "s+s+s+s+s+s+s+s"}}
  - {name: x512, type: map, input: x64, fields: {s: "s+s+s+s+s+s+s+s"}}
  - {name: x4096, type: map, input: x512, fields: {s: "s+s+s+s+s+s+s+s"}}
  - {name: slowf, type: filter, input: x4096, where: 'all(1..90000, {upper(s) != "Z"})'}
sinks:
  - {name: out, input: slowf}
`

// A task whose expression is slow for every tuple stops at once when its
// query stops: the evaluation in progress is aborted (goleak in TestMain
// checks that no goroutine is left), and tuples over the time limit are
// dropped and counted rather than holding the stream forever.
func TestStopAbortsSlowExpression(t *testing.T) {
	c := newCluster(t, 1, slowExprQuery, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	w := c.workers[0]
	src := queryspec.TaskID("slow", "lines", 0, 0)
	waitUntil(t, "the source reports a tuple dropped over the time limit", func() bool {
		for _, st := range w.rt.States() {
			if st.TaskID != src {
				continue
			}
			if st.State != StateRunning {
				t.Fatalf("source task: %+v", st)
			}
			return strings.Contains(st.Message, "(1 over the per-tuple cost budget)")
		}
		return false
	})
	// The source is now (again) inside an evaluation of several seconds.
	start := time.Now()
	w.rt.Apply(context.Background(), nil)
	if d := time.Since(start); d > queryspec.ExprTimeLimit/2 {
		t.Errorf("stopping the query took %v; the evaluation in progress was not aborted", d)
	}
}
