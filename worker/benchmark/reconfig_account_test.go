package benchmark

import "testing"

// TestLostOrDuplicated: results the consumer never read because the
// sink's ring dropped them (undelivered) are not counted as lost;
// duplicates and results outside the reference always count, and
// missing results beyond what undelivered explains do.
func TestLostOrDuplicated(t *testing.T) {
	want := map[string]int{"a": 1, "b": 1, "c": 2}
	for _, c := range []struct {
		name        string
		got         map[string]int
		undelivered int
		lostOrDup   int
		missing     int
	}{
		{"exact", map[string]int{"a": 1, "b": 1, "c": 2}, 0, 0, 0},
		{"one lost", map[string]int{"a": 1, "c": 2}, 0, 1, 1},
		{"one missing, one undelivered", map[string]int{"a": 1, "c": 2}, 1, 0, 1},
		{"backlog undelivered", map[string]int{}, 4, 0, 4},
		{"undelivered includes boundaries", map[string]int{"a": 1}, 9, 0, 3},
		{"more missing than undelivered", map[string]int{"a": 1}, 1, 2, 3},
		{"duplicate", map[string]int{"a": 2, "b": 1, "c": 2}, 0, 1, 0},
		{"duplicate not excused by undelivered", map[string]int{"a": 2, "b": 1, "c": 2}, 5, 1, 0},
		{"unknown key", map[string]int{"a": 1, "b": 1, "c": 2, "z": 3}, 0, 3, 0},
		{"one of a pair lost", map[string]int{"a": 1, "b": 1, "c": 1}, 0, 1, 1},
		{"lost and duplicated", map[string]int{"a": 2, "c": 2}, 0, 2, 1},
		{"negative undelivered is none", map[string]int{"a": 1, "c": 2}, -3, 1, 1},
	} {
		lod, missing := LostOrDuplicated(want, c.got, c.undelivered)
		if lod != c.lostOrDup || missing != c.missing {
			t.Errorf("%s: LostOrDuplicated = %d, missing %d; want %d, %d", c.name, lod, missing, c.lostOrDup, c.missing)
		}
	}
}

// TestDeliveryGap: ids a consumer skipped between the last it received
// and the first of the next batch.
func TestDeliveryGap(t *testing.T) {
	for _, c := range []struct {
		last, first uint64
		want        int
	}{{0, 1, 0}, {0, 5, 4}, {10, 11, 0}, {10, 8, 0}, {10, 10, 0}, {10, 111, 100}} {
		if got := DeliveryGap(c.last, c.first); got != c.want {
			t.Errorf("DeliveryGap(%d, %d) = %d, want %d", c.last, c.first, got, c.want)
		}
	}
}
