package runtime

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestReconfigSourceReplicaLearnsTheCutLate hands a live plan's cut to
// every task but one replica of a source partition, and to that one
// only once its sibling has passed the cut: the late replica holds at
// the lowest cut the plan could get (its acknowledged frontier plus the
// margin) instead of passing the cut unknowingly, so both replicas
// switch at the cut and the two sinks' stable outputs are the same,
// version tags included. Without the hold the late replica went on
// past the cut under the old epoch and switched at a later boundary:
// sink replica 1's tuples between the two were tagged v1, replica 0's
// v2.
func TestReconfigSourceReplicaLearnsTheCutLate(t *testing.T) {
	const (
		limit  = 4000
		margin = 20 * time.Millisecond
		late   = "rc/lines/p0/r1"
	)
	// strict: the late replica's hold is no failure, b's replica 1
	// waits for it rather than going tentative.
	yaml := strings.Replace(fmt.Sprintf(reconfigYAML, 2000, limit), "name: rc\n", "name: rc\nreplicas: 2\navailability: {max_delay: strict}\n", 1)
	r := startReconfigRunReplicas(t, yaml, fsm.TrackingStatic, 2)
	var replica1 []tuple.Tuple
	done1 := r.tailOf("rc/out/p0/r1", &replica1)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })

	r.margin = margin
	r.waitAcked(r.addPlan(2).Epoch)
	loading := r.rc
	loading.Plans = slices.Clone(r.rc.Plans)
	// The coordinator's rule (fsm advanceReconfig): the highest frontier
	// reported plus the margin.
	frontier := int64(math.MinInt64)
	for _, st := range r.states() {
		frontier = max(frontier, st.ReconfigFrontier)
	}
	cut := frontier + int64(margin)
	r.rc.Plans[0].Phase, r.rc.Plans[0].Cut = fsm.ReconfigSwitched, cut
	r.publishExcept(late, &loading)

	waitUntil(t, "the late replica's sibling passed the cut, the late one held or passed it", func() bool {
		if r.level("rc/lines/p0/r0") < 1 {
			return false
		}
		return r.cutHolds(late) > 0 || r.states()[late].ReconfigFrontier >= cut+int64(10*time.Millisecond)
	})
	if r.cutHolds(late) > 0 {
		// A snapshot of the held source leaves the record it drew and
		// holds before to the copy: a copy would draw it again.
		var snap *TaskSnapshot
		for _, w := range r.c.workers {
			if w.rt.task(late) != nil {
				var err error
				if snap, err = w.rt.SnapshotTask(context.Background(), late, SnapshotOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if snap.SourceRecords != int64(snap.Seq) {
			t.Fatalf("snapshot of the held source: %d records drawn, %d emitted", snap.SourceRecords, snap.Seq)
		}
	}
	r.publish()
	r.waitLevel(1)
	r.complete()
	<-done
	<-done1
	paths := r.check(limit, true)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("the upgrade did not happen mid-stream: %v", paths)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sameReplicaRows(t, r.out, replica1)
	if r.cutHolds(late) == 0 {
		t.Fatalf("the late replica never held for the cut %d", cut)
	}
}

// cutHolds is how many times source task id held for a plan's cut.
func (r *reconfigRun) cutHolds(id string) uint64 {
	for _, w := range r.c.workers {
		for _, st := range w.rt.Stats() {
			if st.TaskID == id {
				return st.CutHolds
			}
		}
	}
	return 0
}
