package dataplane

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// A replica whose stream ended and was discarded up to its end (its only
// subscriber acknowledged past it, as a downstream input's ack relay does
// by a stable id further than this replica got) holds nothing more for a
// subscription reading before the end: it is told the stream ended
// (ErrEndedBefore), over the network and locally. It used to hear
// heartbeats for ever, which no failure detector takes for a failure,
// and its task never ended.
func TestSubscriberBelowDiscardedEndIsToldTheStreamEnded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	buf := NewOutputBuffer(BufferOptions{})
	buf.SetHeartbeat(10 * time.Millisecond)
	for id := uint64(1); id <= 5; id++ {
		if err := buf.Append(ctx, dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
	buf.SetEnd(6)
	if err := buf.Append(ctx, &tuple.Tuple{Type: tuple.Boundary, ID: 6, STime: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	buf.Connect("down-0")
	buf.Ack("down-0", 33) // clamped to the end
	buf.Disconnect("down-0")
	if st := buf.Stats(); st.Tuples != 0 {
		t.Fatalf("the acknowledged stream still holds %d tuples", st.Tuples)
	}
	ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
	nothing := func(context.Context, *Batch) error { return errors.New("nothing was to be delivered") }

	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": buf}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := NewSubscriber(ref, "down-1", false, 2).Run(ctx, conn, nothing); !errors.Is(err, ErrEndedBefore) {
		t.Fatalf("remote subscription before the discarded end: %v, want ErrEndedBefore", err)
	}
	if err := NewSubscriber(ref, "down-1", false, 0).RunLocal(ctx, buf, nothing); !errors.Is(err, ErrEndedBefore) {
		t.Fatalf("local subscription before the discarded end: %v, want ErrEndedBefore", err)
	}
}

// A replica whose stream ended and whose every tuple, the final boundary
// too, was acknowledged and discarded (by consumers that count by
// another numbering after a correction that could not be made exact)
// can send a subscription resuming before its end nothing at all: it is
// answered ErrEndedBefore, as one resuming at or past the end is, instead
// of waiting for ever with heartbeats. While the end is held, it is sent.
func TestSubscriptionBeforeADiscardedEndIsToldItEnded(t *testing.T) {
	for _, local := range []bool{false, true} {
		name := "remote"
		if local {
			name = "local"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			buf := NewOutputBuffer(BufferOptions{})
			buf.SetHeartbeat(5 * time.Millisecond)
			for i := uint64(1); i <= 2; i++ {
				if err := buf.Append(ctx, dataTuple(i, "x")); err != nil {
					t.Fatal(err)
				}
			}
			buf.SetEnd(3)
			if err := buf.Append(ctx, &tuple.Tuple{ID: 3, Type: tuple.Boundary, STime: math.MaxInt64}); err != nil {
				t.Fatal(err)
			}
			run := func() error {
				sub := NewSubscriber(&fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}, "down-1", false, 0)
				deliver := func(context.Context, *Batch) error { return ErrStopSubscription }
				if local {
					return sub.RunLocal(ctx, buf, deliver)
				}
				pool := NewPool()
				defer pool.Close()
				conn, err := pool.Conn(startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": buf}}))
				if err != nil {
					return err
				}
				return sub.Run(ctx, conn, deliver)
			}
			if err := run(); err != nil {
				t.Fatalf("the end held: %v, want it delivered", err)
			}
			buf.Connect("down-0")
			buf.Ack("down-0", 3)
			buf.Ack("down-1", 3)
			if !buf.endDiscardedAfter(0) {
				t.Fatal("the end was not discarded")
			}
			if err := run(); !errors.Is(err, ErrEndedBefore) {
				t.Fatalf("the end discarded: %v, want ErrEndedBefore", err)
			}
		})
	}
}
