package runtime

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pinWait bounds how long one attempt at pinning an upstream stream
// waits for the upstream to confirm the registration. An attempt that
// times out is made again with twice the time, up to pinWaitMax: on a
// starved machine a registration can take longer than pinWait, and a
// live snapshot taken without it loses the tuples after its positions
// that the upstream discards before the new copy subscribes (bench move
// under load 30: a pin phase of 969 ms, a timeout nobody was told of, the
// new copy resuming after discarded tuples and 5,826 result rows lost).
// An upstream that answers with an error (down, unknown stream) is not
// asked again.
const (
	pinWait    = 500 * time.Millisecond
	pinWaitMax = 4 * time.Second
)

// pinUpstreams registers the copy spec describes as a subscriber of every
// replica of every upstream stream it will read, before its starting
// snapshot is taken from a copy that keeps running (a live move, a peer
// replica): from then on those buffers keep every tuple the new copy has
// not acknowledged, so whatever the snapshot's input positions turn out to
// be, the tuples after them are still there when the copy subscribes. The
// registration (dataplane.Register) is an ack-only subscription under the
// copy's name that ends at once, reading and acknowledging nothing; the
// subscriber then holds the buffer for one lease, or until the copy's own
// subscriptions (under the same name) acknowledge. It returns once every
// stream is pinned or given up on, with the upstream streams none of
// whose replicas could be pinned ("fragment[partition]"): for those the
// guarantee does not hold (the caller decides; see bootstrap).
func (r *Runtime) pinUpstreams(ctx context.Context, spec TaskSpec) (unpinned []string) {
	t, err := newTask(r, TaskSpec{TaskID: spec.TaskID, Query: spec.Query, Fragment: spec.Fragment, Partition: spec.Partition,
		Replica: spec.Replica, QueryIndex: spec.QueryIndex, Spec: spec.Spec, Placements: spec.Placements,
		Generation: spec.Generation, SlotEpoch: spec.SlotEpoch, Slots: spec.Slots, SlotMaps: spec.SlotMaps})
	if err != nil {
		return nil // the task will fail to start with the reason
	}
	defer t.cancel()
	var wg sync.WaitGroup
	pinned := make([]atomic.Bool, len(t.inputs))
	for i, in := range t.inputs {
		for _, pl := range t.candidates(in.upstream, in.upPartition) {
			ref := &fedstreampb.StreamRef{Query: spec.Query, TaskId: pl.TaskID, Partition: int32(spec.Partition),
				Consumer: spec.Fragment, Generation: int32(pl.Generation)}
			if r.pinFault != nil && r.pinFault(pl) {
				continue // a test's registration that fails
			}
			if local, err := r.LocalStream(ref); err == nil {
				local.Register(spec.CopyID())
				pinned[i].Store(true)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := r.pool.Conn(pl.WorkerAddr)
				for attempt, wait := 1, cmp.Or(r.pinWait, pinWait); err == nil; attempt++ {
					// Registered without reading: nothing crosses, nothing
					// is acknowledged (that would let the upstream discard
					// tuples the snapshot may not reflect yet), and an
					// upstream with nothing buffered answers at once.
					pctx, cancel := context.WithTimeout(ctx, wait)
					err = dataplane.Register(pctx, conn, ref, spec.CopyID())
					// gRPC may report the deadline before pctx does.
					timedOut := err != nil && ctx.Err() == nil && (pctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded)
					cancel()
					if !timedOut || wait >= pinWaitMax {
						break
					}
					wait = min(2*wait, pinWaitMax)
					r.log.Info("registering with an upstream before the snapshot timed out; trying again", "task", spec.TaskID,
						"upstream", pl.TaskID, "worker", pl.WorkerAddr, "attempt", attempt, "next_wait", wait)
					err = nil
				}
				if err == nil {
					pinned[i].Store(true)
				} else if ctx.Err() == nil {
					r.log.Info("could not register with an upstream copy before the snapshot", "task", spec.TaskID,
						"upstream", pl.TaskID, "worker", pl.WorkerAddr, "err", err)
				}
			}()
		}
	}
	wg.Wait()
	for i, in := range t.inputs {
		if !pinned[i].Load() {
			unpinned = append(unpinned, fmt.Sprintf("%s[%d]", in.upstream, in.upPartition))
		}
	}
	return unpinned
}
