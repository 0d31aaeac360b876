package runtime

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// After a correction upstream that could not make every result exact,
// the upstream's replicas number their stable results differently from
// the uncorrectable range on. A sink (pass-through, and merging: it reads
// a keyed aggregate) that read one replica and switches to the other used
// to resume there by its stable id, which names another result there: it
// repeated or skipped results around the switch and named the stream
// times between the last one it took and the first one it took from the
// new replica. Now its input realigns by stream time as an operator's
// does (lineageWatch): the sink's stable output equals the exact
// replica's outside the ranges it names, and it names the correction's
// range (when what it takes still concerns it) and at most one stream
// time of its own (the first new result shares the last one's).
//
// Each case runs twice: with a window's boundary after its results'
// stream time, and at it (as an aggregate puts it: results at the
// window's end, then the boundary there). At it, a sink that had taken
// the results and the boundary took the exact replica's results of that
// stream time again, as new, and named nothing (session 18's extra
// results of TestDCAABothReplicasLostNamesTheLoss).
func TestSinkRealignsOnADivergedReplica(t *testing.T) {
	for _, bOff := range []int64{5, 0} {
		t.Run(fmt.Sprintf("boundary %dms after the results", bOff), func(t *testing.T) { sinkRealigns(t, bOff) })
	}
}

func sinkRealigns(t *testing.T, bOff int64) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	st := func(at int64, v int64) tuple.Tuple {
		return tuple.Tuple{Type: tuple.Stable, STime: ms(at), Values: []tuple.Value{tuple.Int(v)}}
	}
	bd := func(at int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Boundary, STime: ms(at)} }
	end := tuple.Tuple{Type: tuple.Boundary, STime: math.MaxInt64}
	// The exact replica: two results per 10 ms window, windows 1 to 9.
	var exact []tuple.Tuple
	for w := int64(1); w <= 9; w++ {
		exact = append(exact, st(w*10, w), st(w*10, 100+w), bd(w*10+bOff))
	}
	// lossy shares stable ids 1 to 6 (windows 1 and 2) with exact; its
	// windows 3 and 4 are inexact (keep results each), its correction's
	// record before them; exact from window 5 on.
	const shared = 6
	rec := tuple.UncorrectableMarker(ms(25), ms(45))
	lossy := func(keep int) []tuple.Tuple {
		out := slices.Clone(exact[:shared])
		out = append(out, rec)
		for w := int64(3); w <= 4; w++ {
			for k := range keep {
				out = append(out, st(w*10, 900+int64(k)))
			}
			out = append(out, bd(w*10+bOff))
		}
		return append(out, exact[12:]...)
	}
	type side struct {
		ts           []tuple.Tuple
		divergeAfter uint64 // 0: the shared numbering
	}
	for _, tc := range []struct {
		name       string
		first      side // upstream replica 0, read until the sink took upTo tuples
		upTo       int
		then       side // replica 1, read after replica 0 goes away
		wantRecord bool // the correction's range is named
	}{
		{"lossy with fewer results, moved after a boundary", side{lossy(1), shared}, 17, side{exact, 0}, true},
		{"lossy with fewer results, moved after a result", side{lossy(1), shared}, 16, side{exact, 0}, true},
		{"lossy with more results, moved after a result", side{lossy(4), shared}, 23, side{exact, 0}, true},
		{"onto lossy with more results, past its range", side{exact, 0}, 18, side{lossy(4), shared}, false},
		{"onto lossy with fewer results, within its range", side{exact, 0}, 7, side{lossy(1), shared}, true},
		// lossy(0) ends at position 25: the sink resumes at its end
		// (dataplane.ErrEndedBefore, which carries no lineage) and
		// realigns from the replica's start.
		{"onto lossy that ended before the sink's position", side{exact, 0}, 25, side{lossy(0), shared}, false},
	} {
		forSinkKinds(t, tc.name+"/", func(t *testing.T, r *sinkRig) {
			// The replicas hold their streams whatever the sink
			// acknowledges: the other sink replica has not read them
			// yet. (Acknowledgements the sink relays by its own
			// numbering may otherwise have discarded what it realigns
			// on; see docs/DATAPLANE.md.)
			hold := dataplane.BufferOptions{ExpectedSubscribers: 2, Lease: time.Hour}
			r.fake.put(t, r.up0, hold, tc.first.divergeAfter, tc.first.ts[:tc.upTo]...)
			r.fake.put(t, r.up1, hold, tc.then.divergeAfter, append(slices.Clone(tc.then.ts), end)...)
			var want uint64 // the stable id of the last stable tuple of replica 0's part
			for _, tp := range tc.first.ts[:tc.upTo] {
				if tp.Type == tuple.Stable || tp.Type == tuple.Boundary {
					want++
				}
			}
			r.took(t, want)
			got, named := r.switched(t)
			if g, e := resultsOutside(got.stable, named), resultsOutside(exact, named); !slices.Equal(g, e) {
				t.Fatalf("results outside the named ranges %v:\n got %v\nwant %v", named, g, e)
			}
			rest := named
			if tc.wantRecord {
				// Read on the replica it realigns onto, the record
				// concerns only what the sink takes from there: from the
				// last stream time it took on, not the results below it,
				// which it took from the exact replica.
				want := [2]int64{ms(25), ms(45)}
				if tc.then.divergeAfter > 0 {
					for _, tp := range tc.first.ts[:tc.upTo] {
						if tp.Type == tuple.Stable || tp.Type == tuple.Boundary {
							want[0] = max(ms(25), tp.STime)
						}
					}
				}
				if len(named) == 0 || named[0] != want {
					t.Fatalf("named ranges %v, want the correction's %v first", named, want)
				}
				rest = named[1:]
			}
			if len(rest) > 1 || len(rest) == 1 && rest[0][1]-rest[0][0] != 1 {
				t.Fatalf("named ranges %v: besides the correction's, at most one stream time", named)
			}
		})
	}
}

// outsideRanges reports whether stream time at lies outside every range
// [from, to) of ranges (the ones a consumer named as not corrected).
func outsideRanges(ranges [][2]int64, at int64) bool {
	for _, r := range ranges {
		if r[0] <= at && at < r[1] {
			return false
		}
	}
	return true
}
