package coordinator

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// newUnstartedCluster prepares n coordinators (ids c1..cN, mutual TLS,
// gossip key) that bootstrap with bootstrap_expect expect, and starts
// none: the test decides the order. c.start(i) joins node i to every node
// started before it.
func newUnstartedCluster(t *testing.T, n, expect int) *testCluster {
	t.Helper()
	c := &testCluster{t: t, org: "acme", timings: testTimings(), ca: testCA(t, "acme")}
	csr, _, err := tlsutil.NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	c.csr = csr
	base := t.TempDir()
	for i := range n {
		id := fmt.Sprintf("c%d", i+1)
		cfg := Config{
			Org: c.org, NodeID: id, DataDir: filepath.Join(base, id),
			GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
			BootstrapExpect: expect, Timings: c.timings,
			TLS: testCreds(t, c.ca, rpc.RoleCoordinator, id), CA: c.ca, GossipKey: testGossipKey,
		}
		if os.Getenv("FEDSTREAM_TEST_LOG") != "" {
			cfg.Logger = logging.Stderr("debug")
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	c.nodes = make([]*Server, n)
	t.Cleanup(c.shutdown)
	return c
}

// leaderWatch samples every node ever started for leadership claims over
// the whole test: a node that says it is leader in term T. Raft allows one
// leader per term; two nodes claiming the same term means two clusters
// (or a broken election). A claim counts once seen in two consecutive
// samples of that node, so the instant in which a deposed leader has
// already taken the new term but not yet stepped down is not mistaken
// for a claim.
type leaderWatch struct {
	mu      sync.Mutex
	servers []*Server
	claims  map[uint64]map[string]bool // term -> ids that led in it
	stop    context.CancelFunc
	done    chan struct{}
}

func watchLeaders(t *testing.T) *leaderWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &leaderWatch{claims: map[uint64]map[string]bool{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last := map[*Server]uint64{} // term of the node's previous leader sample
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			w.mu.Lock()
			for _, s := range w.servers {
				term := s.raft.CurrentTerm()
				if s.raft.State() != raft.Leader || s.raft.CurrentTerm() != term {
					delete(last, s)
					continue
				}
				if prev, ok := last[s]; ok && prev == term {
					if w.claims[term] == nil {
						w.claims[term] = map[string]bool{}
					}
					w.claims[term][s.NodeID()] = true
				}
				last[s] = term
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *leaderWatch) add(s *Server) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.servers = append(w.servers, s)
}

func (w *leaderWatch) halt() {
	w.stop()
	<-w.done
}

// check fails the test if two nodes ever led in the same term.
func (w *leaderWatch) check(t *testing.T) {
	t.Helper()
	w.halt()
	terms := slices.Sorted(maps.Keys(w.claims))
	for _, term := range terms {
		ids := slices.Sorted(maps.Keys(w.claims[term]))
		if len(ids) > 1 {
			t.Errorf("term %d had %d leaders: %v", term, len(ids), ids)
		}
	}
	t.Logf("leaders by term: %v", w.claims)
}

// startWatched starts node i, joined to every node started before, and
// adds it to the watch.
func (c *testCluster) startWatched(w *leaderWatch, i int) {
	c.t.Helper()
	var join []string
	for j, cfg := range c.cfgs {
		if j != i && cfg.SerfAddr != "127.0.0.1:0" {
			join = append(join, cfg.SerfAddr)
		}
	}
	c.cfgs[i].Join = join
	c.start(i)
	w.add(c.nodes[i])
}

// raftVoters is node i's latest Raft configuration: the sorted ids of its
// voters, and of its other servers.
func (c *testCluster) raftVoters(i int) (voters, others []string) {
	cf := c.nodes[i].raft.GetConfiguration()
	if cf.Error() != nil {
		return nil, nil
	}
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
		} else {
			others = append(others, string(s.ID))
		}
	}
	sort.Strings(voters)
	sort.Strings(others)
	return voters, others
}

// waitOneCluster waits until every running node has exactly one leader in
// view, that leader's duties run, and every node's configuration makes
// all running nodes voters.
func (c *testCluster) waitOneCluster(timeout time.Duration) {
	c.t.Helper()
	var want []string
	for i, n := range c.nodes {
		if n != nil {
			want = append(want, c.cfgs[i].NodeID)
		}
	}
	sort.Strings(want)
	var why string
	if !pollUntil(timeout, func() bool {
		leaders := 0
		for i, n := range c.nodes {
			if n == nil {
				continue
			}
			if n.IsLeader() && n.leading.Load() {
				leaders++
			}
			voters, others := c.raftVoters(i)
			if !slices.Equal(voters, want) || len(others) > 0 {
				why = fmt.Sprintf("%s has voters %v and others %v, want voters %v", c.cfgs[i].NodeID, voters, others, want)
				return false
			}
			if !n.hasRaftState() {
				why = c.cfgs[i].NodeID + " has no raft state"
				return false
			}
		}
		why = fmt.Sprintf("%d leaders", leaders)
		return leaders == 1
	}) {
		c.t.Fatalf("timed out after %v waiting for one cluster of %v: %s", timeout, want, why)
	}
}

// bootstrappers lists the nodes that bootstrapped a cluster themselves.
func (c *testCluster) bootstrappers() []string {
	var out []string
	for i, n := range c.nodes {
		if n != nil && n.selfBootstrapped.Load() {
			out = append(out, c.cfgs[i].NodeID)
		}
	}
	return out
}

// Five coordinators with bootstrap_expect 3 end in one cluster of five
// voters with one leader and one state, whatever order they start in:
//
//   - together: all five at once; they must agree on one bootstrap set.
//   - late: c3-c5 form the cluster; c1 and c2 (which sort first) start
//     once it has a leader and are added by it.
//   - late-leaderless: c3-c5 form the cluster, then c4 and c5 crash, so
//     c3 alone has the cluster's state and no leader; c1 and c2 start and
//     see three coordinators that expect 3. They must ask c3, learn that a
//     cluster exists and wait; c4 and c5 come back from their data dirs
//     and the cluster's leader adds c1 and c2. Before the probe, c1 and c2
//     bootstrapped {c1, c2, c3} and elected a leader of a second cluster.
func TestBootstrapMoreCoordinatorsThanExpected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		first      []int // started first, until the cluster has a leader
		leaderless bool  // then c4 and c5 crash while c1 and c2 start
	}{
		{name: "together", first: []int{0, 1, 2, 3, 4}},
		{name: "late", first: []int{2, 3, 4}},
		{name: "late-leaderless", first: []int{2, 3, 4}, leaderless: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newUnstartedCluster(t, 5, 3)
			w := watchLeaders(t)
			for _, i := range tc.first {
				c.startWatched(w, i)
			}
			c.leader()
			if tc.leaderless {
				// Wait until c3-c5 all hold the configuration, then crash
				// c4 and c5 (no serf leave: they stay voters).
				waitFor(t, 30*time.Second, "c3-c5 in every configuration", func() bool {
					for i := 2; i < 5; i++ {
						if v, _ := c.raftVoters(i); !slices.Equal(v, []string{"c3", "c4", "c5"}) {
							return false
						}
					}
					return true
				})
				for _, i := range []int{3, 4} {
					_ = c.nodes[i].serf.Shutdown()
					c.stop(i)
				}
				// If c3 led, it steps down once its lease runs out; until
				// then it could still add c1 and c2 itself.
				waitFor(t, 20*time.Second, "c3 without a leader", func() bool {
					_, id := c.nodes[2].raft.LeaderWithID()
					return !c.nodes[2].IsLeader() && id == ""
				})
				c.startWatched(w, 0)
				c.startWatched(w, 1)
				waitFor(t, 20*time.Second, "c1 and c2 seeing c1-c3 in serf", func() bool {
					for _, i := range []int{0, 1} {
						for _, name := range []string{"c1.acme", "c2.acme", "c3.acme"} {
							if !c.serfSees(i, name) {
								return false
							}
						}
					}
					return true
				})
				never(t, 3*time.Second, "c1 or c2 bootstrapped while a coordinator they see holds a cluster's state", func() bool {
					return c.nodes[0].selfBootstrapped.Load() || c.nodes[1].selfBootstrapped.Load() ||
						c.nodes[0].hasRaftState() || c.nodes[1].hasRaftState()
				})
				c.startWatched(w, 3)
				c.startWatched(w, 4)
			}
			for i := range c.nodes {
				if c.nodes[i] == nil {
					c.startWatched(w, i)
				}
			}
			c.waitOneCluster(60 * time.Second)
			got := c.bootstrappers()
			t.Logf("bootstrapped by %v", got)
			if len(tc.first) < 5 && (slices.Contains(got, "c1") || slices.Contains(got, "c2")) {
				// c1 and c2 started after the cluster formed: they join.
				t.Errorf("nodes that bootstrapped: %v, want neither c1 nor c2", got)
			}
			// One replicated state: a write through each node reaches all.
			for i := range c.nodes {
				submit(t, c.admin(i), fmt.Sprintf("q%d", i), 1)
			}
			waitSameState(t, c, 30*time.Second)
			if got := queryNames(t, c.admin(c.leader())); len(got) != 5 {
				t.Fatalf("queries %v, want 5", got)
			}
			w.check(t)
		})
	}
}

