package coordinator

import (
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Rescaling a query with replicas is refused at once, with the reason
// (allowReplicatedRescale). Once that refusal is lifted, a keyed operator
// read by another operator is still refused: that operator runs a DCAA
// machine with fixed inputs, which cannot follow a rescale, so the
// prepared rescale would wait for a hold that never comes until it is
// aborted. The same operator read only by a sink is not refused for that
// reason.
func TestScaleReplicatedQueryRefused(t *testing.T) {
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
	for _, name := range []string{"chain", "direct"} {
		if err := scale(name); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "rescaling a replicated query is refused") {
			t.Fatalf("scale of replicated query %s: %v, want FailedPrecondition saying why", name, err)
		}
	}
	allowReplicatedRescale = true
	defer func() { allowReplicatedRescale = false }()
	if err := scale("chain"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "replicated operator") || !strings.Contains(err.Error(), "total") {
		t.Fatalf("scale of an operator a replicated operator reads: %v, want FailedPrecondition naming total", err)
	}
	if err := scale("direct"); err != nil && strings.Contains(err.Error(), "replicated operator") {
		t.Fatalf("scale of an operator only a sink reads refused as read by a replicated operator: %v", err)
	}
}
