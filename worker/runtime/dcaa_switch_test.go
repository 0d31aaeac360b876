package runtime

import (
	"context"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// chainRig is aggRig with a DCAA operator (a filter that keeps every
// window) between the aggregate and the sink, so that a machine reads the
// aggregate's output: source partition 0's replicas on workers 0 and 1,
// partition 1's on worker 3, the aggregate's replica 0 on worker 2 (which
// dials through faults: its sources can be cut), the filter's and sink's
// replica 0 on worker 4 (which dials through other faults: its link to the
// aggregate's replica 0 can be cut), every other replica 1 on worker 1.
type chainRig struct {
	*dcaaRig
	downFaults *dataplane.Faults
}

func newChainRig(t *testing.T, limit int) *chainRig {
	t.Helper()
	q, err := queryspec.Parse("chain.yaml", []byte(`name: chain
replicas: 2
availability: {max_delay: 300ms}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: `+strconv.Itoa(limit)+`}, parallelism: 2}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 100ms}, aggregates: {n: "count()"}}
  - {name: keep, type: filter, input: counts, where: "n >= 0", parallelism: 2}
sinks:
  - {name: out, input: keep}
`))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	opts, pace := pacedOpts(t, dcaaOpts)
	shared := dataplane.NewPool()
	faults, downFaults := dataplane.NewFaults(), dataplane.NewFaults()
	faulty, downFaulty := dataplane.NewPool(faults.DialOption()), dataplane.NewPool(downFaults.DialOption())
	t.Cleanup(func() { faulty.Close(); downFaulty.Close() })
	c := &cluster{pool: shared, query: q, specs: map[*worker][]TaskSpec{}}
	c.workers = []*worker{startWorkerOpts(t, shared, opts), startWorkerOpts(t, shared, opts),
		startWorkerOpts(t, faulty, opts), startWorkerOpts(t, shared, opts), startWorkerOpts(t, downFaulty, opts)}
	t.Cleanup(func() { c.close(t) })
	at := map[string]*worker{}
	var placements []Placement
	for _, node := range plan.Nodes {
		for p := range max(1, node.Partitions) {
			for r := range q.Replicas {
				var w *worker
				switch {
				case node.Kind == queryspec.KindSource && p == 1:
					w = c.workers[3]
				case node.Kind == queryspec.KindSource:
					w = c.workers[r]
				case r == 1:
					w = c.workers[1]
				case node.Name == "counts":
					w = c.workers[2]
				default:
					w = c.workers[4]
				}
				id := queryspec.TaskID(q.Name, node.Name, p, r)
				placements = append(placements, Placement{TaskID: id, Fragment: node.Name, Partition: p, Replica: r, WorkerAddr: w.addr})
				at[id] = w
			}
		}
	}
	for _, pl := range placements {
		c.specs[at[pl.TaskID]] = append(c.specs[at[pl.TaskID]], TaskSpec{TaskID: pl.TaskID, Query: q.Name,
			Fragment: pl.Fragment, Partition: pl.Partition, Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements})
	}
	c.apply()
	return &chainRig{dcaaRig: &dcaaRig{c: c, faults: faults, q: q, pace: pace}, downFaults: downFaults}
}

// After a correction (UNDO, corrections, REC_DONE) the aggregate's
// replicas no longer number their output streams alike: replica 0's holds
// its tentative tuples, the UNDO and REC_DONE, replica 1's does not. The
// filter's replica 0, a DCAA machine, reads replica 0 through the
// correction and then loses it (link reset) and moves to replica 1: it
// resumes and acknowledges by stable id, so its sink's stable output
// equals the failure-free replica's. Resuming at replica 0's position on
// replica 1 skipped (or repeated) windows.
func TestDCAASwitchAfterCorrection(t *testing.T) {
	g := newChainRig(t, 16000)
	agg0 := queryspec.TaskID(g.q.Name, "counts", 0, 0)
	agg0w, up0, up1 := g.c.workers[2], g.c.workers[0].addr, g.c.workers[1].addr
	var keep0 []*task
	for _, tk := range g.c.workers[4].rt.tasksByID() {
		if tk.spec.Fragment == "keep" {
			keep0 = append(keep0, tk)
		}
	}
	if len(keep0) == 0 {
		t.Fatal("no filter task on worker 4 (fused?)")
	}
	waitUntil(t, "aggregate replica 0 reading partition 0, stable", func() bool {
		return g.faults.BytesFrom(up0) > 8<<10 && g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	g.faults.CutOutgoing(up0, dataplane.Hold)
	g.faults.CutOutgoing(up1, dataplane.Hold)
	waitUntil(t, "aggregate replica 0 releasing tentative results", func() bool { return g.taskState(agg0).Tentative })
	g.faults.HealAll()
	var corrected uint64
	waitUntil(t, "aggregate replica 0 corrected, STABLE again", func() bool {
		st := g.taskState(agg0)
		tk := agg0w.rt.task(agg0)
		if tk == nil || st.Replica != fedstreampb.ReplicaState_REPLICA_STABLE || st.Tentative {
			return false
		}
		o := tk.outs[0].buf
		corrected = o.PositionOffset(o.Stats().LastID)
		return corrected > 0
	})
	// Let the filter take some of replica 0's stream past the correction,
	// then cut it off replica 0.
	waitUntil(t, "the filter reading past the correction", func() bool {
		for _, tk := range keep0 {
			for _, in := range tk.inputs {
				if in.stableTaken.Load() < 30 {
					return false
				}
			}
		}
		return true
	})
	g.downFaults.CutOutgoing(agg0w.addr, dataplane.Reset)
	g.restAtSpeed(t)
	got := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 0)))
	want := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 1)))
	t.Logf("aggregate replica 0's offset %d; sink replica 0: %d stable, %d tentative, %d UNDO; reference %d stable", corrected, len(got.stable), got.tentative, got.undos, len(want.stable))
	if want.tentative+want.undos+want.recDones != 0 {
		// Cut from nothing, but a starved process may miss a detection
		// timeout: replica 1 then corrected itself, and its stable view
		// must still match.
		t.Logf("replica 1's output holds %d tentative, %d UNDO, %d REC_DONE", want.tentative, want.undos, want.recDones)
	}
	// The sink merges the filter's two partitions: its stable view is the
	// merge of theirs (a merging sink takes only stable tuples into its
	// merge, by stable id), so a window a filter partition corrected shows
	// once, in order.
	sameStable(t, got.stable, want.stable, 40)
}

