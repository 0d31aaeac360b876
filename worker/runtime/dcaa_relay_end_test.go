package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// s15 diagnosis (TestDCAAFailureLongerThanTheReplayBound/relayed_downstream
// under load: the other chain's aggregate realigned onto the lossy
// replica at the end of the stream and named a range, which its sink
// never carried). An operator task whose input realigns on a replica
// numbering its stable ids otherwise names the ranges of that replica's
// records that concern what it takes from there (here one around the
// stream time of its last taken result; before s19 the input named that
// stream time itself, as it could not count the results there) and
// relayed that record after its machine processed the batch. When that batch also holds the upstream's final boundary, the
// machine may release the task's own final boundary first: the sink
// ends its subscription on it and never reads the record.
func TestDCAARealignRecordBeforeTheEndReachesTheSink(t *testing.T) {
	q, fake, c, w, up0, up1 := countsOverFakeLines(t, "relend")
	// Replica 0: stable tuples at 1..30 ms, boundaries at 10 and 20 ms:
	// stable ids 1 to 32, the last one a result at 30 ms.
	r0 := stableLines(30, false)
	fake.stream(t, up0, r0...)
	// Replica 1 shares only its first id, then a record of the stream
	// times around 30 ms, more results at 30 ms, a boundary and its end
	// (6 positions: the input's 32 is past it).
	r1 := fakeTuples(fakeTuple{"s", 1})
	r1 = append(r1, tuple.UncorrectableMarker(int64(29*time.Millisecond), int64(31*time.Millisecond)))
	r1 = append(r1, fakeTuples(fakeTuple{"s", 30}, fakeTuple{"s", 30}, fakeTuple{"b", 40}, fakeTuple{"end", 0})...)
	fake.put(t, up1, dataplane.BufferOptions{}, 1, r1...)
	c.apply()
	agg := failOverAfter(t, q, fake, w, up0, 32)
	got := viewOf(c.tail(t, queryspec.TaskID(q.Name, "out", 0, 0)))
	tk := w.rt.task(agg)
	named := tk.unc.list()
	st := tk.State()
	t.Logf("aggregate: named %v, status lossy %v %q; sink: %d stable, %d records", named, st.Lossy, st.Message, len(got.stable), len(got.uncorrectable))
	if len(named) == 0 {
		t.Fatal("the aggregate named nothing: the scenario did not arise")
	}
	if len(got.uncorrectable) == 0 {
		t.Errorf("the aggregate named %v, which its sink's stream does not carry", named)
	}
}
