package runtime

import (
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// s15 diagnosis (relayed_downstream under load: "subscriber resumes after
// discarded tuples; it misses some" for a DCAA operator input, and that
// chain's sink then had fewer results than the other, naming nothing).
// A DCAA operator task's input that resumes by stable id on a replica of
// the same lineage that no longer holds the ids after it (discarded:
// acknowledged by others, or past its buffer bound) skips them. Outside
// DCAA such a gap is named (gaploss.go, noteInputGap); a DCAA input
// names nothing.
func TestDCAAInputResumedOverAGapNamesIt(t *testing.T) {
	q, fake, c, w, up0, up1 := countsOverFakeLines(t, "rgap")
	all := append(stableLines(30, true), fakeTuple{"end", 0})
	// Replica 0 has produced the first 15 only (ids 1 to 15).
	fake.stream(t, up0, all[:15]...)
	// Replica 1 has it all, but discarded ids 1 to 20 (acknowledged by
	// another consumer).
	b1 := fake.put(t, up1, dataplane.BufferOptions{}, 0, fakeTuples(all...)...)
	b1.Register("other")
	b1.Ack("other", 20)
	c.apply()
	agg := failOverAfter(t, q, fake, w, up0, 15)
	got := viewOf(c.tail(t, queryspec.TaskID(q.Name, "out", 0, 0)))
	named := w.rt.task(agg).unc.list()
	t.Logf("aggregate named %v; sink: %d stable, %d records", named, len(got.stable), len(got.uncorrectable))
	if len(got.uncorrectable) == 0 {
		t.Errorf("the aggregate skipped ids 16 to 20 of its input (a resumption over discarded tuples) and its sink names nothing")
	}
}
