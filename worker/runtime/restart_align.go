package runtime

import (
	"context"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
)

// restartAlignWait bounds how long an operator copy started again
// without its state waits for its consumers to subscribe before it
// processes anything (see alignRestartedOutputs). Consumers learn of the
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

// alignRestartedOutputs makes a copy started without state continue each
// output stream's ids after the position its consumer resumed at, then
// closes t.aligned, which the task's inputs wait for before they take
// anything. Numbering from 1 again, the copy's results would all fall at
// or below that position, and the consumer would get none of them until
// the copy had produced as many as the lost one: as long as the lost copy
// had run, hours for a long query. The results the copy produces are not
// the lost copy's (its windows open at the loss count only the input
// replayed), so nothing the consumer holds is given again under another
// id; they are simply the next results. Waits at most restartAlignWait
// for every expected consumer to subscribe; a consumer that comes later
// resumes where it is, as before, and the copy's status says so
// (restartedBehind).
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
