package runtime

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// tentResumeQuery: an aggregate (10 ms windows) reading a source whose
// replicas the test writes (fakeUpstreamCluster), and its sink.
const tentResumeQuery = `name: tres
replicas: 2
availability: {max_delay: 100ms}
sources:
  - {name: lines, generator: {kind: words, rate: 1000, seed: 1, limit: 10}}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 10ms}, aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`

// fakeTuples turns fakeTuple kinds ("s" stable, "b" boundary, "n"
// tentative, "undo", "recdone", "end") into tuples (UNDO's target in
// STime: a stable position, as a producer's; see fakeReplicas.stream).
func fakeTuples(fts ...fakeTuple) []tuple.Tuple {
	ts := make([]tuple.Tuple, 0, len(fts))
	for _, ft := range fts {
		tp := tuple.Tuple{STime: int64(ft.ms) * int64(time.Millisecond)}
		switch ft.kind {
		case "s":
			tp.Type, tp.Values = tuple.Stable, []tuple.Value{tuple.Str("a b")}
		case "b":
			tp.Type = tuple.Boundary
		case "n":
			tp.Type, tp.Values = tuple.Tentative, []tuple.Value{tuple.Str("a b")}
		case "undo":
			tp.Type, tp.STime = tuple.Undo, int64(ft.ms)
		case "recdone":
			tp.Type, tp.STime = tuple.RecDone, 0
		case "end":
			tp.Type, tp.STime = tuple.Boundary, math.MaxInt64
		}
		ts = append(ts, tp)
	}
	return ts
}

