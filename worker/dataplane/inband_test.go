package dataplane

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// stateLog records what a subscriber heard of its producer's state.
type stateLog struct {
	mu     sync.Mutex
	heard  int
	states []fedstreampb.ReplicaState
	wm     int64
}

func (l *stateLog) on(st fedstreampb.ReplicaState, wm int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.heard++
	l.states = append(l.states, st)
	l.wm = wm
}

func (l *stateLog) snapshot() (int, fedstreampb.ReplicaState, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.states) == 0 {
		return l.heard, 0, l.wm
	}
	return l.heard, l.states[len(l.states)-1], l.wm
}

// A stream with heartbeats keeps telling an idle subscriber, remote or
// local, that the producer lives and in which state it is; data batches
// carry the state too. Without heartbeats an idle subscriber hears
// nothing (so silence can mean failure only where heartbeats are on).
func TestHeartbeatsCarryStreamState(t *testing.T) {
	for _, local := range []bool{false, true} {
		name := "remote"
		if local {
			name = "local"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			buf := NewOutputBuffer(BufferOptions{})
			buf.SetHeartbeat(5 * time.Millisecond)
			buf.SetStreamState(fedstreampb.ReplicaState_REPLICA_STABLE, 0)
			if err := buf.Append(ctx, dataTuple(1, "one")); err != nil {
				t.Fatal(err)
			}
			sub := NewSubscriber(&fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}, "down-0", false, 0)
			var log stateLog
			sub.OnStreamState(log.on)
			var mu sync.Mutex
			var got []uint64
			done := make(chan error, 1)
			go func() {
				deliver := func(ctx context.Context, b *Batch) error {
					mu.Lock()
					got = append(got, b.LastID)
					mu.Unlock()
					return nil
				}
				if local {
					done <- sub.RunLocal(ctx, buf, deliver)
					return
				}
				pool := NewPool()
				defer pool.Close()
				conn, err := pool.Conn(startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": buf}}))
				if err != nil {
					done <- err
					return
				}
				done <- sub.Run(ctx, conn, deliver)
			}()
			waitFor(t, "the data batch", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 })
			n, st, _ := log.snapshot()
			if n == 0 || st != fedstreampb.ReplicaState_REPLICA_STABLE {
				t.Fatalf("data batch heard %d times, state %v", n, st)
			}
			// Idle: heartbeats keep coming, and carry a state change.
			waitFor(t, "heartbeats", func() bool { h, _, _ := log.snapshot(); return h >= n+5 })
			buf.SetStreamState(fedstreampb.ReplicaState_REPLICA_UP_FAILURE, 42)
			waitFor(t, "the new state in a heartbeat", func() bool {
				_, st, wm := log.snapshot()
				return st == fedstreampb.ReplicaState_REPLICA_UP_FAILURE && wm == 42
			})
			mu.Lock()
			if len(got) != 1 {
				t.Errorf("heartbeats were delivered as batches: %v", got)
			}
			mu.Unlock()
			// Heartbeats off: silence.
			buf.SetHeartbeat(0)
			time.Sleep(20 * time.Millisecond) // let a heartbeat wait in progress end
			h0, _, _ := log.snapshot()
			time.Sleep(50 * time.Millisecond)
			if h1, _, _ := log.snapshot(); h1 > h0+1 {
				t.Errorf("heard %d heartbeats after turning them off", h1-h0)
			}
			cancel()
			<-done
		})
	}
}
