package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/dcaa"
)

// Background subscriptions (dcaa.SubscribeBackground): while an input of
// an operator task reads a tentative upstream replica, its machine may
// ask to read another replica of that upstream beside it, to take that
// replica's corrections as they come and move to it at its REC_DONE
// (worker/dcaa/background.go). The machine chooses the replica and when
// to start and stop; this file only runs the subscription and hands
// what it delivers to the machine, tagged with the attempt.
//
// A background subscription acknowledges nothing (a no-ack subscriber,
// as tail is): it holds no buffer back and is not one of the
// upstream's consumers. It starts at the input's last stable id taken
// as a position (a replica's position of a stable id is never below the
// id, so no stable tuple past it is skipped; those before it that come
// again are dropped by the machine as resent), and its batches are
// renumbered by stable id as the main subscription's are. A replica
// whose stable ids diverged (a correction that could not be made exact:
// a lineage on its batches) or that names results as lost is not read in
// the background: the subscription ends as failed, and the input gets
// the corrections the ordinary way, where the lineage watch realigns
// (dcaa_lineage.go).

// bgSub is an input's running background subscription.
type bgSub struct {
	attempt uint64
	cancel  context.CancelFunc
}

// errBackgroundLineage ends a background subscription to a replica whose
// stable ids diverged.
var errBackgroundLineage = errors.New("dcaa: background replica numbers its stable ids otherwise or names lost results")

// startBackground runs the machine's SubscribeBackground a for input in
// until the machine stops it (stopBackground), it fails (reported to
// the machine as the attempt's SubscriptionFailed), or the task ends.
// The run goroutine only (it owns the inputs' bg).
func (d *dcaaRun) startBackground(a dcaa.SubscribeBackground) {
	in := d.t.inputs[a.Input]
	d.stopBackgroundOf(in) // the machine stopped it first; never two
	ctx, cancel := context.WithCancel(d.t.ctx)
	in.bg = &bgSub{attempt: a.Attempt, cancel: cancel}
	d.backgrounds.Add(1)
	// Owned by the task's context and by the machine's StopBackground
	// (cancel).
	go func() {
		err := d.runBackground(ctx, in, a)
		if ctx.Err() != nil {
			return // stopped by the machine, or the task ended
		}
		d.t.log.Debug("DCAA background subscription ended", "input", in.upstream, "partition", in.upPartition, "replica", a.Replica, "err", err)
		_ = d.post(ctx, dcaaEvent{ev: dcaa.SubscriptionFailed{Input: in.idx, Attempt: a.Attempt}, ended: -1})
	}()
}

// stopBackground ends input i's background subscription attempt (the
// machine's StopBackground). The run goroutine only.
func (d *dcaaRun) stopBackground(a dcaa.StopBackground) {
	in := d.t.inputs[a.Input]
	if in.bg != nil && in.bg.attempt == a.Attempt {
		d.stopBackgroundOf(in)
	}
}

// stopBackgroundOf cancels input in's background subscription, if any,
// without waiting for its goroutine (which may be posting to the run
// goroutine, the caller: the post gives up once cancelled).
func (d *dcaaRun) stopBackgroundOf(in *input) {
	if in.bg != nil {
		in.bg.cancel()
		in.bg = nil
	}
}

// runBackground subscribes to replica a.Replica of input in's upstream
// and posts each batch to the machine as a Deliver of attempt a.Attempt.
func (d *dcaaRun) runBackground(ctx context.Context, in *input, a dcaa.SubscribeBackground) error {
	return d.t.readInBackground(ctx, in, a.Replica, a.AfterID, func(ctx context.Context, b *dataplane.Batch, st dcaa.State) error {
		if _, _, err := renumberStable(b); err != nil {
			return err
		}
		ev := dcaa.Deliver{Input: in.idx, Tuples: b.Tuples, Upstream: st, Attempt: a.Attempt}
		return d.post(ctx, dcaaEvent{ev: ev, ended: -1})
	})
}

// readInBackground subscribes, acknowledging nothing, to replica r of
// input in's upstream after position after, and hands each batch to fn
// with the state the replica advertised with it, until ctx ends or fn
// fails. A batch of a replica whose stable ids diverged or that names
// lost results ends it (errBackgroundLineage). Operator tasks' machines
// (runBackground) and sinks (dcaa_sinkbg.go) read so.
func (t *task) readInBackground(ctx context.Context, in *input, r int, after uint64, fn func(context.Context, *dataplane.Batch, dcaa.State) error) error {
	pl, ok := t.replicaPlacement(in.upstream, in.upPartition, r)
	if !ok {
		return fmt.Errorf("no placement known for %s partition %d replica %d", in.upstream, in.upPartition, r)
	}
	ref := &fedstreampb.StreamRef{Query: t.spec.Query, TaskId: pl.TaskID, Partition: int32(t.spec.Partition), Consumer: t.spec.Fragment, Generation: int32(pl.Generation)}
	sub := dataplane.NewSubscriber(ref, t.spec.CopyID(), true, after)
	// The state each message carries, read by deliver for its batch
	// (OnStreamState runs before the batch is delivered).
	var state atomic.Int32
	sub.OnStreamState(func(st fedstreampb.ReplicaState, _ int64, _ bool) { state.Store(int32(st)) })
	deliver := func(ctx context.Context, b *dataplane.Batch) error {
		if b.Lineage != 0 || len(b.Named) > 0 {
			return errBackgroundLineage
		}
		return fn(ctx, b, dcaa.StateFromProto(fedstreampb.ReplicaState(state.Load())))
	}
	if local, err := t.r.LocalStream(ref); err == nil {
		return sub.RunLocal(ctx, local, deliver)
	}
	conn, err := t.r.pool.Conn(pl.WorkerAddr)
	if err != nil {
		return err
	}
	return sub.Run(ctx, conn, deliver)
}
