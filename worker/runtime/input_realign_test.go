package runtime

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dcaa"
	"github.com/fedstream/fedstream/worker/tuple"
)

// realignCopy is an upstream replica's stream as an operator task's
// input reads it: tuples with their stable ids set (records, which have
// none, after the stable id they follow), its lineage, and the first
// stable id it still holds (0: all).
type realignCopy struct {
	ts         []tuple.Tuple
	lin, since uint64
	oldest     uint64
}

// serve is what a subscription resuming after stable id after gets from
// c, up to its tuple upTo (exclusive).
func (c realignCopy) serve(after uint64, upTo int) []tuple.Tuple {
	var out []tuple.Tuple
	sid := uint64(0)
	for _, tp := range c.ts[:upTo] {
		if tp.Type == tuple.Stable || tp.Type == tuple.Boundary {
			sid = tp.ID
		}
		if sid > after && sid >= c.oldest || tp.Type != tuple.Stable && tp.Type != tuple.Boundary && sid >= after && sid >= c.oldest {
			out = append(out, *tp.Clone())
		}
	}
	return out
}

// numbered sets the stable ids of ts, counting stable tuples and
// boundaries from 1.
func numbered(ts []tuple.Tuple) []tuple.Tuple {
	id := uint64(0)
	for k := range ts {
		if ts[k].Type == tuple.Stable || ts[k].Type == tuple.Boundary {
			id++
			ts[k].ID = id
		}
	}
	return ts
}

// After a correction upstream that could not make every result exact,
// the upstream's replicas number their stable results differently from
// the uncorrectable range on. An operator task's input that read the
// lossy replica and moves to the exact one (the lossy one's worker lost,
// or it was replaced by a copy bootstrapped from its exact peer) used to
// resume there by its stable id, which names an earlier (or later)
// result there: it repeated or skipped results after the range, and
// named a range around the switch as not corrected; when every replica
// of the task had read the lossy copy, none could be replaced from an
// exact peer. Now the input resubscribes after the last id both share
// and realigns by stream time, as `fedstream tail` does: what the
// machine releases equals the exact replica's stream outside the
// correction's range, and the input names more only when it cannot tell
// (the first new result shares the last one's stream time: that one
// stream time; the exact replica no longer holds the shared ids: up to
// the first one it sends).
//
// As TestSinkRealignsOnADivergedReplica, each case runs with a window's
// boundary after its results' stream time and at it.
func TestInputRealignsOnADivergedReplica(t *testing.T) {
	for _, bOff := range []int64{5, 0} {
		t.Run(fmt.Sprintf("boundary %d after the results", bOff), func(t *testing.T) { inputRealigns(t, bOff) })
	}
}

