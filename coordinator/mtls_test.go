package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// A caller without a certificate may only register (with the join token
// and a certificate request), and gets a certificate for the worker id the
// org gave it; one with another org's certificate gets nothing at all.
func TestCoordinatorPortNeedsAnOrgCertificate(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "jt", "at")
	l := c.leader()
	addr := c.cfgs[l].GRPCAddr

	bare := testCreds(t, c.ca, "", "")
	noCert := c.connAs(addr, "at", bare)
	if _, err := pb.NewAdminServiceClient(noCert).Status(ctxT(t, 5*time.Second), &pb.StatusRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("status without a certificate: %v, want Unauthenticated", err)
	}
	wc := pb.NewWorkerServiceClient(c.connAs(addr, "jt", bare))
	if _, err := wc.Register(ctxT(t, 5*time.Second), &pb.RegisterRequest{Addr: "127.0.0.1:9"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("register without a certificate request: %v, want InvalidArgument", err)
	}
	csr, key, err := tlsutil.NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := wc.Register(ctxT(t, 5*time.Second), &pb.RegisterRequest{Addr: "127.0.0.1:9", Csr: csr, IdempotencyKey: "k"})
	if err != nil {
		t.Fatalf("register without a certificate but with the join token: %v", err)
	}
	mine := testCreds(t, c.ca, "", "")
	if err := mine.SetCertificate(resp.Certificate, key); err != nil {
		t.Fatalf("returned certificate: %v", err)
	}
	id, notAfter, _ := mine.Identity()
	if want := (rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: resp.WorkerId}); id != want {
		t.Fatalf("worker certificate identity %v, want %v", id, want)
	}
	if d := time.Until(notAfter); d > tlsutil.DefaultWorkerValidity || d < tlsutil.DefaultWorkerValidity-time.Hour {
		t.Fatalf("worker certificate valid for %v, want about %v", d, tlsutil.DefaultWorkerValidity)
	}
	if _, err := wc.Heartbeat(ctxT(t, 5*time.Second), &pb.HeartbeatRequest{WorkerId: resp.WorkerId}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("heartbeat without a certificate: %v, want Unauthenticated", err)
	}
	// With its certificate the worker heartbeats and renews; another
	// worker cannot renew it.
	own := pb.NewWorkerServiceClient(c.connAs(addr, "jt", mine))
	if _, err := own.Heartbeat(ctxT(t, 5*time.Second), &pb.HeartbeatRequest{WorkerId: resp.WorkerId}); err != nil {
		t.Fatalf("heartbeat with the worker certificate: %v", err)
	}
	csr2, _, _ := tlsutil.NewCSR()
	if r, err := own.RenewCertificate(ctxT(t, 5*time.Second), &pb.RenewCertificateRequest{WorkerId: resp.WorkerId, Csr: csr2}); err != nil || len(r.Certificate) == 0 {
		t.Fatalf("renew with the worker's own certificate: %v", err)
	}
	other := pb.NewWorkerServiceClient(c.connAs(addr, "jt", testCreds(t, c.ca, rpc.RoleWorker, "w-other")))
	if _, err := other.RenewCertificate(ctxT(t, 5*time.Second), &pb.RenewCertificateRequest{WorkerId: resp.WorkerId, Csr: csr2}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("renew by another worker: %v, want PermissionDenied", err)
	}

	// Another org's certificate fails the handshake: nothing is served.
	foreign := testCreds(t, testCA(t, "acme"), rpc.RoleClient, "admin")
	if _, err := pb.NewAdminServiceClient(c.connAs(addr, "at", foreign)).Status(ctxT(t, 5*time.Second), &pb.StatusRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("status with another CA's certificate: %v, want Unavailable (handshake refused)", err)
	}
}

// Plaintext mode is explicit and visible.
func TestPlaintextNeedsTheFlag(t *testing.T) {
	t.Parallel()
	cfg := Config{Org: "acme", NodeID: "c1", DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0", BootstrapExpect: 1}
	if _, err := New(cfg); err == nil {
		t.Fatal("coordinator without TLS credentials or --insecure-plaintext was accepted")
	}
	wrong := cfg
	wrong.TLS = testCreds(t, testCA(t, "acme"), rpc.RoleCoordinator, "c2")
	if _, err := New(wrong); err == nil {
		t.Fatal("coordinator c1 accepted c2's certificate")
	}
	wrong.TLS = testCreds(t, testCA(t, "acme"), rpc.RoleCoordinator, "c1")
	if _, err := New(wrong); err == nil {
		t.Fatal("coordinator with TLS but no gossip key was accepted")
	}
	cfg.InsecurePlaintext = true
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	conn, err := rpc.Dial(srv.GRPCAddr(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := pb.NewAdminServiceClient(conn).Status(ctxT(t, 5*time.Second), &pb.StatusRequest{})
	if err != nil || !st.InsecurePlaintext {
		t.Fatalf("status in plaintext mode: %v, insecure_plaintext=%v", err, st.GetInsecurePlaintext())
	}
}

// peerCtx is the context of a call whose peer presented creds' certificate
// (as mTLS delivers it), with incoming metadata md.
func peerCtx(t *testing.T, creds *tlsutil.Credentials, md metadata.MD) context.Context {
	t.Helper()
	ctx := metadata.NewIncomingContext(context.Background(), md)
	if creds == nil {
		return ctx
	}
	cfg := creds.ClientConfig(tlsutil.Peer{})
	cert, err := cfg.GetClientCertificate(nil)
	if err != nil || cert.Leaf == nil {
		t.Fatalf("test certificate: %v", err)
	}
	state := tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert.Leaf}}}
	return peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: state}})
}

// A forwarded call keeps its caller's identity, vouched for by the
// forwarding coordinator; nobody else can claim one.
func TestCallerIdentityThroughForwarding(t *testing.T) {
	t.Parallel()
	ca := testCA(t, "acme")
	s := &Server{cfg: Config{Org: "acme"}}
	worker := rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: "w-1"}
	claim := metadata.Pairs(forwardedKey, "c2", callerKey, worker.String())
	cases := []struct {
		name   string
		ctx    context.Context
		want   rpc.Identity
		wantOK bool
	}{
		{"direct worker", peerCtx(t, testCreds(t, ca, rpc.RoleWorker, "w-1"), nil), worker, true},
		{"forwarded by a coordinator", peerCtx(t, testCreds(t, ca, rpc.RoleCoordinator, "c2"), claim), worker, true},
		{"forwarded, caller had no certificate", peerCtx(t, testCreds(t, ca, rpc.RoleCoordinator, "c2"), metadata.Pairs(forwardedKey, "c2")), rpc.Identity{}, false},
		{"a client claiming to forward", peerCtx(t, testCreds(t, ca, rpc.RoleClient, "admin"), claim), rpc.Identity{Org: "acme", Role: rpc.RoleClient, Name: "admin"}, true},
		{"no certificate claiming to forward", peerCtx(t, nil, claim), rpc.Identity{}, false},
	}
	for _, tc := range cases {
		got, ok := s.callerIdentity(tc.ctx)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
}
