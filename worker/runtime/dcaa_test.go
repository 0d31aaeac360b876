package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// dcaaRig runs a replicated generator -> sink query on three workers:
// source replica r on worker r, the sink's replica 1 beside source 1, and
// the sink's replica 0 on worker 2, which dials the data plane through
// faults (so its links to the sources can be cut).
type dcaaRig struct {
	c      *cluster
	faults *dataplane.Faults
	q      *queryspec.Query
	// pace is the rig's generator pace (nil: the rig has none): see
	// restAtSpeed.
	pace *Pace
}

func newDCAARig(t *testing.T, limit int) *dcaaRig {
	t.Helper()
	q, err := queryspec.Parse("p.yaml", []byte(`name: p
replicas: 2
availability: {max_delay: 2s}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 3, limit: `+strconv.Itoa(limit)+`}}
sinks:
  - {name: out, input: lines}
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
	faults := dataplane.NewFaults()
	faulty := dataplane.NewPool(faults.DialOption())
	t.Cleanup(func() { faulty.Close() })
	c := &cluster{pool: shared, query: q, specs: map[*worker][]TaskSpec{}}
	c.workers = []*worker{startWorkerOpts(t, shared, opts), startWorkerOpts(t, shared, opts), startWorkerOpts(t, faulty, opts)}
	t.Cleanup(func() { c.close(t) })
	at := map[string]*worker{}
	var placements []Placement
	for _, node := range plan.Nodes {
		for r := range q.Replicas {
			w := c.workers[r]
			if node.Kind == queryspec.KindSink && r == 0 {
				w = c.workers[2]
			}
			id := queryspec.TaskID(q.Name, node.Name, 0, r)
			placements = append(placements, Placement{TaskID: id, Fragment: node.Name, Replica: r, WorkerAddr: w.addr})
			at[id] = w
		}
	}
	for _, pl := range placements {
		c.specs[at[pl.TaskID]] = append(c.specs[at[pl.TaskID]], TaskSpec{TaskID: pl.TaskID, Query: q.Name,
			Fragment: pl.Fragment, Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements})
	}
	c.apply()
	return &dcaaRig{c: c, faults: faults, q: q, pace: pace}
}

// replicaState is the replica state task id reports.
func (g *dcaaRig) replicaState(id string) fedstreampb.ReplicaState {
	for _, st := range g.c.states() {
		if st.TaskID == id {
			return st.Replica
		}
	}
	return -1
}

// sameStableTuples fails unless got equals want tuple for tuple.
func sameStableTuples(t *testing.T, got, want []tuple.Tuple, min int) {
	t.Helper()
	if len(got) != len(want) || len(want) < min {
		t.Fatalf("got %d tuples, reference %d (want >= %d)", len(got), len(want), min)
	}
	for i := range want {
		g, w := &got[i], &want[i]
		if g.ID != w.ID || g.Type != w.Type || g.STime != w.STime || !slices.Equal(g.Values, w.Values) {
			t.Fatalf("tuple %d: got %+v, reference %+v", i, *g, *w)
		}
		if g.Type == tuple.Tentative || g.Type == tuple.Undo || g.Type == tuple.RecDone {
			t.Fatalf("tuple %d is %v: a replica failure must give no tentative output", i, g.Type)
		}
	}
}

// P1 with a silent failure: the link from the upstream replica a
// downstream replica reads is held (no error, bytes just stop, as in a
// network partition or a paused process). Failure detection notices the
// silence (heartbeats stop) and the downstream moves to the other
// replica; its output equals the other replica's, tuple for tuple, with
// nothing tentative. Before failure detection, a held link was never
// noticed and the downstream waited forever.
func TestHeldLinkDetectedBySilence(t *testing.T) {
	g := newDCAARig(t, 6000)
	up0, up1 := g.c.workers[0].addr, g.c.workers[1].addr
	waitUntil(t, "sink replica 0 reading source replica 0", func() bool { return g.faults.BytesFrom(up0) > 16<<10 })
	before := g.faults.BytesFrom(up1)
	g.faults.CutOutgoing(up0, dataplane.Hold)

	got := g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 0))
	want := g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 1))
	if moved := g.faults.BytesFrom(up1) - before; moved < 16<<10 {
		t.Fatalf("only %d bytes came from source replica 1 after the cut: the sink did not switch", moved)
	}
	sameStableTuples(t, got, want, 6000)
	g.faults.HealAll()
}

// Every replica of the upstream silent for a while: the downstream
// replica reports UP_FAILURE while it hears from none, STABLE again once
// the links heal, and its output equals a failure-free replica's, tuple
// for tuple, with nothing tentative (this wiring does not release
// tentative results yet: it waits, as `strict` would).
func TestAllUpstreamReplicasSilentThenHealed(t *testing.T) {
	g := newDCAARig(t, 8000)
	up0, up1 := g.c.workers[0].addr, g.c.workers[1].addr
	sink0 := queryspec.TaskID(g.q.Name, "out", 0, 0)
	waitUntil(t, "sink replica 0 reading and stable", func() bool {
		return g.faults.BytesFrom(up0) > 16<<10 && g.replicaState(sink0) == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	g.faults.CutOutgoing(up0, dataplane.Hold)
	g.faults.CutOutgoing(up1, dataplane.Hold)
	waitUntil(t, "sink replica 0 in UP_FAILURE", func() bool {
		return g.replicaState(sink0) == fedstreampb.ReplicaState_REPLICA_UP_FAILURE
	})
	// The source replicas themselves are fine.
	for r := range 2 {
		if st := g.replicaState(queryspec.TaskID(g.q.Name, "lines", 0, r)); st != fedstreampb.ReplicaState_REPLICA_STABLE {
			t.Fatalf("source replica %d reports %v", r, st)
		}
	}
	g.faults.HealAll()
	got := g.c.tail(t, sink0)
	want := g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 1))
	sameStableTuples(t, got, want, 8000)
	waitUntil(t, "sink replica 0 STABLE again", func() bool {
		return g.replicaState(sink0) == fedstreampb.ReplicaState_REPLICA_STABLE
	})
}

// aggRig runs a two-partition source into a replicated windowed
// aggregate and its sink, on four workers: source partition 0's replicas
// on workers 0 and 1, partition 1's both on worker 3, the aggregate's and
// sink's replica 1 on worker 1 and their replica 0 on worker 2, which
// dials the data plane through faults. Cutting worker 2's links to
// workers 0 and 1 makes every replica of source partition 0 unreachable
// for aggregate replica 0, while partition 1 stays live: the aggregate
// has data it could release, the case DCAA is about. Replica 1 runs
// without failures: its sink's output is the reference.
func newAggRig(t *testing.T, maxDelay string, limit int) *dcaaRig {
	t.Helper()
	q, err := queryspec.Parse("agg.yaml", []byte(`name: agg
replicas: 2
availability: {max_delay: `+maxDelay+`}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: `+strconv.Itoa(limit)+`}, parallelism: 2}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 100ms}, aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
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
	faults := dataplane.NewFaults()
	faulty := dataplane.NewPool(faults.DialOption())
	t.Cleanup(func() { faulty.Close() })
	c := &cluster{pool: shared, query: q, specs: map[*worker][]TaskSpec{}}
	c.workers = []*worker{startWorkerOpts(t, shared, opts), startWorkerOpts(t, shared, opts),
		startWorkerOpts(t, faulty, opts), startWorkerOpts(t, shared, opts)}
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
				case r == 0:
					w = c.workers[2]
				default:
					w = c.workers[1]
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
	return &dcaaRig{c: c, faults: faults, q: q, pace: pace}
}

