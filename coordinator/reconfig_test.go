package coordinator

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

const reconfigQuery = `name: rq
sources:
  - {name: vitals, schema: {time: timestamp, patient: string, temperature: float, heart_rate: int, resp_rate: int, bp_sys: int, bp_dia: int}, generator: {kind: vitals, rate: 100, seed: 1}}
operators:
  - {name: hot, type: filter, input: vitals, where: "temperature > 38.0"}
  - {name: per_patient, type: aggregate, input: hot, window: {size: 1s}, group_by: [patient], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: per_patient}
`

// TestUpdateQueryCommitsOnePlan: an update that cannot be applied live
// (bad YAML, an operator's input changed, an operator added, nothing
// changed, an unknown strategy) changes nothing; a valid one commits a
// plan with a new version of the changed operator, and a second plan
// gives it a third version while the first is still under way; each
// keeps the strategy it was committed with.
func TestUpdateQueryCommitsOnePlan(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	admin := c.admin(0)
	rcs := pb.NewReconfigServiceClient(c.conn(0, c.tokens[1]))
	if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(reconfigQuery), Filename: "rq.yaml"}); err != nil {
		t.Fatal(err)
	}
	before, err := s.State().Query(nil, "rq")
	if err != nil || before == nil {
		t.Fatal(before, err)
	}
	bad := map[string]struct {
		yaml, strategy string
		code           codes.Code
	}{
		"parse error":     {strings.Replace(reconfigQuery, "temperature > 38.0", "temperature >", 1), "", codes.InvalidArgument},
		"input changed":   {strings.Replace(reconfigQuery, "input: hot, window", "input: vitals, window", 1), "", codes.InvalidArgument},
		"nothing changed": {reconfigQuery, "", codes.InvalidArgument},
		"operator added": {strings.Replace(reconfigQuery, "sinks:", "  - {name: extra, type: filter, input: vitals, where: \"true\"}\nsinks:", 1) +
			"  - {name: out2, input: extra}\n", "", codes.InvalidArgument},
		"strategy":      {strings.Replace(reconfigQuery, "38.0", "39.0", 1), "blocking", codes.InvalidArgument},
		"unknown query": {strings.Replace(strings.Replace(reconfigQuery, "38.0", "39.0", 1), "name: rq", "name: nope", 1), "", codes.NotFound},
	}
	for name, b := range bad {
		_, err := rcs.UpdateQuery(ctxT(t, 10*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(b.yaml), Filename: "rq.yaml", Strategy: b.strategy})
		if status.Code(err) != b.code {
			t.Errorf("%s: %v, want %s", name, err, b.code)
		}
	}
	if after, _ := s.State().Query(nil, "rq"); after.ModifyIndex != before.ModifyIndex || after.Reconfig != nil {
		t.Fatalf("a refused update changed the query: %+v", after)
	}
	v2 := strings.Replace(reconfigQuery, "38.0", "38.5", 1)
	resp, err := rcs.UpdateQuery(ctxT(t, 10*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(v2), Filename: "rq.yaml", Tracking: "dynamic"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Epoch != 1 || len(resp.Changes) != 1 || resp.Changes[0].Operator != "hot" || resp.Changes[0].Version != 2 {
		t.Fatalf("first plan: %+v", resp)
	}
	v3 := strings.Replace(reconfigQuery, "38.0", "37.5", 1)
	if resp, err = rcs.UpdateQuery(ctxT(t, 10*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(v3), Filename: "rq.yaml", Strategy: "quiescent"}); err != nil || resp.Epoch != 2 || resp.Changes[0].Version != 3 {
		t.Fatalf("second plan: %+v %v", resp, err)
	}
	vs, err := rcs.QueryVersions(ctxT(t, 10*time.Second), &pb.QueryVersionsRequest{Name: "rq"})
	if err != nil {
		t.Fatal(err)
	}
	if vs.Tracking != "dynamic" || len(vs.Plans) != 2 || vs.Plans[0].Phase != "loading" || vs.Plans[0].Strategy != "live" || vs.Plans[1].Strategy != "quiescent" {
		t.Fatalf("versions: %+v", vs)
	}
	for _, o := range vs.Operators {
		if o.Operator != "hot" {
			if len(o.Versions) != 1 || !o.Versions[0].Active {
				t.Errorf("%s: %+v", o.Operator, o.Versions)
			}
			continue
		}
		if len(o.Versions) != 3 || !o.Versions[0].Active || !o.Versions[1].Active || !o.Versions[2].Active || o.Versions[2].Epoch != 2 {
			t.Fatalf("hot should have three active versions: %+v", o.Versions)
		}
	}
	// No task is placed (no worker): every task is disconnected.
	if n := len(vs.Plans[0].Disconnected); n != int(vs.Plans[0].Tasks) || n == 0 {
		t.Fatalf("disconnected %v of %d tasks", vs.Plans[0].Disconnected, vs.Plans[0].Tasks)
	}
}
