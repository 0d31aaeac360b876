package dcaa

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// An input that left a replica gone silent (a partition, a paused
// worker) for a live replica in UP_FAILURE stays there: the silent
// replica's last advertised STABLE is stale. Before, once its suspicion
// expired (four detection timeouts), the UP_FAILURE delivery switched
// the input back to the silent replica, which failed again after the
// detection timeout, and so on for the whole partition: by hand (a
// worker partitioned from the three others, every upstream with a live
// replica on their side) the alerts stopped for 6 s and came tentative.
func TestInputStaysOffAReplicaThatWentSilent(t *testing.T) {
	const detect = 30 * time.Millisecond
	m := oneInputOfTwoReplicas(t, 100*time.Millisecond, detect)
	if m.Subscribed(0) != 0 {
		t.Fatalf("input reads replica %d, want 0", m.Subscribed(0))
	}
	// Replica 0 goes silent: past the detection timeout the input moves
	// to replica 1.
	m.Step(50*ms, Tick{})
	if m.Subscribed(0) != 1 {
		t.Fatalf("after replica 0 went silent the input reads replica %d, want 1", m.Subscribed(0))
	}
	// Replica 1 lives but advertises UP_FAILURE (its own input from the
	// silent side failed), delivering every 20 ms, well past the
	// suspicion of replica 0.
	id := uint64(1)
	for now := int64(60); now <= 60+10*4*int64(detect/time.Millisecond); now += 20 {
		id++
		acts := m.Step(now*ms, Deliver{Input: 0, Tuples: boundaryAt(id, 10+now), Upstream: UpFailure})
		for _, a := range acts {
			if s, ok := a.(Subscribe); ok {
				t.Fatalf("at %d ms the input moved to replica %d, which went silent and was not heard from since: %s", now, s.Replica, renderActions(acts))
			}
		}
	}
	// Heard from again (a delivery on it after a switch), replica 0
	// ranks by its state once more: once replica 1 goes silent too, the
	// input goes back to 0 and 0's STABLE keeps it there.
	now := int64(60 + 10*4*int64(detect/time.Millisecond) + 100)
	m.Step(now*ms, Tick{})
	if m.Subscribed(0) != 0 {
		t.Fatalf("after replica 1 went silent too the input reads replica %d, want 0", m.Subscribed(0))
	}
	id++
	m.Step((now+5)*ms, Deliver{Input: 0, Tuples: boundaryAt(id, now), Upstream: Stable})
	if m.Subscribed(0) != 0 || m.inputs[0].quiet[0] {
		t.Fatalf("replica 0, heard again, still counts as silent")
	}
}

// oneInputOfTwoReplicas is a machine with one input from an upstream of
// two replicas, started, that took a first boundary (id 1, stream time
// 10 ms) from replica 0 at 5 ms.
func oneInputOfTwoReplicas(t *testing.T, share, detect time.Duration) *Machine {
	t.Helper()
	m, err := New(Config{ID: 0, Replicas: 2, Inputs: []int{2}, Share: share, Detect: detect})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	m.Step(5*ms, Deliver{Input: 0, Tuples: boundaryAt(1, 10), Upstream: Stable})
	return m
}

// boundaryAt is a batch of one stable boundary: stable id id, stream
// time at ms.
func boundaryAt(id uint64, at int64) []tuple.Tuple {
	return []tuple.Tuple{{Type: tuple.Boundary, ID: id, STime: at * ms}}
}
