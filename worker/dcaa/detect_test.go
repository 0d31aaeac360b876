package dcaa

import (
	"testing"
	"time"
)

// The stretched detection timeout (Config.DetectMax) costs nothing when
// the process runs normally: with heartbeats every 10 ms a replica that
// stops is taken for failed just past Detect. After a loaded spell (gaps
// of 60 ms: the timeout stretched to 120 ms) the timeout comes back to
// Detect once gapWindowDetects detection timeouts passed without such a
// gap, and a replica that stops is again taken for failed past Detect.
func TestDetectLimitStretchesOnlyWhileGapsAreLong(t *testing.T) {
	const detect = 30 * time.Millisecond
	m, err := New(Config{ID: 0, Replicas: 1, Inputs: []int{2}, Share: time.Second, Detect: detect, DetectMax: 4 * detect})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	id := uint64(0)
	deliver := func(now int64) {
		id++
		m.Step(now*ms, Deliver{Input: 0, Tuples: boundaryAt(id, now), Upstream: Stable})
	}
	// stopsAt: the replica read delivers nothing after last (ms); the
	// input must move to replica 1 just past last + want.
	stopsAt := func(last int64, want time.Duration) {
		t.Helper()
		if got := m.DetectLimit(); got != want {
			t.Fatalf("at %d ms the detection timeout is %v, want %v", last, got, want)
		}
		due := last + int64(want/time.Millisecond)
		if d := m.NextDeadline(); d != due*ms+1 {
			t.Fatalf("replica silent from %d ms: next deadline %v, want %d ms + 1 ns", last, time.Duration(d), due)
		}
		m.Step(due*ms, Tick{})
		if m.Subscribed(0) != 0 {
			t.Fatalf("replica 0 taken for failed after %v of silence, within the timeout %v", time.Duration(due*ms-last*ms), want)
		}
		m.Step(due*ms+1, Tick{})
		if m.Subscribed(0) != 1 {
			t.Fatalf("replica 0 silent past the timeout %v: the input still reads it", want)
		}
	}
	now := int64(0)
	for now < 200 {
		now += 10
		deliver(now)
	}
	stopsAt(now, detect)

	// Replica 1 delivers, in gaps of 60 ms for a while: the timeout
	// stretches to 120 ms.
	for k := range 5 {
		now += 10
		if k > 0 {
			now += 50
		}
		deliver(now)
	}
	if got := m.DetectLimit(); got != 4*detect {
		t.Fatalf("after gaps of 60 ms the detection timeout is %v, want %v", got, 4*detect)
	}
	// Then every 10 ms again: past the window the timeout is back to
	// Detect.
	end := now + gapWindowDetects*int64(detect/time.Millisecond) + 10
	for now < end {
		now += 10
		deliver(now)
	}
	// The input reads replica 1: stopping it moves the input back to 0.
	if got := m.DetectLimit(); got != detect {
		t.Fatalf("%d ms after the last long gap the detection timeout is %v, want %v", gapWindowDetects*detect/time.Millisecond, got, detect)
	}
	due := now + int64(detect/time.Millisecond)
	m.Step(due*ms+1, Tick{})
	if m.Subscribed(0) != 0 {
		t.Fatalf("replica 1 silent past Detect after the load passed: the input still reads it")
	}
}

// DetectMax: four detection timeouts, at most half the share (a task
// must move off a failed replica well before a bucket's wait runs out),
// never below the detection timeout.
func TestDetectMax(t *testing.T) {
	const d = 400 * time.Millisecond
	for _, c := range []struct{ share, want time.Duration }{
		{Strict, 4 * d}, {0, 4 * d}, {10 * time.Second, 4 * d}, {2500 * time.Millisecond, 1250 * time.Millisecond}, {500 * time.Millisecond, d},
	} {
		if got := DetectMax(d, c.share); got != c.want {
			t.Errorf("DetectMax(%v, %v) = %v, want %v", d, c.share, got, c.want)
		}
	}
}
