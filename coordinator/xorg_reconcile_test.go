package coordinator

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// Cross-org placements that the dev federation's load manager makes and
// the two-org tests never did: tasks of one query at two partners, and
// moves whose waiter is gone (found in a soak of fedstream dev under
// load, where every reconfiguration plan stalled for good).

// contractOut makes an active contract letting owner's tasks run at host
// (both pinned in each other already) and returns its id.
func contractOut(t *testing.T, owner, host *xorgOrg) string {
	t.Helper()
	waitFor(t, 30*time.Second, host.org+" alive in "+owner.org+"'s pool", func() bool { return owner.nodes[0].pool.Known(host.org) })
	resp, err := owner.fedClient(0).ProposeContract(ctxT(t, 20*time.Second), &pb.ProposeContractRequest{To: host.org, PriceMin: 1, PriceMax: 2, MaxLoad: 100, ValidForMs: 3600_000, Direction: "out"})
	if err != nil {
		t.Fatalf("propose to %s: %v", host.org, err)
	}
	var d federation.ContractDoc
	if err := json.Unmarshal(resp.ContractJson, &d); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the proposal at "+host.org, func() bool {
		_, err := host.nodes[0].fed.Contract(d.Terms.ID)
		return err == nil
	})
	if _, err := host.fedClient(0).AnswerContract(ctxT(t, 20*time.Second), &pb.AnswerContractRequest{Id: d.Terms.ID, Accept: true}); err != nil {
		t.Fatalf("%s accepts: %v", host.org, err)
	}
	waitFor(t, 10*time.Second, "the contract with "+host.org+" active at "+owner.org, func() bool {
		_, err := owner.nodes[0].activeContractWith(host.org, time.Now())
		return err == nil
	})
	return d.Terms.ID
}

// xorgTrio starts alpha, beta and gamma (each configured by opts), pins
// alpha and each partner in each other and makes contracts letting
// alpha's tasks run at beta and at gamma; beta and gamma pin nothing of
// each other and hold no contract together, as in fedstream dev's
// federation.
func xorgTrio(t *testing.T, opts ...func(*Config)) (alpha, beta, gamma *xorgOrg, toBeta, toGamma string) {
	alpha = newXorgOrg(t, "alpha", nil, opts...)
	beta = newXorgOrg(t, "beta", fedAddr(alpha.testCluster), opts...)
	gamma = newXorgOrg(t, "gamma", fedAddr(alpha.testCluster), opts...)
	orgs := []*xorgOrg{alpha, beta, gamma}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, o := range orgs {
			for _, stop := range o.stopW {
				wg.Add(1)
				go func() { defer wg.Done(); stop() }()
			}
		}
		wg.Wait()
		for _, o := range orgs {
			wg.Add(1)
			go func() { defer wg.Done(); o.stop(0) }()
		}
		wg.Wait()
	})
	for _, p := range []*xorgOrg{beta, gamma} {
		alpha.pin(p.testCluster)
		p.pin(alpha.testCluster)
	}
	return alpha, beta, gamma, contractOut(t, alpha, beta), contractOut(t, alpha, gamma)
}

