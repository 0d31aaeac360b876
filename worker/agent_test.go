package worker

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/rpctest"
)

// The worker's gRPC server (data plane, ingest, tail) accepts the pings
// of an idle client at the keepalive policy's rate: `fedstream tail`
// waiting for results must not get a too_many_pings GoAway. The server is
// the one Run serves (it serves only once registered, so the test serves
// it itself); the policy is the same with TLS, and the probe speaks
// plaintext HTTP/2.
func TestWorkerAcceptsClientKeepalive(t *testing.T) {
	w, err := New(Config{Org: "acme", Name: "w", Coordinators: []string{"127.0.0.1:1"}, InsecurePlaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Listen(); err != nil {
		t.Fatal(err)
	}
	srv := w.newServer()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(w.lis) }()
	defer func() {
		srv.Stop()
		<-done
	}()
	interval := rpc.DefaultKeepalive.MinPingInterval + 200*time.Millisecond
	if err := rpctest.IdlePings(w.Addr(), nil, interval, 4); err != nil {
		t.Fatalf("idle pings every %v: %v", interval, err)
	}
}
