package runtime

import (
	"fmt"
	"testing"
)

// TestReconfigWakesPacedSource: a paced generator source handed a plan
// while it waits for its next record's due time installs it (and
// acknowledges it) at once, not when it wakes for that record: the plan
// switches only once every task acknowledged, and a source waiting out a
// pacing wait held the worker's report (and the plan) for up to that
// wait. At one record a second, the source acknowledges before it emits
// the next record. (A record falling due between the handing and the
// acknowledgement would make one trial inconclusive; three are tried.)
func TestReconfigWakesPacedSource(t *testing.T) {
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 1, 60), "static")
	const src = "rc/lines/p0/r0"
	var rt *Runtime
	for _, w := range r.c.workers {
		if w.rt.task(src) != nil {
			rt = w.rt
		}
	}
	if rt == nil {
		t.Fatalf("no task %s", src)
	}
	out := func() uint64 {
		for _, st := range rt.Stats() {
			if st.TaskID == src {
				return st.OutTuples
			}
		}
		return 0
	}
	woken := false
	for trial := 0; trial < 3 && !woken; trial++ {
		// The source published what it emitted just before it began to
		// wait for its next record (about a second).
		v0 := out()
		waitUntil(t, "the source emitted a record", func() bool { return out() > v0 })
		v := out()
		p := r.addPlan(2 + trial)
		waitUntil(t, "the source acknowledged the plan", func() bool { return r.states()[src].ReconfigAcked >= p.Epoch })
		woken = out() == v
		t.Logf("trial %d: emitted %d when the plan was handed, %d when it was acknowledged", trial, v, out())
	}
	if !woken {
		t.Fatal("the source acknowledged every plan only once it emitted its next record: it installed them when it woke")
	}
}
