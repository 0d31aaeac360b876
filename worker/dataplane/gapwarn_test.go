package dataplane

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// lockedBuf is a log destination safe for the server's goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A DCAA subscriber resumes on a replica by its last stable id, used as
// a position. That position can lie below positions it took on that
// replica itself before it switched away (the replica's tentative
// tuples and UNDO take positions the stable id does not count), which
// the replica discarded once acknowledged: the subscriber misses
// nothing, and the server must not warn that it does. It warns when a
// result the subscriber lacks was discarded. (Before the fix the first
// case warned too: the server compared the stable id with the newest
// discarded position.)
func TestResumeByStableIDBelowDiscardedPositionsIsNoGap(t *testing.T) {
	ctx := context.Background()
	// Positions 1-3 stable, 4-5 tentative, 6 UNDO, 7-10 the corrected
	// stable results (stable ids 4-7). The subscriber read and
	// acknowledged up to position 8 (stable id 5), then switched to the
	// other replica: positions up to 8 are discarded.
	newBuf := func() *OutputBuffer {
		b := NewOutputBuffer(BufferOptions{})
		for id := uint64(1); id <= 10; id++ {
			if err := b.Append(ctx, dataTuple(id, "x")); err != nil {
				t.Fatal(err)
			}
		}
		b.MarkNonStable(4, 6)
		// The correction was one that could not make every result
		// exact: the stream diverged after stable id 3 (its batches say
		// so).
		b.Diverge(3)
		b.Ack("down", 8)
		if st := b.Stats(); st.OldestID != 9 {
			t.Fatalf("oldest retained %d, want 9", st.OldestID)
		}
		return b
	}
	b := newBuf()
	for after, want := range map[uint64]bool{5: false, 6: false, 4: true, 2: true} {
		if got := b.DiscardedStableAfter(after); got != want {
			t.Errorf("resuming after stable id %d: discarded a later result %v, want %v", after, got, want)
		}
	}
	res := &mapResolver{bufs: map[string]*OutputBuffer{}}

	var logs lockedBuf
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions()...)
	fedstreampb.RegisterDataPlaneServer(srv, NewServer(res, nil,
		slog.New(slog.NewTextHandler(&logs, nil))))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
	read := func(after uint64) {
		t.Helper()
		res.mu.Lock()
		res.bufs["up"] = newBuf()
		res.mu.Unlock()
		sub := NewSubscriber(ref, "down", false, after)
		err := sub.Run(ctx, conn, func(ctx context.Context, bt *Batch) error {
			if bt.Lineage == 0 || bt.LineageSince != 3 {
				return fmt.Errorf("a batch of a diverged stream carries lineage %d since %d, want nonzero since 3", bt.Lineage, bt.LineageSince)
			}
			if bt.LastID >= 10 {
				return ErrStopSubscription
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	const warning = "resumes after discarded tuples"
	read(5) // stable id 5: it holds every result up to it
	if strings.Contains(logs.String(), warning) {
		t.Fatalf("warned of a gap for a subscriber that misses nothing:\n%s", logs.String())
	}
	read(4) // stable id 4: the result with stable id 5 was discarded
	if !strings.Contains(logs.String(), warning) {
		t.Fatalf("no warning for a subscriber that misses a result:\n%s", logs.String())
	}
}
