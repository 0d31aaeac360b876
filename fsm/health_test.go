package fsm

import (
	"errors"
	"testing"
)

// TestHealthLog: an action enters the log pending and is evaluated once;
// incomplete entries, a second evaluation and rewrites are refused; the
// log survives a snapshot and restore.
func TestHealthLog(t *testing.T) {
	h := newHarness(t)
	act := HealthAction{ID: "a1", Query: "q", Fragment: "op", Diagnosis: "under_provisioned", Action: "scale_up",
		AtMs: 1000, Metrics: `{"throughput":10}`, FromParallelism: 1, ToParallelism: 4, Outcome: HealthPending}
	h.mustApply(HealthLogType, HealthLogRequest{Action: act})
	for name, bad := range map[string]HealthAction{
		"no fragment":        {ID: "a2", Query: "q", Diagnosis: "d", Action: "x", AtMs: 1, Outcome: HealthPending},
		"no time":            {ID: "a2", Query: "q", Fragment: "op", Diagnosis: "d", Action: "x", Outcome: HealthPending},
		"born evaluated":     {ID: "a2", Query: "q", Fragment: "op", Diagnosis: "d", Action: "x", AtMs: 1, Outcome: HealthImproved},
		"evaluation no time": {ID: "a1", Outcome: HealthImproved},
		"back to pending":    {ID: "a1", Outcome: HealthPending, EvaluatedAtMs: 5},
	} {
		if res := h.apply(HealthLogType, HealthLogRequest{Action: bad}); !errors.Is(res.Err, ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, res.Err)
		}
	}
	h.mustApply(HealthLogType, HealthLogRequest{Action: HealthAction{ID: "a1", Outcome: HealthNotImproved, OutcomeDetail: "still blocked", EvaluatedAtMs: 2000, Query: "other"}})
	if res := h.apply(HealthLogType, HealthLogRequest{Action: HealthAction{ID: "a1", Outcome: HealthImproved, EvaluatedAtMs: 3000}}); !errors.Is(res.Err, ErrInvalidRequest) {
		t.Errorf("second evaluation: %v, want ErrInvalidRequest", res.Err)
	}
	h.mustApply(HealthLogType, HealthLogRequest{Action: HealthAction{ID: "a2", Query: "q", Fragment: "op", Diagnosis: "data_skew", Action: "rebalance_slots", AtMs: 1500, Outcome: HealthAlert}})
	check := func(st *StateStore) {
		t.Helper()
		as, err := st.HealthActions(nil, "q")
		if err != nil || len(as) != 2 {
			t.Fatalf("actions %+v, %v", as, err)
		}
		a := as[0]
		if a.ID != "a1" || a.Query != "q" || a.Outcome != HealthNotImproved || a.OutcomeDetail != "still blocked" || a.EvaluatedAtMs != 2000 ||
			a.Metrics != act.Metrics || a.ToParallelism != 4 || a.CreateIndex != 1 || a.ModifyIndex <= a.CreateIndex {
			t.Fatalf("evaluated action %+v", a)
		}
	}
	check(h.state())
	check(roundTrip(t, h.fsm).State())
	if v, ok := ProtocolOf(HealthLogType); !ok || v != 8 || ProtocolVersion < 8 {
		t.Fatalf("HealthLog protocol %d %v, build %d", v, ok, ProtocolVersion)
	}
}
