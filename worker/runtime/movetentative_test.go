package runtime

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestMoveWaitsOutATentativeOldCopy: the old copy of a move refuses its
// snapshot as a DCAA replica whose results are tentative does
// (errTentativeNow), for longer than a bootstrap asks a peer replica
// again (tentativeWait, shortened here). The new copy replaces the old
// one, so it keeps asking until the old copy serves it and starts from
// the snapshot: the sink's stream is the unmoved run's. It used to start
// without the snapshot, from its upstreams' buffers, which no longer
// held the stream's start (a fedstream dev soak lost the state of an
// aggregate partition so, returning home from a partner org).
func TestMoveWaitsOutATentativeOldCopy(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	// Refusals in a row: with the bootstrap's pauses between them (50 ms
	// doubling to 500 ms) they last about 2.75 s, far past tentativeWait.
	const refusals = 8
	want := unmovedStream(t)
	c := startMoveRun(t, moving, 300)
	defer c.close(t)
	c.to.rt.tentativeWait = 50 * time.Millisecond
	var asked atomic.Int32
	fault := func(taskID string) error {
		if taskID == moving && asked.Add(1) <= refusals {
			return errTentativeNow
		}
		return nil
	}
	c.from.rt.snapshotFault.Store(&fault)
	c.move(t, moving, c.from, c.to, true)
	if n := asked.Load(); n <= refusals {
		t.Fatalf("the old copy was asked for its snapshot %d times, not past its %d refusals: the test proves nothing", n, refusals)
	}
	c.sameAsUnmoved(t, want, "")
}
