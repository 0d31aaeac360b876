package runtime

import (
	"context"
	"sync"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// pinWait bounds how long pinning one upstream stream waits for the
// upstream to confirm the registration.
const pinWait = 500 * time.Millisecond

// pinUpstreams registers the copy spec describes as a subscriber of every
// replica of every upstream stream it will read, before its starting
// snapshot is taken from a copy that keeps running (a live move, a peer
// replica): from then on those buffers keep every tuple the new copy has
// not acknowledged, so whatever the snapshot's input positions turn out to
// be, the tuples after them are still there when the copy subscribes. The
// registration (dataplane.Register) is an ack-only subscription under the
// copy's name that ends at once, reading and acknowledging nothing; the
// subscriber then holds the buffer for one lease, or until the copy's own
// subscriptions (under the same name) acknowledge. It returns once every stream is pinned or
// given up on; failures only weaken the guarantee, so they are logged.
func (r *Runtime) pinUpstreams(ctx context.Context, spec TaskSpec) {
	t, err := newTask(r, TaskSpec{TaskID: spec.TaskID, Query: spec.Query, Fragment: spec.Fragment, Partition: spec.Partition,
		Replica: spec.Replica, QueryIndex: spec.QueryIndex, Spec: spec.Spec, Placements: spec.Placements,
		Generation: spec.Generation, SlotEpoch: spec.SlotEpoch, Slots: spec.Slots, SlotMaps: spec.SlotMaps})
	if err != nil {
		return // the task will fail to start with the reason
	}
	defer t.cancel()
	var wg sync.WaitGroup
	for _, in := range t.inputs {
		for _, pl := range t.candidates(in.upstream, in.upPartition) {
			ref := &fedstreampb.StreamRef{Query: spec.Query, TaskId: pl.TaskID, Partition: int32(spec.Partition),
				Consumer: spec.Fragment, Generation: int32(pl.Generation)}
			if local, err := r.LocalStream(ref); err == nil {
				local.Register(spec.CopyID())
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				pctx, cancel := context.WithTimeout(ctx, pinWait)
				defer cancel()
				conn, err := r.pool.Conn(pl.WorkerAddr)
				if err == nil {
					// Registered without reading: nothing crosses, nothing
					// is acknowledged (that would let the upstream discard
					// tuples the snapshot may not reflect yet), and an
					// upstream with nothing buffered answers at once.
					err = dataplane.Register(pctx, conn, ref, spec.CopyID())
				}
				if err != nil && pctx.Err() == nil {
					r.log.Warn("could not register with an upstream before the snapshot", "task", spec.TaskID,
						"upstream", pl.TaskID, "worker", pl.WorkerAddr, "err", err)
				}
			}()
		}
	}
	wg.Wait()
}
