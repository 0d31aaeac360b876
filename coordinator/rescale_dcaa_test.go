package coordinator

import (
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// In a query with replicas, a keyed operator read by another operator is
// refused at once, naming that operator: it runs a DCAA machine with
// fixed inputs, which cannot follow a rescale, so the prepared rescale
// would wait for a hold that never comes until it is aborted. The same
// operator read only by a sink is not refused.
func TestScaleReplicatedQueryRefused(t *testing.T) {
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
`} {
		if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(q), Filename: "q.yaml"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"chain", "direct"} {
		waitFor(t, 20*time.Second, "the slot map of "+name+" created", func() bool {
			m, _ := s.State().SlotMap(nil, name, "per_line")
			return m != nil
		})
	}
	scale := func(query string) error {
		_, err := admin.ScaleQuery(ctxT(t, 10*time.Second), &pb.ScaleQueryRequest{Query: query, Operator: "per_line", Parallelism: 2})
		return err
	}
	if err := scale("chain"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "replicated operator") || !strings.Contains(err.Error(), "total") {
		t.Fatalf("scale of an operator a replicated operator reads: %v, want FailedPrecondition naming total", err)
	}
	if err := scale("direct"); err != nil && strings.Contains(err.Error(), "replicated") {
		t.Fatalf("scale of an operator only a sink reads in a replicated query refused: %v", err)
	}
}
