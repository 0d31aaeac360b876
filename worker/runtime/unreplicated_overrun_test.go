package runtime

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// TestUnreplicatedConsumerAwayIsWaitedFor: in a query without replicas,
// a consumer that took some of the source's output and went away (paused,
// reconnecting) without being gone for good holds the source back, far
// past the overrun grace: nothing is discarded, and when it subscribes
// again it gets the stream from where it was, without a gap. Before, the
// source's full buffer discarded the consumer's untaken tuples after the
// grace and the consumer resumed after a gap that only the worker's log
// named: a non-replicated query lost results silently whenever a
// consumer was away longer than the grace.
func TestUnreplicatedConsumerAwayIsWaitedFor(t *testing.T) {
	const grace = 20 * time.Millisecond
	tk, conn, ref, took := sourceWithConsumerAway(t, dataplane.BufferOptions{MaxTuples: 100, OverrunGrace: grace, Lease: time.Minute})
	buf := tk.outs[0].buf
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Blocked for fifty graces, or overrun: whichever comes first.
	waitUntil(t, "the source blocked well past the grace, or an overrun", func() bool {
		st := buf.Stats()
		return st.Overrun > 0 || (!st.BlockedSince.IsZero() && time.Since(st.BlockedSince) > 50*grace)
	})
	if st := buf.Stats(); st.Overrun > 0 || st.OldestID > took+1 {
		t.Fatalf("the output discarded %d tuples the consumer that is away had not taken (it took up to %d; oldest kept %d)", st.Overrun, took, st.OldestID)
	}
	// Back: it resumes where it was, and the source moves again.
	last := buf.Stats().LastID
	back := dataplane.NewSubscriber(ref, "away", false, took)
	first := uint64(0)
	err := back.Run(ctx, conn, func(_ context.Context, b *dataplane.Batch) error {
		if first == 0 {
			first = b.FirstID
		}
		if b.LastID > last {
			return dataplane.ErrStopSubscription
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if first != took+1 {
		t.Fatalf("the consumer resumed after %d and got %d first: a gap", took, first)
	}
	if n := buf.Stats().Overrun; n != 0 {
		t.Fatalf("%d tuples overrun", n)
	}
}

// sourceWithConsumerAway runs the source of a words query without
// replicas on a worker whose buffers have opts, drains its output to
// counts partition 1, and lets the consumer of partition 0 ("away") take
// one batch and go away. It returns the source task, a connection to its
// worker, the stream of partition 0 and how far "away" took it.
func sourceWithConsumerAway(t *testing.T, opts dataplane.BufferOptions) (tk *task, conn grpc.ClientConnInterface, ref *fedstreampb.StreamRef, took uint64) {
	t.Helper()
	pool := dataplane.NewPool()
	t.Cleanup(func() { _ = pool.Close() })
	w := startWorkerOpts(t, pool, Options{BoundaryInterval: time.Millisecond, StallAfter: time.Minute, Buffer: opts})
	t.Cleanup(func() { w.close(t) })
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	const id = "wc/lines/p0/r0"
	w.rt.Apply(context.Background(), []TaskSpec{{TaskID: id, Query: "wc", Fragment: "lines", QueryIndex: 1, Spec: q}})
	if conn, err = pool.Conn(w.addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before the worker closes: cleanups run last first
	drain := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "wc", TaskId: id, Consumer: "counts", Partition: 1}, "drain", false, 0)
	go func() { _ = drain.Run(ctx, conn, func(context.Context, *dataplane.Batch) error { return nil }) }()
	ref = &fedstreampb.StreamRef{Query: "wc", TaskId: id, Consumer: "counts"}
	away := dataplane.NewSubscriber(ref, "away", false, 0)
	if err := away.Run(ctx, conn, func(context.Context, *dataplane.Batch) error { return dataplane.ErrStopSubscription }); err != nil {
		t.Fatal(err)
	}
	return w.rt.task(id), conn, ref, away.LastID()
}
