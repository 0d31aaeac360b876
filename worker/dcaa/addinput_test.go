package dcaa

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// An input added by a live rescale (AddInput) with a floor: two replicas
// that add it at different moments, and get the streams' boundaries in
// different orders, release the same steps, the floor never among them
// (it is no boundary of any stream); the other input's data below the
// floor goes without waiting for the added stream's first boundary; and
// an input cannot be added past what was released.
func TestAddInputReleasesTheSameSteps(t *testing.T) {
	ms := int64(time.Millisecond)
	const floor = 28
	b := func(id uint64, st int64) tuple.Tuple {
		return tuple.Tuple{Type: tuple.Boundary, ID: id, STime: st * ms}
	}
	d := func(id uint64, st int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Stable, ID: id, STime: st * ms} }
	old := []tuple.Tuple{d(1, 5), b(2, 10), d(3, 15), b(4, 20), d(5, 22), b(6, 25), d(7, 35), b(8, 40)}
	added := []tuple.Tuple{b(1, 30), d(2, 33), b(3, 40)}
	run := func(addEarly bool) (steps []int64, tuples []int64) {
		m, err := New(Config{ID: 0, Replicas: 2, Inputs: []int{2}, Detect: 20 * time.Millisecond, Share: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(0)
		now := int64(ms)
		note := func(acts []Action) {
			for _, a := range acts {
				if r, ok := a.(Release); ok {
					if r.Tentative {
						t.Fatalf("tentative release %+v", r)
					}
					for _, st := range r.Steps {
						steps = append(steps, st.Advance)
						for _, run := range st.Runs {
							for _, tp := range run.Tuples {
								tuples = append(tuples, tp.STime)
							}
						}
					}
				}
			}
		}
		deliver := func(i int, ts ...tuple.Tuple) {
			now += ms
			note(m.Step(now, Deliver{Input: i, Upstream: Stable, Tuples: slices.Clone(ts)}))
		}
		deliver(0, old[:2]...)
		// The rescale's hold, then its go: the input is added, the hold
		// lifted.
		if err := m.SetCut(m.Released()); err != nil {
			t.Fatal(err)
		}
		add := func() {
			i, acts, err := m.AddInput(now, 2, floor*ms, 1)
			if err != nil || i != 1 || len(acts) != 1 {
				t.Fatalf("AddInput: %d %v %v", i, acts, err)
			}
			if s, ok := acts[0].(Subscribe); !ok || s.Input != 1 || s.Replica != 0 {
				t.Fatalf("AddInput subscribes %+v", acts[0])
			}
			if err := m.SetCut(math.MaxInt64); err != nil {
				t.Fatal(err)
			}
			now += ms
			note(m.Step(now, Tick{}))
		}
		if addEarly {
			add()
			deliver(0, old[2:]...)
			deliver(1, added...)
		} else {
			deliver(0, old[2:6]...)
			add()
			deliver(1, added[:1]...)
			deliver(0, old[6:]...)
			deliver(1, added[1:]...)
		}
		return steps, tuples
	}
	s1, t1 := run(true)
	s2, t2 := run(false)
	want := []int64{10 * ms, 20 * ms, 25 * ms, 30 * ms, 40 * ms}
	if !slices.Equal(s1, want) || !slices.Equal(s2, want) {
		t.Fatalf("steps %v and %v, want %v", s1, s2, want)
	}
	if !slices.Equal(t1, t2) || len(t1) != 5 {
		t.Fatalf("released tuples %v and %v", t1, t2)
	}

	// Not past what was released.
	m, _ := New(Config{ID: 0, Replicas: 1, Inputs: []int{1}, Detect: 20 * time.Millisecond})
	m.Start(0)
	m.Step(ms, Deliver{Input: 0, Upstream: Stable, Tuples: []tuple.Tuple{b(1, 30)}})
	if _, _, err := m.AddInput(2*ms, 1, floor*ms, 1); !errors.Is(err, ErrAddInput) {
		t.Fatalf("AddInput below the released watermark: %v, want ErrAddInput", err)
	}
	if m.Inputs() != 1 {
		t.Fatalf("%d inputs after a refused AddInput", m.Inputs())
	}
}

// Tuples of equal stream time are released in the order of the inputs'
// ranks, not of their indexes: an input added by a rescale with a rank
// between two others goes between them, as in a copy built with all
// three in rank order.
func TestReleaseOrderFollowsRanks(t *testing.T) {
	ms := int64(time.Millisecond)
	order := func(ranks []int64, addRank int64, add bool) []int {
		ks := make([]int, len(ranks))
		for i := range ks {
			ks[i] = 1
		}
		m, err := New(Config{ID: 0, Replicas: 1, Inputs: ks, Ranks: ranks, Detect: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(0)
		if add {
			if _, _, err := m.AddInput(0, 1, 5*ms, addRank); err != nil {
				t.Fatal(err)
			}
		}
		var got []int
		for i := range m.Inputs() {
			acts := m.Step(int64(i+1)*ms, Deliver{Input: i, Upstream: Stable, Tuples: []tuple.Tuple{
				{Type: tuple.Stable, ID: 1, STime: 7 * ms}, {Type: tuple.Boundary, ID: 2, STime: 10 * ms}}})
			for _, a := range acts {
				if r, ok := a.(Release); ok {
					for _, st := range r.Steps {
						for _, run := range st.Runs {
							for range run.Tuples {
								got = append(got, run.Input)
							}
						}
					}
				}
			}
		}
		return got
	}
	if got := order([]int64{0, 2}, 1, true); !slices.Equal(got, []int{0, 2, 1}) {
		t.Fatalf("released by input %v, want [0 2 1] (ranks 0, 2, added 1)", got)
	}
	if got := order([]int64{0, 1, 2}, 0, false); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("released by input %v, want [0 1 2]", got)
	}
	if got := order([]int64{2, 1, 0}, 0, false); !slices.Equal(got, []int{2, 1, 0}) {
		t.Fatalf("released by input %v, want [2 1 0]", got)
	}
}
