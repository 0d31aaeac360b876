package runtime

import (
	"context"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// restartAlignWait bounds how long a copy started again without its
// state (an operator, or an ingest source: ingestStartsAfresh) waits for
// its consumers to subscribe before it processes or takes anything (see
// alignRestartedOutputs). Consumers learn of the
// new copy from their assignments, as the copy itself does, so they
// normally come within a heartbeat or two; one whose own worker was lost
// too comes later, from nothing, and loses nothing by the copy not
// waiting for it.
const restartAlignWait = 5 * time.Second

// startsWithoutState reports whether the task is a copy of an operator
// placed again without the state of the copy before it (its worker was
// lost and no replica could give a snapshot) in a query without
// replicas: it replays only what its upstreams still buffer, and its
// consumers resume after the results they took from the lost copy.
// Generators catch up by their own means (runGenerator), sinks' readers
// read such a stream from its start (rpc.StreamRestartedHeader), and a
// replicated query's replicas number their streams by stable ids. The
// first copy of a partition a rescale adds also starts without state at
// a generation above 1, but is no such copy (addedByRescale).
func (t *task) startsWithoutState() bool {
	return t.spec.Generation > 1 && t.spec.FromSnapshot == nil && !t.restored &&
		t.gen == nil && t.genSnap == nil && t.ingest == nil && t.kafka == nil &&
		t.merge != nil && t.dm == nil && !t.dcaaOn() && t.node.Kind != queryspec.KindSink &&
		!t.addedByRescale()
}

// addedByRescale reports whether the task is the first copy of a
// partition that the rescale under way in its fragment adds: a partition
// the map before the rescale does not have, whose generation is the
// rescale's epoch (the coordinator creates it so). No copy came before
// it, its consumers hold nothing from it: there is nothing to renumber,
// and waiting for them to subscribe (they do only at the rescale's go)
// would only delay it. A later copy of it (placed again, or started again
// after the rescale finished) may have had consumers, and is not one.
func (t *task) addedByRescale() bool {
	m := t.spec.SlotMaps[t.spec.Fragment]
	if m == nil || m.Next == nil {
		return false
	}
	before := m.Partitions
	if before == 0 {
		before = t.node.Partitions // not said: the query definition's
	}
	return t.spec.Partition >= before && t.spec.Generation == int(m.Next.Epoch)
}

// ingestStartsAfresh reports whether the task is a copy of an ingest
// source placed again without a snapshot (its worker was lost: a source
// copy is snapshotted only to move) in a query without replicas.
//
// The invariant it serves: an id names a position in one producer
// stream, and a consumer resumes after the ids it took. Such a copy
// replays nothing (its producers resend only what it did not
// acknowledge, and know nothing of what its consumers took), so what it
// produces are simply the next tuples of its consumers' streams: it
// numbers them after the position each consumer resumed at
// (alignRestartedOutputs), and takes no line, close or tick before
// (awaitAligned). Numbered from 1 again, its first tuples fell at or
// below that position and the consumer skipped them: records the copy
// accepted and acknowledged never reached it. A replicated query's
// replicas number their streams by stable ids and are left as they were.
func (t *task) ingestStartsAfresh() bool {
	return t.ingest != nil && t.spec.Generation > 1 && t.spec.FromSnapshot == nil && !t.dcaaOn()
}

// awaitAligned waits, for an ingest source started afresh
// (ingestStartsAfresh), until it has numbered its outputs after its
// consumers' positions: anything it emitted before would take the ids
// its consumers skip. At most restartAlignWait after the copy started;
// ctx's error if it ends first. st.mu must not be held.
func (t *task) awaitAligned(ctx context.Context) error {
	a := t.aligned
	if a == nil || t.ingest == nil {
		return nil
	}
	select {
	case <-a:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// alignRestartedOutputs makes a copy started without state continue each
// output stream's ids after the position its consumer resumed at, then
// closes t.aligned, which the task's inputs (an ingest source's requests
// and ticks: awaitAligned) wait for before they take anything. Numbering
// from 1 again, the copy's results would all fall at or below that
// position, and the consumer would get none of them until the copy had
// produced as many as the lost one: as long as the lost copy had run,
// hours for a long query; an ingest source's, never (they are not
// produced again). The results the copy produces are not the lost
// copy's (its windows open at the loss count only the input replayed),
// so nothing the consumer holds is given again under another id; they
// are simply the next results. An ingest source's are the records sent
// to it: one its client sends again because the lost copy's answer was
// lost may be held by the consumer already (at least once). Waits at most restartAlignWait for every expected consumer to
// subscribe; a consumer that comes later resumes where it is, as before,
// and an operator copy's status says so (restartedBehind).
func (t *task) alignRestartedOutputs(ctx context.Context) {
	defer close(t.aligned)
	deadline := time.Now().Add(restartAlignWait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		waiting := false
		t.outMu.RLock()
		for _, o := range t.outs {
			if o.buf.Stats().Missing > 0 {
				waiting = true
				break
			}
		}
		t.outMu.RUnlock()
		if !waiting || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	t.outMu.RLock()
	defer t.outMu.RUnlock()
	for _, o := range t.outs {
		held := o.buf.Wanted()
		if held == 0 || o.w.LastID() != 0 {
			continue
		}
		// Nothing was produced yet (the inputs wait for t.aligned), so
		// the stream is empty and the writer idle.
		if err := o.w.ResumeAfter(held); err != nil {
			t.log.Warn("output of a copy started without state not aligned with its consumer", "consumer", o.consumer, "partition", o.partition, "after", held, "err", err)
			continue
		}
		t.log.Info("copy started without state numbers its output after its consumer's position", "consumer", o.consumer, "partition", o.partition, "after", held)
	}
}
