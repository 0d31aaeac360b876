package integration

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/internal/testport"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// attacker is a TLS client configuration of someone outside the org: it
// accepts any server and presents cert (none if nil).
func attacker(cert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

func loadPair(t *testing.T, dir, role, name string) *tls.Certificate {
	t.Helper()
	cf, kf := tlsutil.CertFiles(role, name)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, cf), filepath.Join(dir, kf))
	if err != nil {
		t.Fatal(err)
	}
	return &pair
}

// grpcRefused calls Status (coordinator) or Subscribe (data plane) through
// creds and returns the error.
func grpcCall(addr string, creds credentials.TransportCredentials, dataPlane bool) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !dataPlane {
		_, err = pb.NewAdminServiceClient(conn).Status(ctx, &pb.StatusRequest{})
		return err
	}
	s, err := pb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err == nil {
		err = s.Send(&pb.SubscribeRequest{Stream: &pb.StreamRef{Query: "nope", TaskId: "nope"}, Subscriber: "attacker"})
	}
	if err == nil {
		_, err = s.Recv()
	}
	return err
}

// rawRefused reports whether the server at addr ends a connection made
// with cfg (nil: plain TCP sending garbage) instead of keeping it open.
func rawRefused(addr string, cfg *tls.Config) error {
	var conn net.Conn
	var err error
	if cfg == nil {
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			_, err = conn.Write([]byte("\x00\x01garbage that is not a TLS record\n"))
		}
	} else {
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	}
	if err != nil {
		return nil // refused at the handshake
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("the connection stayed open")
	}
	if err == nil {
		return fmt.Errorf("the server sent data")
	}
	return nil
}

