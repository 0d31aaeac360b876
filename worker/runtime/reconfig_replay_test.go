package runtime

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestReconfigPlanCommittedWhileAPlacedAgainSourceReplays: a source
// partition runs well ahead of its sibling (held), its consumer takes
// everything it emitted, and its worker is lost with no plan loading,
// so the source never reported how far it had gone and the leader kept
// nothing of it. A plan is then committed, and the source's next copy
// (placed without a snapshot, its stream starting again at record 0)
// gets it with its assignment: it acknowledges before it emitted
// anything, far below what its lost copy emitted, as does the held
// sibling. Its consumer (b) has released nothing past the sibling's
// boundary either, but it received the lost copy's records: it
// acknowledges with the highest stream time it received as well as the
// highest it produced (reconfigProgress), so the cut goes above every
// record the lost copy emitted under the old epoch, and the new copy,
// which tags what it replays by the cut, produces what the lost copy did.
// Without the received frontier the cut rested on the sibling's
// frontier, below records the consumer had taken from the lost copy
// tagged with the old epoch (checkTagsByCut: 'tagged 0, want 1').
func TestReconfigPlanCommittedWhileAPlacedAgainSourceReplays(t *testing.T) {
	const lostSrc = keptSource
	l := &keptLeader{}
	r, done := startKeptRun(t)
	lost, next := r.c.workers[0], r.c.workers[1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The sibling holds between two records while the source runs 100
	// records (50 ms of stream time, 2.5 margins) past it.
	sibling := r.c.workers[1].rt.task(keptSibling)
	holdSibling := make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(holdSibling)
		}
	}
	defer release()
	if !sibling.onGenerator(ctx, nil, holdSibling) {
		t.Fatal("the sibling ended before it could be held")
	}
	ahead := r.stats(keptSibling).OutTuples + 100
	waitUntil(t, "the source 100 records ahead of its held sibling", func() bool { return r.statsOn(lost, lostSrc).OutTuples >= ahead })

	// The source holds too, and its consumer takes everything it
	// appended: that is what the lost copy gave it.
	first := lost.rt.task(lostSrc)
	holdFirst := make(chan struct{})
	defer close(holdFirst)
	var emitted int64
	if !first.onGenerator(ctx, func() { emitted = first.maxSTime }, holdFirst) {
		t.Fatal("the source ended before it could be held")
	}
	var olds []*dataplane.OutputBuffer
	for _, o := range first.outs {
		olds = append(olds, o.buf)
	}
	waitUntil(t, "the consumer took what the lost copy appended", func() bool {
		for _, b := range olds {
			if st := b.Stats(); st.LaggardAck != st.LastID {
				return false
			}
		}
		return true
	})

	// Lost: the leader keeps nothing of it (no plan loaded while it ran).
	r.keepReports(l)
	if k := l.kept[lostSrc]; k != nil {
		t.Fatalf("the leader kept %+v of the lost copy with no plan loading", k)
	}
	spec := r.c.loseWorker(lost, lostSrc)

	// The plan, committed while the task is not placed; its next copy
	// gets it with its assignment.
	r.appendPlan(2)
	r.publish()
	rc := r.rc
	rc.Plans = slices.Clone(r.rc.Plans)
	spec.Reconfig = &rc
	r.c.placeAgainFromNothing(t, lost, spec, next)

	cut := r.leaderCut(l, nil, "", keptMargin)
	if f := r.states()[lostSrc].ReconfigFrontier; f >= emitted {
		t.Fatalf("the new copy acknowledged with frontier %d, at or past what the lost copy emitted (%d): the test does not replay", f, emitted)
	}
	if f := r.states()[keptSibling].ReconfigFrontier; f+int64(keptMargin) > emitted {
		t.Fatalf("the sibling acknowledged with frontier %d, within a margin of what the lost copy emitted (%d): the test does not show the case", f, emitted)
	}
	release()
	r.finishKept(cut, keptLimit, done)
}

// TestReceivedFrontier: what a task received counts in the frontier it
// acknowledges with, released or not, through the merger (its adds and,
// for a DCAA machine's input, noteMarks) and a pass-through sink's
// batches; the final boundary does not, and the frontier never goes
// down.
func TestReceivedFrontier(t *testing.T) {
	data := func(st int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Stable, STime: st} }
	bound := func(st int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Boundary, STime: st} }
	for _, tc := range []struct {
		name    string
		batches [][]tuple.Tuple // to inputs 0, 1, 0, 1, ...
		marks   bool            // noteMarks rather than add
		want    int64
	}{
		{"nothing", nil, false, math.MinInt64},
		{"data above the boundary", [][]tuple.Tuple{{bound(10), data(12), data(17)}}, false, 17},
		{"out of order", [][]tuple.Tuple{{data(30), data(20)}}, false, 30},
		{"the faster input, unreleased", [][]tuple.Tuple{{bound(10), data(11)}, {bound(50), data(90)}}, false, 90},
		{"the final boundary is no stream time", [][]tuple.Tuple{{data(5), bound(finalBoundary)}}, false, 5},
		{"never down", [][]tuple.Tuple{{data(40)}, {data(-3)}}, false, 40},
		{"negative", [][]tuple.Tuple{{data(-9), bound(-7)}}, false, -7},
		{"a machine's input", [][]tuple.Tuple{{bound(10), data(25)}, {data(12)}}, true, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMerger(1 << 20)
			m.addInput(0, 0)
			m.addInput(0, 1)
			for i, b := range tc.batches {
				if tc.marks {
					m.noteMarks(i%2, b)
				} else if err := m.add(context.Background(), i%2, b, nil, 0); err != nil {
					t.Fatal(err)
				}
			}
			if got := m.receivedFrontier(); got != tc.want {
				t.Errorf("merger: received frontier %d, want %d", got, tc.want)
			}
			// A pass-through sink sees the last tuple of each batch.
			tk := &task{}
			for _, b := range tc.batches {
				tk.notePassed(&b[len(b)-1])
			}
			want := int64(math.MinInt64)
			for _, b := range tc.batches {
				if st := b[len(b)-1].STime; st != finalBoundary {
					want = max(want, st)
				}
			}
			if got := tk.receivedFrontier(); got != want {
				t.Errorf("pass-through sink: received frontier %d, want %d", got, want)
			}
		})
	}
}
