package worker

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// noticeCoord is a coordinator whose ReportTasks waits until released
// (a report whose Raft write is slow) and that keeps the notices it gets;
// with old set it serves no NoteReconfigAcks (an older version).
type noticeCoord struct {
	pb.UnimplementedWorkerServiceServer
	release chan struct{}
	notices chan *pb.ReportTasksRequest
	reports atomic.Int32
}

func (c *noticeCoord) ReportTasks(ctx context.Context, req *pb.ReportTasksRequest) (*pb.ReportTasksResponse, error) {
	c.reports.Add(1)
	select {
	case <-c.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &pb.ReportTasksResponse{}, nil
}

type noticeCoordNew struct{ *noticeCoord }

func (c noticeCoordNew) NoteReconfigAcks(_ context.Context, req *pb.ReportTasksRequest) (*pb.ReportTasksResponse, error) {
	c.notices <- req
	return &pb.ReportTasksResponse{}, nil
}

// noticeRig is a worker (not running) whose coordinator is srv, with
// task q/f/p0/r0 at generation 2 acknowledging what acked holds.
func noticeRig(t *testing.T, srv pb.WorkerServiceServer) (*Worker, *atomic.Uint64) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterWorkerServiceServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	w, err := New(Config{Org: "acme", Name: "w", Coordinators: []string{lis.Addr().String()}, InsecurePlaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = w.runtime.Close(ctx)
		w.mu.Lock()
		for _, c := range w.conns {
			_ = c.Close()
		}
		w.mu.Unlock()
	})
	var acked atomic.Uint64
	w.taskStates = func() []wrt.TaskState {
		return []wrt.TaskState{{TaskID: "q/f/p0/r0", Generation: 2, Reconfig: true, ReconfigAcked: acked.Load()}}
	}
	return w, &acked
}

// TestAcksNotedWhileAReportWaits: a task that acknowledges a plan while
// the worker's report waits for its write has its acknowledgement sent to
// the leader at once (NoteReconfigAcks), not after that write, and the
// report loop is told to report again at once (the report carries it to
// Raft). Against a coordinator without NoteReconfigAcks the worker stops
// sending notices and still reports.
func TestAcksNotedWhileAReportWaits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	coord := &noticeCoord{release: make(chan struct{}), notices: make(chan *pb.ReportTasksRequest, 4)}
	w, acked := noticeRig(t, noticeCoordNew{coord})
	sent := ackedSent{}
	var again bool
	var reportErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		again = w.reportNoting(ctx, "w-1", sent, func() {
			reportErr = w.call(ctx, 30*time.Second, func(ctx context.Context, c pb.WorkerServiceClient) error {
				_, err := c.ReportTasks(ctx, &pb.ReportTasksRequest{WorkerId: "w-1"})
				return err
			})
		})
	}()
	for coord.reports.Load() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the report never reached the coordinator")
		case <-time.After(time.Millisecond):
		}
	}
	// The task installs plan 3 while the report waits: the runtime
	// signals progress (an Apply ends with one).
	acked.Store(3)
	w.runtime.Apply(ctx, nil)
	select {
	case n := <-coord.notices:
		if n.WorkerId != "w-1" || len(n.Tasks) != 1 || n.Tasks[0].TaskId != "q/f/p0/r0" || n.Tasks[0].Generation != 2 || n.Tasks[0].Reconfig.GetAcked() != 3 {
			t.Fatalf("notice %v, want task q/f/p0/r0 generation 2 acknowledging 3", n)
		}
	case <-ctx.Done():
		t.Fatal("no notice while the report waited")
	}
	close(coord.release)
	<-done
	if reportErr != nil || !again {
		t.Fatalf("report: %v, report again at once: %v (want true: a progress signal was taken)", reportErr, again)
	}
	if sent.isNew("q/f/p0/r0", 2, 3) || !sent.isNew("q/f/p0/r0", 3, 3) {
		t.Fatalf("acknowledgements sent %v: the noticed one is news, or a new copy's is not", sent)
	}
	// The same acknowledgement is not noticed twice.
	w.noteAcks(ctx, "w-1", sent)
	select {
	case n := <-coord.notices:
		t.Fatalf("a second notice of what left already: %v", n)
	default:
	}

	old := &noticeCoord{release: make(chan struct{}), notices: make(chan *pb.ReportTasksRequest, 4)}
	close(old.release)
	w2, acked2 := noticeRig(t, old)
	acked2.Store(1)
	reported := false
	w2.noteAcks(ctx, "w-2", ackedSent{})
	if !w2.noNotices.Load() {
		t.Fatal("a coordinator without NoteReconfigAcks: the worker keeps sending notices")
	}
	w2.reportNoting(ctx, "w-2", ackedSent{}, func() { reported = true })
	if !reported {
		t.Fatal("the report did not go")
	}
}