// TestSecurityFromOutsideTheOrg attacks a running org (3 coordinator and 1
// worker processes with mTLS and a gossip key) from outside: every port
// refuses a connection without a certificate and one with another CA's
// certificate; a coordinator without the gossip key cannot join; one with
// the key but without a certificate of the org's CA never votes, while a
// real one does; a serf member claiming the leader's id never receives a
// forwarded write.
func TestSecurityFromOutsideTheOrg(t *testing.T) {
	t.Parallel()
	o := startOrg(t, 3, 1)
	var leader statusJSON
	var workerAddr string
	waitFor(t, 60*time.Second, "a leader and a ready worker", func() bool {
		st, err := o.status(t, 0)
		if err != nil || st.LeaderID == "" {
			return false
		}
		leader = st
		ws, err := o.workerList(t, 0)
		if err != nil {
			return false
		}
		for _, w := range ws {
			if w.Status == "ready" && w.Addr != "" {
				workerAddr = w.Addr
				return true
			}
		}
		return false
	})
	evilDir, _ := tlsInit(t, "acme", 1) // another CA, for an org of the same name
	evilCert := loadPair(t, evilDir, rpc.RoleCoordinator, "c1")
	admin := loadPair(t, o.tlsDir, rpc.RoleClient, "admin")

	t.Run("coordinator gRPC", func(t *testing.T) {
		if err := grpcCall(o.grpc[0], insecure.NewCredentials(), false); status.Code(err) != codes.Unavailable {
			t.Errorf("plaintext: %v, want Unavailable", err)
		}
		if err := grpcCall(o.grpc[0], credentials.NewTLS(attacker(nil)), false); status.Code(err) != codes.Unauthenticated {
			t.Errorf("no certificate: %v, want Unauthenticated", err)
		}
		if err := grpcCall(o.grpc[0], credentials.NewTLS(attacker(evilCert)), false); status.Code(err) != codes.Unavailable {
			t.Errorf("another CA's certificate: %v, want Unavailable (handshake refused)", err)
		}
		if err := grpcCall(o.grpc[0], credentials.NewTLS(attacker(admin)), false); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "token") {
			t.Errorf("control, the org's client certificate without a token: %v, want the token check", err)
		}
	})
	t.Run("raft", func(t *testing.T) {
		for name, cfg := range map[string]*tls.Config{"plaintext": nil, "no certificate": attacker(nil), "another CA's certificate": attacker(evilCert),
			"the org's client certificate": attacker(admin)} {
			if err := rawRefused(o.raft[0], cfg); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
	t.Run("worker data plane", func(t *testing.T) {
		if err := grpcCall(workerAddr, insecure.NewCredentials(), true); status.Code(err) != codes.Unavailable {
			t.Errorf("plaintext: %v, want Unavailable", err)
		}
		if err := grpcCall(workerAddr, credentials.NewTLS(attacker(nil)), true); status.Code(err) != codes.Unavailable {
			t.Errorf("no certificate: %v, want Unavailable", err)
		}
		if err := grpcCall(workerAddr, credentials.NewTLS(attacker(evilCert)), true); status.Code(err) != codes.Unavailable {
			t.Errorf("another CA's certificate: %v, want Unavailable", err)
		}
		if err := grpcCall(workerAddr, credentials.NewTLS(attacker(admin)), true); status.Code(err) == codes.Unavailable {
			t.Errorf("control, the org's client certificate: %v, want the data plane's own answer", err)
		}
	})

	// Coordinators joining: c4 has a certificate of the org but another
	// gossip key; c5 the gossip key but a certificate of another CA; c6,
	// the control, both.
	orgCA, err := tlsutil.LoadCA(filepath.Join(o.tlsDir, "ca.pem"), filepath.Join(o.tlsDir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	c46 := t.TempDir()
	if _, err := orgCA.WriteDir(c46, tlsutil.InitOptions{Coordinators: []string{"c4", "c6"}, Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	foreign := t.TempDir()
	if _, err := tlsutil.InitDir(foreign, tlsutil.InitOptions{Org: "acme", Coordinators: []string{"c5"}, Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	otherKey := gossipKeyFile(t, t.TempDir())
	ports := testport.Loopback(t, 9)
	joiner := func(id, tlsDir, keyFile string, p []string) *proc {
		return start(t, id, "coordinator", "--org", "acme", "--node-id", id, "--data-dir", filepath.Join(t.TempDir(), id),
			"--grpc-addr", p[0], "--raft-addr", p[1], "--serf-addr", p[2], "--bootstrap-expect", "0",
			"--join", strings.Join(o.serf, ","), "--tls-dir", tlsDir, "--gossip-key-file", keyFile,
			"--join-token", "join-secret", "--admin-token", o.adminToken, "--log-level", "debug")
	}
	c4 := joiner("c4", c46, otherKey, ports[0:3])
	c5 := joiner("c5", foreign, o.gossipKeyFile, ports[3:6])
	joiner("c6", c46, o.gossipKeyFile, ports[6:9])
	peers := func() map[string]bool {
		var res struct {
			Peers []struct {
				ID string `json:"id"`
			} `json:"peers"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out := map[string]bool{}
		if err := cli(ctx, t, &res, "operator", "raft", "list-peers", "--addr", o.grpc[0], "--token", o.adminToken); err == nil {
			for _, p := range res.Peers {
				out[p.ID] = true
			}
		}
		return out
	}
	waitFor(t, 60*time.Second, "c6 (the control) a voter", func() bool { return peers()["c6"] })
	waitFor(t, 30*time.Second, "c4 reporting its failed serf join", func() bool { return strings.Contains(c4.out.String(), "serf join failed") })
	waitFor(t, 30*time.Second, "c5 in the serf pool", func() bool { return strings.Contains(c5.out.String(), "joined serf pool") })
	end := time.Now().Add(5 * time.Second)
	for time.Now().Before(end) {
		if p := peers(); p["c4"] || p["c5"] {
			t.Fatalf("raft peers %v: a coordinator without the gossip key or the org's certificate became a voter", p)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A serf member with the gossip key claiming the leader's node id and
	// Raft address, serving gRPC with a certificate of the org's CA for
	// another coordinator, and one with another CA's certificate naming
	// the leader. Writes sent to the followers must all reach the leader.
	var calls atomic.Int64
	keyText, err := os.ReadFile(o.gossipKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	gossipKey, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(keyText)))
	if err != nil {
		t.Fatal(err)
	}
	c9Cert, c9Key, err := orgCA.Issue(rpc.Identity{Org: "acme", Role: rpc.RoleCoordinator, Name: "c9"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c9, err := tls.X509KeyPair(c9Cert, c9Key)
	if err != nil {
		t.Fatal(err)
	}
	for i, cert := range []*tls.Certificate{&c9, evilCert} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert}})),
			grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error { calls.Add(1); return nil }))
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		impostor(t, fmt.Sprintf("impostor%d", i), gossipKey, o.serf[0], map[string]string{
			"org": "acme", "role": "coordinator", "id": leader.LeaderID, "raft": leader.LeaderAddr, "grpc": lis.Addr().String(), "expect": "0",
		})
	}
	wc, err := os.ReadFile("../examples/wordcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var followers []string
	for _, addr := range o.grpc {
		if addr != leaderGRPC(o, leader.LeaderID) {
			followers = append(followers, addr)
		}
	}
	// Writes spread over several seconds, so the impostors' gossip has
	// reached every follower for most of them. Each query is stopped
	// again (a second write) so the worker is not loaded.
	writes := 0
	for ; writes < 12; writes++ {
		time.Sleep(500 * time.Millisecond) // pacing, not synchronisation
		addr := followers[writes%len(followers)]
		name := fmt.Sprintf("fwd%d", writes)
		file := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(file, []byte(strings.Replace(string(wc), "name: wordcount", "name: "+name, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		var sub struct {
			Name string `json:"name"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cli(ctx, t, &sub, "query", "submit", file, "--addr", addr, "--token", o.adminToken)
		cancel()
		if err != nil || sub.Name != name {
			t.Fatalf("write %d through follower %s: %v", writes, addr, err)
		}
		var stopped struct {
			Status string `json:"status"`
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		err = cli(ctx, t, &stopped, "query", "stop", name, "--addr", addr, "--token", o.adminToken)
		cancel()
		if err != nil || stopped.Status != "stopped" {
			t.Fatalf("stop %d through follower %s: %v", writes, addr, err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("impostors received %d forwarded calls", n)
	}
	t.Logf("%d submits and stops through the followers reached the leader; the impostors got none", writes)
}

func leaderGRPC(o *org, id string) string {
	var i int
	if _, err := fmt.Sscanf(id, "c%d", &i); err != nil || i < 1 || i > len(o.grpc) {
		return ""
	}
	return o.grpc[i-1]
}

// impostor joins the org's serf (with the gossip key) claiming tags.
func impostor(t *testing.T, name string, key []byte, join string, tags map[string]string) {
	t.Helper()
	conf := serf.DefaultConfig()
	conf.Init()
	conf.NodeName = name
	conf.Tags = tags
	ml := memberlist.DefaultLocalConfig()
	ml.BindAddr, ml.BindPort, ml.AdvertiseAddr = "127.0.0.1", 0, "127.0.0.1"
	ml.SecretKey = key
	ml.Logger = logging.StdLogger(logging.Discard(), "memberlist")
	conf.MemberlistConfig = ml
	conf.Logger = logging.StdLogger(logging.Discard(), "serf")
	s, err := serf.Create(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	if _, err := s.Join([]string{join}, true); err != nil {
		t.Fatalf("impostor join: %v", err)
	}
}