// A follower that loses its data dir and restarts with the same id rejoins
// the same cluster: it does not bootstrap (the others answer that a
// cluster exists), the leader keeps it ("crashed": it never left, so it is
// still in the configuration and Raft's replication refills its empty
// log), moves it ("crashed-new-address": it comes back on another Raft
// port, which the leader puts in the configuration once the node proves
// its id there) or adds it again ("left": it left serf, so the leader
// removed it), and it ends with the same state as the others. No term
// ever has two leaders. Before the probe the wiped node bootstrapped a
// configuration of its own; before the address update the moved node
// never caught up.
func TestWipedCoordinatorRejoins(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		crash, newAddr bool
	}{
		{name: "crashed", crash: true},
		{name: "crashed-new-address", crash: true, newAddr: true},
		{name: "left"},
	} {
		crash := tc.crash
		t.Run(tc.name, func(t *testing.T) {
			c := newUnstartedCluster(t, 3, 3)
			w := watchLeaders(t)
			for i := range c.nodes {
				c.startWatched(w, i)
			}
			c.waitOneCluster(30 * time.Second)
			l := c.leader()
			submit(t, c.admin(l), "before", 1)
			waitSameState(t, c, 30*time.Second)

			f := (l + 1) % 3
			id := c.cfgs[f].NodeID
			if crash {
				// No serf leave: the others see it fail, and it stays a
				// voter (DeadVoterTimeout is long).
				_ = c.nodes[f].serf.Shutdown()
			}
			c.stop(f)
			if !crash {
				waitFor(t, 20*time.Second, id+" removed after leaving", func() bool { return !c.raftServers(l)[id] })
			} else if !c.raftServers(l)[id] {
				t.Fatalf("%s removed from the configuration after a crash", id)
			}
			if err := os.RemoveAll(c.cfgs[f].DataDir); err != nil {
				t.Fatal(err)
			}

			if tc.newAddr {
				c.cfgs[f].RaftAddr = "127.0.0.1:0"
			}
			c.startWatched(w, f)
			c.waitOneCluster(60 * time.Second)
			if c.nodes[f].selfBootstrapped.Load() {
				t.Fatalf("%s bootstrapped a cluster of its own after losing its data dir", id)
			}
			// Its state is the cluster's, including what was written
			// before it lost its data dir, and it follows new writes.
			submit(t, c.admin(f), "after", 1)
			waitSameState(t, c, 30*time.Second)
			names := queryNames(t, c.admin(f))
			sort.Strings(names)
			if !slices.Equal(names, []string{"after", "before"}) {
				t.Fatalf("queries seen through %s: %v, want [after before]", id, names)
			}
			w.check(t)
		})
	}
}

