package coordinator

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// fakeMember is a serf member on loopback that claims whatever tags the
// test gives it, as an attacker holding (or not) the gossip key would.
func fakeMember(t *testing.T, name string, key []byte, tags map[string]string) *serf.Serf {
	t.Helper()
	conf := serf.DefaultConfig()
	conf.Init()
	conf.NodeName = name
	conf.Tags = tags
	ml := memberlist.DefaultLocalConfig()
	ml.BindAddr, ml.BindPort = "127.0.0.1", 0
	ml.AdvertiseAddr = "127.0.0.1"
	ml.SecretKey = key
	ml.GossipInterval = 100 * time.Millisecond
	ml.ProbeInterval, ml.ProbeTimeout = 400*time.Millisecond, 200*time.Millisecond
	ml.Logger = logging.StdLogger(logging.Discard(), "memberlist")
	conf.MemberlistConfig = ml
	conf.Logger = logging.StdLogger(logging.Discard(), "serf")
	s, err := serf.Create(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

func (c *testCluster) raftServers(i int) map[string]bool {
	out := map[string]bool{}
	cf := c.nodes[i].raft.GetConfiguration()
	if cf.Error() != nil {
		return out
	}
	for _, s := range cf.Configuration().Servers {
		out[string(s.ID)] = true
	}
	return out
}

func (c *testCluster) serfSees(i int, name string) bool {
	for _, m := range c.nodes[i].serf.Members() {
		if m.Name == name && m.Status == serf.StatusAlive {
			return true
		}
	}
	return false
}

// never checks that cond stays false for d (an absence can only be
// observed for a while).
func never(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			t.Fatal(what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A serf member without the org's gossip key, or with another key, cannot
// join; the same member with the key can (the control).
func TestGossipNeedsTheKey(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	c.leader()
	tags := map[string]string{tagOrg: "acme", tagRole: roleCoordinator, tagID: "c9"}
	for _, tc := range []struct {
		name string
		key  []byte
	}{{"nokey", nil}, {"wrongkey", []byte("fedcba9876543210fedcba9876543210")}} {
		fake := fakeMember(t, tc.name, tc.key, tags)
		if _, err := fake.Join([]string{c.cfgs[0].SerfAddr}, true); err == nil {
			t.Errorf("%s: join succeeded", tc.name)
		}
		never(t, 2*time.Second, tc.name+": the org's serf lists the member", func() bool { return c.serfSees(0, tc.name) })
	}
	good := fakeMember(t, "withkey", testGossipKey, tags)
	if _, err := good.Join([]string{c.cfgs[0].SerfAddr}, true); err != nil {
		t.Fatalf("control: join with the key: %v", err)
	}
	waitFor(t, 10*time.Second, "the member with the key in serf", func() bool { return c.serfSees(0, "withkey") })
}

// A member with the gossip key that claims to be a coordinator but cannot
// show the coordinator certificate of its id never becomes a voter; a real
// coordinator joining at the same time does (the control). A voter that
// leaves is removed; one that fails is removed after DeadVoterTimeout.
func TestOnlyCertifiedCoordinatorsVote(t *testing.T) {
	t.Parallel()
	tm := testTimings()
	tm.DeadVoterTimeout = 2 * time.Second
	c := newTestClusterWith(t, 3, "", "", tm)
	l := c.leader()

	// The impostor's Raft address answers TLS with a certificate of the
	// org's CA, but for a client, and another with a certificate of
	// another CA naming the coordinator it claims to be.
	for i, creds := range []*tlsutil.Credentials{
		testCreds(t, c.ca, rpc.RoleClient, "c9"),
		testCreds(t, testCA(t, "acme"), rpc.RoleCoordinator, "c8"),
	} {
		id := fmt.Sprintf("c%d", 9-i)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lis.Close() })
		srv := grpc.NewServer(creds.ServerOption(tlsutil.Peer{}, true))
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		fake := fakeMember(t, id+".acme", testGossipKey, map[string]string{
			tagOrg: "acme", tagRole: roleCoordinator, tagID: id, tagRaft: lis.Addr().String(), tagGRPC: lis.Addr().String(), tagExpect: "0",
		})
		if _, err := fake.Join([]string{c.cfgs[0].SerfAddr}, true); err != nil {
			t.Fatal(err)
		}
	}
	// The control: a real coordinator c4 with its certificate.
	c.cfgs = append(c.cfgs, Config{
		Org: c.org, NodeID: "c4", DataDir: c.t.(*testing.T).TempDir(),
		GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
		Join: []string{c.cfgs[0].SerfAddr}, Timings: tm, GossipKey: testGossipKey,
		TLS: testCreds(t, c.ca, rpc.RoleCoordinator, "c4"), CA: c.ca,
	})
	c.nodes = append(c.nodes, nil)
	c.start(3)
	waitFor(t, 20*time.Second, "c4 a voter", func() bool { return c.raftServers(l)["c4"] })
	waitFor(t, 10*time.Second, "the impostors in serf", func() bool { return c.serfSees(l, "c9.acme") && c.serfSees(l, "c8.acme") })
	never(t, 3*time.Second, "an impostor became a voter", func() bool {
		s := c.raftServers(l)
		return s["c9"] || s["c8"]
	})

	// c4 fails without leaving (its serf stops answering): removed after
	// the timeout, not before.
	failedAt := time.Now()
	_ = c.nodes[3].serf.Shutdown()
	c.stop(3)
	waitFor(t, 30*time.Second, "the failed voter c4 removed", func() bool { return !c.raftServers(l)["c4"] })
	if d := time.Since(failedAt); d < tm.DeadVoterTimeout {
		t.Fatalf("failed voter removed after %v, before the %v timeout", d, tm.DeadVoterTimeout)
	}
	if got := c.raftServers(l); len(got) != 3 {
		t.Fatalf("raft configuration %v, want c1-c3", got)
	}
}

// A voter that leaves gracefully is removed at once.
func TestLeftVoterIsRemoved(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, "", "")
	l := c.leader()
	f := (l + 1) % 3
	c.stop(f)
	waitFor(t, 20*time.Second, "the departed voter removed", func() bool { return !c.raftServers(l)[c.cfgs[f].NodeID] })
	// It comes back and is a voter again.
	c.start(f)
	waitFor(t, 20*time.Second, "the returning coordinator a voter again", func() bool { return c.raftServers(l)[c.cfgs[f].NodeID] })
}

// The Raft port refuses a plaintext client and a client with another org's
// coordinator certificate: a RequestVote with a higher term sent through
// either changes nothing (before mTLS one such message caused an election).
func TestRaftPortRefusesOutsiders(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, "", "")
	l := c.leader()
	f := (l + 1) % 3
	term := c.nodes[l].raft.CurrentTerm()

	plain, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 1, time.Second, logging.HCLog(logging.Discard(), "raft"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	layer, err := newTLSStreamLayer("127.0.0.1:0", testCreds(t, testCA(t, "acme"), rpc.RoleCoordinator, c.cfgs[l].NodeID), nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: layer, MaxPool: 1, Timeout: time.Second, Logger: logging.HCLog(logging.Discard(), "raft")})
	defer foreign.Close()
	// Claiming follower f's id, the attacker asks every node for a vote
	// in a much later term, flagged as a leadership transfer (which makes
	// raft consider it even while a leader is known).
	for name, tr := range map[string]*raft.NetworkTransport{"plaintext": plain, "other org": foreign} {
		for i := range c.nodes {
			req := &raft.RequestVoteRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(c.cfgs[f].NodeID), Addr: []byte(c.cfgs[f].RaftAddr)},
				Term:      term + 100, LastLogIndex: 1 << 40, LastLogTerm: term + 100, LeadershipTransfer: true,
			}
			var resp raft.RequestVoteResponse
			if err := tr.RequestVote(raft.ServerID(c.cfgs[i].NodeID), raft.ServerAddress(c.cfgs[i].RaftAddr), req, &resp); err == nil {
				t.Errorf("%s: %s answered a RequestVote (granted=%v)", name, c.cfgs[i].NodeID, resp.Granted)
			}
		}
	}
	// A node that considered a request adopts its term (term+100) and,
	// if it led, steps down. Natural elections on a loaded machine raise
	// the term by one each and may also move leadership (they made this
	// test fail as 'the leader lost its leadership'), so the check is that
	// no node reached the outsiders' term.
	never(t, 2*time.Second, "a node took the outsiders' term", func() bool {
		for _, n := range c.nodes {
			if n.raft.CurrentTerm() >= term+100 {
				return true
			}
		}
		return false
	})
}

