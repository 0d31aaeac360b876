package runtime

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestRescaleSourceReadByReplicatedOperator rescales the words source
// 1 -> 3 -> 2 partitions under load in a query with replicas 2: the keyed
// aggregate reading it runs a DCAA machine, whose inputs the rescale
// changes (added partitions start at the cut, removed ones end there).
// Both replicas of the sink give the same stream, tuple for tuple, with
// no tentative result, UNDO or REC_DONE (there is no failure), and every
// window of every word equals the reference of the rescaled streams.
func TestRescaleSourceReadByReplicatedOperator(t *testing.T) {
	const rate = 4000
	yaml := replaceOnce(t, fmt.Sprintf(wordsQuery, 2, rate), "parallelism: 2", "parallelism: 1")
	rs := startRescalable(t, yaml, rescaler{frag: "lines", reader: "counts", starts: []int64{math.MinInt64}})
	c := rs.c
	defer c.close(t)
	for r := range 2 {
		agg := queryspec.TaskID("wc", "counts", 0, r)
		waitUntil(t, "aggregate replica "+agg+" processed some input", func() bool {
			return c.onAnyWorker(agg, func(tk *task) bool {
				if tk.outs[0].buf.Stats().LastID <= 50 {
					return false
				}
				if tk.dm == nil {
					t.Fatal("the aggregate of a replicated query runs no DCAA machine: the test does not test it")
				}
				return true
			})
		})
	}
	cut1 := rs.scale(t, 3)
	waitUntil(t, "the added partitions produced", func() bool {
		return c.onAnyWorker(queryspec.TaskID("wc", "lines", 2, 1), func(tk *task) bool { return tk.genRecordsSeen() > 100 })
	})
	cut2 := rs.scale(t, 2)
	if cut2 <= cut1 {
		t.Fatalf("cuts %d then %d", cut1, cut2)
	}
	got, other := c.stableReplicas(t, cut1, cut2)
	end := int64(math.MaxInt64)
	want := sourceReference(t, rate, []int64{math.MinInt64, cut1, cut1}, []int64{end, end, cut2})
	sameResults(t, results(t, got, sinkSchema(t, c.query)), want)
	c.rescaledAlike(t, got, other, cut1, cut2)
	c.noCorrection(t)
}

// TestRescaleKeyedReadByReplicatedOperator rescales the keyed aggregate
// 1 -> 2 -> 1 partitions under load in a query with replicas 2 where an
// operator (a filter of parallelism 2, which passes every result) reads
// it: that operator's DCAA machine takes the added partition's stream at
// the cut and ends the removed one's there. Both sink replicas give the
// same stream, with nothing tentative, and every window of every word
// equals the reference of a run without rescaling. Then a replica of the
// filter moves (from a snapshot holding the removed partition's ended
// stream).
func TestRescaleKeyedReadByReplicatedOperator(t *testing.T) {
	const rate = 4000
	yaml := replaceOnce(t, fmt.Sprintf(wordsQuery, 2, rate), "parallelism: 2", "parallelism: 1")
	yaml = replaceOnce(t, yaml, "sinks:\n  - {name: out, input: counts}", `  - {name: some, type: filter, input: counts, where: "cnt > 0", parallelism: 2}
sinks:
  - {name: out, input: some}`)
	rs := startRescalable(t, yaml, rescaler{frag: "counts", reader: "some", upstream: "lines"})
	c := rs.c
	defer c.close(t)
	readers := 0
	waitUntil(t, "the filter emitted some windows", func() bool {
		readers = 0
		for _, w := range c.workers {
			for _, tk := range w.rt.tasksByID() {
				if tk.spec.Fragment == "some" && tk.dm != nil {
					readers++
				}
			}
		}
		tk := c.workers[0].rt.task(queryspec.TaskID("wc", "some", 0, 0))
		return tk != nil && tk.outs[0].buf.Stats().LastID > 50
	})
	if readers != 4 {
		t.Fatalf("%d of the filter's 4 tasks run a DCAA machine: the test does not test it", readers)
	}
	cut1 := rs.scale(t, 2)
	waitUntil(t, "the added partition emitted windows", func() bool {
		return c.onAnyWorker(queryspec.TaskID("wc", "counts", 1, 1), func(tk *task) bool { return tk.outs[0].buf.Stats().LastID > 20 })
	})
	cut2 := rs.scale(t, 1)
	if cut2 <= cut1 {
		t.Fatalf("cuts %d then %d", cut1, cut2)
	}
	// A copy of a reader started from a snapshot taken after the rescale
	// removed a partition leaves out that partition's ended stream, and
	// still runs its machine.
	reader := queryspec.TaskID("wc", "some", 0, 0)
	rs.stableNow(t, reader)
	c.move(t, reader, c.workers[0], c.workers[1], false)
	if tk := c.workers[1].rt.task(reader); tk == nil || tk.dm == nil {
		t.Fatalf("the moved copy of %s runs no DCAA machine (%v)", reader, tk != nil)
	}
	got, other := c.stableReplicas(t, cut1, cut2)
	sameResults(t, results(t, got, sinkSchema(t, c.query)), reference(t, rate))
	c.rescaledAlike(t, got, other, cut1, cut2)
	c.noCorrection(t)
}

