package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// oneStream resolves every StreamRef to one buffer.
type oneStream struct{ buf *dataplane.OutputBuffer }

func (o oneStream) ResolveStream(*pb.StreamRef) (*dataplane.OutputBuffer, error) { return o.buf, nil }

// serveSink serves a sink's result ring holding results 1..n (value i
// at id i) on a plaintext data plane, and returns its address.
func serveSink(t *testing.T, n int, restarted bool) string {
	t.Helper()
	buf := dataplane.NewOutputBuffer(dataplane.BufferOptions{Ring: true, Restarted: restarted})
	for i := 1; i <= n; i++ {
		tp := tuple.Tuple{Type: tuple.Stable, ID: uint64(i), STime: int64(i), Values: []tuple.Value{tuple.Int(int64(i))}}
		if err := buf.Append(context.Background(), &tp); err != nil {
			t.Fatal(err)
		}
	}
	return serveBuffer(t, buf)
}

// serveBuffer serves buf as every stream on a plaintext data plane, and
// returns its address.
func serveBuffer(t *testing.T, buf *dataplane.OutputBuffer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(dataplane.ServerOptions()...)
	pb.RegisterDataPlaneServer(srv, dataplane.NewServer(oneStream{buf}, nil, nil))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// TestTailReadsARestartedSinkFromItsStart: the sink of a query with one
// replica is re-placed after its worker was killed, and its new copy
// (generation 2) starts without the old copy's state, numbering its
// results from 1 again. The tail, which took results up to id 30 from
// the old copy, says so on stderr and prints the new copy's results at
// once. Before, it resumed after id 30 in the new copy and printed
// nothing until that copy had produced 30 results (in the README walk,
// 35 seconds of silence), then went on with those results skipped.
func TestTailReadsARestartedSinkFromItsStart(t *testing.T) {
	schema := tuple.NewSchema([]tuple.Field{{Name: "n", Kind: tuple.KindInt}})
	var ids []uint64
	var printed atomic.Int64
	var notes bytes.Buffer
	tl := &tailer{flags: &clientFlags{tls: clientTLS{insecure: true}}, query: "q", count: 30 + 5, notes: &notes,
		print: func(tp *tuple.Tuple, _ *tuple.Schema, _ string) error {
			ids = append(ids, tp.ID)
			printed.Add(1)
			return nil
		}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old := &pb.TaskInfo{TaskId: "q/out/p0/r0", Generation: 1, WorkerAddr: serveSink(t, 30, false)}
	rctx, rcancel := context.WithCancel(ctx)
	go func() {
		for printed.Load() < 30 && rctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		rcancel() // the old copy's worker is gone
	}()
	if err := tl.follow(rctx, old, schema, "out"); rctx.Err() == nil {
		t.Fatalf("reading the old copy ended with %v", err)
	}
	if len(ids) != 30 || tl.lastID != 30 {
		t.Fatalf("from the old copy: %d results, last id %d; want 30", len(ids), tl.lastID)
	}
	renewed := &pb.TaskInfo{TaskId: "q/out/p0/r0", Generation: 2, WorkerAddr: serveSink(t, 5, true)}
	if err := tl.follow(ctx, renewed, schema, "out"); !errors.Is(err, errCountReached) {
		t.Fatalf("reading the restarted copy: %v after %d results (%v), want its 5 results at once; notes %q", err, len(ids), ids[30:], notes.String())
	}
	if got := ids[30:]; len(got) != 5 || got[0] != 1 || got[4] != 5 {
		t.Fatalf("from the restarted copy: ids %v, want 1..5", got)
	}
	if !strings.Contains(notes.String(), "started again without the state") {
		t.Fatalf("the tail did not say the copy restarted: %q", notes.String())
	}

	// A copy that continues the stream (moved, or bootstrapped from a
	// peer) is resumed by id as before: nothing taken twice.
	ids, notes = nil, bytes.Buffer{}
	tl2 := &tailer{flags: &clientFlags{tls: clientTLS{insecure: true}}, query: "q", count: 3, notes: &notes,
		print: func(tp *tuple.Tuple, _ *tuple.Schema, _ string) error { ids = append(ids, tp.ID); return nil }}
	tl2.lastID, tl2.posFrom = 30, "q/out/p0/r0@g1"
	moved := &pb.TaskInfo{TaskId: "q/out/p0/r0", Generation: 2, WorkerAddr: serveSink(t, 33, false)}
	if err := tl2.follow(ctx, moved, schema, "out"); !errors.Is(err, errCountReached) || len(ids) != 3 || ids[0] != 31 {
		t.Fatalf("reading a continuing copy: %v, ids %v; want 31..33", err, ids)
	}
	if notes.Len() != 0 {
		t.Fatalf("notes for a continuing copy: %q", notes.String())
	}
}