// A member with the gossip key that claims the leader's node id (and its
// Raft address) never receives a forwarded call: followers forward only to
// the leader's certificate. Every write still reaches the real leader.
func TestForwardNeverReachesAnImpostor(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, "jt", "at")
	l := c.leader()
	var calls atomic.Int64
	// The impostor holds a certificate of the org's CA (a stolen client
	// certificate) and of another CA naming the leader; it counts every
	// call that reaches it.
	for i, creds := range []*tlsutil.Credentials{
		testCreds(t, c.ca, rpc.RoleCoordinator, "c9"),
		testCreds(t, testCA(t, "acme"), rpc.RoleCoordinator, c.cfgs[l].NodeID),
	} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(creds.ServerOption(tlsutil.Peer{}, true), grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
			calls.Add(1)
			return nil
		}))
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		fake := fakeMember(t, "impostor"+strconv.Itoa(i), testGossipKey, map[string]string{
			tagOrg: "acme", tagRole: roleCoordinator, tagID: c.cfgs[l].NodeID,
			tagRaft: c.cfgs[l].RaftAddr, tagGRPC: lis.Addr().String(),
		})
		// Joined to every node at once: what this test checks is that
		// forwarding never reaches an impostor, not how fast gossip spreads
		// one (with tests in parallel, the third node once did not see it
		// within 30 s).
		var seeds []string
		for _, cfg := range c.cfgs {
			seeds = append(seeds, cfg.SerfAddr)
		}
		if _, err := fake.Join(seeds, true); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		if !pollUntil(30*time.Second, func() bool { return c.serfSees(i, "impostor0") && c.serfSees(i, "impostor1") }) {
			for _, m := range c.nodes[i].serf.Members() {
				t.Logf("node %d sees %s %s %v", i, m.Name, m.Status, m.Tags)
			}
			t.Fatal("impostors not in every node's serf")
		}
	}
	for i := range 10 {
		f := (l + 1 + i%2) % 3
		name := fmt.Sprintf("fwd%d", i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.admin(f).SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(wordsQuery, name, 1)), Filename: name + ".yaml"})
		cancel()
		if err != nil {
			t.Fatalf("write %d through follower %s: %v", i, c.cfgs[f].NodeID, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the impostor received %d forwarded calls", n)
	}
	if got := len(queryNames(t, c.admin(l))); got != 10 {
		t.Fatalf("the leader has %d queries, want 10", got)
	}
}

func pollUntil(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
