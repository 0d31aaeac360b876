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
