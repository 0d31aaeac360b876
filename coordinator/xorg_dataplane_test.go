package coordinator

import (
	"crypto/tls"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// subscribeVia opens a subscription on a data port presenting creds'
// certificate, without checking the server, and returns the code of the
// first answer.
func subscribeVia(t *testing.T, addr string, creds *tlsutil.Credentials) codes.Code {
	t.Helper()
	cfg := creds.ClientConfig(tlsutil.Peer{})
	cfg.VerifyConnection = func(tls.ConnectionState) error { return nil }
	conn, err := rpc.Dial(addr, "", grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := ctxT(t, 10*time.Second)
	sub, err := pb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return status.Code(err)
	}
	if err := sub.Send(&pb.SubscribeRequest{Stream: &pb.StreamRef{Query: "q", TaskId: "q/f/p0/r0", Consumer: "g"}, Subscriber: "x"}); err != nil {
		_, err = sub.Recv()
		return status.Code(err)
	}
	_, err = sub.Recv()
	return status.Code(err)
}

// The cross-org data port admits a partner's coordinator only with an
// active contract and a certificate signed by the CA pinned for it: an
// org that is pinned but holds no contract, a certificate of another CA
// claiming the partner's org, a partner's worker certificate and this
// org's own coordinator are refused at the handshake; the contract
// partner reaches the relay, which routes nothing it hosts no task of.
func TestCrossOrgDataPortNeedsAContract(t *testing.T) {
	t.Parallel()
	alpha := newFedOrg(t, "alpha", 1, nil)
	beta := newFedOrg(t, "beta", 1, fedAddr(alpha))
	gamma := newFedOrg(t, "gamma", 1, fedAddr(alpha))
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, c := range []*testCluster{alpha, beta, gamma} {
			for i := range c.nodes {
				wg.Add(1)
				go func() { defer wg.Done(); c.stop(i) }()
			}
		}
		wg.Wait()
	})
	alpha.pin(beta)
	beta.pin(alpha)
	alpha.pin(gamma)
	gamma.pin(alpha)
	addr := alpha.nodes[alpha.leader()].FederationDataAddr()
	if addr == "" {
		t.Fatal("no cross-org data port")
	}
	betaCoord := testCreds(t, beta.ca, rpc.RoleCoordinator, "c1")
	if code := subscribeVia(t, addr, betaCoord); code != codes.Unavailable {
		t.Fatalf("beta before any contract: %v, want the handshake refused", code)
	}

	waitFor(t, 30*time.Second, "beta alive in alpha's pool", func() bool { return alpha.nodes[alpha.leader()].pool.Known("beta") })
	// Rolling upgrades: beta's coordinators advertise the cross-org
	// hosting level of their build, which alpha reads before moving a
	// task there during a reconfiguration.
	if l, seen := orgHostLevel(alpha.nodes[alpha.leader()].pool.members(), "beta"); !seen || l != hostLevel {
		t.Fatalf("beta's hosting level as alpha sees it: %d (seen %v), want %d", l, seen, hostLevel)
	}
	resp, err := alpha.fedClient(alpha.leader()).ProposeContract(ctxT(t, 20*time.Second), &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 5, ValidForMs: 3600_000, Direction: "out"})
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	var proposed federation.ContractDoc
	if err := json.Unmarshal(resp.ContractJson, &proposed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the proposal pending at beta", func() bool {
		for _, d := range contractsOf(t, beta.fedClient(beta.leader())) {
			if d.Terms.ID == proposed.Terms.ID && d.Status == federation.StatusPending {
				return true
			}
		}
		return false
	})
	if _, err := beta.fedClient(beta.leader()).AnswerContract(ctxT(t, 20*time.Second), &pb.AnswerContractRequest{Id: proposed.Terms.ID, Accept: true}); err != nil {
		t.Fatalf("accept: %v", err)
	}
	waitFor(t, 10*time.Second, "the contract active at alpha", func() bool {
		_, err := alpha.nodes[alpha.leader()].activeContractWith("beta", time.Now())
		return err == nil
	})

	// With the contract, beta's coordinator reaches the relay, which
	// knows no task q/f/p0/r0 (and would let beta read none it hosts
	// nothing of).
	if code := subscribeVia(t, addr, betaCoord); code != codes.NotFound {
		t.Fatalf("beta with a contract: %v, want NotFound from the relay", code)
	}
	// The org port's relay takes acknowledgements from workers only: a
	// client (even an admin) tails with no_ack.
	client := pb.NewDataPlaneClient(alpha.connAs(alpha.nodes[alpha.leader()].GRPCAddr(), alpha.tokens[1], testCreds(t, alpha.ca, rpc.RoleClient, "ops")))
	for noAck, want := range map[bool]codes.Code{false: codes.PermissionDenied, true: codes.NotFound} {
		sub, err := client.Subscribe(ctxT(t, 10*time.Second))
		if err == nil {
			err = sub.Send(&pb.SubscribeRequest{Stream: &pb.StreamRef{Query: "q", TaskId: "q/f/p0/r0", Consumer: "g"}, Subscriber: "x", NoAck: noAck})
		}
		if err == nil {
			_, err = sub.Recv()
		}
		if status.Code(err) != want {
			t.Fatalf("a client's subscription (no_ack %v) on the org port: %v, want %v", noAck, err, want)
		}
	}
	for name, creds := range map[string]*tlsutil.Credentials{
		"gamma's coordinator (pinned, no contract)": testCreds(t, gamma.ca, rpc.RoleCoordinator, "c1"),
		"beta from a CA that is not the pinned one": testCreds(t, testCA(t, "beta"), rpc.RoleCoordinator, "c1"),
		"beta's worker (not a coordinator)":         testCreds(t, beta.ca, rpc.RoleWorker, "w1"),
		"alpha's own coordinator":                   testCreds(t, alpha.ca, rpc.RoleCoordinator, "c9"),
	} {
		if code := subscribeVia(t, addr, creds); code != codes.Unavailable {
			t.Fatalf("%s: %v, want the handshake refused", name, code)
		}
	}
}
