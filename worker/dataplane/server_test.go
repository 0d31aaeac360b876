package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

type mapResolver struct {
	mu   sync.Mutex
	bufs map[string]*OutputBuffer
}

func (m *mapResolver) ResolveStream(ref *fedstreampb.StreamRef) (*OutputBuffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.bufs[ref.TaskId]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("%w: task %q", ErrUnknownStream, ref.TaskId)
}

// startServer serves resolver on 127.0.0.1:0 and returns its address.
func startServer(t *testing.T, resolver StreamResolver) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions()...)
	fedstreampb.RegisterDataPlaneServer(srv, NewServer(resolver, nil, nil))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestSubscribeResumesOnAnotherReplica(t *testing.T) {
	const n = 20000
	ctx := context.Background()
	// Two replicas of the producer hold identical streams.
	replicas := []*OutputBuffer{NewOutputBuffer(BufferOptions{}), NewOutputBuffer(BufferOptions{})}
	var addrs []string
	for _, b := range replicas {
		for id := uint64(1); id <= n; id++ {
			if err := b.Append(ctx, dataTuple(id, fmt.Sprintf("payload-%d", id))); err != nil {
				t.Fatal(err)
			}
		}
		addrs = append(addrs, startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": b}}))
	}
	pool := NewPool()
	defer pool.Close()

	ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
	sub := NewSubscriber(ref, "down-0", false, 0)
	var got []uint64
	deliver := func(stopAt uint64) DeliverFunc {
		return func(ctx context.Context, b *Batch) error {
			for _, tp := range b.Tuples {
				if want := fmt.Sprintf("payload-%d", tp.ID); tp.Values[0].S != want {
					return fmt.Errorf("tuple %d carries %q", tp.ID, tp.Values[0].S)
				}
				got = append(got, tp.ID)
			}
			if b.LastID >= stopAt {
				return ErrStopSubscription
			}
			return nil
		}
	}
	conn0, err := pool.Conn(addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Run(ctx, conn0, deliver(n/3)); err != nil {
		t.Fatal(err)
	}
	// The first replica saw the acknowledgement of what was delivered.
	waitFor(t, "ack at replica 0", func() bool { return replicas[0].Stats().OldestID == sub.LastID()+1 })
	conn1, err := pool.Conn(addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Run(ctx, conn1, deliver(n)); err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("received %d tuples, want %d", len(got), n)
	}
	for i, id := range got {
		if id != uint64(i+1) {
			t.Fatalf("tuple %d has id %d: loss or duplicate", i, id)
		}
	}
	waitFor(t, "ack at replica 1", func() bool { return replicas[1].Stats().Tuples == 0 })
}

func TestSubscribeUnknownStream(t *testing.T) {
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{}})
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Subscribe(context.Background(), conn, &fedstreampb.StreamRef{Query: "q", TaskId: "nope"}, 0, "s",
		func(context.Context, *Batch) error { return nil })
	if status.Code(err) != codes.NotFound {
		t.Fatalf("err = %v, want NotFound", err)
	}
}

// TestFlowControlEndToEnd: a consumer that stops taking batches makes the
// producer's Append block (bounded buffer, windows, bounded delivery).
func TestFlowControlEndToEnd(t *testing.T) {
	buf := NewOutputBuffer(BufferOptions{MaxTuples: 1000})
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": buf}})
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	subDone := make(chan error, 1)
	var received uint64
	go func() {
		_, err := Subscribe(ctx, conn, &fedstreampb.StreamRef{Query: "q", TaskId: "up"}, 0, "down",
			func(ctx context.Context, b *Batch) error {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				received = b.LastID
				return nil
			})
		subDone <- err
	}()
	prodDone := make(chan error, 1)
	go func() {
		for id := uint64(1); id <= 5000; id++ {
			if err := buf.Append(ctx, dataTuple(id, "x")); err != nil {
				prodDone <- err
				return
			}
		}
		prodDone <- nil
	}()
	waitFor(t, "producer blocked", func() bool { return buf.Stats().BlockedAppends == 1 })
	close(release)
	if err := <-prodDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all delivered", func() bool { return buf.Stats().Tuples == 0 })
	cancel()
	if err := <-subDone; !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
		t.Fatalf("subscriber ended with %v", err)
	}
	if received != 5000 || buf.BlockedNanos() == 0 {
		t.Fatalf("received up to %d, blocked %v", received, time.Duration(buf.BlockedNanos()))
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// With WithMaxBatchBytes(1) every message carries exactly one tuple (the
// unbatched baseline of the benchmark); the default packs many.
func TestMaxBatchBytesOneSendsOneTuplePerMessage(t *testing.T) {
	const n = 50
	for _, tc := range []struct {
		name     string
		opts     []ServerOption
		wantMany bool
	}{{"unbatched", []ServerOption{WithMaxBatchBytes(1)}, false}, {"default", nil, true}} {
		t.Run(tc.name, func(t *testing.T) {
			buf := NewOutputBuffer(BufferOptions{})
			for id := uint64(1); id <= n; id++ {
				if err := buf.Append(context.Background(), dataTuple(id, "x")); err != nil {
					t.Fatal(err)
				}
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer(ServerOptions()...)
			fedstreampb.RegisterDataPlaneServer(srv, NewServer(&mapResolver{bufs: map[string]*OutputBuffer{"up": buf}}, nil, nil, tc.opts...))
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(lis) }()
			defer func() { srv.Stop(); <-done }()
			pool := NewPool()
			defer pool.Close()
			conn, err := pool.Conn(lis.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: &fedstreampb.StreamRef{Query: "q", TaskId: "up"}, Subscriber: "t", NoAck: true}); err != nil {
				t.Fatal(err)
			}
			var got, messages, most uint32
			for got < n {
				b, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				messages++
				got += b.Count
				most = max(most, b.Count)
			}
			if !tc.wantMany && (most != 1 || messages != n) {
				t.Fatalf("%d messages, at most %d tuples each; want %d messages of 1", messages, most, n)
			}
			if tc.wantMany && most < 2 {
				t.Fatalf("default batching sent one tuple per message")
			}
		})
	}
}
