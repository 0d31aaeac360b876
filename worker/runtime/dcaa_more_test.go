package runtime

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// failureFree runs the property rig's query without any failure and
// returns its sink's stable output (the reference). Stream times do not
// depend on pacing, so its generators run restSpeed times faster than
// their rate; the reference is computed once per package run for each
// maxDelay and limit.
func failureFree(t *testing.T, maxDelay string, limit int) []tuple.Tuple {
	t.Helper()
	return failureFreeOf(t, fmt.Sprintf("%s/%d", maxDelay, limit), func() *queryspec.Query { return propQuery(t, "agg", maxDelay, limit) })
}

// failureFreeOf is failureFree for the query query builds, named key
// among the references: the stable output of its sink's replica 0.
func failureFreeOf(t *testing.T, key string, query func() *queryspec.Query) []tuple.Tuple {
	t.Helper()
	failureFreeRuns.mu.Lock()
	defer failureFreeRuns.mu.Unlock()
	if ref, ok := failureFreeRuns.m[key]; ok {
		return ref
	}
	q := query()
	opts := dcaaOpts
	opts.SourceSpeedup = restSpeed
	c := newClusterOpts(t, 2, q, func(_ string, p, r int) int { return p + r }, opts)
	defer c.close(t)
	c.apply()
	v := viewOf(c.tail(t, propSink0))
	if v.tentative+v.undos+v.recDones != 0 {
		t.Fatalf("the failure-free run gave %d tentative, %d UNDO, %d REC_DONE", v.tentative, v.undos, v.recDones)
	}
	if failureFreeRuns.m == nil {
		failureFreeRuns.m = map[string][]tuple.Tuple{}
	}
	failureFreeRuns.m[key] = v.stable
	return v.stable
}

// failureFreeRuns are the references failureFree computed.
var failureFreeRuns struct {
	mu sync.Mutex
	m  map[string][]tuple.Tuple
}

// P4, two simultaneous failures: at one instant every replica of source
// partition 0 becomes unreachable for the aggregate's replica 0 (which
// goes tentative past X) and the sink's replica 0 loses the aggregate
// replica it reads (it moves to the other). After healing, both sinks'
// stable outputs equal the reference.
func TestDCAATwoSimultaneousFailures(t *testing.T) {
	g := newPropRig(t, "300ms", 16000)
	g.readingStable(t)
	g.cut(2, dataplane.Hold, 0, 1)
	g.cut(4, dataplane.Reset, 2)
	waitUntil(t, "aggregate replica 0 releasing tentative results", func() bool { return g.taskState(propAgg0).Tentative })
	g.faults[2].HealAll()
	g.stableAgain(t, propAgg0)
	g.faults[4].HealAll()
	g.restAtSpeed(t)
	g.compare(t)
}

// P4, a second failure during stabilization: the aggregate's replica 0
// goes tentative, its links heal, and as soon as it stops being tentative
// (it reconciles: asks its peer, restores, replays) the same links fail
// again, long enough for tentative results once more; after the second
// healing its sink's stable output equals the reference.
func TestDCAASecondFailureDuringStabilization(t *testing.T) {
	g := newPropRig(t, "300ms", 24000)
	g.readingStable(t)
	agg := g.task(propAgg0)
	g.cut(2, dataplane.Hold, 0, 1)
	waitUntil(t, "aggregate replica 0 releasing tentative results", func() bool { return g.taskState(propAgg0).Tentative })
	g.faults[2].HealAll()
	waitUntil(t, "aggregate replica 0 reconciling", func() bool {
		return agg.replicaState.Load() == int32(fedstreampb.ReplicaState_REPLICA_STABILIZATION) || !agg.tentative.Load()
	})
	g.cut(2, dataplane.Hold, 0, 1)
	waitUntil(t, "aggregate replica 0 tentative again", func() bool { return agg.dm.restores.Load() >= 1 && agg.tentative.Load() })
	g.faults[2].HealAll()
	g.stableAgain(t, propAgg0)
	g.restAtSpeed(t)
	g.compare(t)
	if n := agg.dm.restores.Load(); n < 2 {
		t.Fatalf("aggregate replica 0 corrected %d times: want one correction per failure", n)
	}
}