// appendAs appends ts to b as a producer does (b holds n positions):
// tentative tuples open a range outside the stable view (BeginNonStable)
// that the UNDO closes; a REC_DONE is a position of its own outside it;
// the final boundary is the stream's end. It returns the positions held.
func appendAs(t *testing.T, b *dataplane.OutputBuffer, n uint64, ts ...tuple.Tuple) uint64 {
	t.Helper()
	for i := range ts {
		tp := ts[i]
		n++
		tp.ID = n
		switch tp.Type {
		case tuple.Tentative:
			b.BeginNonStable(n)
		case tuple.Undo:
			b.EndNonStable(n)
		case tuple.RecDone:
			b.MarkNonStable(n, n)
		case tuple.Boundary:
			if tp.STime == math.MaxInt64 {
				b.SetEnd(n)
			}
		}
		if err := b.Append(context.Background(), &tp); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// tentResumeRig runs q with its source's replicas written by the test:
// partition 0's replica 0 holds tentResumeStreams' stable stream,
// replica 1 its first 11 stable ids and then tentResumeTail (UP_FAILURE);
// every other partition's replicas hold the first 11 stable ids (behind).
// want is the sink's output in a failure-free run of the corrected
// stream on every partition. It waits until task reader took stable id
// 33 of partition 0.
type tentResumeRig struct {
	q         *queryspec.Query
	fake      *fakeReplicas
	c         *cluster
	w         *worker
	up0       string
	b1        *dataplane.OutputBuffer // partition 0's replica 1
	n         uint64                  // b1's positions
	behind    []*dataplane.OutputBuffer
	corrected []fakeTuple
	want      view
}

func newTentResumeRig(t *testing.T, yaml, reader string) *tentResumeRig {
	t.Helper()
	q := mustParse(t, yaml)
	local := func(n *queryspec.Node) bool { return n.Kind != queryspec.KindSource }
	g := &tentResumeRig{q: q, up0: queryspec.TaskID(q.Name, "lines", 0, 0)}
	stable, corrected := tentResumeStreams()
	g.corrected = corrected
	parts := 1
	for _, n := range q.Sources {
		if n.Name == "lines" {
			parts = max(1, n.Parallelism)
		}
	}
	full := append(append([]fakeTuple(nil), stable[:11]...), corrected...)
	refFake, ref, _ := fakeUpstreamCluster(t, q, local)
	for p := range parts {
		refFake.stream(t, queryspec.TaskID(q.Name, "lines", p, 0), full...)
	}
	ref.apply()
	g.want = viewOf(ref.tail(t, g.sink()))

	g.fake, g.c, g.w = fakeUpstreamCluster(t, q, local)
	g.fake.stream(t, g.up0, stable...)
	g.b1 = g.fake.stream(t, queryspec.TaskID(q.Name, "lines", 0, 1), stable[:11]...)
	g.n = appendAs(t, g.b1, 11, tentResumeTail()...)
	g.b1.SetStreamState(fedstreampb.ReplicaState_REPLICA_UP_FAILURE, int64(50*time.Millisecond))
	for p := 1; p < parts; p++ {
		for r := range 2 {
			g.behind = append(g.behind, g.fake.stream(t, queryspec.TaskID(q.Name, "lines", p, r), stable[:11]...))
		}
	}
	g.c.apply()
	id := queryspec.TaskID(q.Name, reader, 0, 0)
	waitUntil(t, reader+" taking replica 0's stream", func() bool {
		tk := g.w.rt.task(id)
		return tk != nil && tk.inputs[0].stableTaken.Load() == 33
	})
	return g
}

// sink is the task id of the sink's replica 0.
func (g *tentResumeRig) sink() string { return queryspec.TaskID(g.q.Name, "out", 0, 0) }

// stabilize makes partition 0's replica 1 correct itself: UNDO, the
// corrected stream, REC_DONE, STABLE, the end.
func (g *tentResumeRig) stabilize(t *testing.T) {
	t.Helper()
	g.b1.SetStreamState(fedstreampb.ReplicaState_REPLICA_STABILIZATION, 0)
	g.n = appendAs(t, g.b1, g.n, fakeTuples(fakeTuple{"undo", 11})...)
	g.n = appendAs(t, g.b1, g.n, fakeTuples(g.corrected[:len(g.corrected)-1]...)...)
	g.n = appendAs(t, g.b1, g.n, fakeTuples(fakeTuple{"recdone", 0})...)
	g.b1.SetStreamState(fedstreampb.ReplicaState_REPLICA_STABLE, 0)
	g.n = appendAs(t, g.b1, g.n, fakeTuples(g.corrected[len(g.corrected)-1])...)
}

// tentativeAt is the tentative tuples among ts: their stream time in ms
// and their first value when it is a number (a count), else 0.
func tentativeAt(ts []tuple.Tuple) [][2]int64 {
	var out [][2]int64
	for _, tp := range ts {
		if tp.Type != tuple.Tentative {
			continue
		}
		v := int64(0)
		if len(tp.Values) > 0 && tp.Values[0].Kind == tuple.KindInt {
			v = tp.Values[0].I
		}
		out = append(out, [2]int64{tp.STime / int64(time.Millisecond), v})
	}
	return out
}

// sinkTentatives is tentativeAt for a sink passing the source's tuples
// (no counts): 31-35 and 45 ms.
var sinkTentatives = [][2]int64{{31, 0}, {32, 0}, {33, 0}, {34, 0}, {35, 0}, {45, 0}}

// An input moves during a failure to an upstream replica that went
// tentative before the one it read. Replica 0 of the source holds 30
// stable tuples (stable ids and positions 1 to 33, boundaries every 10
// ms); replica 1 holds the same first 11, then went tentative: its
// tentative tail (positions 12 to 27) has tuples at 11-20 ms, which the
// aggregate took stable from replica 0, and at 31-35 and 45 ms, which
// it did not. The aggregate reads replica 0 up to stable id 33; replica
// 0 goes away; the aggregate resumes on replica 1 after stable id 33.
// Taken as a position, that lay past replica 1's whole stream: the
// aggregate heard only heartbeats (their tentative watermark let it
// release its windows up to 50 ms tentatively, empty) and released no
// tentative result for the failure (TestDCAAImmediateDownstreamKeepsProducing
// under load). Now it reads replica 1's tentative tail, keeps what lies
// past what it took (31-35, 45 ms), and releases tentative results;
// when replica 1 stabilizes (UNDO, the corrected stable tuples, with
// the same stable ids as replica 0's up to 33, REC_DONE, end), the
// aggregate corrects itself, takes the corrections only above stable id
// 33, and the sink's stable output is exactly that of a failure-free
// run. Fails before the fix: the tentative results miss replica 1's
// tuples.
func TestDCAAResumeIntoEarlierTentativeTail(t *testing.T) {
	g := newTentResumeRig(t, tentResumeQuery, "counts")
	agg := queryspec.TaskID(g.q.Name, "counts", 0, 0)
	if g.n >= 33 {
		t.Fatalf("replica 1 holds %d positions: the scenario needs fewer than replica 0's 33", g.n)
	}
	// The aggregate's relay acknowledges stable id 33 to replica 1 (it
	// did, before the kill, under load): that must not discard replica
	// 1's tentative tail, which the aggregate reads after the switch.
	waitUntil(t, "replica 1 discarding what the aggregate's relay acknowledged", func() bool {
		st := g.b1.Stats()
		return st.Tuples == 0 || st.OldestID > 11
	})
	g.fake.kill(g.up0)
	// The aggregate releases its windows up to replica 1's tentative
	// watermark tentatively (the one at 30-40 ms holds the tuples it
	// did not take).
	waitUntil(t, "the aggregate releasing tentatively past 45 ms", func() bool {
		_, wm := g.w.rt.task(agg).outs[0].buf.StreamState()
		return wm >= int64(45*time.Millisecond)
	})
	if got := g.w.rt.task(agg).inputs[0].stableTaken.Load(); got != 33 {
		t.Fatalf("the aggregate's last stable id taken went from 33 to %d on replica 1's tentative tail", got)
	}
	g.stabilize(t)

	all := g.c.tail(t, g.sink())
	// The tentative results: window 30-40 ms counts the stable tuple at
	// 30 ms taken from replica 0 and replica 1's five at 31-35 ms, window
	// 40-50 ms its one at 45 ms (its tuples at 11-20 ms, taken stable
	// from replica 0, are not counted again). Before: one result, window
	// 30-40 ms counting the tuple at 30 ms alone.
	if tent, want := tentativeAt(all), [][2]int64{{40, 6}, {50, 1}}; !slices.Equal(tent, want) {
		t.Fatalf("tentative results (ms, count): %v, want %v", tent, want)
	}
	got := viewOf(all)
	if got.undos == 0 {
		t.Fatalf("%d tentative results, never taken back", got.tentative)
	}
	sameStable(t, got.stable, g.want.stable, 5)
}

// sinkTentResumeQuery: a sink reading a source whose replicas the test
// writes (fakeUpstreamCluster), as it is (a pass-through sink).
const sinkTentResumeQuery = `name: stres
replicas: 2
availability: {max_delay: 100ms}
sources:
  - {name: lines, generator: {kind: words, rate: 1000, seed: 1, limit: 10}}
sinks:
  - {name: out, input: lines}
`

// mergeTentResumeQuery: a merging sink reading the two partitions of a
// source whose replicas the test writes.
const mergeTentResumeQuery = `name: mtres
replicas: 2
availability: {max_delay: 100ms}
sources:
  - {name: lines, generator: {kind: words, rate: 1000, seed: 1, limit: 10}, parallelism: 2}
sinks:
  - {name: out, input: lines}
`

// A sink moves during a failure to an upstream replica that went
// tentative before the one it read (the streams of
// TestDCAAResumeIntoEarlierTentativeTail). It read replica 0 up to stable
// id 33 (30 ms); replica 0 goes away. Resumed after 33 as a position, it
// skipped replica 1's whole tentative tail and showed no tentative result
// for the failure (P3 at the sink) until replica 1 had corrected itself.
// Now it resumes by stable id, shows the tail's results past what it took
// stable (31-35 and 45 ms; not 11-20 ms, which it has stable) once each,
// takes them back at replica 1's UNDO, takes the corrections only above
// stable id 33, passes the REC_DONE, and its stable output is a
// failure-free run's; likewise a merging sink. Fails before the fix: the
// sink never shows a tentative result (the wait below times out); the
// merging sink, without filterDCAA's check, showed the tuples at 11-20 ms.
func TestDCAASinkResumesIntoEarlierTentativeTail(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"pass-through", sinkTentResumeQuery},
		// A merging sink: partition 1 is behind (stable up to 10 ms), so
		// the merger released nothing past 10 ms, and its release does
		// not hide the tail's tuples at 11-20 ms, which partition 0's
		// input took stable from replica 0 (filterDCAA's check does).
		{"merging", mergeTentResumeQuery},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newTentResumeRig(t, tc.yaml, "out")
			g.fake.kill(g.up0)
			waitUntil(t, "the sink showing tentative results from replica 1", func() bool {
				return g.w.rt.task(g.sink()).tentative.Load()
			})
			if got := g.w.rt.task(g.sink()).inputs[0].stableTaken.Load(); got != 33 {
				t.Fatalf("the sink's last stable id taken went from 33 to %d on replica 1's tentative tail", got)
			}
			g.stabilize(t)
			if len(g.behind) > 0 {
				waitUntil(t, "the sink taking partition 0's corrections", func() bool {
					return !g.w.rt.task(g.sink()).tentative.Load()
				})
				for _, b := range g.behind {
					appendAs(t, b, 11, fakeTuples(g.corrected...)...)
				}
			}

			all := g.c.tail(t, g.sink())
			if tent := tentativeAt(all); !slices.Equal(tent, sinkTentatives) {
				t.Fatalf("tentative results (ms) %v, want %v", tent, sinkTentatives)
			}
			got := viewOf(all)
			if got.undos != 1 || got.recDones != 1 {
				t.Fatalf("%d UNDO and %d REC_DONE, want one each (all: %v)", got.undos, got.recDones, all)
			}
			sameStable(t, got.stable, g.want.stable, 30)
		})
	}
}

