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
	s, admin := leaderNode(t)
	for _, tc := range []struct{ yaml, want string }{
		{queryYAML("iq", 0, []string{`{name: text, schema: {line: string}, ingest: true}`}, []string{perLineOp}, "per_line"), "ingest or kafka source"},
		{queryYAML("pq", 0, []string{textSource}, nil, "text"), "passes it through"},
	} {
		name := queryName(tc.yaml)
		submitYAMLs(t, admin, tc.yaml)
		_, err := admin.ScaleQuery(ctxT(t, 20*time.Second), &pb.ScaleQueryRequest{Query: name, Operator: "text", Parallelism: 2})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("scale the source of %s: %v, want FailedPrecondition naming %q", name, err, tc.want)
		}
		if m, _ := s.State().SlotMap(nil, name, "text"); m != nil && m.Next != nil {
			t.Errorf("%s: a refused source rescale left a rescale under way: %+v", name, m.Next)
		}
	}
	// A generator read by replicated operators (they run a DCAA machine),
	// with one input or joining it with another stream, is not refused.
	for _, q := range []string{
		queryYAML("rq", 2, []string{textSource}, []string{perLineOp}, "per_line"),
		queryYAML("jq", 2, []string{textSource, moreSource}, []string{`{name: both, type: join, left: text, right: more, on: [line], window: {size: 1s}}`}, "both"),
	} {
		name := queryName(q)
		submitYAMLs(t, admin, q)
		if err := refusedAsReplicated(t, admin, name, "text", 20*time.Second); err != nil {
			t.Errorf("scale the source of replicated query %s: %v", name, err)
		}
	}
	finish := fsm.ApplyPlanRequest{SlotMaps: []fsm.SlotMapUpdate{{Phase: fsm.RescaleFinish, Starts: []int64{0, 5}}}}
	if v := finish.Protocol(); v != 9 {
		t.Errorf("a finish recording source starts needs protocol %d, want 9", v)
	}
}
