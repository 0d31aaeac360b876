package coordinator

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestReconfigWireEncodesChangedPlansOnly: the assignment watch encodes a
// query's reconfiguration plans one by one and again only the plans that
// changed (a phase); each encoding is the plan's JSON, and a worker that
// does not ask for the split form still gets the whole state's JSON.
func TestReconfigWireEncodesChangedPlansOnly(t *testing.T) {
	plan := func(e uint64, phase string) fsm.ReconfigPlan {
		return fsm.ReconfigPlan{Epoch: e, Strategy: fsm.StrategyLive, Phase: phase, SpecJSON: []byte(`{"name":"q"}`),
			Changes: []fsm.OperatorChange{{Operator: "f", Version: int(e) + 1, SpecJSON: []byte(`{"name":"f"}`)}}}
	}
	q1 := &fsm.Query{Name: "q", CreateIndex: 7, Reconfig: &fsm.QueryReconfig{Tracking: fsm.TrackingStatic,
		Plans: []fsm.ReconfigPlan{plan(1, fsm.ReconfigComplete), plan(2, fsm.ReconfigLoading)}}}
	var w reconfigWire
	e1, err := w.entry(q1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range q1.Reconfig.Plans {
		want, _ := json.Marshal(&q1.Reconfig.Plans[i])
		if !bytes.Equal(e1.plans[i], want) {
			t.Fatalf("plan %d encoded as %s, want %s", i+1, e1.plans[i], want)
		}
	}
	// The next state (a new object, as the state store makes): plan 2
	// switched.
	q2 := &fsm.Query{Name: "q", CreateIndex: 7, Reconfig: &fsm.QueryReconfig{Tracking: fsm.TrackingStatic,
		Plans: []fsm.ReconfigPlan{plan(1, fsm.ReconfigComplete), plan(2, fsm.ReconfigSwitched)}}}
	q2.Reconfig.Plans[1].Cut = 42
	e2, err := w.entry(q2)
	if err != nil {
		t.Fatal(err)
	}
	if &e2.plans[0][0] != &e1.plans[0][0] {
		t.Error("plan 1, unchanged, was encoded again")
	}
	if want, _ := json.Marshal(&q2.Reconfig.Plans[1]); !bytes.Equal(e2.plans[1], want) {
		t.Errorf("plan 2 after its switch encoded as %s, want %s", e2.plans[1], want)
	}
	// The same name submitted again is another query: nothing is reused.
	q3 := &fsm.Query{Name: "q", CreateIndex: 9, Reconfig: &fsm.QueryReconfig{Plans: []fsm.ReconfigPlan{plan(1, fsm.ReconfigComplete)}}}
	if e3, _ := w.entry(q3); &e3.plans[0][0] == &e2.plans[0][0] {
		t.Error("a plan of an earlier query of the same name was reused")
	}

	split, whole := &pb.QueryView{}, &pb.QueryView{}
	if err := w.fill(split, q2, true, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.fill(whole, q2, false, nil); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(q2.Reconfig)
	if len(split.ReconfigJson) != 0 || !split.ReconfigState || split.ReconfigTracking != fsm.TrackingStatic || len(split.ReconfigPlansJson) != 2 {
		t.Errorf("split view: %v", split)
	}
	if !bytes.Equal(whole.ReconfigJson, want) || whole.ReconfigState || len(whole.ReconfigPlansJson) != 0 {
		t.Errorf("whole view: %v, want reconfig_json %s", whole, want)
	}
	if len(split.ReconfigPlanDigests) != 2 || split.ReconfigPlanDigests[0] != PlanDigest(split.ReconfigPlansJson[0]) ||
		split.ReconfigPlanDigests[1] != PlanDigest(split.ReconfigPlansJson[1]) {
		t.Errorf("split view's digests %x, want those of its plans", split.ReconfigPlanDigests)
	}
	// A worker holding plan 1 as it is gets plan 2's JSON only.
	delta := &pb.QueryView{}
	if err := w.fill(delta, q2, true, map[uint64]bool{split.ReconfigPlanDigests[0]: true}); err != nil {
		t.Fatal(err)
	}
	if len(delta.ReconfigPlansJson) != 2 || len(delta.ReconfigPlansJson[0]) != 0 || !bytes.Equal(delta.ReconfigPlansJson[1], split.ReconfigPlansJson[1]) ||
		!slices.Equal(delta.ReconfigPlanDigests, split.ReconfigPlanDigests) {
		t.Errorf("view for a worker holding plan 1: %v", delta)
	}
	if again := (&pb.QueryView{}); w.fill(again, q2, true, nil) != nil || len(again.ReconfigPlansJson[0]) == 0 {
		t.Error("leaving plan 1 out for one worker left it out of the next response")
	}
	none := &pb.QueryView{}
	if err := w.fill(none, &fsm.Query{Name: "r"}, true, nil); err != nil || none.ReconfigState {
		t.Errorf("a query without reconfiguration: %v, %v", none, err)
	}
}

// TestSamePlanComparesEveryField guards samePlan: a field added to a plan
// or an operator change must be compared there too (else a changed plan
// could be sent with its old JSON).
func TestSamePlanComparesEveryField(t *testing.T) {
	if n := reflect.TypeFor[fsm.ReconfigPlan]().NumField(); n != 10 {
		t.Errorf("fsm.ReconfigPlan has %d fields: compare the new ones in samePlan, then update this count", n)
	}
	if n := reflect.TypeFor[fsm.OperatorChange]().NumField(); n != 3 {
		t.Errorf("fsm.OperatorChange has %d fields: compare the new ones in samePlan, then update this count", n)
	}
	a := fsm.ReconfigPlan{Epoch: 1, Phase: fsm.ReconfigLoading, SpecJSON: []byte("x"), Changes: []fsm.OperatorChange{{Operator: "f", Version: 2, SpecJSON: []byte("y")}}}
	for name, change := range map[string]func(p *fsm.ReconfigPlan){
		"phase": func(p *fsm.ReconfigPlan) { p.Phase = fsm.ReconfigSwitched },
		"cut":   func(p *fsm.ReconfigPlan) { p.Cut = 1 },
		"spec":  func(p *fsm.ReconfigPlan) { p.SpecJSON = []byte("z") },
		"change": func(p *fsm.ReconfigPlan) {
			p.Changes = []fsm.OperatorChange{{Operator: "f", Version: 3, SpecJSON: []byte("y")}}
		},
		"index": func(p *fsm.ReconfigPlan) { p.CompleteIndex = 5 },
	} {
		b := a
		change(&b)
		if samePlan(&a, &b) {
			t.Errorf("%s: plans that differ compare equal", name)
		}
	}
	b := a
	b.SpecJSON = []byte("x")
	if !samePlan(&a, &b) {
		t.Error("equal plans compare unequal")
	}
}
