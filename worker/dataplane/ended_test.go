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
