package coordinator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/internal/testport"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// testCluster is a real Raft + serf cluster of coordinators on loopback.
type testCluster struct {
	t       testing.TB
	org     string
	nodes   []*Server
	cfgs    []Config
	tokens  [2]string // join, admin
	timings Timings
	// ca is the org's CA: every node, test client and fake worker holds a
	// certificate it signed (the cluster runs mutual TLS as in production).
	ca *tlsutil.CA
	// csr is a certificate request test workers register with.
	csr []byte
}

// testCreds issues a certificate of ca for role/name and returns
// credentials holding it.
func testCreds(t testing.TB, ca *tlsutil.CA, role, name string) *tlsutil.Credentials {
	t.Helper()
	creds, err := tlsutil.New(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if role == "" {
		return creds
	}
	certPEM, keyPEM, err := ca.Issue(rpc.Identity{Org: ca.Org(), Role: role, Name: name}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := creds.SetCertificate(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	return creds
}

// testGossipKey is the serf key of every test cluster.
var testGossipKey = []byte("0123456789abcdef0123456789abcdef")

func testCA(t testing.TB, org string) *tlsutil.CA {
	t.Helper()
	ca, err := tlsutil.NewCA(org)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// testTimings keep tests quick but survive a loaded machine: a fake
// worker heartbeats every HeartbeatTTL/6, so it is marked down only if it
// (or the coordinator) is starved for over 1.6s; with a 600ms TTL a 0.5s
// stall of a loaded 2-core machine marked healthy workers down.
// minWait is the shortest deadline waitFor gives a condition.
const minWait = 30 * time.Second

func testTimings() Timings {
	tm := FastTimings()
	tm.HeartbeatTTL = 2 * time.Second
	tm.LeaderGrace = time.Second
	// Raft as deployed (DefaultTimings): with FastTimings' 200ms leader
	// lease, a leader of a loaded 2-core machine stepped down whenever a
	// stall kept it from hearing a quorum for 200ms, and tests' writes
	// failed 'leadership lost while committing'.
	d := DefaultTimings()
	tm.RaftHeartbeat, tm.RaftElection, tm.RaftLeaderLease = d.RaftHeartbeat, d.RaftElection, d.RaftLeaderLease
	tm.MaxWatchWait = 5 * time.Second
	return tm
}

// newTestCluster starts n coordinators that bootstrap together.
func newTestCluster(t testing.TB, n int, joinToken, adminToken string) *testCluster {
	t.Helper()
	return newTestClusterWith(t, n, joinToken, adminToken, testTimings())
}

func newTestClusterWith(t testing.TB, n int, joinToken, adminToken string, timings Timings, opts ...func(*Config)) *testCluster {
	t.Helper()
	return newOrgTestCluster(t, "acme", n, joinToken, adminToken, timings, opts...)
}

// newOrgTestCluster starts n coordinators of org, with a CA of their own.
func newOrgTestCluster(t testing.TB, org string, n int, joinToken, adminToken string, timings Timings, opts ...func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, org: org, tokens: [2]string{joinToken, adminToken}, timings: timings, ca: testCA(t, org)}
	csr, _, err := tlsutil.NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	c.csr = csr
	base := t.TempDir()
	for i := 0; i < n; i++ {
		// Port 0 everywhere: start picks the ports (see there).
		cfg := Config{
			Org: c.org, NodeID: fmt.Sprintf("c%d", i+1), DataDir: filepath.Join(base, fmt.Sprintf("c%d", i+1)),
			GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
			BootstrapExpect: n, JoinToken: joinToken, AdminToken: adminToken,
			Timings: c.timings,
			TLS:     testCreds(t, c.ca, rpc.RoleCoordinator, fmt.Sprintf("c%d", i+1)), CA: c.ca,
			GossipKey: testGossipKey,
		}
		if os.Getenv("FEDSTREAM_TEST_LOG") != "" {
			cfg.Logger = logging.Stderr("debug")
		}
		for _, o := range opts {
			o(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	c.nodes = make([]*Server, n)
	for i := range c.cfgs {
		if i > 0 {
			c.cfgs[i].Join = []string{c.cfgs[0].SerfAddr}
		}
		c.start(i)
	}
	// start set each node's Join to the nodes started before it, so the
	// first one has none; give it the others too. Without, a restarted c1
	// (after a graceful leave nobody reconnects to it) sat alone in serf
	// and never became a voter again (TestAdminAPILinearizable failed
	// "waiting for the restarted coordinator a voter again" whenever c1
	// was the leader it killed).
	for i := range c.cfgs {
		c.cfgs[i].Join = nil
		for j := range c.cfgs {
			if j != i {
				c.cfgs[i].Join = append(c.cfgs[i].Join, c.cfgs[j].SerfAddr)
			}
		}
	}
	t.Cleanup(c.shutdown)
	return c
}

func (c *testCluster) start(i int) {
	c.t.Helper()
	// An address not chosen yet gets a port below the ephemeral range:
	// a restart binds it again, and a port the OS had chosen could be
	// taken meanwhile by any outgoing connection (TestBootstrapMore-
	// CoordinatorsThanExpected failed "start serf ...: bind: address
	// already in use" under load).
	var unset []*string
	for _, a := range []*string{&c.cfgs[i].GRPCAddr, &c.cfgs[i].RaftAddr, &c.cfgs[i].SerfAddr} {
		if *a == "127.0.0.1:0" {
			unset = append(unset, a)
		}
	}
	for k, addr := range testport.Loopback(c.t, len(unset)) {
		*unset[k] = addr
	}
	srv, err := New(c.cfgs[i])
	if err != nil {
		c.t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		c.t.Fatalf("start %s: %v", c.cfgs[i].NodeID, err)
	}
	// A restart must come back on the same addresses: Raft's configuration
	// names the node by its address.
	c.cfgs[i].GRPCAddr, c.cfgs[i].RaftAddr, c.cfgs[i].SerfAddr = srv.GRPCAddr(), srv.RaftAddr(), srv.SerfAddr()
	var join []string
	for j := range c.cfgs {
		if j != i && c.cfgs[j].SerfAddr != "127.0.0.1:0" {
			join = append(join, c.cfgs[j].SerfAddr)
		}
	}
	c.cfgs[i].Join = join
	c.nodes[i] = srv
}

func (c *testCluster) stop(i int) {
	if c.nodes[i] != nil {
		_ = c.nodes[i].Shutdown()
		c.nodes[i] = nil
	}
}

// shutdown stops every node: all but one at once, then that one. A node
// takes a second or more to stop (serf's leave waits to propagate), which
// one after the other made the end of every 3- or 5-node test several
// seconds long. All at once is worse now and then: a node's leave
// message had no live member left to gossip to and waited serf's 5 s
// broadcast timeout. The node kept for last still hears the others leave,
// and then has nobody to tell.
func (c *testCluster) shutdown() {
	last := -1
	var wg sync.WaitGroup
	for i := range c.nodes {
		if c.nodes[i] == nil {
			continue
		}
		if last < 0 {
			last = i
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); c.stop(i) }()
	}
	wg.Wait()
	if last >= 0 {
		c.stop(last)
	}
}

// waitFor polls cond until it holds or the deadline passes. The deadline
// is at least minWait: a loaded 2-core machine (CI, parallel packages)
// can starve a cluster for seconds, and waiting longer only costs time
// when the test fails anyway (absence is checked with never, not here).
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	timeout = max(timeout, minWait)
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leader waits for a leader among the running nodes and returns its index.
func (c *testCluster) leader() int {
	c.t.Helper()
	idx := -1
	waitFor(c.t, 15*time.Second, "a leader", func() bool {
		for i, n := range c.nodes {
			if n != nil && n.IsLeader() {
				idx = i
				return true
			}
		}
		return false
	})
	return idx
}

// whileUnavailable makes call (each attempt with its own 10 s deadline)
// again while it answers Unavailable, as a client does with the same
// idempotency key: on a loaded machine leadership can change under a
// write ("leadership lost while committing"), even right after a test
// waited for a new leader. It returns the first other answer, or the
// last Unavailable after 30 s.
func whileUnavailable(t testing.TB, call func(ctx context.Context) error) error {
	t.Helper()
	return whileUnavailableFor(t, 10*time.Second, call)
}

// whileUnavailableFor is whileUnavailable with each attempt's deadline
// per.
func whileUnavailableFor(t testing.TB, per time.Duration, call func(ctx context.Context) error) error {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := call(ctxT(t, per))
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // back-off between retries, not synchronisation
	}
}

func (c *testCluster) follower() int {
	l := c.leader()
	for i, n := range c.nodes {
		if n != nil && i != l {
			return i
		}
	}
	c.t.Fatal("no follower")
	return -1
}

func (c *testCluster) conn(i int, token string) *grpc.ClientConn {
	return c.connAddr(c.cfgs[i].GRPCAddr, token)
}

// connAddr dials a coordinator with an org client certificate.
func (c *testCluster) connAddr(addr, token string) *grpc.ClientConn {
	return c.connAs(addr, token, testCreds(c.t, c.ca, rpc.RoleClient, "test"))
}

// connAs dials a coordinator presenting creds' certificate (none if creds
// has none), accepting only a coordinator of the org.
func (c *testCluster) connAs(addr, token string, creds *tlsutil.Credentials) *grpc.ClientConn {
	c.t.Helper()
	conn, err := rpc.Dial(addr, token, creds.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}}))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return conn
}

func (c *testCluster) admin(i int) pb.AdminServiceClient {
	return pb.NewAdminServiceClient(c.conn(i, c.tokens[1]))
}

// workers is a worker API client with a worker certificate; its Register
// sends a certificate request when the test gives none.
func (c *testCluster) workers(i int) pb.WorkerServiceClient {
	conn := c.connAs(c.cfgs[i].GRPCAddr, c.tokens[0], testCreds(c.t, c.ca, rpc.RoleWorker, "test"))
	return csrWorkerClient{WorkerServiceClient: pb.NewWorkerServiceClient(conn), csr: c.csr}
}

type csrWorkerClient struct {
	pb.WorkerServiceClient
	csr []byte
}

func (w csrWorkerClient) Register(ctx context.Context, req *pb.RegisterRequest, opts ...grpc.CallOption) (*pb.RegisterResponse, error) {
	if len(req.Csr) == 0 {
		req = proto.CloneOf(req)
		req.Csr = w.csr
	}
	return w.WorkerServiceClient.Register(ctx, req, opts...)
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// fakeWorkerPort numbers the fake workers' addresses. It is shared by the
// package's tests, which run in parallel, hence atomic. Nothing listens at
// these addresses; the ports lie below the OS's ephemeral range, so no
// port-0 listener of a parallel test can take one.
var fakeWorkerPort atomic.Int32

// fakeWorker registers through the real API and heartbeats until stopped.
type fakeWorker struct {
	id     string
	cancel context.CancelFunc
	done   chan struct{}
}

// startWorker registers a fake worker named name through node and keeps it
// alive with heartbeats. level, when given, is the data-plane level it
// states; without it the worker states none, as builds before levels did.
func (c *testCluster) startWorker(t testing.TB, node int, name string, level ...int32) *fakeWorker {
	t.Helper()
	// Each fake worker has its own address: a registration at the address
	// of another worker replaces it (a restarted process).
	addr := fmt.Sprintf("127.0.0.1:%d", 20000+fakeWorkerPort.Add(1))
	// Like a real worker, retry with the same idempotency key while the
	// coordinators answer Unavailable: on a loaded machine leadership can
	// change under a registration ("leadership lost while committing").
	req := &pb.RegisterRequest{Addr: addr, Cores: 4, Name: name, IdempotencyKey: name}
	if len(level) > 0 {
		req.DataplaneLevel = level[0]
	}
	var resp *pb.RegisterResponse
	if err := whileUnavailable(t, func(ctx context.Context) (err error) {
		resp, err = c.workers(node).Register(ctx, req)
		return err
	}); err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	var clients []pb.WorkerServiceClient
	for i := range c.cfgs {
		clients = append(clients, pb.NewWorkerServiceClient(c.connAddr(c.cfgs[i].GRPCAddr, c.tokens[0])))
	}
	ctx, cancel := context.WithCancel(context.Background())
	fw := &fakeWorker{id: resp.WorkerId, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(fw.done)
		tick := time.NewTicker(c.timings.HeartbeatTTL / 6)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				// Any coordinator will do: followers forward heartbeats.
				for _, cl := range clients {
					hctx, hc := context.WithTimeout(ctx, time.Second)
					_, err := cl.Heartbeat(hctx, &pb.HeartbeatRequest{WorkerId: fw.id})
					hc()
					if err == nil {
						break
					}
				}
			}
		}
	}()
	t.Cleanup(fw.stop)
	return fw
}

func (fw *fakeWorker) stop() {
	fw.cancel()
	<-fw.done
}