func (g *dcaaRig) taskState(id string) TaskState {
	for _, st := range g.c.states() {
		if st.TaskID == id {
			return st
		}
	}
	return TaskState{}
}

// view is what a consumer of a sink's result stream makes of it: UNDO
// carries in its STime the position of the last stable tuple it keeps.
type view struct {
	stable                     []tuple.Tuple
	tentative, undos, recDones int
	// uncorrectable: the UNCORRECTABLE records (outside the stable view).
	uncorrectable []tuple.Tuple
}

func viewOf(ts []tuple.Tuple) view {
	var v view
	for _, tp := range ts {
		switch tp.Type {
		case tuple.Tentative:
			v.tentative++
		case tuple.Undo:
			v.undos++
		case tuple.RecDone:
			v.recDones++
		case tuple.Uncorrectable:
			v.uncorrectable = append(v.uncorrectable, tp)
		default:
			v.stable = append(v.stable, tp)
		}
	}
	return v
}

// sameStable fails unless the stable streams hold the same tuples in the
// same order (ids aside: they are stream positions, and corrections take
// new ones).
func sameStable(t *testing.T, got, want []tuple.Tuple, min int) {
	t.Helper()
	if len(got) != len(want) || len(want) < min {
		t.Fatalf("stable output: %d tuples, reference %d (want >= %d)", len(got), len(want), min)
	}
	for i := range want {
		g, w := &got[i], &want[i]
		if g.Type != w.Type || g.STime != w.STime || !slices.Equal(g.Values, w.Values) {
			t.Fatalf("stable tuple %d: got %+v, reference %+v", i, *g, *w)
		}
	}
}