// tentResumeStreams are upstream replica 0's stream (1-30 ms: stable ids
// and positions 1 to 33, boundaries every 10 ms) and the corrected stream
// past stable id 11 (replica 1's corrections: replica 0's, then 31-40 ms
// and the end).
func tentResumeStreams() (stable, corrected []fakeTuple) {
	for ms := 1; ms <= 30; ms++ {
		stable = append(stable, fakeTuple{"s", ms})
		if ms%10 == 0 {
			stable = append(stable, fakeTuple{"b", ms})
		}
	}
	corrected = append(corrected, stable[11:]...)
	for ms := 31; ms <= 40; ms++ {
		corrected = append(corrected, fakeTuple{"s", ms})
	}
	return stable, append(corrected, fakeTuple{"b", 40}, fakeTuple{"end", 0})
}

// tentResumeTail is replica 1's tentative tail after its first 11 stable
// ids: tuples at 11-20 ms (which the reader of replica 0 took stable) and
// at 31-35 and 45 ms (which it did not).
func tentResumeTail() []tuple.Tuple {
	var fts []fakeTuple
	for _, ms := range []int{11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 31, 32, 33, 34, 35, 45} {
		fts = append(fts, fakeTuple{"n", ms})
	}
	return fakeTuples(fts...)
}

