package coordinator

import (
	"testing"
	"time"
)

// In a query with replicas, a keyed operator is not refused for what
// reads it: another operator with a single input (which runs a DCAA
// machine), a join reading it and another stream (its machine ranks the
// added partitions' streams among its inputs), or a sink.
func TestScaleReplicatedQueryNotRefused(t *testing.T) {
	t.Parallel()
	s, admin := leaderNode(t)
	submitYAMLs(t, admin,
		queryYAML("chain", 2, []string{textSource}, []string{perLineOp,
			`{name: total, type: aggregate, input: per_line, window: {size: 1s}, aggregates: {lines: "count()"}}`}, "total"),
		queryYAML("direct", 2, []string{textSource}, []string{perLineOp}, "per_line"),
		queryYAML("joined", 2, []string{textSource, moreSource}, []string{perLineOp,
			`{name: other, type: aggregate, input: more, window: {size: 1s}, group_by: [line], aggregates: {m: "count()"}}`,
			`{name: both, type: join, left: per_line, right: other, on: [line], window: {size: 1s}}`}, "both"),
	)
	for _, name := range []string{"chain", "direct", "joined"} {
		waitFor(t, 20*time.Second, "the slot map of "+name+" created", func() bool {
			m, _ := s.State().SlotMap(nil, name, "per_line")
			return m != nil
		})
	}
	for _, q := range []string{"chain", "direct", "joined"} {
		if err := refusedAsReplicated(t, admin, q, "per_line", 10*time.Second); err != nil {
			t.Fatalf("scale of an operator of replicated query %s refused: %v", q, err)
		}
	}
}
