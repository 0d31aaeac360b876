package dataplane

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// stateLog records what a subscriber heard of its producer's state.
type stateLog struct {
	mu     sync.Mutex
	heard  int
	states []fedstreampb.ReplicaState
	wm     int64
}

func (l *stateLog) on(st fedstreampb.ReplicaState, wm int64, _ bool) {
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

// A batch's tentative watermark never covers tuples after the batch: the
// producer appends its tentative tuples and then raises the watermark, so
// a watermark read while later tuples wait in the buffer may cover them.
// A DCAA consumer releases tentatively up to the watermark and drops what
// comes below it later as late: reading the watermark after the batch
// (as the stream did) lost every tuple of the batches that followed it.
// Only the message ending at the buffer's end (or a heartbeat with
// nothing left) carries it.
func TestTentativeWatermarkNeverAheadOfTuples(t *testing.T) {
	const n = 20000 // several batches, remote and local
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
			for i := range uint64(n) {
				if err := buf.Append(ctx, dataTuple(i+1, "tentative")); err != nil {
					t.Fatal(err)
				}
			}
			buf.SetStreamState(fedstreampb.ReplicaState_REPLICA_UP_FAILURE, 42)
			sub := NewSubscriber(&fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}, "down-0", false, 0)
			var (
				mu     sync.Mutex
				taken  uint64 // delivered so far
				wmAt   []uint64
				beats  int
				ahead  []string
				pendWM int64
			)
			sub.OnStreamState(func(_ fedstreampb.ReplicaState, wm int64, beat bool) {
				mu.Lock()
				defer mu.Unlock()
				if beat {
					beats++
					if wm == 42 && taken == n {
						wmAt = append(wmAt, taken)
					}
					if wm != 0 && taken < n {
						ahead = append(ahead, fmt.Sprintf("heartbeat with watermark after %d of %d tuples", taken, n))
					}
					return
				}
				pendWM = wm
			})
			done := make(chan error, 1)
			deliver := func(ctx context.Context, b *Batch) error {
				mu.Lock()
				defer mu.Unlock()
				taken = b.LastID
				if pendWM != 0 {
					wmAt = append(wmAt, b.LastID)
					if b.LastID < n {
						ahead = append(ahead, fmt.Sprintf("batch ending at %d of %d with the watermark", b.LastID, n))
					}
				}
				return nil
			}
			go func() {
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
			waitFor(t, "every tuple and a heartbeat after them", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return taken == n && beats > 0
			})
			cancel()
			<-done
			mu.Lock()
			defer mu.Unlock()
			if len(ahead) > 0 {
				t.Fatalf("the watermark came ahead of its tuples: %v", ahead)
			}
			if len(wmAt) == 0 {
				t.Fatal("the watermark never came")
			}
		})
	}
}

