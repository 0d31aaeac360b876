package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestReconfigLeaderChangeMidPlan: an org of three coordinators and two
// workers runs reconfigQuery; a quiescent plan is committed and the
// leader is stopped at once, so the sources hold (from when they learn
// the plan until it is complete) while the org elects another leader.
// The workers report to it (a report the old leader failed is sent
// again), the plan switches and completes there, the sources resume, and
// every result is processed by one consistent set of versions, none lost
// or duplicated, the upgrade mid-stream.
func TestReconfigLeaderChangeMidPlan(t *testing.T) {
	t.Parallel()
	const limit = 16000 // 8 s of stream per partition
	o := newLiveOrgOf(t, 3, 2, nil, nil)
	leader := -1
	waitFor(t, 30*time.Second, "a leader", func() bool {
		for i, n := range o.nodes {
			if n != nil && n.IsLeader() {
				leader = i
				return true
			}
		}
		return false
	})
	// The clients talk to a coordinator that stays.
	o.useCoordinator(t, (leader+1)%3)
	base := strings.Replace(fmt.Sprintf(reconfigQuery, limit), "replicas: 2\n", "", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(base), Filename: "rq.yaml"}); err != nil {
		t.Fatal(err)
	}
	// The follower the clients talk to applied the submission.
	waitFor(t, 20*time.Second, "the query at the follower", func() bool {
		_, err := o.admin.GetQuery(context.Background(), &pb.GetQueryRequest{Name: "rq"})
		return err == nil
	})
	var (
		wg      sync.WaitGroup
		started bool
		log     []string
	)
	update := func() {
		defer wg.Done()
		uctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := o.reconfig.UpdateQuery(uctx, &pb.UpdateQueryRequest{Yaml: []byte(reconfigVersion(base, 2)), Filename: "rq.yaml", Strategy: "quiescent"})
		if err != nil {
			t.Errorf("update: %v", err)
			return
		}
		o.stop(leader)
		stopped := time.Now()
		phase := func() string {
			vs, err := o.reconfig.QueryVersions(context.Background(), &pb.QueryVersionsRequest{Name: "rq"})
			if err != nil || len(vs.Plans) < int(resp.Epoch) {
				return ""
			}
			return vs.Plans[resp.Epoch-1].Phase
		}
		var during string
		waitFor(t, 30*time.Second, "another leader", func() bool {
			for i, n := range o.nodes {
				if i != leader && n != nil && n.IsLeader() {
					during = phase()
					return during != ""
				}
			}
			return false
		})
		waitFor(t, 60*time.Second, "the plan complete under the new leader", func() bool { return phase() == "complete" })
		// Every generator source held for the plan and resumed once it was
		// complete, after the leader was gone.
		held := 0
		for _, w := range o.workers {
			for _, h := range w.Runtime().ReconfigHolds() {
				if h.Query != "rq" || h.Epoch != resp.Epoch {
					continue
				}
				held++
				if !h.Resumed.After(stopped) {
					t.Errorf("source %s resumed at %v, before the leader stopped (%v): it did not hold across the change", h.Task, h.Resumed, stopped)
				}
			}
		}
		if held != 2 {
			t.Errorf("%d sources held for the plan, want 2", held)
		}
		log = append(log, fmt.Sprintf("plan %d %s when the new leader served", resp.Epoch, during))
	}
	out := o.tailRaw(t, "rq/out/p0/r0", func(n int) {
		if n > 500 && !started {
			started = true
			wg.Add(1)
			go update()
		}
	})
	wg.Wait()
	if !started {
		t.Fatal("the stream ended before the update")
	}
	t.Logf("%v", log)
	paths := checkReconfigResults(t, out, limit)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("paths %v: the upgrade did not happen mid-stream", paths)
	}
	t.Logf("paths %v", paths)
}
