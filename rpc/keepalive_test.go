package rpc

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/rpc/rpctest"
)

func serve(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// The client's keepalive interval is above the servers' minimum, as the
// policy requires.
func TestKeepalivePoliciesAgree(t *testing.T) {
	k := DefaultKeepalive
	if k.MinPingInterval >= k.Time {
		t.Fatalf("servers accept pings every %v but clients ping every %v: clients would get too_many_pings", k.MinPingInterval, k.Time)
	}
	if k.Time < 10*time.Second {
		t.Fatalf("client keepalive %v is below grpc-go's 10s floor: it would not be honoured as set", k.Time)
	}
}

// A connection idle (no call open) that is pinged at the client's rate is
// not turned away by a server with the policy's options, while a server
// with grpc's defaults answers the same pings with too_many_pings. Short
// intervals stand in for the real ones.
func TestServerKeepalivePermitsClientPings(t *testing.T) {
	fast := Keepalive{Time: 100 * time.Millisecond, Timeout: time.Second, MinPingInterval: 20 * time.Millisecond}
	if err := rpctest.IdlePings(serve(t, fast.ServerOptions()...), fast.Time, 5); err != nil {
		t.Fatalf("server with the policy: %v", err)
	}
	err := rpctest.IdlePings(serve(t), fast.Time, 5)
	if !errors.Is(err, rpctest.ErrGoAway) || !strings.Contains(err.Error(), "too_many_pings") {
		t.Fatalf("server with grpc defaults: %v; want a too_many_pings GoAway (the probe must see it)", err)
	}
}