// A DCAA input resuming by stable id on a replica whose open tentative
// tail begins at or below that id (it went tentative before the replica
// read so far) reads the tail from its start, also once its UNDO closed
// it; below the tail the id is taken as a position as before, and once
// the corrections came, the position of that stable id; a retry (by
// position) does not get the tail again.
func TestResumeByStableIDIntoTentativeTail(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	add := func(typ tuple.Type, n int) {
		for range n {
			if err := b.Append(context.Background(), &tuple.Tuple{Type: typ, ID: b.lastID + 1, Values: []tuple.Value{tuple.Int(1)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(tuple.Stable, 11)
	for sid, want := range map[uint64]uint64{5: 5, 11: 11, 33: 33} {
		if got := b.ResumePosition(sid); got != want {
			t.Fatalf("no tail: ResumePosition(%d) = %d, want %d", sid, got, want)
		}
	}
	b.BeginNonStable(12)
	add(tuple.Tentative, 5) // positions 12-16
	for sid, want := range map[uint64]uint64{5: 5, 11: 11, 12: 11, 33: 11} {
		if got := b.ResumePosition(sid); got != want {
			t.Fatalf("open tail from 12: ResumePosition(%d) = %d, want %d", sid, got, want)
		}
	}
	sub := NewSubscriber(&fedstreampb.StreamRef{}, "down", false, 0)
	read := func() (first, last uint64) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := sub.RunLocal(ctx, b, func(_ context.Context, bt *Batch) error {
			first, last = bt.FirstID, bt.LastID
			return ErrStopSubscription
		})
		if err != nil {
			t.Fatal(err)
		}
		return first, last
	}
	sub.ResumeAfterStable(33)
	if first, last := read(); first != 12 || last != 16 {
		t.Fatalf("resumed after stable id 33: read positions %d-%d, want the tail 12-16", first, last)
	}
	add(tuple.Tentative, 1)
	if first, last := read(); first != 17 || last != 17 {
		t.Fatalf("resumed by position 16: read positions %d-%d, want 17", first, last)
	}
	b.EndNonStable(18)
	add(tuple.Undo, 1)
	if got := b.ResumePosition(33); got != 17 {
		// What is left of it: the reader above acknowledged up to 17.
		t.Fatalf("closed tail ending with its UNDO: ResumePosition(33) = %d, want 17", got)
	}
	// Corrections follow: stable ids 12 and 13 at positions 19 and 20.
	add(tuple.Stable, 2)
	for sid, want := range map[uint64]uint64{5: 5, 11: 11, 12: 19, 13: 20, 33: 33} {
		if got := b.ResumePosition(sid); got != want {
			t.Fatalf("after the correction: ResumePosition(%d) = %d, want %d", sid, got, want)
		}
	}
}

// A sink's result stream marks each tentative result, UNDO and REC_DONE
// outside its stable view on its own (closed ranges): its trailing ones,
// after its last stable result, are its tentative tail too. A reader
// resuming by stable id (fedstream tail, moving from a sink copy that
// had more stable results) reads them from their start. Fails before:
// only an open range was a tail, and the reader skipped the tentative
// results below position 33, hearing nothing until the copy had 33
// positions.
func TestResumeByStableIDIntoSinkTentativeResults(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{Ring: true})
	for i := uint64(1); i <= 20; i++ {
		typ := tuple.Stable
		if i > 11 {
			typ = tuple.Tentative
			b.MarkNonStable(i, i)
		}
		if err := b.Append(context.Background(), &tuple.Tuple{Type: typ, ID: i, Values: []tuple.Value{tuple.Int(1)}}); err != nil {
			t.Fatal(err)
		}
	}
	for sid, want := range map[uint64]uint64{5: 5, 11: 11, 12: 11, 33: 11} {
		if got := b.ResumePosition(sid); got != want {
			t.Fatalf("ResumePosition(%d) = %d, want %d", sid, got, want)
		}
	}
}

// A relayed acknowledgement of a stable id at or past an open tentative
// tail that begins below it keeps that tail, which a consumer switching
// here reads (ResumePosition), while it fits: once an Append waits for
// room, the next relayed acknowledgement gives it up, and a consumer
// then resumes after what is left of it (not before it, where the
// heartbeats stated the stream stable). Fails before: the relay
// discarded the tail at once.
func TestRelayedAckKeepsTentativeTailWhileItFits(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{MaxTuples: 5})
	b.Connect("relay")
	add := func(typ tuple.Type) error {
		return b.Append(context.Background(), &tuple.Tuple{Type: typ, ID: b.lastID + 1, Values: []tuple.Value{tuple.Int(1)}})
	}
	for range 11 {
		if err := add(tuple.Stable); err != nil {
			t.Fatal(err)
		}
		b.AckStable("relay", b.lastID)
	}
	b.BeginNonStable(12)
	for range 5 { // positions 12-16: the buffer is full
		if err := add(tuple.Tentative); err != nil {
			t.Fatal(err)
		}
	}
	b.AckStable("relay", 33)
	if st := b.Stats(); st.OldestID != 12 || st.Tuples != 5 {
		t.Fatalf("relayed stable id 33: oldest %d, %d tuples kept; want the tail 12-16", st.OldestID, st.Tuples)
	}
	if got := b.ResumePosition(33); got != 11 {
		t.Fatalf("ResumePosition(33) = %d, want 11", got)
	}
	appended := make(chan error, 1)
	go func() { appended <- add(tuple.Tentative) }()
	deadline := time.Now().Add(30 * time.Second)
	for b.Stats().BlockedAppends == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the 6th tentative tuple never waited for room")
		}
		time.Sleep(time.Millisecond)
	}
	b.AckStable("relay", 33)
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if got := b.ResumePosition(33); got != 16 {
		t.Fatalf("tail discarded up to 16: ResumePosition(33) = %d, want 16", got)
	}
	// Given up once, the tail is not held again.
	if got := b.RelayedPosition(33); got != math.MaxUint64 {
		t.Fatalf("tail given up: RelayedPosition(33) = %d, want past the stream", got)
	}
}
