package dcaa

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// An input merely behind sets no deadline: nothing can time out until an
// input fails, and a deadline in the past would make the caller (the
// runtime's run loop) wake at once, again and again, burning a core
// while the task waits for its slow input.
func TestNoDeadlineForALaggingInput(t *testing.T) {
	for _, share := range []time.Duration{0, 100 * time.Millisecond} {
		m, err := New(Config{ID: 0, Replicas: 2, Inputs: []int{2, 2}, Share: share, Detect: 30 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(0)
		b := func(id uint64, at int64) []tuple.Tuple {
			return []tuple.Tuple{{Type: tuple.Boundary, ID: id, STime: at * ms}}
		}
		// Input 0 reaches 500 ms of stream time, input 1 only 100 ms;
		// both keep delivering every 20 ms.
		for k := int64(1); k <= 10; k++ {
			now := 20 * k * ms
			for _, acts := range [][]Action{
				m.Step(now, Deliver{Input: 0, Tuples: b(uint64(k), 50*k), Upstream: Stable}),
				m.Step(now, Deliver{Input: 1, Tuples: b(uint64(k), 10*k), Upstream: Stable}),
			} {
				if _, tent := releasedSteps(acts); tent {
					t.Fatalf("share %v: tentative release at %d ms with no failure", share, now/ms)
				}
			}
			// The next deadline is the silence timeout of the inputs,
			// never now or earlier.
			if d := m.NextDeadline(); d <= now {
				t.Fatalf("share %v: at %d ms the next deadline is %d ms: the caller would spin", share, now/ms, d/ms)
			}
		}
		if m.State() != Stable {
			t.Fatalf("share %v: state %v, want STABLE", share, m.State())
		}
	}
}

// Alive vouches for inputs the caller heard (their batches still queued
// for the machine) without timing out the others first: after a gap of
// 100 ms (detection 30 ms) in which the machine took no event, vouching
// for both inputs and stepping leaves both live and the replica STABLE.
// Stepping a heartbeat per input instead times out the second input
// during the first input's step.
func TestAliveVouchesWithoutTimingOut(t *testing.T) {
	cfg := Config{ID: 0, Replicas: 2, Inputs: []int{2, 2}, Share: 10 * time.Millisecond, Detect: 30 * time.Millisecond}
	boundary := []tuple.Tuple{{Type: tuple.Boundary, ID: 1, STime: 10 * ms}}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	m.Step(5*ms, Deliver{Input: 0, Tuples: boundary, Upstream: Stable})
	m.Step(5*ms, Deliver{Input: 1, Tuples: boundary, Upstream: Stable})
	m.Alive(0, 100*ms)
	m.Alive(1, 100*ms)
	if acts := m.Step(100*ms, Tick{}); len(acts) != 0 {
		t.Fatalf("after vouching for both inputs: %s", renderActions(acts))
	}
	if m.State() != Stable || m.Subscribed(0) != 0 || m.Subscribed(1) != 0 {
		t.Fatalf("state %v, inputs read replicas %d and %d", m.State(), m.Subscribed(0), m.Subscribed(1))
	}
	// The way the runtime did it before: one heartbeat step per input.
	m2, _ := New(cfg)
	m2.Start(0)
	m2.Step(5*ms, Deliver{Input: 0, Tuples: boundary, Upstream: Stable})
	m2.Step(5*ms, Deliver{Input: 1, Tuples: boundary, Upstream: Stable})
	acts := m2.Step(100*ms, Deliver{Input: 0, Upstream: Stable})
	if len(acts) == 0 {
		t.Fatalf("a heartbeat step for input 0 alone left input 1 untimed: the comparison above proves nothing")
	}
}

// One input failed, another alive but behind: the bucket's wait has run
// out, but its release waits for the live input. No deadline may name
// that expired wait (the caller would spin until the live input moves).
func TestNoSpinWhileALiveInputHoldsATentativeRelease(t *testing.T) {
	for _, share := range []time.Duration{0, 20 * time.Millisecond} {
		m, err := New(Config{ID: 0, Replicas: 1, Inputs: []int{1, 1, 1}, Share: share, Detect: 30 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(0)
		b := func(id uint64, at int64) []tuple.Tuple {
			return []tuple.Tuple{{Type: tuple.Boundary, ID: id, STime: at * ms}}
		}
		// Input 2 delivers once, then is silent (failed at 36 ms); input
		// 0 runs ahead, input 1 lags behind it, both live.
		m.Step(5*ms, Deliver{Input: 2, Tuples: b(1, 10), Upstream: Stable})
		for k := int64(1); k <= 8; k++ {
			now := 20 * k * ms
			m.Step(now, Deliver{Input: 0, Tuples: b(uint64(k), 100*k), Upstream: Stable})
			m.Step(now, Deliver{Input: 1, Tuples: b(uint64(k), 10*k), Upstream: Stable})
			if d := m.NextDeadline(); d <= now {
				t.Fatalf("share %v: at %d ms the next deadline is %d ms: the caller would spin", share, now/ms, d/ms)
			}
		}
		if m.State() != UpFailure || !m.Tentative() || m.Released() != 80*ms {
			t.Fatalf("share %v: state %v, tentative %v, released %d ms: want UP_FAILURE, tentative up to the live input behind (80 ms)", share, m.State(), m.Tentative(), m.Released()/ms)
		}
	}
}
