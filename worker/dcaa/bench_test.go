package dcaa

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// BenchmarkLongFailure: one input of two silent for 500 or 4000 batches of 50
// tuples (a boundary each), all released tentative, then the input comes
// back and the whole failure is replayed. The cost per tuple should not
// grow with the failure's length (releases find their range by binary
// search).
func BenchmarkLongFailure(b *testing.B) {
	for _, batches := range []int{500, 4000} {
		b.Run(fmt.Sprint(batches), func(b *testing.B) { benchLongFailure(b, batches) })
	}
}

func benchLongFailure(b *testing.B, batches int) {
	const per = 50
	for range b.N {
		m, err := New(Config{ID: 0, Replicas: 1, Inputs: []int{1, 1}, Share: 10 * time.Millisecond, Detect: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		m.Start(0)
		id := uint64(0)
		var live []tuple.Tuple
		now := int64(0)
		for k := range batches {
			live = live[:0]
			for j := range per {
				id++
				live = append(live, tuple.Tuple{Type: tuple.Stable, ID: id, STime: int64(k*per + j)})
			}
			id++
			live = append(live, tuple.Tuple{Type: tuple.Boundary, ID: id, STime: int64((k + 1) * per)})
			now += int64(time.Millisecond)
			m.Step(now, Deliver{Input: 0, Tuples: append([]tuple.Tuple(nil), live...), Upstream: Stable})
			if k == 0 {
				m.Step(now, Deliver{Input: 1, Tuples: []tuple.Tuple{{Type: tuple.Boundary, ID: 1, STime: per}}, Upstream: Stable})
			}
		}
		if !m.Tentative() {
			b.Fatal("never went tentative")
		}
		acts := m.Step(now+1, Deliver{Input: 1, Tuples: []tuple.Tuple{{Type: tuple.Boundary, ID: 2, STime: int64(batches * per)}}, Upstream: Stable})
		if m.Tentative() || len(acts) == 0 {
			b.Fatal("did not recover")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batches*per), "ns/tuple")
}

// BenchmarkStableRelease: two inputs, every batch stable, 1000 tuples per
// input per release step (a boundary interval at saturation holds tens of
// thousands): the all-stable path's cost per tuple through the machine.
func BenchmarkStableRelease(b *testing.B) {
	const per, steps = 1000, 20
	batches := make([][2][]tuple.Tuple, steps)
	for k := range steps {
		for i := range 2 {
			var ts []tuple.Tuple
			for j := range per {
				ts = append(ts, tuple.Tuple{Type: tuple.Stable, ID: uint64(k*(per+1) + j + 1), STime: int64(k*per*2 + j*2 + i)})
			}
			ts = append(ts, tuple.Tuple{Type: tuple.Boundary, ID: uint64((k + 1) * (per + 1)), STime: int64((k + 1) * per * 2)})
			batches[k][i] = ts
		}
	}
	b.ResetTimer()
	for range b.N {
		m, err := New(Config{ID: 0, Replicas: 2, Inputs: []int{2, 2}, Share: 10 * time.Millisecond, Detect: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		m.Start(0)
		released := 0
		for k := range steps {
			for i := range 2 {
				for _, a := range m.Step(int64(k+1), Deliver{Input: i, Tuples: slices.Clone(batches[k][i]), Upstream: Stable}) {
					if r, ok := a.(Release); ok {
						for _, st := range r.Steps {
							released += len(st.Tuples)
						}
					}
				}
			}
		}
		if released != steps*per*2 {
			b.Fatalf("%d tuples released, want %d", released, steps*per*2)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*steps*per*2), "ns/tuple")
}