// P3: every replica of one upstream partition unreachable for longer
// than X. The aggregate replica that lost it releases what its live input
// brings as TENTATIVE once X has passed (checkpointing first), and after
// the links heal restores its checkpoint, replays the stable input and
// sends UNDO, the corrections and REC_DONE: its sink's stable output then
// equals the failure-free replica's, in order.
func TestDCAALongFailureTentativeThenCorrected(t *testing.T) {
	g := newAggRig(t, "300ms", 16000)
	agg0 := queryspec.TaskID(g.q.Name, "counts", 0, 0)
	up0, up1 := g.c.workers[0].addr, g.c.workers[1].addr
	waitUntil(t, "aggregate replica 0 reading partition 0, stable", func() bool {
		return g.faults.BytesFrom(up0) > 8<<10 && g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	g.faults.CutOutgoing(up0, dataplane.Hold)
	g.faults.CutOutgoing(up1, dataplane.Hold)
	// Tentative release steps covering more than a window (10ms steps,
	// 100ms windows), so that tentative windows were emitted.
	tk0 := g.c.workers[2].rt.task(agg0)
	waitUntil(t, "aggregate replica 0 releasing tentative results", func() bool { return tk0.dm.tentSteps.Load() >= 15 })
	if st := g.taskState(agg0).Replica; st != fedstreampb.ReplicaState_REPLICA_UP_FAILURE {
		t.Fatalf("tentative aggregate replica reports %v", st)
	}
	g.faults.HealAll()
	waitUntil(t, "aggregate replica 0 STABLE again", func() bool {
		st := g.taskState(agg0)
		return st.Replica == fedstreampb.ReplicaState_REPLICA_STABLE && !st.Tentative
	})
	g.restAtSpeed(t)
	got := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 0)))
	want := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 1)))
	t.Logf("replica 0: %d stable, %d tentative, %d UNDO, %d REC_DONE; reference %d stable", len(got.stable), got.tentative, got.undos, got.recDones, len(want.stable))
	if got.tentative == 0 || got.undos == 0 || got.recDones == 0 {
		t.Fatalf("replica 0's output: %d tentative, %d UNDO, %d REC_DONE: want tentative results then corrections", got.tentative, got.undos, got.recDones)
	}
	if want.tentative+want.undos+want.recDones != 0 {
		// Cut from nothing, but a process starved of CPU may miss a
		// detection timeout: replica 1 then corrected itself too.
		t.Logf("replica 1's output holds %d tentative, %d UNDO, %d REC_DONE", want.tentative, want.undos, want.recDones)
	}
	sameStable(t, got.stable, want.stable, 40)
	// Replica 0 reconciled with its peer's permission, asked over the
	// data plane.
	r0 := g.c.workers[2].rt.task(agg0).dm
	r1 := g.c.workers[1].rt.task(queryspec.TaskID(g.q.Name, "counts", 0, 1)).dm
	if r0.peers.granted.Load() == 0 || r1.peers.served.Load() == 0 {
		t.Fatalf("permission: replica 0 was granted %d times, replica 1 served %d requests", r0.peers.granted.Load(), r1.peers.served.Load())
	}
	checkDCAAInTuples(t, g)
}

