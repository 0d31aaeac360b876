package runtime

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
)

// TestReconfigAfterTheStreamEnded: a plan that reaches a finite query
// after its sources sent their final boundaries is acknowledged by every
// task and reaches every level (the coordinator then switches and
// completes it), instead of waiting forever for acknowledgements from
// generators that stopped and markers that no upstream will send. Both
// orders: the plan arrives after the end; the plan loads while the
// stream runs and switches after the end.
func TestReconfigAfterTheStreamEnded(t *testing.T) {
	const limit = 400
	for _, tc := range []struct {
		name        string
		loadBefore  bool
		wantVersion []int
	}{
		{name: "plan after the end"},
		{name: "plan loaded before the end, switched after", loadBefore: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 4000, limit), fsm.TrackingStatic)
			done := r.tail()
			if tc.loadBefore {
				waitUntil(t, "output flowing", func() bool { return r.received() > 50 })
				r.commit(2)
			}
			<-done
			if !tc.loadBefore {
				r.commit(2)
			}
			r.switchAll(time.Hour) // a cut no source reaches any more
			r.waitLevel(1)
			if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{2}) {
				t.Fatalf("b runs versions %v once every task is at level 1, want [2]", v)
			}
			r.commit(3) // and a second plan after that one
			r.switchAll(time.Hour)
			r.waitLevel(2)
			r.complete()
			paths := r.check(limit, true)
			if paths["v1"] != 2*limit {
				t.Fatalf("paths %v: every tuple was produced before the plans, by v1", paths)
			}
		})
	}
}
