package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// A replica stream as a sink copy serves it: tuples at positions 1..n,
// its lineage (dataplane.OutputBuffer.Diverge) and the offsets of the
// positions outside the stable view.
type copyStream struct {
	name       string
	ts         []tuple.Tuple
	lin, since uint64
	// oldest: the first position the copy still holds (0: all).
	oldest uint64
	// named: the ranges of the records the copy put on its stream, which
	// a subscription's first batch carries (Batch.named_ranges).
	named [][2]int64
}

// serve is what the copy sends to a subscription resuming after position
// after, up to its tuple upTo (exclusive): one batch, with the offset at
// its end.
func (c copyStream) serve(after uint64, upTo int) (ts []tuple.Tuple, last, off uint64) {
	var nonStable uint64
	for i, tp := range c.ts[:upTo] {
		pos := uint64(i + 1)
		if tp.Type != tuple.Stable && tp.Type != tuple.Boundary {
			nonStable++
		}
		if pos > after && pos >= c.oldest {
			ts = append(ts, *tp.Clone())
			last, off = pos, nonStable
		}
	}
	return ts, last, off
}

// stableAt is a stable result of value v at stream time at; boundaryAt
// a boundary.
func stableAt(at, v int64) tuple.Tuple {
	return tuple.Tuple{Type: tuple.Stable, STime: at, Values: []tuple.Value{tuple.Int(v)}}
}

func boundaryAt(at int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Boundary, STime: at} }

// follow does what tailer.follow does with a subscription to c: the
// first batch's lineage may make tail subscribe again (errRealign).
func (tl *tailer) followCopy(t *testing.T, c copyStream, upTo int) {
	t.Helper()
	tl.fresh = true
	tl.carried = c.named
	ts, last, off := c.serve(tl.afterID(), upTo)
	if err := tl.realignIfDiverged(c.lin, c.since, c.name); errors.Is(err, errRealign) {
		ts, last, off = c.serve(tl.afterID(), upTo)
	}
	if len(ts) == 0 {
		return
	}
	tl.posFrom = c.name
	tl.lin, tl.linSince = c.lin, c.since
	if err := tl.batch(ts, last, off, nil, "out"); err != nil {
		t.Fatal(err)
	}
}

// After a correction that could not make every result exact, the
// replicas of a sink number their stable results differently from the
// uncorrectable range on: the lossy copy gave fewer (or more) results in
// that range. tail reading the lossy copy and then the exact one (its
// worker lost, or the copy replaced by one bootstrapped from its exact
// peer) used to resume after its last stable id on the exact copy, where
// that id names an earlier (or later) result: it repeated (or skipped)
// results after the range, and nothing said so. Now every batch carries
// the copy's lineage; tail sees that the two copies share ids only up to
// the one the lossy copy diverged after, subscribes again from there and
// takes results by stream time: its output equals the exact copy's
// outside the ranges named by UNCORRECTABLE records (the correction's,
// and one tail names itself when the exact copy no longer holds the
// shared ids). Each case runs with a window's boundary after its
// results' stream time and at it (as an aggregate puts it): at it, tail
// moved after the boundary printed the window's results twice, unnamed
// (before session 19; results of one stream time are counted now).
func TestTailRealignsOnADivergedCopy(t *testing.T) {
	for _, bOff := range []int64{5, 0} {
		t.Run(fmt.Sprintf("boundary %d after the results", bOff), func(t *testing.T) { tailRealigns(t, bOff) })
	}
}

