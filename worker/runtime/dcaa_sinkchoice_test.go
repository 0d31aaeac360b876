package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
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

// TestDCAASinkOfThreeReplicasChoosesTheStableOne: a query with three
// replicas; the coordinator's hints say the aggregate's replica 1 is in
// UP_FAILURE and replica 2 STABLE. The link from the sinks' worker to the
// aggregate's replica 0 is held: sink replica 0 detects the silence and
// moves to replica 2, not to replica 1 (the next in turn, where it went
// before), and its stable output ends equal to sink replica 1's, which
// read its own replica throughout.
func TestDCAASinkOfThreeReplicasChoosesTheStableOne(t *testing.T) {
	q := mustParse(t, `name: k3
replicas: 3
availability: {max_delay: 300ms}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: 16000}, parallelism: 2}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 100ms}, aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`)
	const sinks = 6
	g := newFaultRig(t, q, 7, []int{sinks}, dcaaOpts, func(node string, p, r int) int {
		switch node {
		case "lines":
			return r
		case "counts":
			return 3 + r
		}
		return sinks
	})
	g.c.apply()
	sinkID := queryspec.TaskID(q.Name, "out", 0, 0)
	reading := func() (int, bool) {
		tk := g.task(sinkID)
		if tk == nil {
			return 0, false
		}
		ins := tk.inputsNow()
		if len(ins) != 1 {
			return 0, false
		}
		ins[0].mu.Lock()
		defer ins[0].mu.Unlock()
		return ins[0].current.Replica, ins[0].current.TaskID != "" && ins[0].cancelCur != nil
	}
	waitUntil(t, "sink replica 0 reading the aggregate's replica 0", func() bool {
		r, ok := reading()
		return ok && r == 0 && g.faults[sinks].BytesFrom(g.c.workers[3].addr) > 4<<10
	})
	g.c.workers[sinks].rt.NoteReplicaStates([]ReplicaStateHint{
		{TaskID: queryspec.TaskID(q.Name, "counts", 0, 1), Generation: 1, State: fedstreampb.ReplicaState_REPLICA_UP_FAILURE},
		{TaskID: queryspec.TaskID(q.Name, "counts", 0, 2), Generation: 1, State: fedstreampb.ReplicaState_REPLICA_STABLE},
	}, time.Now())
	g.cut(sinks, dataplane.Hold, 3)
	var r int
	waitUntil(t, "sink replica 0 left the aggregate's replica 0", func() bool {
		var ok bool
		r, ok = reading()
		return ok && r != 0
	})
	if r != 2 {
		t.Fatalf("sink replica 0 moved to the aggregate's replica %d, want 2 (STABLE by the hints; 1 is in UP_FAILURE)", r)
	}
	g.faults[sinks].HealAll()
	g.restAtSpeed(t)
	got := viewOf(g.c.tail(t, sinkID))
	want := viewOf(g.c.tail(t, queryspec.TaskID(q.Name, "out", 0, 1)))
	sameStable(t, got.stable, want.stable, 20)
}
