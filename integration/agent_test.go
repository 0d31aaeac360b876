package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker"
)

// inProcessOrg runs coordinators in this process on OS-chosen ports.
type inProcessOrg struct {
	t     *testing.T
	cfgs  []coordinator.Config
	nodes []*coordinator.Server
	ca    *tlsutil.CA
}

// newInProcessOrg starts n coordinators running mutual TLS with a CA made
// for the test; they sign the workers' certificates, valid certTTL (0:
// the default).
func newInProcessOrg(t *testing.T, n int, certTTL ...time.Duration) *inProcessOrg {
	return newInProcessOrgWith(t, n, nil, certTTL...)
}

// newInProcessOrgWith is newInProcessOrg with opt applied to each
// coordinator's configuration before it starts (nil: none).
func newInProcessOrgWith(t *testing.T, n int, opt func(*coordinator.Config), certTTL ...time.Duration) *inProcessOrg {
	ca, err := tlsutil.NewCA("acme")
	if err != nil {
		t.Fatal(err)
	}
	o := &inProcessOrg{t: t, ca: ca}
	dir := t.TempDir()
	tm := coordinator.FastTimings()
	tm.HeartbeatTTL, tm.LeaderGrace = time.Second, time.Second
	for i := 0; i < n; i++ {
		clog := testLogger(t, fmt.Sprintf("c%d", i+1))
		o.cfgs = append(o.cfgs, coordinator.Config{
			Org: "acme", NodeID: fmt.Sprintf("c%d", i+1), DataDir: filepath.Join(dir, fmt.Sprintf("c%d", i+1)),
			GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
			BootstrapExpect: n, Timings: tm, Logger: clog,
			TLS: coordCreds(t, ca, fmt.Sprintf("c%d", i+1)), CA: ca,
			GossipKey: []byte("0123456789abcdef0123456789abcdef"),
		})
		if len(certTTL) > 0 {
			o.cfgs[i].WorkerCertTTL = certTTL[0]
		}
		if opt != nil {
			opt(&o.cfgs[i])
		}
	}
	o.nodes = make([]*coordinator.Server, n)
	var join []string
	for i := range o.cfgs {
		o.cfgs[i].Join = join
		o.start(i)
		join = append(join, o.cfgs[i].SerfAddr)
	}
	t.Cleanup(func() {
		for i := range o.nodes {
			o.stop(i)
		}
	})
	return o
}

func (o *inProcessOrg) start(i int) {
	srv, err := coordinator.New(o.cfgs[i])
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		o.t.Fatalf("start %s: %v", o.cfgs[i].NodeID, err)
	}
	o.cfgs[i].GRPCAddr, o.cfgs[i].RaftAddr, o.cfgs[i].SerfAddr = srv.GRPCAddr(), srv.RaftAddr(), srv.SerfAddr()
	o.nodes[i] = srv
}

func (o *inProcessOrg) stop(i int) {
	if o.nodes[i] != nil {
		_ = o.nodes[i].Shutdown()
		o.nodes[i] = nil
	}
}

func (o *inProcessOrg) grpcAddrs() []string {
	var out []string
	for _, c := range o.cfgs {
		out = append(out, c.GRPCAddr)
	}
	return out
}

// workerStatus reads a worker's status from any running node's state.
func (o *inProcessOrg) workerStatus(id string) string {
	for _, n := range o.nodes {
		if n == nil || !n.IsLeader() {
			continue
		}
		w, err := n.State().Worker(nil, id)
		if err == nil && w != nil {
			return w.Status
		}
	}
	return ""
}

