package dcaa

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestStableReleaseOrder: stable releases hand every tuple over once, in
// (stime, input, id) order, whatever the interleaving of the inputs'
// batches, ties on stime across inputs, and tuples out of stime order on
// an input (allowed lateness). Stable releases merge the inputs' kept data
// instead of sorting it (collect): this checks the merge against the sort.
func TestStableReleaseOrder(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		inputs := 1 + rng.IntN(4)
		ks := make([]int, inputs)
		for i := range ks {
			ks[i] = 2
		}
		m, err := New(Config{ID: 0, Replicas: 2, Inputs: ks, Share: 10 * time.Millisecond, Detect: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(0)
		var (
			want, got []Entry
			ids       = make([]uint64, inputs)
			bound     = make([]int64, inputs)
			now       int64
		)
		for range 40 {
			i := rng.IntN(inputs)
			var batch []tuple.Tuple
			for range rng.IntN(30) {
				// Stimes on a coarse grid (ties across inputs), a few below
				// the input's last tuple but never below its boundary.
				st := bound[i] + int64(rng.IntN(6))*10
				ids[i]++
				tp := tuple.Tuple{Type: tuple.Stable, ID: ids[i], STime: st}
				batch = append(batch, tp)
				want = append(want, Entry{Input: i, Tuple: tp})
			}
			if rng.IntN(2) == 0 {
				bound[i] += 50
				ids[i]++
				batch = append(batch, tuple.Tuple{Type: tuple.Boundary, ID: ids[i], STime: bound[i]})
			}
			now++
			got = appendReleased(got, m.Step(now, Deliver{Input: i, Tuples: batch, Upstream: Stable}))
		}
		// Every input's final boundary releases the rest.
		for i := range inputs {
			ids[i]++
			now++
			got = appendReleased(got, m.Step(now, Deliver{Input: i, Tuples: []tuple.Tuple{{Type: tuple.Boundary, ID: ids[i], STime: 1 << 40}}, Upstream: Stable}))
		}
		slices.SortStableFunc(want, func(a, b Entry) int {
			return cmp.Or(cmp.Compare(a.Tuple.STime, b.Tuple.STime), cmp.Compare(a.Input, b.Input), cmp.Compare(a.Tuple.ID, b.Tuple.ID))
		})
		if !slices.EqualFunc(got, want, func(a, b Entry) bool {
			return a.Input == b.Input && a.Tuple.ID == b.Tuple.ID && a.Tuple.STime == b.Tuple.STime
		}) {
			t.Fatalf("seed %d, %d inputs: released %d tuples\n%v\nwant %d\n%v", seed, inputs, len(got), got, len(want), want)
		}
	}
}

// appendReleased appends the tuples of acts' releases (all stable).
func appendReleased(dst []Entry, acts []Action) []Entry {
	for _, a := range acts {
		if r, ok := a.(Release); ok && !r.Tentative {
			for _, st := range r.Steps {
				dst = append(dst, st.Tuples...)
			}
		}
	}
	return dst
}
