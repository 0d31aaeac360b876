package dataplane

import (
	"context"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// A subscriber moving to a replica that is behind it (its position is
// beyond that replica's last tuple) while that replica's buffer is full
// and waits for this very subscriber: its position counts as its
// acknowledgement there, so the replica catches up instead of waiting
// forever for an acknowledgement of tuples it never sends.
func TestSubscriberAheadOfFullReplica(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	buf := NewOutputBuffer(BufferOptions{MaxTuples: 4, ExpectedSubscribers: 1})
	produced := make(chan error, 1)
	go func() {
		for id := uint64(1); id <= 20; id++ {
			if err := buf.Append(ctx, dataTuple(id, "x")); err != nil {
				produced <- err
				return
			}
		}
		produced <- nil
	}()
	waitFor(t, "the buffer to fill", func() bool { return buf.Stats().LastID == 4 })
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": buf}}))
	if err != nil {
		t.Fatal(err)
	}
	sub := NewSubscriber(&fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}, "down-0", false, 10)
	got := make(chan uint64, 32)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(ctx, conn, func(ctx context.Context, b *Batch) error {
			for _, tp := range b.Tuples {
				got <- tp.ID
			}
			if b.LastID == 20 {
				return ErrStopSubscription
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the replica behind never caught up: last id %d", buf.Stats().LastID)
	}
	close(got)
	want := uint64(11)
	for id := range got {
		if id != want {
			t.Fatalf("got id %d, want %d", id, want)
		}
		want++
	}
	if want != 21 {
		t.Fatalf("got ids up to %d, want 20", want-1)
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
}
