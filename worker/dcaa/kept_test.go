package dcaa

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// keptOwner is a batch owner for the keptStore tests: it counts its
// hand-backs.
type keptOwner struct{ released int }

func (o *keptOwner) Release() { o.released++ }

// TestKeptStoreMatchesSlice: a keptStore fed random runs of batches
// (kept in place), single tuples in and out of stime order (split
// around) and drops from its head holds, in order, what a plain sorted
// slice holds; from and appendRange agree with the slice; a batch is
// handed back exactly once, when the last of its tuples is dropped; and
// no batch's memory is written to (a tuple added never lands in a
// batch's array).
func TestKeptStoreMatchesSlice(t *testing.T) {
	type ref struct {
		t     tuple.Tuple
		owner int // -1: the store's own copy
	}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 11))
		var (
			k       keptStore
			want    []ref
			owners  []*keptOwner
			batches [][]tuple.Tuple // as delivered
			orig    [][]tuple.Tuple // their contents then
			done    []Releaser
			id      uint64
			st      int64
		)
		for step := range 60 {
			switch op := rng.IntN(10); {
			case op < 5: // a batch's run, in order after everything kept
				n := 1 + rng.IntN(8)
				ts := make([]tuple.Tuple, n)
				for j := range ts {
					st += int64(rng.IntN(3))
					id++
					ts[j] = tuple.Tuple{Type: tuple.Stable, ID: id, STime: st}
				}
				o := &keptOwner{}
				owners = append(owners, o)
				batches, orig = append(batches, ts), append(orig, slices.Clone(ts))
				// Part of the batch, as deliver keeps runs between
				// boundaries: a held batch with one or two segments.
				h := &heldBatch{owner: o}
				cut := rng.IntN(n + 1)
				k.appendSeg(ts[:cut], h)
				k.appendSeg(ts[cut:], h)
				if h.segs == 0 {
					done = append(done, o)
				}
				for j := range ts {
					want = append(want, ref{ts[j], len(owners) - 1})
				}
			case op < 8: // one tuple, anywhere in stime order
				id++
				tp := tuple.Tuple{Type: tuple.Stable, ID: id, STime: st - int64(rng.IntN(12)) + 2}
				st = max(st, tp.STime)
				k.add(tp)
				at := len(want)
				for at > 0 && want[at-1].t.STime > tp.STime {
					at--
				}
				want = slices.Insert(want, at, ref{tp, -1})
			default: // drop a head
				n := rng.IntN(len(want) + 1)
				done = k.drop(n, done)
				want = want[n:]
			}
			if k.len() != len(want) {
				t.Fatalf("seed %d step %d: %d kept, want %d", seed, step, k.len(), len(want))
			}
			var got []tuple.Tuple
			for _, p := range k.appendRange(nil, 0, k.len()) {
				got = append(got, p...)
			}
			for i := range want {
				if got[i].ID != want[i].t.ID {
					t.Fatalf("seed %d step %d: kept[%d] has id %d, want %d", seed, step, i, got[i].ID, want[i].t.ID)
				}
			}
			for range 4 {
				q := st - int64(rng.IntN(20)) + 3
				wi := 0
				for wi < len(want) && want[wi].t.STime < q {
					wi++
				}
				fi := k.from(q)
				if fi != wi {
					t.Fatalf("seed %d step %d: from(%d) = %d, want %d", seed, step, q, fi, wi)
				}
				j := wi + rng.IntN(len(want)-wi+1)
				var part []tuple.Tuple
				for _, p := range k.appendRange(nil, wi, j) {
					part = append(part, p...)
				}
				if len(part) != j-wi || len(part) > 0 && part[0].ID != want[wi].t.ID {
					t.Fatalf("seed %d step %d: range [%d, %d) gave %d tuples", seed, step, wi, j, len(part))
				}
			}
			// Hand-backs: exactly the batches none of whose tuples stay.
			for _, o := range done {
				o.Release()
			}
			done = done[:0]
			left := make([]int, len(owners))
			for _, r := range want {
				if r.owner >= 0 {
					left[r.owner]++
				}
			}
			for i, o := range owners {
				if wantN := min(1, max(0, 1-left[i])); o.released != wantN {
					t.Fatalf("seed %d step %d: batch %d (%d tuples kept) handed back %d times, want %d", seed, step, i, left[i], o.released, wantN)
				}
			}
			for i := range batches {
				if !slices.EqualFunc(batches[i], orig[i], func(a, b tuple.Tuple) bool { return a.ID == b.ID && a.STime == b.STime }) {
					t.Fatalf("seed %d step %d: batch %d's memory was written to", seed, step, i)
				}
			}
		}
	}
}
