package runtime

import (
	"fmt"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
)

// TestAddedPartitionIsNotAligned: the first copy of a partition a rescale
// adds (generation = the rescale's epoch, no snapshot) has nothing to
// renumber, its consumers hold nothing from it, so it does not wait for
// them to subscribe (alignRestartedOutputs) as an operator copy started
// again without its state does; every other copy started without state,
// during a rescale or after it, still does. Fails before the added
// partitions were told apart: they took the restart path.
func TestAddedPartitionIsNotAligned(t *testing.T) {
	prepared := &SlotMap{Epoch: 1, Partitions: 2, Next: &SlotMapNext{Epoch: 2, Partitions: 4}}
	finished := &SlotMap{Epoch: 2, Partitions: 4}
	for _, tc := range []struct {
		what                  string
		m                     *SlotMap
		partition, generation int
		aligns                bool
	}{
		{"added partition, first copy", prepared, 2, 2, false},
		{"added partition, first copy (last)", prepared, 3, 2, false},
		{"old partition started again during the rescale", prepared, 1, 2, true},
		{"added partition placed again during the rescale", prepared, 3, 3, true},
		{"added partition started again after the rescale", finished, 3, 2, true},
		{"started again, no rescale", &SlotMap{Epoch: 1, Partitions: 2}, 1, 2, true},
		{"started again, no slot map", nil, 1, 2, true},
	} {
		t.Run(tc.what, func(t *testing.T) {
			tk := &task{
				spec: TaskSpec{TaskID: fmt.Sprintf("q/counts/p%d/r0", tc.partition), Fragment: "counts",
					Partition: tc.partition, Generation: tc.generation},
				node:  &queryspec.Node{Name: "counts", Kind: queryspec.KindOperator, Partitions: 2},
				merge: newMerger(8),
			}
			if tc.m != nil {
				tk.spec.SlotMaps = map[string]*SlotMap{"counts": tc.m}
			}
			if got := tk.startsWithoutState(); got != tc.aligns {
				t.Fatalf("startsWithoutState = %v, want %v", got, tc.aligns)
			}
		})
	}
}
