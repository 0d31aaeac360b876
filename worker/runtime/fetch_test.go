package runtime

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestFetchSnapshot: a task's snapshot crosses to another worker over
// the DataPlane FetchSnapshot RPC in many small chunks and arrives equal
// to the snapshot taken locally; a copy of another generation and a
// source are refused with a code the caller can tell apart.
func TestFetchSnapshot(t *testing.T) {
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterOpts(t, 1, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: time.Millisecond, SnapshotChunkBytes: 16})
	defer c.close(t)
	c.apply()
	c.tail(t, "wc/out/p0/r0") // the whole input processed: the state no longer changes
	w := c.workers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	local, err := w.rt.SnapshotTask(ctx, "wc/counts/p0/r0", SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := local.MarshalBinary()
	if len(want) < 4*16 {
		t.Fatalf("snapshot of %d bytes: too small to cross in several chunks, the test would prove nothing", len(want))
	}
	conn, err := c.pool.Conn(w.addr)
	if err != nil {
		t.Fatal(err)
	}
	got, err := FetchSnapshot(ctx, conn, &fedstreampb.FetchSnapshotRequest{Query: "wc", TaskId: "wc/counts/p0/r0", Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := got.MarshalBinary()
	if !bytes.Equal(enc, want) {
		t.Fatalf("fetched snapshot (%d bytes) differs from the local one (%d bytes)", len(enc), len(want))
	}
	if n := w.rt.SnapshotsServed(); n != 1 {
		t.Fatalf("SnapshotsServed = %d, want 1", n)
	}
	_, err = FetchSnapshot(ctx, conn, &fedstreampb.FetchSnapshotRequest{Query: "wc", TaskId: "wc/counts/p0/r0", Generation: 2})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("another generation: %v, want NotFound", err)
	}
	_, err = FetchSnapshot(ctx, conn, &fedstreampb.FetchSnapshotRequest{Query: "wc", TaskId: "wc/lines/p0/r0"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("source: %v, want FailedPrecondition", err)
	}
	// A move's copy whose fetch broke off asks again: the halted task
	// gives the same snapshot; a snapshot that would not halt is refused.
	halted, err := FetchSnapshot(ctx, conn, &fedstreampb.FetchSnapshotRequest{Query: "wc", TaskId: "wc/counts/p0/r0", Halt: true})
	if err != nil {
		t.Fatal(err)
	}
	again, err := FetchSnapshot(ctx, conn, &fedstreampb.FetchSnapshotRequest{Query: "wc", TaskId: "wc/counts/p0/r0", Halt: true})
	if err != nil {
		t.Fatalf("halt snapshot asked again: %v", err)
	}
	a, _ := halted.MarshalBinary()
	b, _ := again.MarshalBinary()
	if !bytes.Equal(a, b) {
		t.Fatal("the halt snapshot asked again differs")
	}
	if _, err := FetchSnapshot(ctx, conn, &fedstreampb.FetchSnapshotRequest{Query: "wc", TaskId: "wc/counts/p0/r0"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("live snapshot of a halted task: %v, want FailedPrecondition", err)
	}
}
