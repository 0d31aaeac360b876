package runtime

import (
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// A merging sink's input filters a batch (filterDCAA) before the merger
// takes it, and the merger may give the batch up (its add waits for room
// and the attempt ends: failure detection under load). filterDCAA moves
// the lineage watch as if the batch were taken: on a realigning
// subscription it ends the realignment and adopts the new replica's
// lineage, while stableTaken keeps the old replica's numbering. The next
// attempt then resumed on the new replica by the old numbering's id, its
// lineage taken for the input's own: no realignment, the new replica's
// results between the cut and that id skipped, named nowhere (the
// unnamed loss of TestDCAABothReplicasLostNamesTheLoss under load 40-100,
// s15). The input puts the watch back when the merger gives the batch up
// (input.go); this shows the sequence on the watch alone.
func TestSinkRealignNotTakenRealignsAgain(t *testing.T) {
	const linB = 7
	const taken = 1845 // the input's stable id, the lost replica's numbering
	var w lineageWatch
	w.batch(0, 0) // the shared numbering
	w.took(14_040_000_000, false)
	if !w.start(true, linB, 0, taken) {
		t.Fatal("a switch onto another lineage did not realign")
	}
	before := w
	// The realigning subscription's first batch: the replica no longer
	// holds its first ids (gapped), the first it has is at 15.58s.
	ts := []tuple.Tuple{
		{Type: tuple.Stable, ID: 5, STime: 15_580_000_000},
		{Type: tuple.Boundary, ID: 6, STime: 15_600_000_000},
	}
	cut, renumbered, marks := w.sinkRealign(ts)
	if cut != 0 || renumbered != 4 || len(marks) != 1 {
		t.Fatalf("cut %d renumbered %d marks %v", cut, renumbered, marks)
	}
	// The merger gave the batch up: stableTaken is still 1845.
	if w.start(true, linB, 0, taken) {
		t.Fatal("the watch realigns again although it adopted the new lineage: the premise of this test changed")
	}
	// Without the watch put back, the next attempt resumes after 1845 on
	// the new replica (ResumeAfterStable) and skips its ids 5 to 1845.
	w = before // what input.go does when the merger's add fails
	w.re.on = false
	if !w.start(true, linB, 0, taken) {
		t.Fatal("the watch put back does not realign on the new lineage")
	}
}
