package coordinator

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
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

// A query's sink runs at beta and one partition of the aggregate it reads
// at gamma, as the MPA load manager of fedstream dev placed them: beta's
// copy of the sink reads the partition through alpha, which relays it
// from gamma's data port (beta and gamma never talk, and hold no
// contract together). Its results equal those of the query left alone.
// (Before, alpha refused beta's subscription, "no cross-org route for
// this stream: task ... is on no worker of org alpha", for as long as
// the two tasks stayed apart.)
func TestCrossOrgConsumerAndProducerAtTwoPartners(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, _, toBeta, toGamma := xorgTrio(t, calmFailureDetection)
	const limit = 100000
	want := xorgReference(t, limit)

	const query, sink, producer = "x3", "x3/out/p0/r0", "x3/counts/p0/r0"
	alpha.submit(t, query, 1, limit)
	var started bool
	done := make(chan error, 1)
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
			if err := alpha.moveOut(ctx, t, producer, "gamma", toGamma); err != nil {
				done <- fmt.Errorf("the aggregate's partition to gamma: %w", err)
				return
			}
			// What beta's coordinator asks alpha for, for its copy of
			// the sink, now that the partition runs at gamma.
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
			defer rcancel()
			ref := &pb.StreamRef{Query: query, TaskId: producer, Consumer: "out"}
			if err := firstBatchVia(rctx, t, alpha.nodes[0].FederationDataAddr(), beta, ref); err != nil {
				err = fmt.Errorf("beta reads %s (at gamma) through alpha: %v", producer, err)
				t.Log(err) // the tail, which waits for the stream's end, fails later
				done <- err
				return
			}
			done <- nil
		}()
	})
	if !started {
		t.Fatal("the query ended before the moves: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
}