// checkDCAAInTuples: once the query ran to its end, each replica of the
// aggregate counted as input (TaskStats.InTuples) exactly the tuples the
// sources emitted: every stable input tuple once, whether it was
// released stable at once or tentatively and then replayed by a
// correction, and it was busy for some time.
func checkDCAAInTuples(t *testing.T, g *dcaaRig) {
	t.Helper()
	// The sinks' ends do not say the aggregate replicas are done: a sink
	// whose replica of the aggregate was tentative moves to the other
	// one once it is stable again (dcaa_sinkbg.go), and its end no
	// longer waits for the one it left, which may still be catching up
	// (its sources' buffers waiting for it). Counted before, its input
	// fell short of what the sources would emit.
	q := g.q.Name
	for _, id := range []string{queryspec.TaskID(q, "lines", 0, 1), queryspec.TaskID(q, "lines", 1, 0), queryspec.TaskID(q, "counts", 0, 0), queryspec.TaskID(q, "counts", 0, 1)} {
		waitUntil(t, id+" at the end of its input", func() bool { return g.taskState(id).Message == "input exhausted" })
	}
	stats := map[string]TaskStats{}
	for _, w := range g.c.workers {
		for _, s := range w.rt.Stats() {
			stats[s.TaskID] = s
		}
	}
	emitted := stats[queryspec.TaskID(q, "lines", 0, 1)].OutTuples + stats[queryspec.TaskID(q, "lines", 1, 0)].OutTuples
	if emitted == 0 {
		t.Fatalf("the sources emitted nothing: %+v", stats)
	}
	for r := range 2 {
		st := stats[queryspec.TaskID(q, "counts", 0, r)]
		if st.InTuples != emitted || st.BusyNanos <= 0 {
			t.Errorf("aggregate replica %d: InTuples %d (sources emitted %d), BusyNanos %d", r, st.InTuples, emitted, st.BusyNanos)
		}
	}
}

// P2: every replica of one upstream partition unreachable for less than
// X: the aggregate detects the failure (UP_FAILURE) but releases nothing
// tentative, and its output equals the failure-free replica's.
func TestDCAAShortFailureCostsNothing(t *testing.T) {
	g := newAggRig(t, "5s", 16000)
	agg0 := queryspec.TaskID(g.q.Name, "counts", 0, 0)
	up0, up1 := g.c.workers[0].addr, g.c.workers[1].addr
	waitUntil(t, "aggregate replica 0 reading partition 0, stable", func() bool {
		return g.faults.BytesFrom(up0) > 8<<10 && g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	g.faults.CutOutgoing(up0, dataplane.Hold)
	g.faults.CutOutgoing(up1, dataplane.Hold)
	waitUntil(t, "aggregate replica 0 detecting the failure", func() bool {
		return g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_UP_FAILURE
	})
	g.faults.HealAll()
	waitUntil(t, "aggregate replica 0 STABLE again", func() bool {
		return g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	g.restAtSpeed(t)
	got := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 0)))
	want := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 1)))
	if got.tentative+got.undos+got.recDones != 0 {
		t.Fatalf("a failure shorter than X gave %d tentative, %d UNDO, %d REC_DONE", got.tentative, got.undos, got.recDones)
	}
	sameStable(t, got.stable, want.stable, 40)
}

