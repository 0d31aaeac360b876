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
				for _, a := range m.Step(int64(k+1), Deliver{Input: i, Tuples: slices.Clone(batches[k][i]), Upstream: Stable, Owner: nopOwner{}}) {
					if r, ok := a.(Release); ok {
						for _, st := range r.Steps {
							released += st.Len()
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

// BenchmarkStableReleaseFromEmpty: three inputs, every batch stable, one
// input 60 steps ahead of the others (inputs run unevenly at saturation,
// up to the pending bound), a fresh machine each time: the all-stable
// path's cost per tuple including the growth of what the machine keeps
// from empty, which a short saturation run (bench dcaa) pays in full.
func BenchmarkStableReleaseFromEmpty(b *testing.B) {
	const per, steps, ahead, inputs = 1000, 120, 60, 3
	batch := func(i, k int) []tuple.Tuple {
		ts := make([]tuple.Tuple, 0, per+1)
		for j := range per {
			ts = append(ts, tuple.Tuple{Type: tuple.Stable, ID: uint64(k*(per+1) + j + 1), STime: int64(k*per*inputs + j*inputs + i)})
		}
		return append(ts, tuple.Tuple{Type: tuple.Boundary, ID: uint64((k + 1) * (per + 1)), STime: int64((k + 1) * per * inputs)})
	}
	var batches [inputs][][]tuple.Tuple
	for i := range inputs {
		for k := range steps {
			batches[i] = append(batches[i], batch(i, k))
		}
	}
	b.ResetTimer()
	for range b.N {
		m, err := New(Config{ID: 0, Replicas: 2, Inputs: []int{2, 2, 2}, Share: 10 * time.Millisecond, Detect: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		m.Start(0)
		released := 0
		count := func(acts []Action) {
			for _, a := range acts {
				if r, ok := a.(Release); ok {
					for _, st := range r.Steps {
						released += st.Len()
					}
				}
			}
		}
		for k := range ahead {
			count(m.Step(int64(k+1), Deliver{Input: 0, Tuples: batches[0][k], Upstream: Stable, Owner: nopOwner{}}))
		}
		for k := range steps {
			now := int64(ahead + k + 1)
			if k+ahead < steps {
				count(m.Step(now, Deliver{Input: 0, Tuples: batches[0][k+ahead], Upstream: Stable, Owner: nopOwner{}}))
			}
			for i := 1; i < inputs; i++ {
				count(m.Step(now, Deliver{Input: i, Tuples: batches[i][k], Upstream: Stable, Owner: nopOwner{}}))
			}
		}
		if released != steps*per*inputs {
			b.Fatalf("%d tuples released, want %d", released, steps*per*inputs)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*steps*per*inputs), "ns/tuple")
}

// nopOwner owns delivered batches the benchmarks never reuse: the
// machine keeps them in place, as the runtime's batches.
type nopOwner struct{}

func (nopOwner) Release() {}