func inputRealigns(t *testing.T, bOff int64) {
	st := func(at int64, v int64) tuple.Tuple {
		return tuple.Tuple{Type: tuple.Stable, STime: at, Values: []tuple.Value{tuple.Int(v)}}
	}
	bd := func(at int64) tuple.Tuple { return tuple.Tuple{Type: tuple.Boundary, STime: at} }
	var exact []tuple.Tuple
	for w := int64(1); w <= 9; w++ {
		exact = append(exact, st(w*10, w), st(w*10, 100+w), bd(w*10+bOff))
	}
	// A boundary past the last window's: the machine releases a stream
	// time's results once a boundary passes it.
	exact = numbered(append(exact, bd(100)))
	lossy := func(keep int) []tuple.Tuple {
		// Shared up to window 2 (stable id 6); windows 3 and 4 inexact
		// (keep results each), the correction's record first; exact
		// from window 5 on.
		out := slices.Clone(exact[:6])
		out = append(out, tuple.UncorrectableMarker(25, 45))
		for w := int64(3); w <= 4; w++ {
			for k := range keep {
				out = append(out, st(w*10, 900+int64(k)))
			}
			out = append(out, bd(w*10+bOff))
		}
		for _, tp := range exact[12:] {
			out = append(out, *tp.Clone())
		}
		return numbered(out)
	}
	for _, tc := range []struct {
		name   string
		lossy  []tuple.Tuple
		upTo   int    // the lossy replica's tuples read before the move
		oldest uint64 // the exact replica's first stable id still held
		gapTo  int64  // when set: the end of the range named for what may be missing
		// blind: the exact replica answered that its stream ended
		// before the input's stable id (dataplane.ErrEndedBefore, no
		// lineage): the input reads it again from its start.
		blind bool
	}{
		{"the exact replica no longer holds the shared ids", lossy(1), 17, 20, 71, false},
		{"fewer results, moved after a boundary", lossy(1), 17, 0, 0, false},
		{"fewer results, moved after a result", lossy(1), 16, 0, 0, false},
		{"more results, moved after a boundary", lossy(4), 24, 0, 0, false},
		{"more results, moved after a result", lossy(4), 23, 0, 0, false},
		{"more results, the exact replica ended before the input's position", lossy(4), 30, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := dcaa.New(dcaa.Config{ID: 0, Replicas: 2, Inputs: []int{2}, Share: time.Second, Detect: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			var named [][2]int64
			now := int64(0)
			apply := func(acts []dcaa.Action) {
				for _, a := range acts {
					if r, ok := a.(dcaa.Release); ok && !r.Tentative {
						for _, s := range r.Steps {
							for _, run := range s.Runs {
								for _, tp := range run.Tuples {
									if tp.Type == tuple.Stable {
										got = append(got, fmt.Sprintf("%d:%d", tp.STime, tp.Values[0].I))
									}
								}
							}
						}
					}
				}
			}
			apply(m.Start(now))
			var w lineageWatch
			taken := uint64(0)
			// deliver does what dcaaRun.deliver does with a batch; it
			// reports whether the input must resubscribe (errRealign).
			deliver := func(ts []tuple.Tuple, fresh bool, c realignCopy) bool {
				al := w.align(ts, fresh, c.lin, c.since, taken, nil)
				if al.resubscribe {
					return true
				}
				named = append(named, al.marks...)
				if al.skip {
					return false
				}
				for k := range al.ts {
					if tp := al.ts[k].Type; tp == tuple.Stable || tp == tuple.Boundary {
						taken = al.ts[k].ID
					}
				}
				now += int64(time.Millisecond)
				apply(m.Step(now, dcaa.Deliver{Input: 0, Tuples: al.ts, Upstream: dcaa.Stable, Renumber: al.renumber}))
				return false
			}
			// read follows replica c after taken, in batches of three.
			read := func(c realignCopy, upTo int) {
				after, fresh := taken, true
				if w.re.on {
					// Started blind (as runMachine): the same attempt
					// again, from the replica's start.
					after, fresh = w.re.resumeAt, false
				}
				for {
					ts := c.serve(after, upTo)
					again := false
					for len(ts) > 0 && !again {
						n := min(3, len(ts))
						again = deliver(ts[:n], fresh, c)
						fresh = false
						ts = ts[n:]
					}
					if !again {
						return
					}
					if !w.re.on {
						t.Fatal("resubscribe without a realignment")
					}
					after = w.re.resumeAt
				}
			}
			a := realignCopy{ts: tc.lossy, lin: 77, since: 6}
			b := realignCopy{ts: exact, oldest: tc.oldest}
			read(a, tc.upTo)
			if tc.blind && !w.realignBlind() {
				t.Fatal("no blind realignment after the input took results")
			}
			read(b, len(exact))
			outside := func(at int64) bool { return outsideRanges(named, at) }
			var want []string
			for _, tp := range exact {
				if tp.Type == tuple.Stable && outside(tp.STime) {
					want = append(want, fmt.Sprintf("%d:%d", tp.STime, tp.Values[0].I))
				}
			}
			have := slices.DeleteFunc(slices.Clone(got), func(s string) bool {
				var at, v int64
				fmt.Sscanf(s, "%d:%d", &at, &v)
				return !outside(at)
			})
			if !slices.Equal(have, want) {
				t.Fatalf("results released outside the named ranges %v:\n got %v\nwant %v", named, have, want)
			}
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
			if taken != exact[len(exact)-1].ID || w.lin != 0 {
				t.Fatalf("last stable id %d lineage %d, want %d and 0: the input follows the exact replica's numbering", taken, w.lin, exact[len(exact)-1].ID)
			}
		})
	}
}