// P1 with real workers: the upstream replica the aggregate's replica 0
// reads goes silent (its link held: a failed or paused worker looks the
// same). The machine detects it and moves to the other replica within
// the detection timeout, far below X: no tentative result, and the
// output equals the failure-free replica's.
//
// The replica held is the one the aggregate reads: replica 0, unless a
// start under load (upstreams not heard for the start grace) moved it
// to replica 1 already. The hold must come within the stream: at load
// 30 the aggregate was seen STABLE only 16 s after the start, the
// stream (4 s at the generators' rate) long over, and nothing was read
// after the cut. A run whose stream ended before the hold proves nothing
// and runs again (at most three times); the stream is 8 s long, the
// rest of it run fast once the switch is seen (restAtSpeed).
func TestDCAAOneReplicaLostNoTentative(t *testing.T) {
	whileInconclusive(t, 3, oneReplicaLostRun)
}

// oneReplicaLostRun runs TestDCAAOneReplicaLostNoTentative's scenario
// once; it returns why the run was inconclusive ("" when it was judged).
func oneReplicaLostRun(t *testing.T) (inconclusive string) {
	g := newAggRig(t, "5s", 32000)
	agg0 := queryspec.TaskID(g.q.Name, "counts", 0, 0)
	ups := []string{g.c.workers[0].addr, g.c.workers[1].addr}
	tk := g.c.workers[2].rt.task(agg0)
	if tk == nil || tk.dm == nil {
		t.Fatal("the replicated aggregate does not run the DCAA machine")
	}
	var held, other string
	var in *input
	waitUntil(t, "aggregate replica 0 STABLE, reading partition 0", func() bool {
		var r int
		if r, in = readsReplica(tk, "lines", 0); in == nil {
			return false
		}
		held, other = ups[r], ups[1-r]
		return g.faults.BytesFrom(held) > 8<<10 && g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	before := g.faults.BytesFrom(other)
	g.faults.CutOutgoing(held, dataplane.Hold)
	defer g.faults.HealAll()
	waitUntil(t, "aggregate replica 0 reading from the other source replica, or its input ended", func() bool {
		return g.faults.BytesFrom(other)-before >= 8<<10 || in.endTaken.Load()
	})
	if moved := g.faults.BytesFrom(other) - before; moved < 8<<10 {
		return fmt.Sprintf("the aggregate's input from partition 0 ended with %d bytes from the other source replica after the hold", moved)
	}
	g.restAtSpeed(t)
	got := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 0)))
	want := viewOf(g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 1)))
	if got.tentative+got.undos+got.recDones != 0 {
		t.Fatalf("losing one replica gave %d tentative, %d UNDO, %d REC_DONE", got.tentative, got.undos, got.recDones)
	}
	sameStable(t, got.stable, want.stable, 40)
	return ""
}

