package runtime

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestMergerReleaseOrder checks that the merger releases exactly the
// tuples below the watermark in (stime, port, upstream partition, id)
// order, whether the inputs arrive in stime order (merged) or not
// (sorted).
func TestMergerReleaseOrder(t *testing.T) {
	tests := []struct {
		name     string
		inputs   int
		inOrder  bool
		maxDelta int64
	}{
		{"one input in order", 1, true, 3},
		{"one input out of order", 1, false, 3},
		{"three inputs in order", 3, true, 2},
		{"three inputs out of order", 3, false, 2},
		{"many inputs in order", 10, true, 5},
		{"equal stimes", 3, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.inputs)))
			m := newMerger(1 << 20)
			for i := range tc.inputs {
				m.addInput(i%2, i)
			}
			var generated, want []mergedTuple
			var owners []ownedBatch
			stimes := make([]int64, tc.inputs)
			ids := make([]uint64, tc.inputs)
			for round := int64(1); round <= 20; round++ {
				wm := round * 10
				for i := range tc.inputs {
					// Input i runs i ahead of the watermark: its tuples in
					// [wm, wm+i) wait for the next round.
					bound := wm + int64(i)
					var batch []tuple.Tuple
					for stimes[i] < bound {
						st := stimes[i]
						if !tc.inOrder && rng.IntN(3) == 0 {
							st = max(bound-10, st-rng.Int64N(5)) // back in time, not below the last boundary
						}
						ids[i]++
						tp := tuple.Tuple{Type: tuple.Stable, ID: ids[i], STime: st}
						batch = append(batch, tp)
						generated = append(generated, mergedTuple{port: i % 2, upPartition: i, t: tp})
						stimes[i] += rng.Int64N(tc.maxDelta + 1)
						if tc.maxDelta == 0 && rng.IntN(4) == 0 {
							stimes[i] = bound
						}
					}
					ids[i]++
					batch = append(batch, tuple.Tuple{Type: tuple.Boundary, ID: ids[i], STime: bound})
					owner := &testOwner{}
					owners = append(owners, ownedBatch{owner: owner, tuples: batch})
					if err := m.add(context.Background(), i, batch, owner, 0); err != nil {
						t.Fatal(err)
					}
				}
				rest := generated[:0]
				for _, g := range generated {
					if g.t.STime < wm {
						want = append(want, g)
					} else {
						rest = append(rest, g)
					}
				}
				generated = rest
				rel, ok := m.take()
				if !ok || rel.steps[len(rel.steps)-1] != wm {
					t.Fatalf("round %d: take ok=%v", round, ok)
				}
				var out []mergedTuple
				for _, r := range rel.runs {
					for _, tp := range r.tuples {
						out = append(out, mergedTuple{port: r.port, upPartition: r.upPartition, t: tp})
					}
				}
				slices.SortStableFunc(want, func(a, b mergedTuple) int {
					return cmp.Or(cmp.Compare(a.t.STime, b.t.STime), cmp.Compare(a.port, b.port),
						cmp.Compare(a.upPartition, b.upPartition), cmp.Compare(a.t.ID, b.t.ID))
				})
				if len(out) != len(want) {
					t.Fatalf("round %d: released %d tuples, want %d", round, len(out), len(want))
				}
				for k := range out {
					if out[k].port != want[k].port || out[k].upPartition != want[k].upPartition || out[k].t.ID != want[k].t.ID {
						t.Fatalf("round %d: tuple %d is %+v, want %+v", round, k, out[k], want[k])
					}
				}
				// A batch is handed back once, with the release of its
				// last data tuple (or at once when it holds none).
				for _, b := range rel.finished {
					b.Release()
				}
				for _, ob := range owners {
					pending := false
					for _, tp := range ob.tuples {
						pending = pending || tp.Type.IsData() && tp.STime >= wm
					}
					if got := ob.owner.released; pending && got != 0 || !pending && got != 1 {
						t.Fatalf("round %d: batch released %d times, still pending %v", round, got, pending)
					}
				}
				want = want[:0]
			}
		})
	}
}

// testOwner counts how often the merger handed its batch back.
type testOwner struct{ released int }

func (o *testOwner) Release() { o.released++ }

type ownedBatch struct {
	owner  *testOwner
	tuples []tuple.Tuple
}

// TestMergeGateNamesTheLaggingInput: a merge's gate (TaskStats.Gate) is
// the input with the lowest latest boundary, the one its release waits
// for, and the spread up to the highest.
func TestMergeGateNamesTheLaggingInput(t *testing.T) {
	m := newMerger(1 << 20)
	for i := range 3 {
		m.addInput(0, i)
	}
	for i, b := range []int64{50, 20, 80} {
		batch := []tuple.Tuple{{Type: tuple.Stable, ID: 1, STime: b - 1}, {Type: tuple.Boundary, ID: 2, STime: b}}
		if err := m.add(context.Background(), i, batch, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	n, g := m.pendingTuples()
	if n != 3 || g.Lowest != 20 || g.Highest != 80 || g.UpPartition != 1 || g.Port != 0 {
		t.Fatalf("pending %d, gate %+v: want 3 pending, upstream partition 1 lowest at 20, highest 80", n, g)
	}
}