// A copy placed again from a snapshot (a replica re-placed from its
// peer's, or moved) resumes by stable id too: the snapshot's input
// positions are stable ids. The task (the aggregate of tentResumeQuery,
// the sink of sinkTentResumeQuery) took upstream replica 0's stream up to
// stable id 33; its snapshot is taken, replica 0 goes away, and the copy
// starts from the snapshot on another worker while replica 1 holds the
// tentative tail of TestDCAAResumeIntoEarlierTentativeTail. The copy's
// results for the failure count replica 1's tuples past 30 ms; after
// replica 1's correction the sink's stable output is a failure-free
// run's. The sink case fails before (a restored sink's input resumed
// after its snapshot's stable id as a position: the wait for its
// tentative results times out); the aggregate's passed already (its
// machine's first attempt resumes by stable id).
func TestDCAARestoredCopyResumesIntoEarlierTentativeTail(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, task string
		wantTent         [][2]int64 // the sink's (tentativeAt)
	}{
		{"aggregate", tentResumeQuery, "counts", [][2]int64{{40, 6}, {50, 1}}},
		{"sink", sinkTentResumeQuery, "out", sinkTentatives},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newTentResumeRig(t, tc.yaml, tc.task)
			id := queryspec.TaskID(g.q.Name, tc.task, 0, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			snap, err := g.w.rt.SnapshotTask(ctx, id, SnapshotOptions{Halt: true})
			if err != nil {
				t.Fatal(err)
			}
			if got := snap.Inputs[0].After; got != 33 {
				t.Fatalf("the snapshot's input position is %d, want stable id 33", got)
			}
			g.fake.kill(g.up0)
			w2 := startWorkerOpts(t, g.c.pool, dcaaOpts)
			g.c.workers = append(g.c.workers, w2)
			g.c.moveTask(t, id, g.w, w2, snap)
			waitUntil(t, "the restored "+tc.task+" releasing tentative results from replica 1", func() bool {
				tk := w2.rt.task(id)
				if tk == nil {
					return false
				}
				_, wm := tk.outs[0].buf.StreamState()
				return tk.tentative.Load() || wm >= int64(45*time.Millisecond)
			})
			g.stabilize(t)

			all := g.c.tail(t, g.sink())
			if tent := tentativeAt(all); !slices.Equal(tent, tc.wantTent) {
				t.Fatalf("tentative results (ms, count) %v, want %v", tent, tc.wantTent)
			}
			sameStable(t, viewOf(all).stable, g.want.stable, 5)
		})
	}
}