func tailRealigns(t *testing.T, bOff int64) {
	st, bd := stableAt, boundaryAt
	// The exact copy: two results per window (stream times 10, 20, ...),
	// each window closed by a boundary.
	var exact []tuple.Tuple
	for w := int64(1); w <= 9; w++ {
		exact = append(exact, st(w*10, w), st(w*10, 100+w), bd(w*10+bOff))
	}
	lost := tuple.UncorrectableMarker(25, 45)
	lossy := func(keep func(at int64) int) []tuple.Tuple {
		// Shared up to window 2; windows 3 and 4 inexact (keep: how many
		// results each gave), the correction's record first; exact from
		// window 5 on.
		out := slices.Clone(exact[:6])
		out = append(out, lost)
		for w := int64(3); w <= 4; w++ {
			for k := range keep(w) {
				out = append(out, st(w*10, 900+int64(k)))
			}
			out = append(out, bd(w*10+bOff))
		}
		return append(out, exact[12:]...)
	}
	// The stable id the lossy copy diverged after: 6 (windows 1 and 2).
	for _, tc := range []struct {
		name  string
		lossy []tuple.Tuple
		// upTo: the lossy copy's tuples read before the move.
		upTo int
		// oldest: the exact copy's first position still held; gapTo,
		// when set, the end of the range tail names for what it may
		// have missed.
		oldest uint64
		gapTo  int64
	}{
		{"the exact copy no longer holds the shared ids", lossy(func(int64) int { return 1 }), 17, 20, 71},
		{"fewer results, moved after a boundary", lossy(func(int64) int { return 1 }), 17, 0, 0},
		{"fewer results, moved after a result", lossy(func(int64) int { return 1 }), 16, 0, 0},
		{"more results, moved after a boundary", lossy(func(int64) int { return 4 }), 24, 0, 0},
		{"more results, moved after a result", lossy(func(int64) int { return 4 }), 23, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []tuple.Tuple
			tl := &tailer{print: func(tp *tuple.Tuple, _ *tuple.Schema, _ string) error {
				got = append(got, *tp.Clone())
				return nil
			}}
			a := copyStream{name: "out/p0/r0@g1", ts: tc.lossy, lin: 77, since: 6}
			b := copyStream{name: "out/p0/r1@g1", ts: exact, oldest: tc.oldest}
			tl.followCopy(t, a, tc.upTo)
			tl.followCopy(t, b, len(exact))
			named := sameOutsideNamed(t, got, exact)
			// Only the correction's range and, moved after a result,
			// that result's stream time are named: the rest is exact.
			if len(named) == 0 || named[0] != [2]int64{25, 45} || len(named) > 2 {
				t.Fatalf("named ranges %v, want [25 45] and at most one more", named)
			}
			if tc.gapTo != 0 {
				if len(named) != 2 || named[1] != [2]int64{60 + bOff, tc.gapTo} {
					t.Fatalf("named ranges %v, want [25 45] and [%d %d]: the results in between were not held", named, 60+bOff, tc.gapTo)
				}
			} else if len(named) == 2 && named[1][1]-named[1][0] != 1 {
				t.Fatalf("named ranges %v: the second should be one stream time", named)
			}
			// tail follows the exact copy's numbering from then on.
			if tl.lastID != uint64(len(exact)) || tl.lin != 0 {
				t.Fatalf("last id %d lineage %d, want %d and 0", tl.lastID, tl.lin, len(exact))
			}
		})
	}
}

// The sink copy tail realigns onto no longer holds its record (its ring
// dropped it; or, as in TestDCAABothReplicasLostNamesTheLoss, a copy
// started without state whose first positions were acknowledged away):
// tail names the record's range all the same from what the subscription
// carries, cut to start at the last stream time it took (it took the
// results below from the other copy, exact). Before, it took the copy's
// inexact result at 50 as exact.
func TestTailRealignsOverADroppedRecordNamesIt(t *testing.T) {
	st, bd := stableAt, boundaryAt
	var exact []tuple.Tuple
	for w := int64(1); w <= 9; w++ {
		exact = append(exact, st(w*10, w), bd(w*10+5))
	}
	// The restarted copy: its record from the start to 55, inexact
	// windows 4 and 5, then exact ones; positions 1 and 2 dropped.
	restarted := append([]tuple.Tuple{tuple.UncorrectableMarker(math.MinInt64, 55), st(40, 904), bd(45), st(50, 905), bd(55)}, exact[10:]...)
	var got []tuple.Tuple
	tl := &tailer{print: func(tp *tuple.Tuple, _ *tuple.Schema, _ string) error {
		got = append(got, *tp.Clone())
		return nil
	}}
	tl.followCopy(t, copyStream{name: "out/p0/r0@g1", ts: exact}, 6) // up to the boundary at 35
	tl.followCopy(t, copyStream{name: "out/p0/r1@g1", ts: restarted, lin: 9, since: 0, oldest: 3,
		named: [][2]int64{{math.MinInt64, 55}}}, len(restarted))
	named := sameOutsideNamed(t, got, exact)
	for _, r := range named {
		if r[0] < 35 {
			t.Errorf("named %v: from before what tail took (35)", r)
		}
	}
}

// sameOutsideNamed returns the ranges of the UNCORRECTABLE records tail
// printed (got) and checks that its stable results outside them are the
// exact copy's.
func sameOutsideNamed(t *testing.T, got, exact []tuple.Tuple) [][2]int64 {
	t.Helper()
	var named [][2]int64
	for _, tp := range got {
		if tp.Type == tuple.Uncorrectable {
			from, to, _ := tuple.UncorrectableRange(&tp)
			named = append(named, [2]int64{from, to})
		}
	}
	outside := func(ts []tuple.Tuple) []string {
		var out []string
		for _, tp := range ts {
			if tp.Type == tuple.Stable && !slices.ContainsFunc(named, func(r [2]int64) bool { return r[0] <= tp.STime && tp.STime < r[1] }) {
				out = append(out, fmt.Sprintf("%d:%d", tp.STime, tp.Values[0].I))
			}
		}
		return out
	}
	if have, want := outside(got), outside(exact); !slices.Equal(have, want) {
		t.Fatalf("results outside the named ranges %v:\n got %v\nwant %v", named, have, want)
	}
	return named
}