// After a correction the aggregate's replicas route the same stable
// windows to the same filter partitions: a DCAA checkpoint keeps the
// routing sequence that spreads unkeyed tuples over the downstream's
// partitions, and the restore puts it back. Without it, the tentative
// windows moved the sequence on replica 0 alone, its corrected windows
// went to other partitions than replica 1's, and the partition streams
// had different stable views (a consumer switching replicas by stable id
// then skipped or repeated windows).
func TestDCAACorrectionRoutesLikeFailureFreeRun(t *testing.T) {
	g := newChainRig(t, 16000)
	agg0 := queryspec.TaskID(g.q.Name, "counts", 0, 0)
	agg1 := queryspec.TaskID(g.q.Name, "counts", 0, 1)
	// Hold every output of both replicas from the start: the streams are
	// read whole at the end.
	var bufs [2][2]*dataplane.OutputBuffer
	for r, id := range []string{agg0, agg1} {
		w := g.c.workers[2]
		if r == 1 {
			w = g.c.workers[1]
		}
		for p := range 2 {
			b, err := w.rt.task(id).output("keep", p)
			if err != nil {
				t.Fatal(err)
			}
			b.Connect("holder")
			bufs[r][p] = b
		}
	}
	up0, up1 := g.c.workers[0].addr, g.c.workers[1].addr
	waitUntil(t, "aggregate replica 0 reading partition 0, stable", func() bool {
		return g.faults.BytesFrom(up0) > 8<<10 && g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	g.faults.CutOutgoing(up0, dataplane.Hold)
	g.faults.CutOutgoing(up1, dataplane.Hold)
	tk0 := g.c.workers[2].rt.task(agg0)
	waitUntil(t, "aggregate replica 0 tentative", func() bool { return tk0.dm.tentSteps.Load() > 3 })
	g.faults.HealAll()
	g.restAtSpeed(t)
	for p := range 2 {
		a := stableView(t, bufs[0][p])
		b := stableView(t, bufs[1][p])
		if len(a) < 10 {
			t.Fatalf("partition %d: %d stable tuples", p, len(a))
		}
		sameStable(t, a, b, 10)
	}
	if tk0.dm.restores.Load() == 0 {
		t.Fatal("aggregate replica 0 corrected nothing")
	}
}

// stableView reads a held output buffer from its start to its final
// boundary and returns its stable tuples and boundaries.
func stableView(t *testing.T, buf *dataplane.OutputBuffer) []tuple.Tuple {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{}, "", true, 0)
	var out []tuple.Tuple
	err := sub.RunLocal(ctx, buf, func(_ context.Context, b *dataplane.Batch) error {
		for _, tp := range b.Tuples {
			if tp.Type == tuple.Stable || tp.Type == tuple.Boundary {
				tp.Values = slices.Clone(tp.Values)
				out = append(out, tp)
			}
			if tp.Type == tuple.Boundary && tp.STime == math.MaxInt64 {
				return dataplane.ErrStopSubscription
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return out
}