// P6: every replica of the aggregate loses source partition 0 for longer
// than X; both release tentative results, and after healing they
// reconcile one at a time (peer permission): while one replica is in
// STABILIZATION the other is not, so one of them always produces. Both
// sinks' stable outputs then equal a failure-free run's.
func TestDCAAOneReplicaKeepsProducingDuringStabilization(t *testing.T) {
	const limit = 16000
	want := failureFree(t, "5s", limit)
	g := newFaultRig(t, propQuery(t, "agg", "300ms", limit), 6, []int{2, 4, 5}, dcaaOpts, propPlace(true))
	g.c.apply()
	g.readingStable(t)
	a0, a1 := g.task(propAgg0), g.task(propAgg1)
	var both atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		stab := int32(fedstreampb.ReplicaState_REPLICA_STABILIZATION)
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if a0.replicaState.Load() == stab && a1.replicaState.Load() == stab {
				both.Store(true)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	g.cut(2, dataplane.Hold, 0, 1)
	g.cut(5, dataplane.Hold, 0, 1)
	// Tentative steps covering more than a window (10ms steps, 100ms
	// windows) on both: tentative windows were emitted.
	waitUntil(t, "both aggregate replicas tentative", func() bool { return a0.dm.tentSteps.Load() >= 15 && a1.dm.tentSteps.Load() >= 15 })
	g.faults[2].HealAll()
	g.faults[5].HealAll()
	g.stableAgain(t, propAgg0)
	g.stableAgain(t, propAgg1)
	g.restAtSpeed(t)
	if both.Load() {
		t.Fatal("both replicas of the aggregate were in STABILIZATION at once")
	}
	if a0.dm.restores.Load() == 0 || a1.dm.restores.Load() == 0 {
		t.Fatalf("recoveries: replica 0 %d, replica 1 %d: want both to correct", a0.dm.restores.Load(), a1.dm.restores.Load())
	}
	for _, id := range []string{propSink0, propSink1} {
		v := viewOf(g.c.tail(t, id))
		if v.tentative == 0 {
			t.Fatalf("%s: no tentative result although every replica failed", id)
		}
		sameStable(t, v.stable, want, 40)
	}
}

// max_delay: 0 with real workers: nothing waits. A failure of every
// replica of one source partition gives tentative results at once (and
// so does mere skew between live inputs); after healing the stable
// output of both sinks equals a failure-free run's.
func TestDCAAMaxDelayZero(t *testing.T) {
	want := failureFree(t, "5s", 16000)
	g := newPropRig(t, "0s", 16000)
	// Skew alone makes max_delay 0 tentative now and then: wait for data,
	// not for a STABLE moment.
	waitUntil(t, "aggregate replica 0 reading partition 0", func() bool { return g.faults[2].BytesFrom(g.c.workers[0].addr) > 8<<10 })
	agg := g.task(propAgg0)
	before := agg.dm.tentSteps.Load() // skew alone releases tentatively
	g.cut(2, dataplane.Hold, 0, 1)
	waitUntil(t, "aggregate replica 0 releasing tentative results", func() bool { return agg.dm.tentSteps.Load() > before+15 })
	g.faults[2].HealAll()
	g.stableAgain(t, propAgg0)
	g.restAtSpeed(t)
	got := g.compare(t)
	if got.tentative == 0 {
		t.Fatal("max_delay 0: no tentative result during the failure")
	}
	sameStable(t, got.stable, want, 40)
}

// strict with real workers: never tentative. Every replica of one source
// partition unreachable while the live partition's data piles up: the
// aggregate's replica 0 reports UP_FAILURE and releases nothing
// tentative (it blocks); after healing its sink's output equals the
// reference with no tentative result, UNDO or REC_DONE.
func TestDCAAStrictNeverTentative(t *testing.T) {
	g := newPropRig(t, "strict", 16000)
	g.readingStable(t)
	agg := g.task(propAgg0)
	sink1 := g.task(propSink1)
	g.cut(2, dataplane.Hold, 0, 1)
	waitUntil(t, "aggregate replica 0 in UP_FAILURE", func() bool {
		return g.taskState(propAgg0).Replica == fedstreampb.ReplicaState_REPLICA_UP_FAILURE
	})
	// The failure-free replica moves on by more than a second of windows
	// meanwhile (X would long have passed for any duration).
	from := sink1.outs[0].buf.Stats().LastID
	waitUntil(t, "the failure-free replica moving on", func() bool { return sink1.outs[0].buf.Stats().LastID > from+30 })
	if agg.tentative.Load() || agg.dm.tentSteps.Load() != 0 {
		t.Fatal("strict: the aggregate released tentative results")
	}
	g.faults[2].HealAll()
	g.restAtSpeed(t)
	got := g.compare(t)
	if got.tentative+got.undos+got.recDones != 0 {
		t.Fatalf("strict: %d tentative, %d UNDO, %d REC_DONE", got.tentative, got.undos, got.recDones)
	}
}

// P5: two queries with different X share the workers (and the cut
// links). Every replica of one source partition becomes unreachable for
// both aggregates' replica 0: the query with X = 300ms releases tentative
// results, the one with X = 10m does not (it waits); after healing both
// sinks of each query agree, stable tuple for stable tuple. The slow X
// is longer than any wait of the test: with 20s, a loaded machine on
// which the fast query took over 20 s to release its tentative results
// let the slow one's X pass too, and its sink rightly saw tentative
// results, which the test took for a broken bound.
func TestDCAATwoQueriesKeepTheirOwnBound(t *testing.T) {
	const slowX = 10 * time.Minute
	fast := propQuery(t, "fast", "300ms", 16000)
	slow := propQuery(t, "slow", slowX.String(), 16000)
	g := newFaultRig(t, fast, 6, []int{2, 4, 5}, dcaaOpts, propPlace(false))
	plan, err := slow.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	g.place(t, slow, plan, propPlace(false))
	g.c.apply()
	fastAgg, slowAgg := g.task("fast/counts/p0/r0"), g.task("slow/counts/p0/r0")
	waitUntil(t, "both aggregates' replica 0 reading partition 0, stable", func() bool {
		return g.faults[2].BytesFrom(g.c.workers[0].addr) > 16<<10 &&
			g.taskState("fast/counts/p0/r0").Replica == fedstreampb.ReplicaState_REPLICA_STABLE &&
			g.taskState("slow/counts/p0/r0").Replica == fedstreampb.ReplicaState_REPLICA_STABLE
	})
	cutAt := time.Now()
	g.cut(2, dataplane.Hold, 0, 1)
	waitUntil(t, "the fast query tentative for a while", func() bool { return fastAgg.dm.tentSteps.Load() >= 20 })
	slowTentative := slowAgg.tentative.Load() || slowAgg.dm.tentSteps.Load() > 0
	if elapsed := time.Since(cutAt); elapsed < slowX && slowTentative {
		t.Fatalf("the query with X = %v released tentative results %v after the failure", slowX, elapsed)
	}
	g.faults[2].HealAll()
	g.restAtSpeed(t)
	for _, q := range []string{"fast", "slow"} {
		got := viewOf(g.c.tail(t, q+"/out/p0/r0"))
		want := viewOf(g.c.tail(t, q+"/out/p0/r1"))
		t.Logf("%s: sink replica 0 %d stable, %d tentative, %d UNDO", q, len(got.stable), got.tentative, got.undos)
		sameStable(t, got.stable, want.stable, 40)
		if q == "fast" && got.tentative == 0 {
			t.Fatal("the fast query's sink saw no tentative result")
		}
		if q == "slow" && got.tentative+got.undos != 0 {
			t.Fatalf("the slow query's sink saw %d tentative results, %d UNDO", got.tentative, got.undos)
		}
	}
}

// P7: a failure longer than the bound on the input a task keeps for its
// replay. The aggregate's replica 0 keeps at most DCAAKeepTuples stable
// tuples while its results are tentative (the oldest go, whole release
// steps), so its memory stays within the bound however long the failure;
// after healing, its correction cannot make the windows that overlapped
// the dropped input exact, and its status names them (by stream time);
// every result outside that range, before and after, equals the
// failure-free replica's: the windowed query converges. The sink passes
// the aggregate's output through here; in the keyed variant it merges.
func TestDCAAFailureLongerThanTheReplayBound(t *testing.T) {
	t.Run("pass-through sink", func(t *testing.T) {
		testFailureLongerThanReplayBound(t, propQuery(t, "agg", "300ms", 16000), 0)
	})
	t.Run("merging sink", func(t *testing.T) {
		testFailureLongerThanReplayBound(t, mustParse(t, keyedAggYAML), 0)
	})
	// The aggregate's record is relayed by a windowed operator behind
	// it, its range widened by that operator's window.
	t.Run("relayed downstream", func(t *testing.T) {
		testFailureLongerThanReplayBound(t, mustParse(t, `name: chain
replicas: 2
availability: {max_delay: 300ms}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: 16000}, parallelism: 2}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 100ms}, aggregates: {n: "count()"}}
  - {name: total, type: aggregate, input: counts, window: {size: 200ms}, aggregates: {windows: "count()", n: "sum(n)"}}
sinks:
  - {name: out, input: total}
`), 200*time.Millisecond)
	})
}

// keyedAggYAML: two generated partitions, a keyed aggregate (one
// partition) and a sink that merges its replicas' results (placed by
// propPlace like propQuery's).
const keyedAggYAML = `name: kagg
replicas: 2
availability: {max_delay: 300ms}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: 16000}, parallelism: 2}
operators:
  - {name: firsts, type: map, input: lines, fields: {word: "split(line, ' ')[0]"}, parallelism: 2}
  - {name: counts, type: aggregate, input: firsts, window: {size: 100ms}, group_by: [word], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`

// widen is the window of an operator between the aggregate that loses
// input and the sink (0: none): the sink's results are uncorrectable
// that much longer.
func testFailureLongerThanReplayBound(t *testing.T, q *queryspec.Query, widen time.Duration) {
	const keep, pending, bufTuples = 300, 200, 1000
	opts := dcaaOpts
	opts.DCAAKeepTuples = keep
	// The live input's data waits for the failed one up to X (300ms,
	// about 600 tuples): past this bound it is held back by flow control.
	opts.InputPendingTuples = pending
	// Output buffers smaller than the sink's result stream: they reach
	// their bound during the failure. In the keyed variant the lossy
	// replica's correction gives fewer results than the exact replica,
	// so stable ids no longer match across them; before the ack relays
	// of a diverged input acknowledged everything, the exact replica
	// kept the difference for the lossy replica's sink and, that being
	// more than its buffer, blocked for good at the end.
	opts.Buffer.MaxTuples = bufTuples
	g := newFaultRig(t, q, 6, []int{2, 4, 5}, opts, propPlace(false))
	g.c.apply()
	id := func(node string, r int) string { return queryspec.TaskID(q.Name, node, 0, r) }
	agg0, sink0, sink1 := id("counts", 0), id("out", 0), id("out", 1)
	// The comparison below needs stable results from before the failure:
	// wait until the aggregate released a thousand input tuples stable
	// (a quarter second of stream, windows of 100ms). Under load, the
	// bytes from partition 0 alone had come while nothing was released
	// yet: every result then fell in the uncorrectable range.
	waitUntil(t, "aggregate replica 0 reading partition 0, stable, with results released", func() bool {
		tk := g.task(agg0)
		return tk != nil && g.faults[2].BytesFrom(g.c.workers[0].addr) > 8<<10 && g.taskState(agg0).Replica == fedstreampb.ReplicaState_REPLICA_STABLE &&
			tk.counters.in.Load() >= 1000
	})
	agg := g.task(agg0)
	// Memory is sampled throughout (buffer lengths, not process RSS):
	// every output buffer of the query and the aggregate's machine.
	var ids []string
	for _, st := range g.c.states() {
		ids = append(ids, st.TaskID)
	}
	if len(ids) < 8 {
		t.Fatalf("tasks %v: want at least 8 (2 source partitions, aggregate and sink, 2 replicas each)", ids)
	}
	var bufMax atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, id := range ids {
				tk := g.task(id)
				if tk == nil {
					continue // not (or no longer) running
				}
				if tk.node.Kind == queryspec.KindSink {
					// A sink's result stream is a ring bounded by
					// SinkBufferTuples, not by the output buffers' bound:
					// it drops its oldest results and never holds the
					// query back (results and corrections can fill more
					// than bufTuples of it on a loaded machine).
					continue
				}
				tk.outMu.RLock()
				for _, o := range tk.outs {
					if n := int64(o.buf.Stats().Tuples); n > bufMax.Load() {
						bufMax.Store(n)
					}
				}
				tk.outMu.RUnlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	if widen > 0 {
		// The operator behind the aggregate (worker 4) reads the lossy
		// replica 0 alone: its link to replica 1 (worker 1) is cut,
		// otherwise it would move to that replica, which loses nothing.
		g.cut(4, dataplane.Reset, 1)
	}
	g.cut(2, dataplane.Hold, 0, 1)
	waitUntil(t, "aggregate replica 0 dropping kept input", func() bool { return agg.dm.shed.Load() > 3*keep })
	// What the live input had waiting during the failure (see below).
	waitedMax, waitedHeld := agg.dm.wait.max.Load(), agg.dm.wait.held.Load()
	g.faults[2].HealAll()
	g.stableAgain(t, agg0)
	if widen > 0 {
		// It relays the record once it takes the aggregate's correction.
		waitUntil(t, "the operator behind the aggregate naming the results it could not correct", func() bool {
			return strings.Contains(g.taskState(id("total", 0)).Message, "could not be corrected")
		})
		g.stableAgain(t, id("total", 0))
	}
	g.restAtSpeed(t)
	close(stop)
	wg.Wait()
	if m := agg.dm.keptMax.Load(); m > keep {
		t.Fatalf("the aggregate kept %d stable tuples for its replay, bound %d", m, keep)
	}
	// Soft bound: an input stops taking batches once the bound is
	// reached, so it goes over by less than one batch.
	if w, b := agg.dm.wait.max.Load(), agg.dm.wait.batchMax.Load(); w >= pending+b {
		t.Fatalf("the aggregate held %d tuples of one input waiting for release, bound %d (+ a batch of at most %d)", w, pending, b)
	}
	// The failure reached the bound: after some step of the failure the
	// live input had its bound of tuples waiting, so the machine took no
	// more of it until a release (the flag the input waits on was set).
	// Whether the input then actually waited is a race with that
	// release: on a loaded machine its next batch may come only after
	// the release step, so the bound counts as reached without it ever
	// blocking (the only input with data during the failure is the live
	// one).
	if !waitedHeld && waitedMax < pending {
		t.Fatalf("during the failure the aggregate's live input never had its bound of %d tuples waiting (at most %d): the test's failure did not reach the bound", pending, waitedMax)
	}
	if mv := g.task(sink0).mv; mv != nil && mv.tentMax.Load() > pending {
		t.Fatalf("the merging sink kept %d current tentative results of one input, bound %d", mv.tentMax.Load(), pending)
	}
	if m := bufMax.Load(); m > bufTuples {
		t.Fatalf("an output buffer held %d tuples, bound %d", m, bufTuples)
	}
	t.Logf("most held: replay %d (bound %d), waiting %d (bound %d; during the failure %d, input held back %v), output buffer %d (bound %d)",
		agg.dm.keptMax.Load(), keep, agg.dm.wait.max.Load(), pending, waitedMax, waitedHeld, bufMax.Load(), bufTuples)
	msg := g.taskState(agg0).Message
	if !strings.Contains(msg, "could not be corrected") {
		t.Fatalf("the aggregate's status does not name the results it could not correct: %q", msg)
	}
	from, to := agg.dm.lostFrom.Load(), agg.dm.lostTo.Load()+int64(widen)
	got := viewOf(g.c.tail(t, sink0))
	want := viewOf(g.c.tail(t, sink1))
	// A task input that switched onto a replica whose stable ids follow
	// another lineage (a loaded machine takes a live upstream for failed
	// now and then) names the stream times around the switch with a
	// record of its own (dcaa_lineage.go): results there may be repeated
	// or missing, so they are left out of the comparison.
	var switched [][2]int64
	lossyRecords := 0
	for _, v := range []view{got, want} {
		for k := range v.uncorrectable {
			f, t2, ok := tuple.UncorrectableRange(&v.uncorrectable[k])
			if ok && f == from && t2 == to {
				continue
			}
			switched = append(switched, [2]int64{f, t2})
		}
	}
	if len(switched) > 0 {
		t.Logf("ranges named for switches onto a diverged replica: %v", switched)
	}
	// The sink's stream says it, once, with the range (issue 10 item 5):
	// the aggregate's record passed through the sink.
	for k := range got.uncorrectable {
		if f, to2, ok := tuple.UncorrectableRange(&got.uncorrectable[k]); ok && f == from && to2 == to {
			lossyRecords++
		}
	}
	if lossyRecords != 1 {
		// Not the one lossy correction the test injected: see
		// extraEpisodes.
		extraEpisodes(t, got, want)
		return
	}
	outside := func(ts []tuple.Tuple, after bool) []tuple.Tuple {
		var out []tuple.Tuple
	next:
		for _, tp := range ts {
			for _, r := range switched {
				if r[0] <= tp.STime && tp.STime < r[1] {
					continue next
				}
			}
			if after && tp.STime >= to || !after && tp.STime < from {
				out = append(out, tp)
			}
		}
		return out
	}
	t.Logf("uncorrected range [%d, %d); %d of %d stable tuples after it; status %q", from, to, len(outside(want.stable, true)), len(want.stable), msg)
	// At least one result before the failure to compare, unless a range
	// named for a switch covers them all: a live upstream taken for
	// failed at the start (load 20-30: 2 runs of 40 named one from the
	// start to past the injected failure's start) leaves none outside it.
	before := 1
	if len(switched) > 0 && len(outside(want.stable, false)) == 0 {
		t.Logf("no result before the failure outside the ranges named for switches: nothing to compare before it")
		before = 0
	}
	sameStable(t, outside(got.stable, false), outside(want.stable, false), before)
	sameStable(t, outside(got.stable, true), outside(want.stable, true), 40)
	for k := range want.uncorrectable {
		if f, to2, ok := tuple.UncorrectableRange(&want.uncorrectable[k]); ok && f == from && to2 == to {
			// Its chain carries the record rightly when one of its
			// tasks read a lossy replica (the exact chain runs on worker
			// 1, the lossy one on workers 2 and 4): an input taken for
			// silent on a loaded machine moves to the other replica, or
			// one chose it first, and takes its stream, record and all.
			exact := []string{sink1}
			if widen > 0 {
				exact = append(exact, id("total", 1))
			}
			if other := g.readOther(1, exact...); len(other) > 0 {
				t.Logf("the other sink carried the lossy aggregate's record: its chain read the lossy replicas (%v)", other)
				break
			}
			t.Fatalf("the other sink, whose aggregate lost nothing and whose tasks %v read no other replica, carried the lossy aggregate's UNCORRECTABLE record", exact)
		}
	}
	if msg := g.taskState(sink0).Message; !strings.Contains(msg, "could not be corrected") {
		t.Fatalf("the sink's status does not name the results it could not correct: %q", msg)
	}
	// The lossy sink's result stream says its stable ids follow a
	// lineage of their own (a reader moving between the two sink
	// replicas realigns by stream time instead of resuming by id); the
	// other sink's follow the shared one.
	if lin, _ := g.task(sink0).outs[0].buf.Lineage(); lin == 0 {
		t.Fatal("the lossy sink's result stream kept the shared lineage")
	}
	if lin, _ := g.task(sink1).outs[0].buf.Lineage(); lin != 0 && len(want.uncorrectable) == 0 {
		t.Fatalf("the exact sink's result stream has lineage %d, want the shared one (0)", lin)
	}
	// Both are lossy (the coordinator replaces them from their STABLE
	// peers); the other sink is not.
	// (Unless it named a switch onto a diverged replica.)
	if !g.taskState(agg0).Lossy || !g.taskState(sink0).Lossy || g.taskState(sink1).Lossy && len(want.uncorrectable) == 0 {
		t.Fatalf("lossy: aggregate %v, its sink %v (want both), the other sink %v (want not)",
			g.taskState(agg0).Lossy, g.taskState(sink0).Lossy, g.taskState(sink1).Lossy)
	}
}

// extraEpisodes checks a run of testFailureLongerThanReplayBound whose
// sinks did not carry exactly the one UNCORRECTABLE record of the
// injected failure. On a loaded machine (load 16-21) failure detection
// took live upstreams for failed now and then, on either replica (at the
// start on both at once); with a replay bound of 300 tuples (75 ms of
// input) each such episode was uncorrectable too, and named as such; or
// the lossy replica's sink, taking it for silent, read the exact replica
// instead and carried no record. The test then still holds what must
// hold whatever the timing: every UNCORRECTABLE record names a range,
// and the stable results outside every range either sink named are the
// same on both sinks, in order (the aggregate's status named its loss,
// checked before).
func extraEpisodes(t *testing.T, got, want view) {
	t.Helper()
	type span struct{ from, to int64 }
	ranges := func(v view) []span {
		var out []span
		for i := range v.uncorrectable {
			f, to, ok := tuple.UncorrectableRange(&v.uncorrectable[i])
			if !ok || to <= f {
				t.Fatalf("an UNCORRECTABLE record names no range: %+v", v.uncorrectable[i])
			}
			out = append(out, span{f, to})
		}
		return out
	}
	rg, rw := ranges(got), ranges(want)
	t.Logf("UNCORRECTABLE records: lossy replica's sink %v, the other sink %v (more than the injected failure's: a loaded machine)", rg, rw)
	all := append(rg, rw...)
	outside := func(ts []tuple.Tuple) []tuple.Tuple {
		var out []tuple.Tuple
		for _, tp := range ts {
			if !slices.ContainsFunc(all, func(r span) bool { return tp.STime >= r.from && tp.STime < r.to }) {
				out = append(out, tp)
			}
		}
		return out
	}
	sameStable(t, outside(got.stable), outside(want.stable), 40)
}
