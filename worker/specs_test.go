package worker

import (
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestTaskSpecsParseEachDefinitionOnce: a watch response repeats the
// definitions of every query on the worker at each assignment change (each
// phase of a reconfiguration plan among them); a definition seen in the
// previous response is not parsed (validated, its expressions compiled)
// again, one that changed is, and one no longer sent is forgotten.
func TestTaskSpecsParseEachDefinitionOnce(t *testing.T) {
	def := func(threshold string) []byte {
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
