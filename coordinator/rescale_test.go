package coordinator

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
)

// TestPlanFieldsWaitForEveryCoordinator: a plan using fields an older
// build would ignore (a live move here) is refused while a coordinator
// advertises protocol 3, naming it, and proposed once it advertises the
// current protocol; a plan without them goes through meanwhile.
func TestPlanFieldsWaitForEveryCoordinator(t *testing.T) {
	c := newTestCluster(t, 3, "", "")
	l := c.leader()
	s := c.nodes[l]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	old := (l + 1) % 3
	setProto := func(v int) {
		t.Helper()
		nt := map[string]string{}
		for k, val := range c.nodes[old].serf.LocalMember().Tags {
			nt[k] = val
		}
		nt[tagProto] = strconv.Itoa(v)
		if err := c.nodes[old].serf.SetTags(nt); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 15*time.Second, "the tag to spread", func() bool {
			v2, err := s.coordinatorProtocols()
			return err == nil && v2[c.cfgs[old].NodeID] == v
		})
	}
	live := fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, Placements: []fsm.PlannedPlacement{{TaskID: "q/f/p0/r0", FromGeneration: 1, ToWorker: "w", Live: true}}}
	plain := live
	plain.Placements = []fsm.PlannedPlacement{{TaskID: "q/f/p0/r0", FromGeneration: 1, ToWorker: "w"}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	setProto(3)
	if _, err := s.submitPlan(ctx, live); !errors.Is(err, ErrCommandNotSupported) {
		t.Fatalf("live move with a protocol-3 coordinator: %v, want ErrCommandNotSupported", err)
	}
	if _, err := s.submitPlan(ctx, plain); err != nil {
		t.Fatalf("plain plan with a protocol-3 coordinator: %v", err)
	}
	setProto(fsm.ProtocolVersion)
	out, err := s.submitPlan(ctx, live)
	if err != nil || len(out.Result.Refused) != 1 {
		t.Fatalf("live move once every coordinator upgraded: %+v, %v (want the unknown task refused)", out, err)
	}
}
