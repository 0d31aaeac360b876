package runtime

import (
	"fmt"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
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

// TestQuiescentSourceCatchesUpToTheCut: under the quiescent baseline a
// source whose stream time is behind the plan's cut (it started after
// the source that set the cut) produces its records up to the cut at
// once and holds at its marker, rather than producing them at its pace,
// the stream not paused, until its stream time reaches the cut. Here
// the cut is 30 s of stream time ahead of a source producing a record a
// second: it holds at its marker well before that.
func TestQuiescentSourceCatchesUpToTheCut(t *testing.T) {
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 1, 100), "static")
	r.strategy = fsm.StrategyQuiescent
	p := r.addPlan(2)
	r.switchAll(30 * time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for {
		held := 0
		for _, w := range r.c.workers {
			for _, h := range w.rt.ReconfigHolds() {
				if h.Epoch == p.Epoch && !h.Marker.IsZero() {
					held++
				}
			}
		}
		if held == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 sources held at their markers 20 s after the switch: they paced up to a cut 30 s ahead", held)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.complete()
}
