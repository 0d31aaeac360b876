package runtime

import (
	"testing"
	"time"
)

// TestMoveHaltsWhenThePinFails: a live move whose new copy cannot
// register with its upstream before the snapshot (an upstream that
// refuses or does not answer in time, as under CPU starvation) takes a
// stop-and-copy snapshot instead: the old copy acknowledges nothing after
// the snapshot's positions, so the upstream still holds that input when
// the new copy subscribes, and the sink's stream is identical to an
// unmoved run. (The live snapshot was cut anyway, with a warning, and the
// old copy went on acknowledging input the new copy then missed: a
// coordinator package run at load 20 lost 14 of 69,557 results so.)
func TestMoveHaltsWhenThePinFails(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	want := unmovedStream(t)

	c := startMoveRun(t, moving, 300)
	defer c.close(t)
	c.to.rt.pinFault = func(pl Placement) bool { return true }
	old := c.from.rt.task(moving)
	// A copy left running goes on receiving (and acknowledging) past
	// the snapshot's positions: wait until it has, as TestMoveWithoutHalt
	// does, unless the snapshot halted it.
	c.to.rt.afterFetch = func(snap *TaskSnapshot) {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && !old.halted.Load() {
			for i, in := range snap.Inputs {
				if in.Upstream == "lines" && old.inputs[i].sub.LastID() > in.After+200 {
					time.Sleep(5 * time.Millisecond) // let its acknowledgement go out: fault injection, not synchronisation
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
	}
	c.move(t, moving, c.from, c.to, false)
	if tk := c.to.rt.task(moving); tk == nil || !tk.restored {
		t.Fatal("the new copy did not start from the snapshot")
	}
	if !old.halted.Load() {
		t.Error("the old copy was not halted by the snapshot although its successor could not pin the upstream")
	}
	c.sameAsUnmoved(t, want, "")
}
