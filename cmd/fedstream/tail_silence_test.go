package main

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// silentDataPlane accepts a subscription and then sends nothing, as a
// paused worker process (SIGSTOP) or a host behind a silent partition
// looks to tail: the connection stays open, nothing arrives, nothing
// fails.
type silentDataPlane struct {
	pb.UnimplementedDataPlaneServer
	subscribed chan struct{}
}

func (s *silentDataPlane) Subscribe(stream grpc.BidiStreamingServer[pb.SubscribeRequest, pb.Batch]) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	select {
	case s.subscribed <- struct{}{}:
	default:
	}
	<-stream.Context().Done()
	return stream.Context().Err()
}

func startSilentDataPlane(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterDataPlaneServer(srv, &silentDataPlane{subscribed: make(chan struct{}, 1)})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

// A tail reading a sink copy that went silent (its worker paused) moves
// on once the coordinators place that copy elsewhere, instead of
// waiting for gRPC's keepalive (about 40 s; by hand: kill -STOP of the
// worker serving the tail, which stopped printing for 40 s while the
// other replica and the copy placed again produced results). A copy that
// is only quiet and still placed there is not left.
func TestTailLeavesASilentCopyPlacedElsewhere(t *testing.T) {
	addr := startSilentDataPlane(t)
	copy0 := &pb.TaskInfo{TaskId: "q/out/p0/r0", Fragment: "out", WorkerAddr: addr, State: states.TaskRunning, Generation: 1}

	t.Run("placed elsewhere", func(t *testing.T) {
		var asked atomic.Int32
		tl := &tailer{flags: &clientFlags{tls: clientTLS{insecure: true}}, query: "q", silence: 50 * time.Millisecond,
			placedElsewhere: func(context.Context, *pb.TaskInfo) (string, error) {
				if asked.Add(1) < 2 {
					return "", nil // the worker not declared down yet
				}
				return "the coordinators placed it again (generation 2 at 127.0.0.1:1)", nil
			}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := tl.follow(ctx, copy0, nil, "out")
		if !errors.Is(err, errCopyGone) {
			t.Fatalf("follow of a silent copy placed elsewhere returned %v, want %v (before the deadline)", err, errCopyGone)
		}
		if ctx.Err() != nil {
			t.Fatal("follow returned only at the test's deadline")
		}
	})

	t.Run("still placed there", func(t *testing.T) {
		var asked atomic.Int32
		tl := &tailer{flags: &clientFlags{tls: clientTLS{insecure: true}}, query: "q", silence: 20 * time.Millisecond,
			placedElsewhere: func(context.Context, *pb.TaskInfo) (string, error) {
				asked.Add(1)
				return "", nil
			}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res := make(chan error, 1)
		go func() { res <- tl.follow(ctx, copy0, nil, "out") }()
		deadline := time.Now().Add(10 * time.Second)
		for asked.Load() < 3 {
			select {
			case err := <-res:
				t.Fatalf("follow left a copy still placed there: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the silent stream was never asked about")
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		if err := <-res; errors.Is(err, errCopyGone) {
			t.Fatalf("follow: %v", err)
		}
	})
}

func TestPlacedElsewhere(t *testing.T) {
	followed := &pb.TaskInfo{TaskId: "q/out/p0/r1", WorkerAddr: "127.0.0.1:9503", State: states.TaskRunning, Generation: 1}
	other := &pb.TaskInfo{TaskId: "q/out/p0/r0", WorkerAddr: "127.0.0.1:9501", State: states.TaskRunning, Generation: 1}
	with := func(f func(*pb.TaskInfo)) *pb.QueryInfo {
		now := &pb.TaskInfo{TaskId: followed.TaskId, WorkerAddr: followed.WorkerAddr, State: followed.State, Generation: followed.Generation}
		if f != nil {
			f(now)
		}
		return &pb.QueryInfo{Status: states.QueryRunning, Tasks: []*pb.TaskInfo{other, now}}
	}
	for _, tc := range []struct {
		name string
		q    *pb.QueryInfo
		gone bool
	}{
		{"unchanged", with(nil), false},
		{"unknown to a new leader", with(func(t *pb.TaskInfo) { t.State = states.TaskUnknown }), false},
		{"stalled", with(func(t *pb.TaskInfo) { t.State = states.TaskStalled }), false},
		{"placed again", with(func(t *pb.TaskInfo) { t.WorkerAddr, t.Generation = "127.0.0.1:9504", 2 }), true},
		{"lost", with(func(t *pb.TaskInfo) { t.State = states.TaskLost }), true},
		{"pending", with(func(t *pb.TaskInfo) { t.State, t.WorkerAddr = states.TaskPending, "" }), true},
		{"not listed", &pb.QueryInfo{Status: states.QueryRunning, Tasks: []*pb.TaskInfo{other}}, true},
		{"query stopped", &pb.QueryInfo{Status: states.QueryStopped, Tasks: []*pb.TaskInfo{followed}}, true},
	} {
		if why := placedElsewhere(tc.q, followed); (why != "") != tc.gone {
			t.Errorf("%s: placedElsewhere = %q, want gone %v", tc.name, why, tc.gone)
		}
	}
}
