package coordinator

import (
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// In a query with replicas, a keyed operator is not refused for what
// reads it: another operator with a single input (which runs a DCAA
// machine), a join reading it and another stream (its machine ranks the
// added partitions' streams among its inputs), or a sink.
func TestScaleReplicatedQueryNotRefused(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	admin := c.admin(0)
	for _, q := range []string{`name: chain
replicas: 2
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
  - {name: total, type: aggregate, input: per_line, window: {size: 1s}, aggregates: {lines: "count()"}}
sinks:
  - {name: out, input: total}
`, `name: direct
replicas: 2
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: per_line}
`, `name: joined
replicas: 2
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
  - {name: more, generator: {kind: words, rate: 100, seed: 2}}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
  - {name: other, type: aggregate, input: more, window: {size: 1s}, group_by: [line], aggregates: {m: "count()"}}
  - {name: both, type: join, left: per_line, right: other, on: [line], window: {size: 1s}}
sinks:
  - {name: out, input: both}
`} {
		if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(q), Filename: "q.yaml"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"chain", "direct", "joined"} {
		waitFor(t, 20*time.Second, "the slot map of "+name+" created", func() bool {
			m, _ := s.State().SlotMap(nil, name, "per_line")
			return m != nil
		})
	}
	scale := func(query string) error {
		_, err := admin.ScaleQuery(ctxT(t, 10*time.Second), &pb.ScaleQueryRequest{Query: query, Operator: "per_line", Parallelism: 2})
		return err
	}
	for _, q := range []string{"chain", "direct", "joined"} {
		if err := scale(q); err != nil && strings.Contains(err.Error(), "replicated") {
			t.Fatalf("scale of an operator of replicated query %s refused: %v", q, err)
		}
	}
}
