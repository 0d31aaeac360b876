package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dcaa"
)

// TestSinkChoiceFollowsThePreference: a DCAA sink's input with three
// upstream replicas or more chooses, after a failure, as the machine's
// inputs do: not a replica that failed it recently, then STABLE before
// UP_FAILURE before STABILIZATION (the coordinator's hints), then the
// nearest number. (Before, it took the next replica in turn, whatever
// its state.)
func TestSinkChoiceFollowsThePreference(t *testing.T) {
	const detect = 100 * time.Millisecond
	cands := []Placement{{TaskID: "q/agg/p0/r0", Replica: 0}, {TaskID: "q/agg/p0/r1", Replica: 1}, {TaskID: "q/agg/p0/r2", Replica: 2}}
	t0 := time.Unix(1000, 0)
	type failure struct {
		replica int
		at      time.Duration // after t0
	}
	for _, tc := range []struct {
		name     string
		hints    map[int]dcaa.State
		failures []failure
		at       time.Duration
		want     int // replica
	}{
		{name: "the stable replica, not the next in turn", hints: map[int]dcaa.State{1: dcaa.UpFailure, 2: dcaa.Stable}, failures: []failure{{0, 0}}, want: 2},
		{name: "up-failure before stabilization", hints: map[int]dcaa.State{1: dcaa.Stabilization, 2: dcaa.UpFailure}, failures: []failure{{0, 0}}, want: 2},
		{name: "no hints: the nearest number", failures: []failure{{0, 0}}, want: 1},
		{name: "a stale STABLE hint of a replica that failed is suspected", hints: map[int]dcaa.State{0: dcaa.Stable, 1: dcaa.UpFailure, 2: dcaa.Stabilization},
			failures: []failure{{0, 0}}, at: time.Millisecond, want: 1},
		{name: "suspicion expires", hints: map[int]dcaa.State{0: dcaa.Stable, 1: dcaa.UpFailure, 2: dcaa.Stabilization},
			failures: []failure{{0, 0}}, at: 5 * detect, want: 0},
		{name: "repeated failures suspect longer", hints: map[int]dcaa.State{0: dcaa.Stable, 1: dcaa.UpFailure, 2: dcaa.Stabilization},
			failures: []failure{{0, 0}, {0, time.Millisecond}}, at: 5 * detect, want: 1},
		{name: "every replica failed: the one that failed longest ago", hints: map[int]dcaa.State{0: dcaa.Stable, 1: dcaa.Stable, 2: dcaa.Stable},
			failures: []failure{{1, 0}, {2, time.Millisecond}, {0, 2 * time.Millisecond}}, at: 3 * time.Millisecond, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := &task{r: &Runtime{opts: Options{DetectTimeout: detect}}, spec: TaskSpec{Replica: 0}}
			for r, st := range tc.hints {
				tk.hints.set(hintKey{"agg", 0, r}, hint{state: st, at: t0})
			}
			in := &input{t: tk, upstream: "agg", upPartition: 0}
			var c sinkChoice
			for _, f := range tc.failures {
				c.failed(f.replica, t0.Add(f.at))
			}
			if got := cands[c.next(in, cands, t0.Add(tc.at))].Replica; got != tc.want {
				t.Fatalf("chose replica %d, want %d", got, tc.want)
			}
		})
	}
}
