package dcaa

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// A long failure of an input that brings boundaries but little data: the
// stable steps kept for the replay count towards KeepLimit, so they stay
// within it too. Before, only data tuples counted, and the steps of a
// failure (one per boundary interval) grew without bound.
func TestKeptStepsWithinKeepLimit(t *testing.T) {
	const limit = 20
	m, err := New(Config{ID: 0, Replicas: 1, Inputs: []int{1, 1}, Share: 10 * time.Millisecond, Detect: 20 * time.Millisecond, KeepLimit: limit})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	id := uint64(0)
	bd := func(st int64) []tuple.Tuple { id++; return []tuple.Tuple{{Type: tuple.Boundary, ID: id, STime: st}} }
	// Both inputs speak once; then input 1 goes silent for good.
	m.Step(1*ms, Deliver{Input: 0, Tuples: bd(1), Upstream: Stable})
	m.Step(1*ms, Deliver{Input: 1, Tuples: []tuple.Tuple{{Type: tuple.Boundary, ID: 1, STime: 1}}, Upstream: Stable})
	maxSteps := 0
	for k := int64(2); k < 400; k++ {
		m.Step(k*5*ms, Deliver{Input: 0, Tuples: bd(k), Upstream: Stable})
		maxSteps = max(maxSteps, len(m.inputs[0].steps))
	}
	if !m.Tentative() {
		t.Fatal("the machine never released tentatively: the test's failure did not happen")
	}
	if maxSteps > limit+2 {
		t.Fatalf("input 0 kept up to %d stable steps during the failure, KeepLimit %d", maxSteps, limit)
	}
	if f := m.Figures(); f.Shed == 0 || f.KeptMax > limit {
		t.Fatalf("figures %+v: want steps shed and at most %d kept", f, limit)
	}
}

// Waiting: a strict machine with a failed input holds the other
// input's covered data, all of it counted as waiting (the runtime stops
// taking that input's batches at its bound); the input furthest behind
// has nothing waiting; once the failed input covers the data again it is
// released and nothing waits.
func TestWaiting(t *testing.T) {
	m, err := New(Config{ID: 0, Replicas: 1, Inputs: []int{1, 1}, Share: Strict, Detect: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	id := uint64(0)
	data := func(st int64, n int) []tuple.Tuple {
		var ts []tuple.Tuple
		for range n {
			id++
			ts = append(ts, tuple.Tuple{Type: tuple.Stable, ID: id, STime: st, Values: []tuple.Value{tuple.Int(st)}})
		}
		id++
		return append(ts, tuple.Tuple{Type: tuple.Boundary, ID: id, STime: st + 1})
	}
	m.Step(1*ms, Deliver{Input: 1, Tuples: []tuple.Tuple{{Type: tuple.Boundary, ID: 1, STime: 1}}, Upstream: Stable})
	for k := int64(1); k <= 10; k++ {
		m.Step(k*10*ms, Deliver{Input: 0, Tuples: data(k*10, 10), Upstream: Stable})
		if w := m.Waiting(0); w != int(k*10) {
			t.Fatalf("after %d tuples held: Waiting(0) %d", k*10, w)
		}
		if w := m.Waiting(1); w != 0 {
			t.Fatalf("the input furthest behind has %d waiting", w)
		}
	}
	m.Step(200*ms, Deliver{Input: 1, Tuples: []tuple.Tuple{{Type: tuple.Boundary, ID: 2, STime: 1000}}, Upstream: Stable})
	if w := m.Waiting(0); w != 0 {
		t.Fatalf("input 0 has %d waiting after the release up to %d", w, m.Released())
	}
}
