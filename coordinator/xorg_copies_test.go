package coordinator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// A move to beta whose copy beta does not have (its host request never
// arrived: the waiter's leader lost leadership right after writing the
// plan and the record, as in TestCrossOrgMoveLeftMovingIsSettled):
// while a reconfiguration plan waits for the task, fedstream query
// versions lists it as disconnected, naming beta's word; and alpha rolls
// the move back once any host request of it has ended (two partner
// timeouts), not only after the move's whole bound. Before, the task on
// beta's stand-in worker (always ready) was listed as nothing, and the
// move stayed "moving to org beta" for the catch-up bound and four
// partner timeouts.
func TestCrossOrgCopyGoneIsDisconnectedAndRolledBack(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, _, contract := xorgPair(t, calmFailureDetection, func(c *Config) {
		c.Timings.MoveCatchUpBound = 5 * time.Minute
		c.Timings.PartnerTimeout = 15 * time.Second
	})
	const query, moving = "xg", "xg/counts/p0/r0"
	yaml := fmt.Sprintf(xorgRCQuery, query, 0) // endless
	if _, err := alpha.admin(0).SubmitQuery(ctxT(t, 20*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(yaml), Filename: query + ".yaml"}); err != nil {
		t.Fatal(err)
	}
	a := alpha.nodes[0]
	pw := partnerWorkerID("beta")
	waitFor(t, 60*time.Second, "the query's tasks running", func() bool {
		ts, err := a.State().TasksByQuery(nil, query)
		if err != nil || len(ts) == 0 {
			return false
		}
		for _, tk := range ts {
			if tk.State != states.TaskRunning {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The move's plan and the record MigrateTaskOut writes before it
	// asks the host, nothing more.
	tk := alpha.task(t, moving)
	from, gen := tk.WorkerID, tk.Gen()
	if err := a.ensurePartnerWorker(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	out, err := a.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, StateIndex: a.State().LatestIndex(),
		Placements: []fsm.PlannedPlacement{{TaskID: moving, FromWorker: from, FromGeneration: gen, ToWorker: pw, Live: true, CatchUp: true}}})
	if err != nil || len(out.Result.Refused) > 0 {
		t.Fatalf("the move's plan: %v %v", out, err)
	}
	began := time.Now()
	orphan := fsm.HostedTask{ID: fsm.HostedTaskID("alpha", moving), Owner: "alpha", Host: "beta", Contract: contract, Query: query, TaskID: moving,
		Fragment: tk.Fragment, Partition: tk.Partition, Replica: tk.Replica, Generation: gen + 1, SourceGeneration: gen,
		Phase: fsm.HostedMoving, Since: began.UnixNano()}
	if err := a.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: orphan}); err != nil {
		t.Fatal(err)
	}
	// A plan committed now waits for every task's acknowledgement.
	rcs := pb.NewReconfigServiceClient(alpha.conn(0, alpha.tokens[1]))
	v2 := strings.Replace(strings.Replace(yaml, `where: "n > 7"`, `where: "n >= 8"`, 1), `"total + 0"`, `"total * 1"`, 1)
	if _, err := rcs.UpdateQuery(ctxT(t, 20*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(v2), Filename: query + ".yaml", SwitchMarginMs: 300}); err != nil {
		t.Fatalf("update: %v", err)
	}
	// Listed as disconnected within a few syncs, and before alpha may
	// roll the move back (two partner timeouts after its start).
	var last string
	listed := false
	for !listed {
		vs, err := rcs.QueryVersions(ctxT(t, 10*time.Second), &pb.QueryVersionsRequest{Name: query})
		switch {
		case err != nil:
			last = err.Error()
		case len(vs.Plans) != 1:
			last = fmt.Sprintf("%d plans", len(vs.Plans))
		default:
			last = fmt.Sprintf("plan %s, %d/%d tasks acknowledged, disconnected %q", vs.Plans[0].Phase, vs.Plans[0].TasksAcked, vs.Plans[0].Tasks, vs.Plans[0].Disconnected)
			for _, d := range vs.Plans[0].Disconnected {
				if strings.HasPrefix(d, moving+" (no copy at org beta") {
					listed = true
				}
			}
		}
		if !listed && time.Since(began) > 2*a.cfg.Timings.PartnerTimeout {
			t.Fatalf("%s after a move whose copy beta does not have, query versions says: %s; want %s listed disconnected (no copy at org beta)", time.Since(began).Round(time.Millisecond), last, moving)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("listed: %s", last)
	deadline := began.Add(2*a.cfg.Timings.PartnerTimeout + 60*time.Second)
	for {
		tk := alpha.task(t, moving)
		if tk.WorkerID == from && tk.Gen() == gen && tk.MovingFrom == "" && a.TasksAtPartners()[moving] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after a move whose copy beta does not have: the task is on %s generation %d moving from %q, at partners %v; want it back on %s generation %d",
				time.Since(began).Round(time.Millisecond), tk.WorkerID, tk.Gen(), tk.MovingFrom, a.TasksAtPartners(), from, gen)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("rolled back after %s", time.Since(began).Round(time.Millisecond))
}

// A sync whose task list the owner read before it recorded a move (its
// sync loop reads the list, then syncs each partner in turn) reaches the
// host after the host accepted the move: the host keeps the new copy.
// Before, it dropped it as a task its owner no longer runs (twice in six
// minutes of the dev soak, 0.7 and 1.5 s after accepting), and the move
// waited out its bound. A list read once the owner had recorded the move
// still drops a copy it leaves out.
func TestCrossOrgSyncListedBeforeTheMoveKeepsTheCopy(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, contract := xorgPair(t, calmFailureDetection)
	const query, moving = "xs", "xs/counts/p0/r0"
	if _, err := alpha.admin(0).SubmitQuery(ctxT(t, 20*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(xorgRCQuery, query, 0)), Filename: query + ".yaml"}); err != nil {
		t.Fatal(err)
	}
	a, b := alpha.nodes[0], beta.nodes[0]
	waitFor(t, 60*time.Second, "the task to move running", func() bool {
		tk, err := a.State().Task(nil, moving)
		return err == nil && tk != nil && tk.State == states.TaskRunning
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := alpha.moveOut(ctx, t, moving, "beta", contract); err != nil {
		t.Fatal(err)
	}
	rec, err := b.State().HostedTask(nil, "alpha", moving)
	if err != nil || rec == nil || rec.OwnerIndex == 0 {
		t.Fatalf("beta's record of the moved task: %+v (%v); want one with alpha's index of the move", rec, err)
	}
	// alpha's list from before the move: the task is not in it.
	if _, err := b.syncHosted(ctx, "alpha", syncRequest{StateIndex: rec.OwnerIndex - 1}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.State().HostedTask(nil, "alpha", moving); err != nil || got == nil || got.Generation != rec.Generation {
		t.Fatalf("after a sync listed from alpha's state before the move, beta's record is %+v (%v); want generation %d kept", got, err, rec.Generation)
	}
	// From a state after it: the owner no longer runs it there.
	if _, err := b.syncHosted(ctx, "alpha", syncRequest{StateIndex: rec.OwnerIndex}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.State().HostedTask(nil, "alpha", moving); err != nil || got != nil {
		t.Fatalf("after a sync listed from alpha's state with the move that leaves it out, beta's record is %+v (%v); want it dropped", got, err)
	}
}
