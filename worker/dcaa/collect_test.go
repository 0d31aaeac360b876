package dcaa

import (
	"cmp"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestStableReleaseOrder: stable releases hand every tuple over once, in
// (stime, input, id) order, whatever the interleaving of the inputs'
// batches, ties on stime across inputs, and tuples out of stime order on
// an input (allowed lateness), kept in the delivered batches (split
// around tuples out of order) or in copies. Stable releases merge the inputs' kept data
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
				tp := tuple.Tuple{Type: tuple.Stable, ID: ids[i], STime: st, Values: []tuple.Value{tuple.Int(int64(ids[i]))}}
				batch = append(batch, tp)
				want = append(want, Entry{Input: i, Tuple: tp})
			}
			if rng.IntN(2) == 0 {
				bound[i] += 50
				ids[i]++
				batch = append(batch, tuple.Tuple{Type: tuple.Boundary, ID: ids[i], STime: bound[i]})
			}
			now++
			// Owned batches (poisoned when handed back) in half the
			// seeds: kept in place, or copied.
			var owner Releaser
			if seed%2 == 0 {
				owner = &poisonBatch{t: t, ts: batch}
			}
			got = appendReleased(got, m.Step(now, Deliver{Input: i, Tuples: batch, Upstream: Stable, Owner: owner}))
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
			return a.Input == b.Input && a.Tuple.ID == b.Tuple.ID && a.Tuple.STime == b.Tuple.STime &&
				len(a.Tuple.Values) == 1 && a.Tuple.Values[0] == tuple.Int(int64(b.Tuple.ID))
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
				for _, run := range st.Runs {
					for k := range run.Tuples {
						dst = append(dst, Entry{Input: run.Input, Tuple: *run.Tuples[k].Clone()})
					}
				}
			}
		}
	}
	return dst
}

// countedBatch is a delivered batch's owner that counts its Releases.
type countedBatch struct {
	ts       []tuple.Tuple
	released int
}

func (b *countedBatch) Release() { b.released++ }

// TestStableReleaseCopiesNothing: the all-stable path keeps each
// delivered batch's stable tuples where they are (a delivery with an
// Owner), releases them as runs of the batch's own memory, and hands
// every batch back to its owner exactly once, at the first Step after
// its last tuple was released: a round of two inputs' batches of 70 000
// tuples (one release step of 140 000 tuples, as at saturation)
// allocates next to nothing. Before, the machine copied every stable
// tuple into memory of its own (and the runtime could not recycle the
// batch: a decoder allocated each batch's arrays anew), 11 MB per round
// here; earlier still, every release copied its tuples into a scratch.
func TestStableReleaseCopiesNothing(t *testing.T) {
	const per, rounds = 70_000, 8
	m, err := New(Config{ID: 0, Replicas: 2, Inputs: []int{2, 2}, Share: 10 * time.Millisecond, Detect: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	var batches [rounds][2]*countedBatch
	for k := range rounds {
		for i := range 2 {
			ts := make([]tuple.Tuple, 0, per+1)
			for j := range per {
				ts = append(ts, tuple.Tuple{Type: tuple.Stable, ID: uint64(k*(per+1) + j + 1), STime: int64(k*per*2 + j*2 + i)})
			}
			batches[k][i] = &countedBatch{ts: append(ts, tuple.Tuple{Type: tuple.Boundary, ID: uint64((k + 1) * (per + 1)), STime: int64((k + 1) * per * 2)})}
		}
	}
	var ms runtime.MemStats
	round := func(k int) (released int, inBatch bool) {
		inBatch = true
		for i := range 2 {
			b := batches[k][i]
			for _, a := range m.Step(int64(k+1), Deliver{Input: i, Tuples: b.ts, Upstream: Stable, Owner: b}) {
				r, ok := a.(Release)
				if !ok {
					continue
				}
				for _, st := range r.Steps {
					for _, run := range st.Runs {
						released += len(run.Tuples)
						// The run is the delivered batch's memory, not a copy.
						own := batches[k][run.Input].ts
						base := unsafe.Pointer(unsafe.SliceData(own))
						p := unsafe.Pointer(unsafe.SliceData(run.Tuples))
						inBatch = inBatch && uintptr(p) >= uintptr(base) && uintptr(p) < uintptr(base)+uintptr(len(own))*unsafe.Sizeof(tuple.Tuple{})
					}
				}
			}
		}
		return released, inBatch
	}
	for k := range 2 { // warm up
		round(k)
	}
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	for k := 2; k < rounds; k++ {
		released, inBatch := round(k)
		if released != 2*per || !inBatch {
			t.Fatalf("round %d: released %d tuples (want %d), from the delivered batches: %t", k, released, 2*per, inBatch)
		}
		// The previous round's batches went back when this round's first
		// Step began; this round's are still referenced by its runs.
		for i := range 2 {
			if got := batches[k-1][i].released; got != 1 {
				t.Fatalf("round %d: batch of input %d of the previous round handed back %d times, want once", k, i, got)
			}
			if got := batches[k][i].released; got != 0 {
				t.Fatalf("round %d: batch of input %d handed back while its runs may still be read (%d)", k, i, got)
			}
		}
	}
	runtime.ReadMemStats(&ms)
	if per := (ms.TotalAlloc - before) / (rounds - 2); per > 256<<10 {
		t.Errorf("a warm round allocated %d bytes, want next to nothing (the tuples are kept in place and released from there)", per)
	}
}
