package coordinator

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestScaleSourceRefusals: a source rescale is refused, with its reason,
// for an ingest source (its partitions are its producers' streams) and for
// a generator read directly by a sink that passes its single stream
// through; and a source rescale's finish needs protocol 9.
func TestScaleSourceRefusals(t *testing.T) {
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	admin := c.admin(0)
	for _, tc := range []struct{ name, yaml, want string }{
		{"iq", `name: iq
sources:
  - {name: text, schema: {line: string}, ingest: true}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: per_line}
`, "ingest or kafka source"},
		{"pq", `name: pq
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
sinks:
  - {name: out, input: text}
`, "passes it through"},
	} {
		if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(tc.yaml), Filename: tc.name + ".yaml"}); err != nil {
			t.Fatal(err)
		}
		_, err := admin.ScaleQuery(ctxT(t, 20*time.Second), &pb.ScaleQueryRequest{Query: tc.name, Operator: "text", Parallelism: 2})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("scale the source of %s: %v, want FailedPrecondition naming %q", tc.name, err, tc.want)
		}
		if m, _ := s.State().SlotMap(nil, tc.name, "text"); m != nil && m.Next != nil {
			t.Errorf("%s: a refused source rescale left a rescale under way: %+v", tc.name, m.Next)
		}
	}
	// A generator read by replicated operators (they run a DCAA machine),
	// with one input or joining it with another stream, is not refused.
	for _, q := range []string{`name: rq
replicas: 2
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: per_line}
`, `name: jq
replicas: 2
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
  - {name: more, generator: {kind: words, rate: 100, seed: 2}}
operators:
  - {name: both, type: join, left: text, right: more, on: [line], window: {size: 1s}}
sinks:
  - {name: out, input: both}
`} {
		name := q[len("name: "):strings.Index(q, "\n")]
		if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(q), Filename: name + ".yaml"}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ScaleQuery(ctxT(t, 20*time.Second), &pb.ScaleQueryRequest{Query: name, Operator: "text", Parallelism: 2}); err != nil && strings.Contains(err.Error(), "replicated") {
			t.Errorf("scale the source of replicated query %s: %v", name, err)
		}
	}
	finish := fsm.ApplyPlanRequest{SlotMaps: []fsm.SlotMapUpdate{{Phase: fsm.RescaleFinish, Starts: []int64{0, 5}}}}
	if v := finish.Protocol(); v != 9 {
		t.Errorf("a finish recording source starts needs protocol %d, want 9", v)
	}
}