// readsReplica is the upstream replica task tk's input from partition
// part of fragment upstream reads, and that input (nil: it has no live
// subscription to the replica the machine chose).
func readsReplica(tk *task, upstream string, part int) (int, *input) {
	for _, in := range tk.inputsNow() {
		if in.upstream != upstream || in.upPartition != part {
			continue
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		if !in.target.set || in.cancelCur == nil || in.machineAttempt.Load() != in.target.attempt {
			return 0, nil
		}
		return in.target.replica, in
	}
	return 0, nil
}

// A DCAA operator task (replicated query) moves from a stop-and-copy
// snapshot: the snapshot takes the machine's inputs (last stable ids,
// stable data not yet released) instead of the unused merger's, so the
// copy resumes exactly: the sink's stream equals an unmoved run's, tuple
// for tuple. Before the machine was captured, the copy resumed from the
// start of its inputs on top of the restored state.
func TestDCAATaskMovesFromSnapshot(t *testing.T) {
	// Windows much wider than a release step: the snapshot catches open
	// windows, so input processed twice (or missed) would change results.
	yaml := strings.Replace(fmt.Sprintf(wordsQuery, 2, 20000), "size: 2ms", "size: 200ms", 1)
	place := func(string, int, int) int { return 0 }
	const moving = "wc/counts/p0/r0"

	unmoved := newCluster(t, 2, yaml, place)
	unmoved.apply()
	want := unmoved.tail(t, "wc/out/p0/r0")
	// The moving task's own output: a replicated sink may read the other
	// replica, so the copy's stream is compared too (by stable id: a copy
	// that processed anything twice or missed anything ends elsewhere).
	wantLast := finalOutputID(t, unmoved.workers[0].rt.task(moving))
	unmoved.close(t)

	c := newCluster(t, 2, yaml, place)
	defer c.close(t)
	c.apply()
	from, to := c.workers[0], c.workers[1]
	if tk := from.rt.task(moving); tk == nil || tk.dm == nil {
		t.Fatal("the replicated aggregate does not run the DCAA machine")
	}
	// Another subscriber holds the source's streams to the moving task,
	// on both source replicas: the streams keep what the task took, so
	// the copy must resume from its snapshot's position, not from what
	// happens to be left. Both, as a move registers its new copy with
	// every upstream replica before the snapshot (pinUpstreams), which
	// this hand-made move does not do, and whose old copy leaves them
	// when it stops: the copy reads replica 1 when it takes replica 0
	// for failed (a starved process), and with replica 1 unheld the
	// other aggregate replica's acknowledgements had let it discard the
	// tuples after the snapshot (under load: "the moved copy's output
	// ends at id 1875, an unmoved run's at 2431", the source replica 1
	// warning that the copy resumed after discarded tuples).
	for _, src := range []string{"wc/lines/p0/r0", "wc/lines/p0/r1"} {
		held, err := from.rt.task(src).output("counts", 0)
		if err != nil {
			t.Fatal(err)
		}
		held.Connect("holder")
		defer held.Disconnect("holder")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The snapshot must come before the aggregate processes the end of its
	// 1 s input, which a loaded machine used to let pass first: the
	// sources (both replicas run on from) are held between two records
	// from the first time the aggregate emitted its first windows, or the
	// sources are half way, and resumed once the snapshot is taken.
	emitted := func() bool {
		tk := from.rt.task(moving)
		return tk != nil && tk.outs[0].buf.Stats().LastID > 300
	}
	var resume func()
	waitUntil(t, "the aggregate emitted some windows or the sources are half way", func() bool {
		_, high, res := from.rt.PauseSources(ctx, "wc")
		if high == math.MinInt64 { // none held: not started yet, or ended
			res()
			if src := from.rt.task("wc/lines/p0/r0"); src != nil && src.State().Message == "input exhausted" {
				t.Fatal("the sources ended before they could be held")
			}
			return false
		}
		if emitted() || high >= int64(500*time.Millisecond) {
			resume = res
			return true
		}
		res()
		return false
	})
	// Held, the sources have sent what they produced (past 200 ms, the
	// end of the first windows).
	waitUntil(t, "the aggregate emitted some windows", emitted)
	snap, err := from.rt.SnapshotTask(ctx, moving, SnapshotOptions{Halt: true})
	resume()
	if err != nil {
		t.Fatal(err)
	}
	if snap.Released == math.MaxInt64 || len(snap.Operator) < 100 {
		t.Fatalf("snapshot at watermark %d with %d bytes of state: not mid-stream", snap.Released, len(snap.Operator))
	}
	if err := from.rt.WaitTaken(ctx, moving, snap); err != nil {
		t.Fatal(err)
	}
	c.moveTask(t, moving, from, to, snap)
	got := c.tail(t, "wc/out/p0/r0")
	// Stable views: a process starved of CPU may take a live upstream
	// for failed and correct itself, which adds positions (not stable
	// ones) to either run.
	sameStable(t, viewOf(got).stable, viewOf(want).stable, 100)
	if last := finalOutputID(t, to.rt.task(moving)); last != wantLast {
		t.Fatalf("the moved copy's output ends at id %d, an unmoved run's at %d", last, wantLast)
	}
	if _, err := to.rt.SnapshotTask(ctx, moving, SnapshotOptions{Halt: true, Aligned: true, At: 1}); !errors.Is(err, ErrNotSnapshottable) {
		t.Fatalf("an aligned snapshot of a DCAA task: %v, want ErrNotSnapshottable", err)
	}
}

// finalOutputID waits until the task processed its input to the end and
// returns the stable id of the last tuple of its first output (its
// position less the positions outside the stable view: corrections after
// a spurious failure detection add those).
func finalOutputID(t *testing.T, tk *task) uint64 {
	t.Helper()
	waitUntil(t, tk.spec.TaskID+" exhausting its input", func() bool { return tk.State().Message == "input exhausted" })
	b := tk.outs[0].buf
	last := b.Stats().LastID
	return last - b.PositionOffset(last)
}

// max_delay 0 without any failure: the aggregate waits for no failed
// input, and an input merely behind is no failure, so the output is
// normally all stable (it used to go tentative whenever its inputs were
// not level and correct itself right after; a starved process can still
// make an input silent past the detection timeout, which is a failure).
// When a correction replays up to the final boundary, its REC_DONE used
// to follow the final boundary, so consumers, which take a batch ending with the final
// boundary for the end of the stream, never saw the end: the sinks never
// finished and the tail below timed out. Now REC_DONE comes just before
// the final boundary, the streams end, and the stable output equals the
// other replica's.
func TestDCAAImmediateStreamsEnd(t *testing.T) {
	g := newAggRig(t, "0", 8000)
	got := g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 0))
	want := g.c.tail(t, queryspec.TaskID(g.q.Name, "out", 0, 1))
	for _, ts := range [][]tuple.Tuple{got, want} {
		for i, tp := range ts {
			if tp.Type == tuple.Boundary && tp.STime == math.MaxInt64 && i != len(ts)-1 {
				t.Fatalf("%v follows the final boundary", ts[i+1].Type)
			}
		}
	}
	g0, g1 := viewOf(got), viewOf(want)
	t.Logf("replica 0: %d stable, %d tentative, %d UNDO; replica 1: %d stable, %d tentative, %d UNDO",
		len(g0.stable), g0.tentative, g0.undos, len(g1.stable), g1.tentative, g1.undos)
	sameStable(t, g0.stable, g1.stable, 20)
	waitUntil(t, "both sinks done", func() bool {
		return g.taskState(queryspec.TaskID(g.q.Name, "out", 0, 0)).Message == "input exhausted" &&
			g.taskState(queryspec.TaskID(g.q.Name, "out", 0, 1)).Message == "input exhausted"
	})
}

