package dataplane

import (
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// A relay that acknowledges by stable id (a DCAA consumer reading another
// replica) frees this replica's positions up to its own position of that
// stable id: the tentative tuples, UNDO and REC_DONE of a correction take
// positions the stable id does not count. Taken as a position, the relay
// left this replica holding as many positions as its corrections had
// taken, for every such consumer and for good: a replica whose
// corrections took more than its buffer's bound stopped.
func TestStableRelayFreesCorrectedPositions(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	// Positions 1..20: 3..6 non-stable (a tentative run, its UNDO),
	// 12 non-stable (a REC_DONE), 18.. an open tentative tail.
	b.MarkNonStable(3, 6)
	b.MarkNonStable(12, 12)
	fill(t, b, 1, 17)
	b.BeginNonStable(18)
	fill(t, b, 18, 20)
	for sid, want := range map[uint64]uint64{1: 1, 2: 2, 3: 7, 7: 11, 8: 13, 12: 17, 13: math.MaxUint64} {
		if got := b.PositionOfStable(sid); got != want {
			t.Errorf("position of stable id %d: %d, want %d", sid, got, want)
		}
	}
	conn := serveUp(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sid := make(chan uint64, 1)
	sid <- 8
	cur := uint64(0)
	done := make(chan error, 1)
	go func() {
		done <- RelayAcks(ctx, conn, &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}, "down/r1", true, func() uint64 {
			select {
			case cur = <-sid:
			default:
			}
			return cur
		})
	}()
	// Stable id 8 is position 13: 14..20 stay.
	waitFor(t, "stable id 8 acknowledged", func() bool { return b.Stats().OldestID == 14 })
	// Past this replica's last stable id: everything up to its open
	// tentative tail, which a consumer switching here reads
	// (ResumePosition), so it stays while it fits (RelayedPosition).
	sid <- 13
	waitFor(t, "every position before the tentative tail acknowledged", func() bool { return b.Stats().OldestID == 18 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("relay ended with %v", err)
	}
	// Past a divergence (a lossy correction) a stable id means other
	// results here: it counts as a position, as it always did.
	d := NewOutputBuffer(BufferOptions{})
	d.MarkNonStable(3, 4)
	fill(t, d, 1, 12)
	d.Diverge(4)
	if p := d.RelayedPosition(4); p != 6 {
		t.Errorf("relayed stable id 4, within the shared numbering: position %d, want 6", p)
	}
	if p := d.RelayedPosition(7); p != 7 {
		t.Errorf("relayed stable id 7, past the divergence: position %d, want 7", p)
	}
	// The same through a local relay.
	l := NewOutputBuffer(BufferOptions{})
	l.MarkNonStable(2, 3)
	fill(t, l, 1, 6)
	lctx, lcancel := context.WithCancel(context.Background())
	ldone := make(chan error, 1)
	go func() { ldone <- RelayAcksLocal(lctx, l, "down/r1", true, func() uint64 { return 2 }) }()
	waitFor(t, "local relay: stable id 2 is position 4", func() bool { return l.Stats().OldestID == 5 })
	lcancel()
	if err := <-ldone; err != nil {
		t.Fatalf("local relay ended with %v", err)
	}
}

// serveUp serves b as stream "up" and returns a connection to it.
func serveUp(t *testing.T, b *OutputBuffer) grpc.ClientConnInterface {
	t.Helper()
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": b}})
	pool := NewPool()
	t.Cleanup(func() { pool.Close() })
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// A producer waiting for room while a connected subscriber is behind and
// a disconnected one (within its lease) is further behind overruns once
// the connected one catches up and the grace has passed, even though that
// acknowledgement freed nothing by itself: it waited for the lease's end
// (default 30 s) before.
func TestOverrunAfterConnectedSubscriberCatchesUp(t *testing.T) {
	const grace = 50 * time.Millisecond
	b := NewOutputBuffer(BufferOptions{ExpectedSubscribers: 2, MaxTuples: 10, OverrunGrace: grace, Lease: time.Hour})
	b.Connect("live")
	defer b.Disconnect("live")
	b.Connect("gone")
	fill(t, b, 1, 10)
	b.Disconnect("gone") // has taken nothing
	// Full; "live" has taken nothing: flow control.
	appended := make(chan error, 1)
	go func() { appended <- b.Append(context.Background(), dataTuple(11, "x")) }()
	waitFor(t, "producer waiting", func() bool { return b.Stats().BlockedAppends == 1 })
	b.Ack("live", 10) // frees nothing: "gone" holds 1..10
	select {
	case err := <-appended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("producer still waiting 20 s after the connected subscriber caught up (grace %v): %+v", grace, b.Stats())
	}
	if st := b.Stats(); st.Overrun == 0 {
		t.Fatalf("no overrun: %+v", st)
	}
}
