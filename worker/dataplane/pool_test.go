package dataplane

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
)

// TestPoolRedialsQuickly: a data-plane connection to a peer that does not
// answer keeps redialing at the pool's short reconnect backoff, so a link
// that returns is used within milliseconds. With gRPC's default backoff
// (1 s, growing 1.6x) the tenth attempt comes after more than a minute;
// here the test waits for it for 20 s. Once the peer answers, WaitReady
// returns as soon as the connection is ready.
func TestPoolRedialsQuickly(t *testing.T) {
	conn, down, attempts := cutPeer(t)
	deadline := time.Now().Add(20 * time.Second)
	for attempts.Load() < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("%d dial attempts in 20 s: the reconnect backoff is too long", attempts.Load())
		}
		time.Sleep(time.Millisecond)
	}
	down.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	WaitReady(ctx, conn, 20*time.Second)
	if st := conn.GetState(); st != connectivity.Ready {
		t.Fatalf("connection %v after the link returned", st)
	}
}

// cutPeer is a pool's connection (dialled with extra) to a gRPC server
// over a link that is cut until down is cleared; attempts counts the
// dials.
func cutPeer(t *testing.T, extra ...grpc.DialOption) (conn *grpc.ClientConn, down *atomic.Bool, attempts *atomic.Int64) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	down, attempts = &atomic.Bool{}, &atomic.Int64{}
	down.Store(true)
	p := NewPool(append(extra, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		attempts.Add(1)
		if down.Load() {
			return nil, errors.New("link cut")
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}))...)
	t.Cleanup(func() { _ = p.Close() })
	if conn, err = p.Conn(lis.Addr().String()); err != nil {
		t.Fatal(err)
	}
	conn.Connect()
	return conn, down, attempts
}

// TestWaitReadySinceRedialsEarlyInAnOutage: a waiter whose peer has just
// become unreachable has the connection redial without waiting out its
// reconnect backoff (here 10 s, longer than the wait): the link's return
// is found within the wait. Plain WaitReady (no outage start) would time
// out in the backoff.
func TestWaitReadySinceRedialsEarlyInAnOutage(t *testing.T) {
	conn, down, attempts := cutPeer(t, grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 20 * time.Second,
		Backoff: backoff.Config{BaseDelay: 10 * time.Second, Multiplier: 1, MaxDelay: 10 * time.Second}}))
	deadline := time.Now().Add(20 * time.Second)
	for attempts.Load() < 1 || conn.GetState() != connectivity.TransientFailure {
		if time.Now().After(deadline) {
			t.Fatalf("connection %v after %d dial attempts", conn.GetState(), attempts.Load())
		}
		time.Sleep(time.Millisecond)
	}
	down.Store(false) // the link returns while the connection is in its 10 s backoff
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	WaitReadySince(ctx, conn, 5*time.Second, time.Now())
	if st := conn.GetState(); st != connectivity.Ready {
		t.Fatalf("connection %v after waiting 5 s for a link that returned (%d dial attempts)", st, attempts.Load())
	}
}
