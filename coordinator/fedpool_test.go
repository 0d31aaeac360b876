package coordinator

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// testFedKeyring is the federation pool's key in tests: not the orgs'
// gossip key (testGossipKey), as validation demands.
var testFedKeyring = []byte("federation-keyring-0123456789abc")

// newFedOrg starts org as an n-coordinator cluster that also joins the
// federation pool through join (nil: it is the first).
func newFedOrg(t *testing.T, org string, n int, join []string, opts ...func(*Config)) *testCluster {
	t.Helper()
	// Raft's production clocks: six coordinators share a loaded test
	// machine, and a leader lost mid-accept would only test retries.
	tm := testTimings()
	d := DefaultTimings()
	tm.RaftHeartbeat, tm.RaftElection, tm.RaftLeaderLease = d.RaftHeartbeat, d.RaftElection, d.RaftLeaderLease
	c := newOrgTestCluster(t, org, n, "join-"+org, "admin-"+org, tm, func(c *Config) {
		c.Federation = FederationConfig{SerfAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", Join: join, Keyring: testFedKeyring}
		for _, o := range opts {
			o(c)
		}
	})
	// Ports are chosen at start, so the org's later coordinators join the
	// first one's pool here (a deployment lists them in federation.join).
	// A join made again after an error: a starved machine times out
	// its TCP push (seen at load ~40: 'i/o timeout'); joining is
	// idempotent.
	for _, n := range c.nodes[1:] {
		err := retry.Do(ctxT(t, 30*time.Second), retry.Policy{Max: time.Second}, 5, func(_ int, err error, _ time.Duration) {
			t.Logf("%s: joining the pool: %v (retrying)", org, err)
		}, func(context.Context) error {
			_, err := n.pool.serf.Join(fedAddr(c), true)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func fedAddr(c *testCluster) []string {
	for _, n := range c.nodes {
		if n != nil {
			return []string{n.FederationSerfAddr()}
		}
	}
	return nil
}

func (c *testCluster) fedClient(i int) pb.FederationServiceClient {
	return pb.NewFederationServiceClient(c.conn(i, c.tokens[1]))
}

// members lists the federation pool as node i of c sees it.
func (c *testCluster) members(i int) []*pb.FederationMember {
	c.t.Helper()
	resp, err := pb.NewFederationPeerServiceClient(c.conn(i, c.tokens[1])).Members(ctxT(c.t, 10*time.Second), &pb.FederationMembersRequest{})
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Members
}

// orgKey waits for org c's identity and returns its public key.
func (c *testCluster) orgKey() string {
	c.t.Helper()
	l := c.leader()
	var key string
	waitFor(c.t, 20*time.Second, c.org+"'s identity", func() bool {
		k, ok, err := c.nodes[l].fed.IdentityKey()
		if err == nil && ok {
			key = ledger.EncodePublicKey(k)
		}
		return key != ""
	})
	return key
}

// pin pins org p's key and CA in c (as c's admin). p's key is read
// before any call deadline starts: orgKey can wait (up to 20 s) for p's
// leader to record its identity, and Go evaluates a call's context
// argument before its request, so a deadline made in the same expression
// was partly spent on that wait. A pin of the same key and CA again is a
// no-op (PinWithCA), so the call is retried, as a client would, while it
// meets Unavailable (a leader change under the write) or its own
// deadline (a commit stalled on a loaded machine: once, under load 20,
// beside five other coordinators).
func (c *testCluster) pin(p *testCluster) {
	c.t.Helper()
	req := &pb.PinKeyRequest{Org: p.org, Key: p.orgKey(), CaPem: p.ca.CertPEM}
	deadline := time.Now().Add(40 * time.Second)
	for {
		_, err := c.fedClient(c.leader()).PinKey(ctxT(c.t, 10*time.Second), req)
		if err == nil {
			return
		}
		if code := status.Code(err); (code != codes.Unavailable && code != codes.DeadlineExceeded) || time.Now().After(deadline) {
			c.t.Fatalf("%s pins %s: %v", c.org, p.org, err)
		}
		c.t.Logf("%s pins %s: %v; retrying", c.org, p.org, err)
		time.Sleep(100 * time.Millisecond) // back-off between retries, not synchronisation
	}
}

func contractsOf(t *testing.T, c pb.FederationServiceClient) []federation.ContractDoc {
	t.Helper()
	resp, err := c.ListContracts(ctxT(t, 10*time.Second), &pb.ListContractsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []federation.ContractDoc
	for _, b := range resp.ContractsJson {
		var d federation.ContractDoc
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// crossOrgDial dials a cross-org port presenting creds' certificate,
// without checking the server (the test is the server's refusal).
func crossOrgDial(t *testing.T, addr string, creds *tlsutil.Credentials) pb.FederationPeerServiceClient {
	t.Helper()
	cfg := creds.ClientConfig(tlsutil.Peer{})
	cfg.VerifyConnection = func(tls.ConnectionState) error { return nil }
	conn, err := rpc.Dial(addr, "", grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewFederationPeerServiceClient(conn)
}

// Two orgs, each a Raft cluster with its own CA, in one federation pool
// over loopback: members lists both with their leaders; after both
// operators pinned the other's key and CA, a contract proposed by one is
// accepted by the other and co-signed in both Rafts. A third org without
// a pin, a certificate from a wrong CA and a message that lies about its
// sender are refused on the cross-org port; a killed org shows failed.
func TestFederationPoolTwoOrgsContract(t *testing.T) {
	t.Parallel()
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	defer step("done")
	// alpha's first proposal commits and its answer is lost with the
	// leadership (loseFirstAnswer).
	var lost atomic.Int32
	var alphaRef atomic.Pointer[testCluster]
	alpha := newFedOrg(t, "alpha", 3, nil, loseFirstAnswer(fsm.UpsertContractType, &lost, &alphaRef))
	alphaRef.Store(alpha)
	beta := newFedOrg(t, "beta", 2, fedAddr(alpha))
	gamma := newFedOrg(t, "gamma", 1, fedAddr(alpha))
	// Stop every coordinator at once (runs before each cluster's own
	// cleanup, which then finds them stopped): each takes a second or two
	// to leave its pools, which in sequence would dominate the test.
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

	step("orgs started")
	al := alpha.leader()
	var last []*pb.FederationMember
	defer func() {
		if t.Failed() {
			t.Log("last members:", last)
		}
	}()
	// Each org elects (raft with deployed clocks; two coordinators
	// starting elections together split their votes, again and again on
	// a starved machine) and the pool gossips its leader tags: up to
	// 60 s (30 s ran out at load 40-60).
	waitFor(t, 60*time.Second, "all 6 coordinators alive in alpha's view, one leader per org", func() bool {
		ms := alpha.members(al)
		last = ms
		alive, leaders := 0, map[string]int{}
		for _, m := range ms {
			if m.Status == "alive" {
				alive++
			}
			if m.Leader {
				leaders[m.Org]++
			}
		}
		return len(ms) == 6 && alive == 6 && leaders["alpha"] == 1 && leaders["beta"] == 1 && leaders["gamma"] == 1
	})
	for _, m := range alpha.members(al) {
		if m.Addr == "" || m.Node == "" || m.Proto == "" {
			t.Fatalf("member without its tags: %+v", m)
		}
	}

	step("pool formed")
	// Before any pin, a proposal is refused with the reason. Each call
	// is made again while Unavailable: under load an org's leadership
	// changes every few seconds (raft steps down after a stall longer
	// than its lease), and a call held through an election is answered
	// "retry" (holdUntil).
	err := whileUnavailable(t, func(ctx context.Context) error {
		_, err := alpha.fedClient(al).ProposeContract(ctx, &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 5, ValidForMs: 3600_000})
		return err
	})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "pin") {
		t.Fatalf("proposal before pinning: %v", err)
	}

	step("unpinned proposal refused")
	alpha.pin(beta)
	beta.pin(alpha)
	// A CA that is not beta's is refused as beta's pin.
	if err := whileUnavailable(t, func(ctx context.Context) error {
		_, err := alpha.fedClient(al).PinKey(ctx, &pb.PinKeyRequest{Org: "beta", Key: beta.orgKey(), CaPem: gamma.ca.CertPEM})
		return err
	}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("pinning gamma's CA as beta's: %v", err)
	}

	// Made again while Unavailable, with the same request id: the first
	// attempt's answer is lost after its write committed, with alpha's
	// leadership (loseFirstAnswer), and on a loaded machine leadership
	// can change under a later one too. The retries store no second
	// proposal and answer the first.
	var resp *pb.ContractResponse
	req := &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 5, ValidForMs: 3600_000, Direction: "out", RequestId: "first-proposal"}
	attempts := 0
	// Each attempt has 20 s: it is forwarded to alpha's leader, commits
	// there, is delivered to beta's leader and commits there, each leader
	// possibly just elected (a call held while an org elects is answered
	// Unavailable with a quarter of its time left: holdUntil). With 10 s
	// it ran out (DeadlineExceeded) at load ~50.
	err = whileUnavailableFor(t, 20*time.Second, func(ctx context.Context) (err error) {
		attempts++
		resp, err = alpha.fedClient(0).ProposeContract(ctx, req)
		return err
	})
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	if lost.Load() != 1 || attempts < 2 {
		t.Fatalf("the first proposal's answer was not lost (%d attempts): the test tests nothing", attempts)
	}
	var proposed federation.ContractDoc
	if err := json.Unmarshal(resp.ContractJson, &proposed); err != nil {
		t.Fatal(err)
	}
	if cs := contractsOf(t, alpha.fedClient(alpha.leader())); len(cs) != 1 || cs[0].Terms.ID != proposed.Terms.ID {
		t.Fatalf("alpha holds %+v after %d attempts of one proposal, want only %s", cs, attempts, proposed.Terms.ID)
	}
	// The same request id with other terms: refused, naming it.
	other := proto.Clone(req).(*pb.ProposeContractRequest)
	other.MaxLoad = 6
	if err := whileUnavailable(t, func(ctx context.Context) error {
		_, err := alpha.fedClient(0).ProposeContract(ctx, other)
		return err
	}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"first-proposal"`) {
		t.Fatalf("other terms under the same request id: %v", err)
	}
	step("proposed")
	bl := beta.leader()
	waitFor(t, 10*time.Second, "the proposal pending at beta", func() bool {
		for _, d := range contractsOf(t, beta.fedClient(bl)) {
			if d.Terms.ID == proposed.Terms.ID && d.Status == federation.StatusPending {
				return true
			}
		}
		return false
	})
	// An acceptance retried after a lost answer answers the first. Each
	// attempt has 20 s: it commits in beta (the pin), is delivered to
	// alpha's leader and committed there, then in beta again.
	if err := whileUnavailableFor(t, 20*time.Second, func(ctx context.Context) error {
		_, err := beta.fedClient(bl).AnswerContract(ctx, &pb.AnswerContractRequest{Id: proposed.Terms.ID, Accept: true})
		return err
	}); err != nil {
		t.Fatalf("accept: %v", err)
	}
	step("accepted")
	for _, org := range []*testCluster{alpha, beta} {
		l := org.leader()
		cs := contractsOf(t, org.fedClient(l))
		if len(cs) != 1 || cs[0].Status != federation.StatusActive || len(cs[0].Signed.Signatures) != 2 {
			t.Fatalf("%s: contracts %+v", org.org, cs)
		}
		es, err := org.nodes[l].fed.Entries()
		if err != nil {
			t.Fatal(err)
		}
		var contract *ledger.Entry
		for i := range es {
			if es[i].Record.Kind == ledger.KindContract {
				contract = &es[i]
			}
		}
		if contract == nil || len(contract.Signatures) != 2 || contract.Signatures[0].Org != "alpha" || contract.Signatures[1].Org != "beta" {
			t.Fatalf("%s: no co-signed contract in the ledger: %+v", org.org, es)
		}
		rep, err := org.nodes[l].fed.Verify()
		if err != nil || !rep.Valid {
			t.Fatalf("%s: ledger verify %+v %v", org.org, rep, err)
		}
	}

	step("co-signed in both")
	// gamma pinned beta, beta did not pin gamma: beta's cross-org port
	// refuses gamma at the handshake, so its proposal never arrives.
	gamma.pin(beta)
	gl := gamma.leader()
	if _, err := gamma.fedClient(gl).ProposeContract(ctxT(t, 20*time.Second), &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 5, ValidForMs: 3600_000}); err == nil {
		t.Fatal("gamma's proposal reached beta, which never pinned gamma")
	}
	if cs := contractsOf(t, beta.fedClient(bl)); len(cs) != 1 {
		t.Fatalf("beta stored a contract from gamma: %+v", cs)
	}

	step("gamma refused")
	// Certificates presented directly to every cross-org port of beta:
	// gamma's (no pin), one naming alpha but from another CA, and a real
	// alpha coordinator whose message claims to come from gamma.
	fakeAlphaCA := testCA(t, "alpha")
	alphaCert := testCreds(t, alpha.ca, rpc.RoleCoordinator, "c1")
	msg, _ := json.Marshal(federation.Message{Kind: federation.MsgReject, From: "alpha", Signed: &proposed.Signed})
	lie, _ := json.Marshal(federation.Message{Kind: federation.MsgReject, From: "gamma", Signed: &proposed.Signed})
	for i, n := range beta.nodes {
		addr := n.FederationGRPCAddr()
		for name, creds := range map[string]*tlsutil.Credentials{
			"gamma's coordinator (no pinned CA)": testCreds(t, gamma.ca, rpc.RoleCoordinator, "c1"),
			"alpha from a wrong CA":              testCreds(t, fakeAlphaCA, rpc.RoleCoordinator, "c1"),
			"alpha's client (not a coordinator)": testCreds(t, alpha.ca, rpc.RoleClient, "c1"),
			"beta's own coordinator":             testCreds(t, beta.ca, rpc.RoleCoordinator, "c9"),
		} {
			_, err := crossOrgDial(t, addr, creds).Deliver(ctxT(t, 10*time.Second), &pb.FederationEnvelope{MessageJson: msg})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("beta node %d, %s: %v, want the handshake refused", i, name, err)
			}
		}
		_, err := crossOrgDial(t, addr, alphaCert).Deliver(ctxT(t, 10*time.Second), &pb.FederationEnvelope{MessageJson: lie})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("beta node %d: a message claiming another sender: %v", i, err)
		}
		// The real alpha, on a follower or the leader, reaches the
		// leader's Org.Receive, which refuses to reject an active
		// contract.
		// A leader change under load makes a forwarded call answer
		// Unavailable ("retry"): a partner retries, so does the test.
		var out *pb.FederationEnvelope
		err = retry.Do(ctxT(t, 40*time.Second), retry.Policy{Max: time.Second}, 0, func(_ int, err error, _ time.Duration) {
			t.Logf("beta node %d: alpha's delivery: %v (retrying)", i, err)
		}, func(ctx context.Context) error {
			var err error
			out, err = crossOrgDial(t, addr, alphaCert).Deliver(ctx, &pb.FederationEnvelope{MessageJson: msg})
			if status.Code(err) == codes.Unavailable {
				return err
			}
			return retry.Permanent(err)
		})
		if err != nil {
			t.Fatalf("beta node %d: alpha's delivery: %v", i, err)
		}
		var ans federation.Message
		if err := json.Unmarshal(out.MessageJson, &ans); err != nil || ans.Kind != federation.MsgRefused || ans.From != "beta" {
			t.Fatalf("beta node %d: answer %s %v", i, out.MessageJson, err)
		}
	}
	step("cross-org port refusals")
	// The org port refuses a partner's certificate too (org CA only).
	if _, err := pb.NewFederationPeerServiceClient(beta.connAs(beta.nodes[bl].GRPCAddr(), "", alphaCert)).Deliver(ctxT(t, 10*time.Second), &pb.FederationEnvelope{MessageJson: msg, FromOrg: "alpha"}); err == nil {
		t.Fatal("beta's org port took a delivery from alpha's certificate")
	}
	if cs := contractsOf(t, beta.fedClient(bl)); len(cs) != 1 || cs[0].Status != federation.StatusActive {
		t.Fatalf("beta's contracts changed: %+v", cs)
	}

	// The calling side checks the partner too: a server showing a
	// certificate of another "beta" CA (an impostor at an address the pool
	// advertised) is refused before anything is sent. The impostor takes
	// any client, so a call that got through would meet Unimplemented.
	impostor := testCreds(t, testCA(t, "beta"), rpc.RoleCoordinator, "c1")
	icfg := impostor.ServerConfig(tlsutil.Peer{}, true)
	icfg.ClientAuth, icfg.ClientCAs, icfg.VerifyConnection = tls.RequestClientCert, nil, nil
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	isrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(icfg)))
	go func() { _ = isrv.Serve(lis) }()
	defer isrv.Stop()
	iconn, err := alpha.nodes[alpha.leader()].pool.conn("beta", "c1", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewFederationPeerServiceClient(iconn).Deliver(ctxT(t, 10*time.Second), &pb.FederationEnvelope{MessageJson: msg}); status.Code(err) != codes.Unavailable {
		t.Fatalf("alpha called an impostor of beta: %v", err)
	}

	step("org port refusal")
	// gamma dies without leaving (its pool gossip stops as in a crash).
	for _, n := range gamma.nodes {
		if err := n.pool.serf.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	gamma.shutdown()
	waitFor(t, 30*time.Second, "gamma failed in alpha's view", func() bool {
		for _, m := range alpha.members(alpha.leader()) {
			if m.Org == "gamma" && (m.Status != "failed" || m.Leader) {
				return false
			}
		}
		return true
	})
	if alpha.nodes[alpha.leader()].pool.Known("gamma") {
		t.Fatal("a failed org is still known")
	}
	t.Log("members after gamma failed:", alpha.members(alpha.leader()))
}

// Federation settings that cannot work are refused with the reason.
func TestFederationConfigValidation(t *testing.T) {
	t.Parallel()
	ca := testCA(t, "acme")
	base := func() Config {
		return Config{Org: "acme", NodeID: "c1", DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
			TLS: testCreds(t, ca, rpc.RoleCoordinator, "c1"), GossipKey: testGossipKey,
			Federation: FederationConfig{SerfAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", Keyring: testFedKeyring}}
	}
	for name, tc := range map[string]struct {
		mod  func(*Config)
		want string
	}{
		"same key as the org pool": {func(c *Config) { c.Federation.Keyring = testGossipKey }, "must differ"},
		"no keyring":               {func(c *Config) { c.Federation.Keyring = nil }, "keyring-file is required"},
		"no cross-org port":        {func(c *Config) { c.Federation.GRPCAddr = "" }, "federation.grpc-addr is required"},
		"join without bind":        {func(c *Config) { c.Federation.SerfAddr = "" }, "without federation.bind"},
		"utilisation of 1":         {func(c *Config) { c.Federation.Load.Utilisation = 1 }, "federation.load: invalid load manager setting: target utilisation 1"},
		"unknown cost function":    {func(c *Config) { c.Federation.Load.Cost = "linear" }, `cost function "linear"`},
		"plaintext": {func(c *Config) {
			c.TLS, c.InsecurePlaintext = nil, true
		}, "needs mutual TLS"},
	} {
		cfg := base()
		tc.mod(&cfg)
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := New(base()); err != nil {
		t.Fatalf("valid federation config refused: %v", err)
	}
}
