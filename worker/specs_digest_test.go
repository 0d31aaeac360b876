package worker

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestTaskSpecsPlansLeftOutByDigest: a response that leaves out the JSON
// of plans the worker named as held (by digest) gives the same state as
// one that sends them all, the plans held are the last response's, and a
// plan left out that the worker does not hold is errPlanMissing with no
// task spec (running without the query's plans would stop its tasks).
func TestTaskSpecsPlansLeftOutByDigest(t *testing.T) {
	def := filterSpecJSON(t, "1")
	plan := func(e uint64, phase string) fsm.ReconfigPlan {
		return fsm.ReconfigPlan{Epoch: e, Phase: phase, SpecJSON: def, Changes: []fsm.OperatorChange{{Operator: "f", Version: int(e) + 1, SpecJSON: []byte(`{}`)}}}
	}
	// resp sends plans with digests; a nil plan is left out.
	resp := func(digests []uint64, plans ...*fsm.ReconfigPlan) *pb.WatchAssignmentsResponse {
		v := &pb.QueryView{Name: "q", Index: 1, SpecJson: def, ReconfigState: true, ReconfigTracking: fsm.TrackingStatic, ReconfigPlanDigests: digests}
		for _, p := range plans {
			var b []byte
			if p != nil {
				b, _ = json.Marshal(p)
			}
			v.ReconfigPlansJson = append(v.ReconfigPlansJson, b)
		}
		return &pb.WatchAssignmentsResponse{Queries: []*pb.QueryView{v}, Assignments: []*pb.Assignment{{TaskId: "q/f/p0/r0", Query: "q", Fragment: "f"}}}
	}
	p1, p2, p2s := plan(1, fsm.ReconfigComplete), plan(2, fsm.ReconfigLoading), plan(2, fsm.ReconfigSwitched)
	var cache specCache
	first, err := taskSpecs(resp([]uint64{11, 22}, &p1, &p2), &cache)
	if err != nil {
		t.Fatal(err)
	}
	if have := sorted(cache.have()); !slices.Equal(have, []uint64{11, 22}) {
		t.Fatalf("plans held %v, want 11 and 22", have)
	}
	next, err := taskSpecs(resp([]uint64{11, 33}, nil, &p2s), &cache)
	if err != nil {
		t.Fatal(err)
	}
	want := &fsm.QueryReconfig{Tracking: fsm.TrackingStatic, Plans: []fsm.ReconfigPlan{p1, p2s}}
	if len(next) != 1 || !reflect.DeepEqual(next[0].Reconfig, want) {
		t.Fatalf("plan 1 left out: state %+v, want %+v", next[0].Reconfig, want)
	}
	if &first[0].Reconfig.Plans[0].SpecJSON[0] != &next[0].Reconfig.Plans[0].SpecJSON[0] {
		t.Error("plan 1, left out, is not the one held")
	}
	if have := sorted(cache.have()); !slices.Equal(have, []uint64{11, 33}) {
		t.Fatalf("plans held %v, want the last response's: 11 and 33", have)
	}
	specs, err := taskSpecs(resp([]uint64{99, 33}, nil, &p2s), &cache)
	if !errors.Is(err, errPlanMissing) || len(specs) != 0 {
		t.Fatalf("a plan left out that is not held: %d specs, err %v, want errPlanMissing and none", len(specs), err)
	}
}

func sorted(xs []uint64) []uint64 {
	slices.Sort(xs)
	return xs
}
