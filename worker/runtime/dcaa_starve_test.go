package runtime

import (
	"testing"
	"time"
)

// TestStarveClock: waits below the threshold are not starvation; a
// wait counts as the interval ending when it is observed, and intervals
// that overlap (several detectors seeing the same stall) count once, so
// that the starved time never runs ahead of the wall clock.
func TestStarveClock(t *testing.T) {
	ms := int64(time.Millisecond)
	c := newStarveClock(10 * time.Millisecond)
	c.note(100*ms, 9*ms)
	if got := c.total.Load(); got != 0 {
		t.Fatalf("a wait below the threshold counted %v", time.Duration(got))
	}
	c.note(200*ms, 50*ms) // [150, 200]
	c.note(210*ms, 40*ms) // [170, 210]: 10 more
	c.note(210*ms, 30*ms) // inside: nothing
	if got, want := c.total.Load(), 60*ms; got != want {
		t.Fatalf("starved %v, want %v", time.Duration(got), time.Duration(want))
	}
}
