package rpc

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

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
	if err := rpctest.IdlePings(serve(t, fast.ServerOptions()...), nil, fast.Time, 5); err != nil {
		t.Fatalf("server with the policy: %v", err)
	}
	err := rpctest.IdlePings(serve(t), nil, fast.Time, 5)
	if !errors.Is(err, rpctest.ErrGoAway) || !strings.Contains(err.Error(), "too_many_pings") {
		t.Fatalf("server with grpc defaults: %v; want a too_many_pings GoAway (the probe must see it)", err)
	}
}

// A real client with a call open and idle past several of its keepalive
// pings (grpc-go does not let a client ping more often than every 10 s,
// so this takes half a minute) keeps its stream on a server with the
// policy's options; grpc's default server policy answers the third ping
// with a too_many_pings GoAway, which is what `fedstream tail` printed.
func TestIdleStreamSurvivesKeepalive(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for real keepalive pings (30 s)")
	}
	addr := func() string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(ServerOptions()...)
		hs := health.NewServer()
		healthpb.RegisterHealthServer(srv, hs)
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(lis) }()
		t.Cleanup(func() { srv.Stop(); <-done })
		return lis.Addr().String()
	}()
	client := Keepalive{Time: 10 * time.Second, Timeout: 5 * time.Second}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), client.DialOption())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // the current status
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := stream.Recv() // nothing more is sent: the call idles
		ended <- err
	}()
	select {
	case err := <-ended:
		t.Fatalf("idle stream ended: %v", err)
	case <-time.After(3*client.Time + 2*time.Second):
	}
}
