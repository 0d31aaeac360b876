package worker

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestTaskSpecsParseEachDefinitionOnce: a watch response repeats the
// definitions of every query on the worker at each assignment change (each
// phase of a reconfiguration plan among them); a definition seen in the
// previous response is not parsed (validated, its expressions compiled)
// again, one that changed is, and one no longer sent is forgotten.
func TestTaskSpecsParseEachDefinitionOnce(t *testing.T) {
	def := func(threshold string) []byte { return filterSpecJSON(t, threshold) }
	resp := func(spec []byte) *pb.WatchAssignmentsResponse {
		return &pb.WatchAssignmentsResponse{
			Queries:     []*pb.QueryView{{Name: "q", Index: 1, SpecJson: spec}},
			Assignments: []*pb.Assignment{{TaskId: "q/f/p0/r0", Query: "q", Fragment: "f"}, {TaskId: "q/s/p0/r0", Query: "q", Fragment: "s"}},
		}
	}
	var cache specCache
	first, err := taskSpecs(resp(def("1")), &cache)
	if err != nil || len(first) != 2 || first[0].Spec != first[1].Spec {
		t.Fatalf("first response: %v, %d specs", err, len(first))
	}
	again, err := taskSpecs(resp(def("1")), &cache)
	if err != nil || again[0].Spec != first[0].Spec {
		t.Fatalf("the same definition was parsed again (err %v)", err)
	}
	changed, err := taskSpecs(resp(def("2")), &cache)
	if err != nil || changed[0].Spec == first[0].Spec {
		t.Fatalf("a changed definition was not parsed (err %v)", err)
	}
	if len(cache.byJSON) != 1 {
		t.Fatalf("the cache holds %d definitions, want the last response's 1", len(cache.byJSON))
	}
}

// TestTaskSpecsDecodeChangedPlansOnly: a query's reconfiguration plans
// sent one by one are decoded into the same state as the whole JSON,
// and a plan whose JSON the last response had is not decoded again (its
// spec shares the bytes decoded then); a plan that does not decode is an
// error naming its query.
func TestTaskSpecsDecodeChangedPlansOnly(t *testing.T) {
	def := filterSpecJSON(t, "1")
	state := func(phase2 string) *fsm.QueryReconfig {
		return &fsm.QueryReconfig{Tracking: fsm.TrackingDynamic, Plans: []fsm.ReconfigPlan{
			{Epoch: 1, Phase: fsm.ReconfigComplete, SpecJSON: def, Changes: []fsm.OperatorChange{{Operator: "f", Version: 2, SpecJSON: []byte(`{}`)}}},
			{Epoch: 2, Phase: phase2, SpecJSON: def, Changes: []fsm.OperatorChange{{Operator: "f", Version: 3, SpecJSON: []byte(`{}`)}}},
		}}
	}
	resp := func(rc *fsm.QueryReconfig, split bool) *pb.WatchAssignmentsResponse {
		v := &pb.QueryView{Name: "q", Index: 1, SpecJson: def}
		if split {
			v.ReconfigState, v.ReconfigTracking = true, rc.Tracking
			for i := range rc.Plans {
				b, _ := json.Marshal(&rc.Plans[i])
				v.ReconfigPlansJson = append(v.ReconfigPlansJson, b)
			}
		} else {
			v.ReconfigJson, _ = json.Marshal(rc)
		}
		return &pb.WatchAssignmentsResponse{Queries: []*pb.QueryView{v}, Assignments: []*pb.Assignment{{TaskId: "q/f/p0/r0", Query: "q", Fragment: "f"}}}
	}
	var cache specCache
	for _, phase := range []string{fsm.ReconfigLoading, fsm.ReconfigSwitched} {
		whole, err := taskSpecs(resp(state(phase), false), nil)
		if err != nil {
			t.Fatal(err)
		}
		split, err := taskSpecs(resp(state(phase), true), &cache)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(whole[0].Reconfig, split[0].Reconfig) {
			t.Fatalf("%s: split plans decode to %+v, the whole JSON to %+v", phase, split[0].Reconfig, whole[0].Reconfig)
		}
	}
	first, _ := taskSpecs(resp(state(fsm.ReconfigSwitched), true), &cache)
	next, _ := taskSpecs(resp(state(fsm.ReconfigComplete), true), &cache)
	if &first[0].Reconfig.Plans[0].SpecJSON[0] != &next[0].Reconfig.Plans[0].SpecJSON[0] {
		t.Error("plan 1, unchanged, was decoded again")
	}
	if &first[0].Reconfig.Plans[1].SpecJSON[0] == &next[0].Reconfig.Plans[1].SpecJSON[0] || next[0].Reconfig.Plans[1].Phase != fsm.ReconfigComplete {
		t.Error("plan 2, completed, was not decoded again")
	}
	if len(cache.plans) != 2 {
		t.Errorf("the cache holds %d plans, want the last response's 2", len(cache.plans))
	}
	bad := resp(state(fsm.ReconfigComplete), true)
	bad.Queries[0].ReconfigPlansJson[1] = []byte(`{"epoch":`)
	if specs, err := taskSpecs(bad, &cache); err == nil || !strings.Contains(err.Error(), "query q") || len(specs) != 0 {
		t.Errorf("a plan that does not decode: %d specs, err %v", len(specs), err)
	}
}

// filterSpecJSON is the canonical JSON of a query filtering a vitals
// generator's records on heart_rate > threshold.
func filterSpecJSON(t *testing.T, threshold string) []byte {
	t.Helper()
	q, err := queryspec.Parse("q.yaml", []byte(`name: q
sources:
  - name: s
    schema: {time: timestamp, patient: string, temperature: float, heart_rate: int, resp_rate: int, bp_sys: int, bp_dia: int}
    generator: {kind: vitals, rate: 10}
operators:
  - {name: f, type: filter, input: s, where: "heart_rate > `+threshold+`"}
sinks:
  - {name: out, input: f}
`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := q.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