// The failure detector's periodic state update leaves a machine-run
// task's advertised state alone: the machine owns it. Before, a task
// holding tentative state (UP_FAILURE, with its tentative watermark)
// whose inputs were all fine again was re-advertised as STABLE with
// watermark 0 on every watchdog tick, between the machine's own
// advertisements.
func TestDCAAWatchdogLeavesMachineStateAlone(t *testing.T) {
	g := newAggRig(t, "5s", 40000)
	agg0 := queryspec.TaskID(g.q.Name, "counts", 0, 0)
	waitUntil(t, "aggregate replica 0 running, stable", func() bool {
		return g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	tk := g.c.workers[2].rt.task(agg0)
	if tk == nil || tk.dm == nil {
		t.Fatalf("aggregate replica 0 runs no DCAA machine")
	}
	// What the machine advertises while its operators are tentative.
	tk.replicaState.Store(int32(fedstreampb.ReplicaState_REPLICA_UP_FAILURE))
	for _, o := range tk.outs {
		o.buf.SetStreamState(fedstreampb.ReplicaState_REPLICA_UP_FAILURE, 12345)
	}
	tk.updateReplicaState()
	for _, o := range tk.outs {
		if st, wm := o.buf.StreamState(); st != fedstreampb.ReplicaState_REPLICA_UP_FAILURE || wm != 12345 {
			t.Fatalf("after the watchdog's update the output advertises %v, watermark %d: want UP_FAILURE, 12345", st, wm)
		}
	}
}
