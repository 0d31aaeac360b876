package runtime

import "testing"

// An input that switches to an upstream replica whose stable ids mean
// other results past the ids it took (another lineage, diverged below
// them) names the stream times around the switch: from the first one it
// takes there to the last one it took before, whichever is lower, to the
// higher (included). A switch within the shared ids, onto the same
// lineage, or a batch that is not a subscription's first names nothing.
func TestLineageWatchNamesADivergedSwitch(t *testing.T) {
	type step struct {
		fresh      bool
		lin, since uint64
		taken      uint64
		first      int64 // stream time of the first stable tuple taken
		last       int64
		want       [2]int64 // {0, 0}: nothing named
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"same lineage", []step{{true, 7, 40, 0, 10, 50, [2]int64{}}, {true, 7, 40, 60, 60, 70, [2]int64{}}}},
		{"within the shared ids", []step{{true, 0, 0, 0, 10, 50, [2]int64{}}, {true, 9, 60, 60, 60, 70, [2]int64{}}}},
		{"repeats: the new replica is behind", []step{{true, 0, 0, 0, 10, 50, [2]int64{}}, {true, 9, 20, 60, 30, 70, [2]int64{30, 51}}}},
		{"skips: the new replica is ahead", []step{{true, 9, 20, 0, 10, 50, [2]int64{}}, {true, 0, 0, 60, 80, 90, [2]int64{50, 81}}}},
		{"not a subscription's first batch", []step{{true, 0, 0, 0, 10, 50, [2]int64{}}, {false, 9, 20, 60, 80, 90, [2]int64{}}}},
		{"named once", []step{{true, 0, 0, 0, 10, 50, [2]int64{}}, {true, 9, 20, 60, 80, 90, [2]int64{50, 81}}, {false, 9, 20, 70, 95, 99, [2]int64{}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w lineageWatch
			for i, s := range tc.steps {
				w.batch(s.fresh, s.lin, s.since, s.taken)
				from, to, ok := w.took(s.first)
				w.took(s.last)
				got := [2]int64{}
				if ok {
					got = [2]int64{from, to}
				}
				if got != s.want {
					t.Fatalf("batch %d: named %v (ok %v), want %v", i, got, ok, s.want)
				}
			}
		})
	}
}