func coordCreds(t *testing.T, ca *tlsutil.CA, id string) *tlsutil.Credentials {
	creds, err := tlsutil.New(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(rpc.Identity{Org: ca.Org(), Role: rpc.RoleCoordinator, Name: id}, []string{"127.0.0.1"}, time.Hour)
	if err == nil {
		err = creds.SetCertificate(certPEM, keyPEM)
	}
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// runWorker runs a worker holding only the org's CA certificate.
func (o *inProcessOrg) runWorker(t *testing.T, coords []string) *worker.Worker {
	w, _ := o.runWorkerCreds(t, coords)
	return w
}

func (o *inProcessOrg) runWorkerCreds(t *testing.T, coords []string) (*worker.Worker, *tlsutil.Credentials) {
	creds, err := tlsutil.New(o.ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{Org: "acme", Name: "w1", Coordinators: coords, Cores: 2, Logger: logging.Discard(), TLS: creds})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w, creds
}

// TestWorkerSurvivesCoordinatorLoss: the worker's preferred coordinator dies;
// it keeps heartbeating through the others and is never marked down.
func TestWorkerSurvivesCoordinatorLoss(t *testing.T) {
	t.Parallel()
	o := newInProcessOrg(t, 3)
	w := o.runWorker(t, o.grpcAddrs()[:1]) // it knows one; the org tells it the rest
	waitFor(t, 20*time.Second, "worker registered and ready", func() bool {
		return w.ID() != "" && o.workerStatus(w.ID()) == "ready"
	})
	o.stop(0)
	// Well past TTL + grace of the new leader, the worker must still be ready.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if st := o.workerStatus(w.ID()); st == "down" {
			t.Fatalf("worker marked down after losing its coordinator")
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, "worker ready under the new leader", func() bool { return o.workerStatus(w.ID()) == "ready" })
}

// TestWorkerRegistersAgainWhenForgotten: the org loses its state (a fresh
// cluster on the same addresses); the worker is told it is unknown and
// registers again under a new id.
func TestWorkerRegistersAgainWhenForgotten(t *testing.T) {
	t.Parallel()
	o := newInProcessOrg(t, 1)
	w := o.runWorker(t, o.grpcAddrs())
	waitFor(t, 20*time.Second, "worker registered", func() bool { return w.ID() != "" && o.workerStatus(w.ID()) == "ready" })
	first := w.ID()
	o.stop(0)
	o.cfgs[0].DataDir = filepath.Join(t.TempDir(), "fresh")
	o.start(0)
	waitFor(t, 20*time.Second, "worker registered again under a new id", func() bool {
		id := w.ID()
		return id != first && id != "" && o.workerStatus(id) == "ready"
	})
}

// TestWorkerRenewsItsCertificate: a worker's certificate lives 3 s; the
// worker renews it before it expires, again and again, stays ready, and
// its data plane keeps presenting a valid certificate of its identity.
func TestWorkerRenewsItsCertificate(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	// The worker must stay ready through the renewals, which is not a
	// question of its heartbeats: a heartbeat TTL of 5 s rather than the
	// org's 1 s keeps a loaded machine's second-long stalls from marking
	// it down meanwhile (a worker beats every quarter of the TTL).
	o := newInProcessOrgWith(t, 1, func(cfg *coordinator.Config) { cfg.Timings.HeartbeatTTL = 5 * time.Second }, ttl)
	w, creds := o.runWorkerCreds(t, o.grpcAddrs())
	waitFor(t, 20*time.Second, "worker registered", func() bool { return w.ID() != "" && o.workerStatus(w.ID()) == "ready" })
	_, first, ok := creds.Identity()
	if !ok {
		t.Fatal("registered worker holds no certificate")
	}
	if d := time.Until(first); d > ttl+time.Second {
		t.Fatalf("certificate valid for %v, want the coordinator's %v", d, ttl)
	}
	client, err := tlsutil.New(o.ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, _ := o.ca.Issue(rpc.Identity{Org: "acme", Role: rpc.RoleClient, Name: "probe"}, nil, time.Hour)
	if err := client.SetCertificate(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	// Three lifetimes: the first certificate and at least two more expire.
	end := time.Now().Add(3 * ttl)
	renewals := 0
	last := first
	for time.Now().Before(end) {
		if _, na, _ := creds.Identity(); na.After(last) {
			renewals++
			last = na
		}
		if st := o.workerStatus(w.ID()); st != "ready" {
			t.Fatalf("worker %s while its certificate was being renewed", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if renewals < 2 {
		t.Fatalf("certificate renewed %d times in %v, want at least 2", renewals, 3*ttl)
	}
	// The data plane serves with the current certificate: the first one
	// expired two lifetimes ago, and would fail this handshake. A
	// handshake may still meet a certificate expiring at that instant
	// while its renewal, due a third of its life earlier, is late on a
	// loaded machine ("current time 20:11:18Z is after 20:11:18Z" at load
	// 60): the next one must succeed.
	waitFor(t, 10*time.Second, "a handshake with the worker's data plane after renewals", func() bool {
		conn, err := tls.Dial("tcp", w.Addr(), client.ClientConfig(tlsutil.Peer{Roles: []string{rpc.RoleWorker}, Name: w.ID()}))
		if err != nil {
			t.Logf("handshake: %v", err)
			return false
		}
		conn.Close()
		return true
	})
}

// TestPlaintextOrgNeedsTheFlagEverywhere: without TLS material a worker
// refuses to start unless told --insecure-plaintext; with the flag on both
// sides a plaintext org still works (for debugging).
func TestPlaintextOrgNeedsTheFlagEverywhere(t *testing.T) {
	t.Parallel()
	if _, err := worker.New(worker.Config{Org: "acme", Coordinators: []string{"127.0.0.1:1"}}); !errors.Is(err, worker.ErrNoTLS) {
		t.Fatalf("worker without TLS or the flag: %v, want ErrNoTLS", err)
	}
	tm := coordinator.FastTimings()
	srv, err := coordinator.New(coordinator.Config{
		Org: "acme", NodeID: "c1", DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
		BootstrapExpect: 1, Timings: tm, Logger: logging.Discard(), InsecurePlaintext: true,
	})
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown() })
	w, err := worker.New(worker.Config{Org: "acme", Name: "w1", Coordinators: []string{srv.GRPCAddr()}, Cores: 1, Logger: logging.Discard(), InsecurePlaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, 20*time.Second, "plaintext worker registered", func() bool {
		if w.ID() == "" {
			return false
		}
		wk, err := srv.State().Worker(nil, w.ID())
		return err == nil && wk != nil && wk.Status == "ready"
	})
}
