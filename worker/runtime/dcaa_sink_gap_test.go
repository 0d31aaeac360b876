package runtime

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// sinkRig is one DCAA sink (replica 0, pass-through or merging) reading a
// 10 ms counts aggregate whose two replicas, up0 and up1, the test writes
// (fakeUpstreamCluster).
type sinkRig struct {
	fake     *fakeReplicas
	c        *cluster
	w        *worker
	up0, up1 string
	sink     string
	merging  bool
}

// forSinkKinds runs f as a subtest (prefix/kind) on a pass-through and
// on a merging sink: the aggregate is grouped (keyed) for the merging
// one.
func forSinkKinds(t *testing.T, prefix string, f func(t *testing.T, r *sinkRig)) {
	for _, merging := range []bool{false, true} {
		kind, groupBy := "pass-through", ""
		if merging {
			kind, groupBy = "merging", ", group_by: [line]"
		}
		t.Run(prefix+kind, func(t *testing.T) {
			q := mustParse(t, `name: sinkrig
replicas: 2
availability: {max_delay: 5s}
sources:
  - {name: lines, generator: {kind: words, rate: 1000, seed: 1, limit: 10}}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 10ms}`+groupBy+`, aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`)
			fake, c, w := fakeUpstreamCluster(t, q, func(n *queryspec.Node) bool { return n.Name == "out" })
			f(t, &sinkRig{fake: fake, c: c, w: w, merging: merging,
				up0:  queryspec.TaskID(q.Name, "counts", 0, 0),
				up1:  queryspec.TaskID(q.Name, "counts", 0, 1),
				sink: queryspec.TaskID(q.Name, "out", 0, 0)})
		})
	}
}

// took starts the query and waits until the sink took up0's stream up to
// stable id n (a stable tuple or boundary), then checks its kind.
func (r *sinkRig) took(t *testing.T, n uint64) {
	t.Helper()
	r.c.apply()
	waitUntil(t, "the sink taking replica 0's stream", func() bool {
		tk := r.w.rt.task(r.sink)
		return tk != nil && tk.inputs[0].stableTaken.Load() == n && tk.inputs[0].lw.haveST
	})
	if tk := r.w.rt.task(r.sink); tk.passDCAA() == r.merging || (tk.mv != nil) != r.merging {
		t.Fatalf("the sink is not of the kind wanted (merging %v)", r.merging)
	}
}

// switched kills up0 and returns the sink's whole result stream (read to
// its end) and the ranges its UNCORRECTABLE records name.
func (r *sinkRig) switched(t *testing.T) (view, [][2]int64) {
	t.Helper()
	r.fake.kill(r.up0)
	got := viewOf(r.c.tail(t, r.sink))
	var named [][2]int64
	for k := range got.uncorrectable {
		if f, e, ok := tuple.UncorrectableRange(&got.uncorrectable[k]); ok {
			named = append(named, [2]int64{f, e})
		}
	}
	t.Logf("sink: %d stable, named %v", len(got.stable), named)
	return got, named
}

// resultsOutside lists the stable results of ts outside the named ranges
// as "ms:value".
func resultsOutside(ts []tuple.Tuple, named [][2]int64) []string {
	var out []string
	for _, tp := range ts {
		if tp.Type == tuple.Stable && outsideRanges(named, tp.STime) {
			out = append(out, fmt.Sprintf("%d:%d", tp.STime/int64(time.Millisecond), tp.Values[0].I))
		}
	}
	return out
}

// The sinks' counterpart of TestDCAAInputResumedOverAGapNamesIt (s15
// diagnosis): a sink resuming by stable id on an upstream replica of the
// same numbering that no longer holds the ids after its own skips them
// and must name the stream times concerned: a merging sink (filterDCAA)
// and a pass-through one (passSlow; s16: it named nothing, its result
// stream went on past the gap as if complete).
func TestDCAASinkResumedOverAGapNamesIt(t *testing.T) {
	forSinkKinds(t, "", func(t *testing.T, r *sinkRig) {
		ms := func(n int64) int64 { return n * int64(time.Millisecond) }
		var all []tuple.Tuple
		for at := int64(1); at <= 9; at++ {
			all = append(all, tuple.Tuple{Type: tuple.Stable, STime: ms(at * 10), Values: []tuple.Value{tuple.Int(at)}},
				tuple.Tuple{Type: tuple.Boundary, STime: ms(at*10 + 5)})
		}
		all = append(all, tuple.Tuple{Type: tuple.Boundary, STime: math.MaxInt64})
		hold := dataplane.BufferOptions{ExpectedSubscribers: 2, Lease: time.Hour}
		r.fake.put(t, r.up0, hold, 0, all[:6]...) // ids 1 to 6: the sink takes up to 35 ms
		b1 := r.fake.put(t, r.up1, dataplane.BufferOptions{}, 0, all...)
		b1.Register("other")
		b1.Ack("other", 10) // ids 7 to 10 (40 ms to 55 ms) gone
		r.took(t, 6)
		_, named := r.switched(t)
		// Skipped: the results at 40 and 50 ms. Named: from the last
		// stream time taken (the boundary at 35 ms) to the first one
		// taken after the gap (60 ms, included: results of that stream
		// time may be gone too).
		if want := [2]int64{ms(35), ms(60) + 1}; len(named) != 1 || named[0] != want {
			t.Errorf("the sink skipped ids 7 to 10 of its input (a resumption over discarded tuples) and named %v, want [%v]", named, want)
		}
		// Its status says what happened: not an upstream's failure.
		if st := r.w.rt.task(r.sink).State(); !st.Lossy || !strings.Contains(st.Message, "no longer held") {
			t.Errorf("status does not name the gap: lossy %v, %q", st.Lossy, st.Message)
		}
	})
}