// firstBatchVia subscribes (no_ack) to ref on the cross-org data port at
// addr as org's coordinator would, and waits for the first batch (or the
// stream's end): nil, or the status of the refusal.
func firstBatchVia(ctx context.Context, t *testing.T, addr string, org *xorgOrg, ref *pb.StreamRef) error {
	t.Helper()
	cfg := testCreds(t, org.ca, rpc.RoleCoordinator, "c1").ClientConfig(tlsutil.Peer{})
	cfg.VerifyConnection = func(tls.ConnectionState) error { return nil }
	conn, err := rpc.Dial(addr, "", grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	sub, err := pb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return err
	}
	if err := sub.Send(&pb.SubscribeRequest{Stream: ref, Subscriber: "test-" + org.org, NoAck: true}); err != nil {
		_, err = sub.Recv()
		return err
	}
	if _, err := sub.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// A query's sink runs at beta, one partition of the aggregate it reads
// at beta too and the other at gamma, as the MPA load manager of
// fedstream dev placed them: beta's copy of the sink reads both
// partitions through alpha, which relays each from the data port of the
// partner running it (beta's own, or gamma's: beta and gamma never talk,
// and hold no contract together). Its results equal those of the query
// left alone. (Before, alpha refused beta's subscriptions, "no cross-org
// route for this stream: task ... is on no worker of org alpha", for as
// long as the tasks stayed there.)
func TestCrossOrgConsumerAndProducerAtTwoPartners(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, _, toBeta, toGamma := xorgTrio(t, calmFailureDetection)
	const limit = 400000 // 20 s at the generator's rate: the reads below come before its end
	want := xorgReference(t, limit)

	const query, sink, producer, sibling = "x3", "x3/out/p0/r0", "x3/counts/p0/r0", "x3/counts/p1/r0"
	alpha.submit(t, query, 1, limit)
	var started bool
	done, ended := make(chan error, 1), make(chan struct{})
	got := alpha.results(t, query, func(n int) {
		if n < 100 || started {
			return
		}
		started = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := alpha.moveOut(ctx, t, sink, "beta", toBeta); err != nil {
				done <- fmt.Errorf("the sink to beta: %w", err)
				return
			}
			// What beta's coordinator asks alpha for, for its copy of
			// the sink, once the partition runs at a partner: its
			// placement has no generation (it knows none of alpha's),
			// which its worker asks for as 1.
			read := func(producer, at string) error {
				rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
				defer rcancel()
				ref := &pb.StreamRef{Query: query, TaskId: producer, Consumer: "out", Generation: 1}
				err := firstBatchVia(rctx, t, alpha.nodes[0].FederationDataAddr(), beta, ref)
				select {
				case <-ended:
					if status.Code(err) == codes.DeadlineExceeded {
						// Routed, and waiting: the stream had ended (and
						// been taken) before this read.
						t.Logf("the stream ended before beta's read of %s: it was routed, and had nothing more", producer)
						return nil
					}
				default:
				}
				if err != nil {
					err = fmt.Errorf("beta reads %s (at %s) through alpha: %v", producer, at, err)
					t.Log(err) // the tail, which waits for the stream's end, fails later
					return err
				}
				return nil
			}
			// The other partition at beta itself: the same relay, back.
			if err := alpha.moveOut(ctx, t, sibling, "beta", toBeta); err != nil {
				done <- fmt.Errorf("the aggregate's other partition to beta: %w", err)
				return
			}
			if err := read(sibling, "beta"); err != nil {
				done <- err
				return
			}
			if err := alpha.moveOut(ctx, t, producer, "gamma", toGamma); err != nil {
				done <- fmt.Errorf("the aggregate's partition to gamma: %w", err)
				return
			}
			done <- read(producer, "gamma")
		}()
	})
	close(ended)
	if !started {
		t.Fatal("the query ended before the moves: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
}

// A move to beta whose end alpha never recorded (the write failed as its
// leader changed: the record stays "moving") and whose copy beta then
// dropped (alpha silent past the partner timeout), as a soak left it:
// alpha records the end, learns at the next sync that the copy is gone
// and places the task at home again, so a reconfiguration plan committed
// meanwhile does not wait for it for ever. Then a move whose waiter is
// gone before it asked beta at all (its leader lost leadership right
// after the plan): alpha rolls it back once its waiter's bound has passed
// (the task runs on its old copy). Before, both stayed "moving to org
// beta" for good.
func TestCrossOrgMoveLeftMovingIsSettled(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, contract := xorgPair(t, calmFailureDetection, func(c *Config) { c.Timings.MoveCatchUpBound = 2 * time.Second })
	const query = "xl"
	yaml := fmt.Sprintf(xorgRCQuery, query, 0) // endless
	if _, err := alpha.admin(0).SubmitQuery(ctxT(t, 20*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(yaml), Filename: query + ".yaml"}); err != nil {
		t.Fatal(err)
	}
	const moving, left = "xl/counts/p0/r0", "xl/counts/p1/r0"
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
	if err := alpha.moveOut(ctx, t, moving, "beta", contract); err != nil {
		t.Fatal(err)
	}
	rec, err := a.State().HostedTask(nil, "alpha", moving)
	if err != nil || rec == nil || rec.Phase != fsm.HostedRunning {
		t.Fatalf("after the move alpha's record is %+v (%v), want running", rec, err)
	}
	// The soak's state: the move's end unrecorded at alpha, the copy
	// dropped at beta (both as the code writes them).
	stale := *rec
	stale.Phase = fsm.HostedMoving
	if err := a.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: stale, IfGeneration: rec.Generation}); err != nil {
		t.Fatal(err)
	}
	if err := beta.nodes[0].applyCmd(ctx, fsm.DeleteHostedTaskType, fsm.DeleteHostedTaskRequest{ID: rec.ID, IfGeneration: rec.Generation}); err != nil {
		t.Fatal(err)
	}
	// A plan committed now waits for every task's acknowledgement.
	rcs := pb.NewReconfigServiceClient(alpha.conn(0, alpha.tokens[1]))
	v2 := strings.Replace(strings.Replace(yaml, `where: "n > 7"`, `where: "n >= 8"`, 1), `"total + 0"`, `"total * 1"`, 1)
	if _, err := rcs.UpdateQuery(ctxT(t, 20*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(v2), Filename: query + ".yaml", SwitchMarginMs: 300}); err != nil {
		t.Fatalf("update: %v", err)
	}
	var last string
	deadline := time.Now().Add(60 * time.Second)
	for {
		tk := alpha.task(t, moving)
		vs, err := rcs.QueryVersions(ctxT(t, 10*time.Second), &pb.QueryVersionsRequest{Name: query})
		plan := "no answer"
		if err == nil && len(vs.Plans) == 1 {
			p := vs.Plans[0]
			plan = fmt.Sprintf("plan %s, %d/%d tasks acknowledged", p.Phase, p.TasksAcked, p.Tasks)
			if tk.WorkerID != pw && tk.MovingFrom == "" && tk.State == states.TaskRunning && p.Phase != fsm.ReconfigLoading {
				break
			}
		}
		last = fmt.Sprintf("%s on %s generation %d (%s), at partners %v; %s", moving, tk.WorkerID, tk.Gen(), tk.State, a.TasksAtPartners(), plan)
		if time.Now().After(deadline) {
			t.Fatalf("60s after beta dropped the copy of a move whose end alpha had not recorded: %s", last)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A move left by its waiter before the host request: the plan and
	// the record MigrateTaskOut writes first, nothing more.
	tk := alpha.task(t, left)
	from, gen := tk.WorkerID, tk.Gen()
	if err := a.ensurePartnerWorker(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	out, err := a.submitPlan(ctx, fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove, StateIndex: a.State().LatestIndex(),
		Placements: []fsm.PlannedPlacement{{TaskID: left, FromWorker: from, FromGeneration: gen, ToWorker: pw, Live: true, CatchUp: true}}})
	if err != nil || len(out.Result.Refused) > 0 {
		t.Fatalf("the move's plan: %v %v", out, err)
	}
	orphan := fsm.HostedTask{ID: fsm.HostedTaskID("alpha", left), Owner: "alpha", Host: "beta", Contract: contract, Query: query, TaskID: left,
		Fragment: tk.Fragment, Partition: tk.Partition, Replica: tk.Replica, Generation: gen + 1, SourceGeneration: gen,
		Phase: fsm.HostedMoving, Since: time.Now().UnixNano()}
	if err := a.applyCmd(ctx, fsm.UpsertHostedTaskType, fsm.UpsertHostedTaskRequest{Task: orphan}); err != nil {
		t.Fatal(err)
	}
	// Its waiter would have rolled it back by the catch-up bound and three
	// partner timeouts; alpha does one partner timeout later.
	tm := a.cfg.Timings
	bound := tm.MoveCatchUpBound + 4*tm.PartnerTimeout
	deadline = time.Now().Add(bound + 30*time.Second)
	for {
		tk := alpha.task(t, left)
		if tk.WorkerID == from && tk.Gen() == gen && tk.MovingFrom == "" && a.TasksAtPartners()[left] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after a move's waiter was gone: the task is on %s generation %d moving from %q, at partners %v; want it back on %s generation %d",
				bound+30*time.Second, tk.WorkerID, tk.Gen(), tk.MovingFrom, a.TasksAtPartners(), from, gen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
