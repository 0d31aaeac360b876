package coordinator

import (
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A replicated query's keyed operator read by another operator: that
// operator runs a DCAA machine with fixed inputs, which cannot follow a
// rescale, so ScaleQuery refuses at once with a reason, instead of
// preparing a rescale that waits for a hold that never comes until it
// is aborted. The same operator read only by a sink is not refused for
// that reason.
func TestScaleRefusesReplicatedOperatorReader(t *testing.T) {
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
	_, err := admin.ScaleQuery(ctxT(t, 10*time.Second), &pb.ScaleQueryRequest{Query: "chain", Operator: "per_line", Parallelism: 2})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "replicated operator") || !strings.Contains(err.Error(), "total") {
		t.Fatalf("scale of an operator a replicated operator reads: %v, want FailedPrecondition naming total", err)
	}
	ctx := ctxT(t, 10*time.Second)
	if _, err := admin.ScaleQuery(ctx, &pb.ScaleQueryRequest{Query: "direct", Operator: "per_line", Parallelism: 2}); err != nil && strings.Contains(err.Error(), "replicated operator") {
		t.Fatalf("scale of an operator only a sink reads refused as read by a replicated operator: %v", err)
	}
}
