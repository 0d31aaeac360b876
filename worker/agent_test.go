package worker

import (
	"context"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/rpctest"
)

// The worker's gRPC server (data plane, ingest, tail) accepts the pings
// of an idle client at the keepalive policy's rate: `fedstream tail`
// waiting for results must not get a too_many_pings GoAway. The policy is
// the same with TLS; the probe speaks plaintext HTTP/2.
func TestWorkerAcceptsClientKeepalive(t *testing.T) {
	w, err := New(Config{Org: "acme", Name: "w", Coordinators: []string{"127.0.0.1:1"}, InsecurePlaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }() // serves while it tries to register
	defer func() {
		cancel()
		<-done
	}()
	interval := rpc.DefaultKeepalive.MinPingInterval + 200*time.Millisecond
	if err := rpctest.IdlePings(w.Addr(), interval, 4); err != nil {
		t.Fatalf("idle pings every %v: %v", interval, err)
	}
}
