package dcaa

import (
	"testing"
	"time"
)

// A replica whose subscriptions fail at once (its worker killed: every
// connection refused) while the input's other replica lives in
// UP_FAILURE is tried again ever more rarely, and at once when the
// coordinator places it anew. Before, its suspicion was four detection
// timeouts whatever had happened: the input went back to it each time
// that expired (its stale STABLE ranks above UP_FAILURE), 24 times in
// the 10 s (100 detection timeouts) this test runs.
func TestKilledReplicaIsTriedAgainEverMoreRarely(t *testing.T) {
	const detect = 100 * time.Millisecond
	m := oneInputOfTwoReplicas(t, 300*time.Millisecond, detect)
	m.Step(6*ms, SubscriptionFailed{Input: 0}) // replica 0 killed
	if m.Subscribed(0) != 1 {
		t.Fatalf("after replica 0's subscription failed the input reads replica %d, want 1", m.Subscribed(0))
	}
	id := uint64(1)
	tries := 0
	// step delivers from replica 1 (UP_FAILURE, every 20 ms); a
	// subscription to replica 0 fails at once.
	step := func(now int64) {
		id++
		for _, a := range m.Step(now*ms, Deliver{Input: 0, Tuples: boundaryAt(id, now), Upstream: UpFailure}) {
			if s, ok := a.(Subscribe); ok && s.Replica == 0 {
				tries++
				m.Step(now*ms, SubscriptionFailed{Input: 0})
				if m.Subscribed(0) != 1 {
					t.Fatalf("at %d ms, after replica 0 refused again, the input reads replica %d", now, m.Subscribed(0))
				}
			}
		}
	}
	const end = 10_000
	now := int64(20)
	for ; now <= end; now += 20 {
		step(now)
	}
	// Suspected for 0.4, 0.8, 1.6, 3.2, 6.4 s after each refusal: tried
	// again at about 0.4, 1.2, 2.8 and 6 s.
	if tries > 5 {
		t.Fatalf("the input went back to the killed replica %d times in %d ms", tries, end)
	}
	if tries == 0 {
		t.Fatal("the input never tried the killed replica again")
	}
	// The coordinator places replica 0 anew: the input tries the new copy
	// at once (its state unknown ranks above UP_FAILURE).
	acts := m.Step(now*ms, ReplicaMoved{Input: 0, Replica: 0})
	moved := false
	for _, a := range acts {
		if s, ok := a.(Subscribe); ok && s.Replica == 0 {
			moved = true
		}
	}
	if !moved || m.Subscribed(0) != 0 {
		t.Fatalf("replica 0 placed anew: the input reads replica %d (%s), want 0", m.Subscribed(0), renderActions(acts))
	}
	// The new copy, not started yet, refuses again and again: never
	// heard, it is not backed off (tried again each four detection
	// timeouts, as before).
	for k := range 3 {
		if m.Subscribed(0) != 0 {
			t.Fatalf("refusal %d of the new copy: the input reads replica %d, want 0 (suspicion %v)", k, m.Subscribed(0), time.Duration(m.suspicion(m.inputs[0], 0)))
		}
		m.Step(now*ms, SubscriptionFailed{Input: 0})
		now += 5 * int64(detect/time.Millisecond)
		id++ // replica 1 delivers in UP_FAILURE: back to 0 once its suspicion expired
		m.Step(now*ms, Deliver{Input: 0, Tuples: boundaryAt(id, now), Upstream: UpFailure})
	}
}

// A replica the input reads while it is suspected (both refused a
// subscription: the input took the one that failed longer ago) is no
// longer suspected once it delivers. Still suspected, it counted as
// failed recently when the other replica later went silent, and the
// input stayed on that silent replica one detection timeout more (the
// doubted silence).
func TestReplicaThatDeliversIsNoLongerSuspected(t *testing.T) {
	const detect = 30 * time.Millisecond
	m := oneInputOfTwoReplicas(t, time.Second, detect)
	m.Step(6*ms, SubscriptionFailed{Input: 0}) // replica 0 refuses: replica 1
	m.Step(7*ms, SubscriptionFailed{Input: 0}) // replica 1 refuses: back to 0
	if m.Subscribed(0) != 0 {
		t.Fatalf("every replica refused: the input reads replica %d, want 0 (failed longer ago)", m.Subscribed(0))
	}
	m.Step(8*ms, Deliver{Input: 0, Tuples: boundaryAt(2, 20), Upstream: Stable})
	if in := m.inputs[0]; m.suspected(in, 0) {
		t.Fatal("replica 0 delivered but is still suspected")
	}
}