// joinQuery is the words query with counts at parallelism 1 joined with
// another keyed aggregate of the same stream (longest); the join, in a
// query with replicas, runs a DCAA machine over three inputs once counts
// has two partitions.
func joinQuery(t *testing.T, replicas, rate int) string {
	return replaceOnce(t, fmt.Sprintf(wordsQuery, replicas, rate), "    parallelism: 2\nsinks:\n  - {name: out, input: counts}", `    parallelism: 1
  - name: longest
    type: aggregate
    input: long
    window: {size: 2ms}
    group_by: [word]
    aggregates: {top: "max(n)"}
  - {name: both, type: join, left: counts, right: longest, on: [word], window: {size: 2ms}}
sinks:
  - {name: out, input: both}`)
}

// TestRescaleReadByReplicatedJoin rescales counts 1 -> 2 under load in
// a query with replicas 2 where a join reads it and another aggregate:
// the join's machine adds counts' second partition after its two other
// inputs, and ranks it between them (by port, then partition). Then one
// replica of the join moves, from a snapshot whose inputs are in that
// added order, to a copy built with them in port order. Both sink
// replicas give the same stream, with nothing tentative, and the same
// results as a run with one replica and no rescale.
func TestRescaleReadByReplicatedJoin(t *testing.T) {
	const rate = 4000
	ref := newCluster(t, 1, joinQuery(t, 1, rate), func(string, int, int) int { return 0 })
	defer ref.close(t)
	ref.apply()
	rs := startRescalable(t, joinQuery(t, 2, rate), rescaler{frag: "counts", reader: "both", upstream: "lines"})
	c := rs.c
	defer c.close(t)
	join := queryspec.TaskID("wc", "both", 0, 1)
	waitUntil(t, "the join emitted some results", func() bool {
		tk := c.workers[1].rt.task(join)
		return tk != nil && tk.dm != nil && tk.outs[0].buf.Stats().LastID > 50
	})
	cut := rs.scale(t, 2)
	rs.stableNow(t, join)
	c.move(t, join, c.workers[1], c.workers[0], false)
	if tk := c.workers[0].rt.task(join); tk == nil || tk.dm == nil {
		t.Fatalf("the moved copy of %s runs no DCAA machine", join)
	}
	// Both replicas release tuples of equal stream time in the same
	// order of streams, although replica 0 has counts' second partition
	// as its last input and the moved copy of replica 1 as its second.
	order := func(tk *task) (seq []string, added int) {
		if err := tk.lockProc(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer tk.unlockProc()
		for _, i := range tk.dm.m.Order() {
			in := tk.inputs[i]
			seq = append(seq, fmt.Sprintf("%s/p%d", in.upstream, in.upPartition))
		}
		last := tk.inputs[len(tk.inputs)-1]
		return seq, last.upPartition
	}
	seq0, last0 := order(c.workers[0].rt.task(queryspec.TaskID("wc", "both", 0, 0)))
	seq1, last1 := order(c.workers[0].rt.task(join))
	if last0 != 1 || last1 != 0 {
		t.Fatalf("the replicas' last inputs are partitions %d and %d, want 1 (added) and 0 (port order): the test does not test the order", last0, last1)
	}
	if !slices.Equal(seq0, seq1) || !slices.Equal(seq0, []string{"counts/p0", "counts/p1", "longest/p0"}) {
		t.Fatalf("release orders %v and %v, want counts/p0 counts/p1 longest/p0 on both", seq0, seq1)
	}
	want := sinkRows(ref.tail(t, queryspec.TaskID("wc", "out", 0, 0)))
	got, other := c.stableReplicas(t, cut)
	if g := sinkRows(got); !slices.Equal(g, want) {
		t.Fatalf("the rescaled query gave %d results, the reference %d (or others)", len(g), len(want))
	}
	c.rescaledAlike(t, got, other, cut)
}

// stableNow waits until task id's output is stable: a replica holding
// tentative results is not snapshotted (a copy could not correct them),
// and on a loaded machine failure detection may have taken a live
// upstream for failed just before a move.
func (rs *rescaler) stableNow(t *testing.T, id string) {
	t.Helper()
	waitUntil(t, id+" stable", func() bool {
		st := rs.state(id)
		return st.Replica == fedstreampb.ReplicaState_REPLICA_STABLE && !st.Tentative
	})
}