// Only a coordinator of the org may ask another for its Raft state: a
// client certificate is refused (even with the admin token, even in dev
// mode), as is a worker's, and a coordinator certificate of another CA
// fails the TLS handshake; the org's own coordinator certificate gets an
// answer (the control).
func TestRaftStateOnlyForCoordinators(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "jt", "at")
	c.leader()
	ask := func(creds *tlsutil.Credentials, token string) (*pb.RaftStateResponse, error) {
		conn := c.connAs(c.cfgs[0].GRPCAddr, token, creds)
		return pb.NewCoordinatorPeerServiceClient(conn).RaftState(ctxT(t, 5*time.Second), &pb.RaftStateRequest{})
	}
	if _, err := ask(testCreds(t, c.ca, rpc.RoleClient, "admin"), "at"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("client certificate with the admin token: %v, want PermissionDenied", err)
	}
	if _, err := ask(testCreds(t, c.ca, rpc.RoleWorker, "w1"), "jt"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("worker certificate: %v, want PermissionDenied", err)
	}
	if _, err := ask(testCreds(t, testCA(t, "acme"), rpc.RoleCoordinator, "c2"), ""); err == nil {
		t.Error("coordinator certificate of another CA: answered")
	}
	resp, err := ask(testCreds(t, c.ca, rpc.RoleCoordinator, "c2"), "")
	if err != nil {
		t.Fatalf("the org's coordinator certificate: %v", err)
	}
	if resp.NodeId != "c1" || resp.LastIndex == 0 || resp.LeaderId != "c1" || !slices.Equal(resp.Configuration, []string{"c1"}) {
		t.Fatalf("raft state %v", resp)
	}

	// Dev mode (no tokens) accepts every client, but not here.
	dev := newTestCluster(t, 1, "", "")
	dev.leader()
	conn := dev.connAs(dev.cfgs[0].GRPCAddr, "", testCreds(t, dev.ca, rpc.RoleClient, "admin"))
	if _, err := pb.NewCoordinatorPeerServiceClient(conn).RaftState(ctxT(t, 5*time.Second), &pb.RaftStateRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("dev mode, client certificate: %v, want PermissionDenied", err)
	}
}

// In plaintext mode with tokens configured, coordinators cannot prove who
// they are, yet must still be able to ask each other before bootstrapping:
// three of them form one cluster (the probe is not refused for lack of a
// token, which would keep them from ever bootstrapping).
func TestPlaintextCoordinatorsBootstrap(t *testing.T) {
	t.Parallel()
	c := newUnstartedCluster(t, 3, 3)
	w := watchLeaders(t)
	for i := range c.cfgs {
		c.cfgs[i].TLS, c.cfgs[i].CA, c.cfgs[i].GossipKey = nil, nil, nil
		c.cfgs[i].InsecurePlaintext = true
		c.cfgs[i].JoinToken, c.cfgs[i].AdminToken = "jt", "at"
	}
	for i := range c.nodes {
		c.startWatched(w, i)
	}
	c.waitOneCluster(60 * time.Second)
	w.check(t)
}
