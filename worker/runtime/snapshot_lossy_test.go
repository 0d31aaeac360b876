package runtime

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// A DCAA copy placed again from the snapshot of a peer that named a loss
// (a replica re-placed from a lossy peer's, or moved) stays lossy: its
// stable stream is that peer's, so its status says so, its output keeps
// the peer's lineage (consumers moving between the two resume by id, and
// one coming from an exact replica realigns), and it does not name the
// same range again. Here the sink took upstream replica 0's
// UNCORRECTABLE record (10-20 ms) and put it on its result stream; its
// snapshot goes through the encoding and starts a copy on another
// worker. Fails before: the copy's status was clean and its output of the
// shared lineage.
func TestLossyCopyFromSnapshotStaysLossy(t *testing.T) {
	q := mustParse(t, sinkTentResumeQuery)
	local := func(n *queryspec.Node) bool { return n.Kind != queryspec.KindSource }
	up0, up1 := queryspec.TaskID(q.Name, "lines", 0, 0), queryspec.TaskID(q.Name, "lines", 0, 1)
	sink := queryspec.TaskID(q.Name, "out", 0, 0)
	stable, _ := tentResumeStreams()
	ts := fakeTuples(stable[:11]...)
	ts = append(ts, tuple.UncorrectableMarker(int64(10*time.Millisecond), int64(20*time.Millisecond)))
	ts = append(ts, fakeTuples(stable[11:]...)...)

	fake, c, w := fakeUpstreamCluster(t, q, local)
	fake.put(t, up0, dataplane.BufferOptions{}, 11, ts...)
	fake.put(t, up1, dataplane.BufferOptions{}, 11, ts...)
	c.apply()
	waitUntil(t, "the sink taking replica 0's stream and its record", func() bool {
		tk := w.rt.task(sink)
		return tk != nil && tk.inputs[0].stableTaken.Load() == 33 && tk.State().Lossy
	})
	note := w.rt.task(sink).State().Message
	lin, since := w.rt.task(sink).outs[0].buf.Lineage()
	if lin == 0 {
		t.Fatal("the sink's result stream kept the shared lineage after naming a range")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	snap, err := w.rt.SnapshotTask(ctx, sink, SnapshotOptions{Halt: true})
	if err != nil {
		t.Fatal(err)
	}
	w2 := startWorkerOpts(t, c.pool, dcaaOpts)
	c.workers = append(c.workers, w2)
	c.moveTask(t, sink, w, w2, reencoded(t, snap))
	waitUntil(t, "the copy running", func() bool {
		tk := w2.rt.task(sink)
		return tk != nil && tk.State().State == StateRunning
	})
	tk := w2.rt.task(sink)
	if st := tk.State(); !st.Lossy || !strings.Contains(st.Message, "could not be corrected") || !strings.Contains(note, st.Message) {
		t.Fatalf("the copy's status: lossy %v, %q; the snapshot's copy said %q", st.Lossy, st.Message, note)
	}
	if l, s := tk.outs[0].buf.Lineage(); l != lin || s != since {
		t.Fatalf("the copy's lineage %x since %d, the snapshot's copy's %x since %d", l, s, lin, since)
	}
	if !tk.unc.has(int64(10*time.Millisecond), int64(20*time.Millisecond)) {
		t.Fatal("the copy does not know the range it holds a record of already")
	}
}

// reencoded is s after MarshalBinary and UnmarshalBinary (a snapshot as
// a copy on another worker gets it).
func reencoded(t *testing.T, s *TaskSnapshot) *TaskSnapshot {
	t.Helper()
	enc, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var dec TaskSnapshot
	if err := dec.UnmarshalBinary(enc); err != nil {
		t.Fatal(err)
	}
	return &dec
}