// msWindows gives a stream's tuples in milliseconds: ms converts,
// st(at, v) is a stable result v at at ms, bd(at) a boundary; exact is a
// failure-free stream of nine 10 ms windows (result i at 10*i ms, its
// boundary 5 ms later).
func msWindows() (ms func(int64) int64, st func(at, v int64) tuple.Tuple, bd func(at int64) tuple.Tuple, exact []tuple.Tuple) {
	ms = func(n int64) int64 { return n * int64(time.Millisecond) }
	st = func(at, v int64) tuple.Tuple {
		return tuple.Tuple{Type: tuple.Stable, STime: ms(at), Values: []tuple.Value{tuple.Int(v)}}
	}
	bd = func(at int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Boundary, STime: ms(at)} }
	for at := int64(1); at <= 9; at++ {
		exact = append(exact, st(at*10, at), bd(at*10+5))
	}
	return ms, st, bd, exact
}

// A copy started without state (both replicas of its partition lost)
// puts its record [start, first input] first on its stream; the
// acknowledgements other readers relay may discard it, with the copy's
// first results, before a sink that read the lost copies realigns onto
// it. The sink then took the copy's inexact results past the gap as
// exact, named nowhere: the unnamed loss of
// TestDCAABothReplicasLostNamesTheLoss under load (s16: sink r1 named
// only [7.81s 7.84s] of its gap and missed a result at 7.9s, the copy's
// record [start 8.03s) discarded). The copy's stream carries the ranges
// of its records on a subscription's first batch (Batch.Named): the
// sink names the part past what it took.
func TestDCAASinkRealignsOverADiscardedRecordNamesIt(t *testing.T) {
	forSinkKinds(t, "", func(t *testing.T, r *sinkRig) {
		ms, st, bd, exact := msWindows()
		end := tuple.Tuple{Type: tuple.Boundary, STime: math.MaxInt64}
		// The lost copy (up0, the shared numbering): the sink takes it
		// up to the boundary at 35 ms.
		hold := dataplane.BufferOptions{ExpectedSubscribers: 2, Lease: time.Hour}
		r.fake.put(t, r.up0, hold, 0, exact[:6]...)
		// The copy started without state (a lineage of its own from its
		// first id): its record, then its windows at 40 and 50 ms,
		// inexact (they miss input discarded before it started), then
		// exact ones.
		copyTs := []tuple.Tuple{tuple.UncorrectableMarker(math.MinInt64, ms(55)),
			st(40, 904), bd(45), st(50, 905), bd(55)}
		copyTs = append(append(copyTs, exact[10:]...), end)
		b1 := r.fake.put(t, r.up1, dataplane.BufferOptions{Lease: time.Hour}, 0, copyTs...)
		b1.Diverge(0)
		b1.NoteUncorrectable(math.MinInt64, ms(55))
		b1.Register("other")
		b1.Ack("other", 2) // the record and the result at 40 ms gone
		r.took(t, 6)
		got, named := r.switched(t)
		// Fails before Batch.Named: the result at 50 ms (905) lay
		// outside the only range named, the gap's [35ms, 45ms].
		if g, e := resultsOutside(got.stable, named), resultsOutside(exact, named); !slices.Equal(g, e) {
			t.Fatalf("results outside the named ranges %v:\n got %v\nwant %v", named, g, e)
		}
		// Precise: nothing below the last stream time the sink took from
		// the lost copy (35 ms) is named.
		for _, rg := range named {
			if rg[0] < ms(35) {
				t.Errorf("named %v: from before what the sink took (35 ms)", rg)
			}
		}
	})
}
