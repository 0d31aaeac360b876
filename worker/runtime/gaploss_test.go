package runtime

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestPlacedAgainWithoutStateNamesLostInput: in a query without
// replicas, an aggregate partition whose worker is lost is placed again
// without state (no replica to start from, as after a worker falsely
// declared down under load). Its upstream discarded the start of its
// input, taken by the lost copy: the new copy's windows miss it, and the
// results are lost for good. The loss is named: the new copy's status
// says which stream times may miss results (lossy), and the sink's
// result stream, which readers tail, carries an UNCORRECTABLE record of
// that range, relayed by the sink, which notes it too. Before, the new
// copy ran on as if nothing had happened and only the source's worker
// logged "subscriber resumes after discarded tuples" (fails: no
// UNCORRECTABLE record, no lossy task).
func TestPlacedAgainWithoutStateNamesLostInput(t *testing.T) {
	const rate = 100
	q := mustParse(t, fmt.Sprintf(wordsQuery, 1, rate))
	const agg, sink = "wc/counts/p0/r0", "wc/out/p0/r0"
	place := func(node string, partition, _ int) int {
		if node == "counts" && partition == 0 {
			return 1
		}
		return 0
	}
	pace, err := NewPace(1)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{BoundaryInterval: time.Millisecond, SourcePace: pace}
	c := newClusterEach(t, q, place, opts, opts, opts)
	defer c.close(t)
	c.apply()
	lost, next := c.workers[1], c.workers[2]
	src := c.workers[0].rt.task("wc/lines/p0/r0")
	if src == nil {
		t.Fatal("the source did not start")
	}
	// The first copy took (and acknowledged) the start of its input.
	waitUntil(t, "the aggregate's first copy took some input", func() bool {
		return src.outs[0].buf.Stats().LaggardAck > 20
	})
	spec := c.loseWorker(lost, agg)
	again := c.placeAgainFromNothing(t, lost, spec, next)
	waitUntil(t, "the new copy names what it lost", func() bool {
		st := again.State()
		return st.Lossy && strings.Contains(st.Message, "no longer held")
	})
	if err := pace.Set(1000); err != nil { // the rest of the stream at once
		t.Fatal(err)
	}
	got := c.tail(t, sink)
	var marks [][2]int64
	for i := range got {
		if from, to, ok := tuple.UncorrectableRange(&got[i]); ok {
			marks = append(marks, [2]int64{from, to})
		}
	}
	if len(marks) != 1 || marks[0][0] != math.MinInt64 || marks[0][1] <= 0 {
		t.Fatalf("UNCORRECTABLE records on the sink's stream: %v, want one from the start of the stream", marks)
	}
	for _, st := range c.states() {
		if st.TaskID == sink && !st.Lossy {
			t.Fatalf("the sink's status does not name the loss: %+v", st)
		}
		if st.State == StateFailed {
			t.Fatalf("task %s failed: %s", st.TaskID, st.Message)
		}
	}
}
