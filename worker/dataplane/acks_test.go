package dataplane

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

func fill(t *testing.T, b *OutputBuffer, from, to uint64) {
	t.Helper()
	for id := from; id <= to; id++ {
		if err := b.Append(context.Background(), dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplicatedAcksTrimEveryReplica: two downstream replicas each read
// one upstream replica and relay their progress to the other; both
// upstream buffers (expecting two subscribers) trim everything. Before
// relays each buffer only ever saw one subscriber and kept everything.
func TestReplicatedAcksTrimEveryReplica(t *testing.T) {
	const n = 5000
	ups := []*OutputBuffer{NewOutputBuffer(BufferOptions{ExpectedSubscribers: 2}), NewOutputBuffer(BufferOptions{ExpectedSubscribers: 2})}
	var addrs []string
	for _, b := range ups {
		fill(t, b, 1, n)
		addrs = append(addrs, startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": b}}))
	}
	pool := NewPool()
	defer pool.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for r := range 2 {
		name := fmt.Sprintf("down/r%d", r)
		ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
		sub := NewSubscriber(ref, name, false, 0)
		read, other := addrs[r], addrs[1-r]
		wg.Add(2)
		go func() {
			defer wg.Done()
			conn, _ := pool.Conn(read)
			_ = sub.Run(ctx, conn, func(ctx context.Context, b *Batch) error {
				if b.LastID == n {
					return ErrStopSubscription
				}
				return nil
			})
		}()
		go func() {
			defer wg.Done()
			conn, _ := pool.Conn(other)
			_ = RelayAcks(ctx, conn, ref, name, false, sub.LastID)
		}()
	}
	for r, b := range ups {
		waitFor(t, fmt.Sprintf("replica %d trimmed", r), func() bool { return b.Stats().Tuples == 0 })
	}
}

// servedUpstream serves a buffer holding ids 1 to 10 as stream "up" and
// returns it with a connection to its server.
func servedUpstream(t *testing.T) (*OutputBuffer, *grpc.ClientConn) {
	t.Helper()
	b := NewOutputBuffer(BufferOptions{})
	fill(t, b, 1, 10)
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": b}})
	pool := NewPool()
	t.Cleanup(func() { pool.Close() })
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	return b, conn
}

// TestAckOnlyRelayIsClampedAndRepeated: an ack-only relay beyond what the
// upstream replica has produced is clamped to its last id, and the relay's
// repetition acknowledges the rest once it is produced. An ack-only
// subscription gets no data.
func TestAckOnlyRelayIsClampedAndRepeated(t *testing.T) {
	b, conn := servedUpstream(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RelayAcks(ctx, conn, &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}, "down/r1", false,
			func() uint64 { return 1000 })
	}()
	waitFor(t, "relayed ack applied", func() bool { return b.Stats().Tuples == 0 })
	// Tuples produced after the clamp are not discarded by it...
	fill(t, b, 11, 20)
	if st := b.Stats(); st.LastID != 20 || st.Subscribers != 1 || st.Connected != 1 {
		t.Fatalf("stats %+v", st)
	}
	// ...but by the relay's next repetition (the ack has not changed).
	waitFor(t, "repeated ack applied", func() bool { return b.Stats().Tuples == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("relay ended with %v, want nil on cancel", err)
	}
	waitFor(t, "relay disconnected", func() bool { return b.Stats().Connected == 0 })

	// Through the raw protocol: no data flows on an ack-only subscription.
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: &fedstreampb.StreamRef{Query: "q", TaskId: "up"}, Subscriber: "s", AckOnly: true}); err != nil {
		t.Fatal(err)
	}
	fill(t, b, 21, 30)
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Recv(); err == nil {
		t.Fatalf("ack-only subscription received %d tuples", msg.Count)
	}
}

// TestAckOnlyRelayAppliedAgainByTheServer: the serving worker applies a
// relayed acknowledgement it clamped again as the replica catches up,
// without the subscriber sending it again (a relay repeats an unchanged
// one only every relayRepeat, for older servers).
func TestAckOnlyRelayAppliedAgainByTheServer(t *testing.T) {
	b, conn := servedUpstream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One message only: acknowledged up to 1000, clamped to 10.
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: &fedstreampb.StreamRef{Query: "q", TaskId: "up"}, Subscriber: "s", AckOnly: true, AckId: 1000}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "relayed ack applied", func() bool { return b.Stats().Tuples == 0 })
	fill(t, b, 11, 20)
	waitFor(t, "the same ack applied again by the server", func() bool { return b.Stats().Tuples == 0 })
}

// TestLeaseExpiryForgetsSubscriber: a subscriber that disconnected holds
// the buffer for its lease, then is forgotten and no longer holds it.
func TestLeaseExpiryForgetsSubscriber(t *testing.T) {
	const lease = 300 * time.Millisecond
	b := NewOutputBuffer(BufferOptions{ExpectedSubscribers: 2, Lease: lease})
	fill(t, b, 1, 100)
	b.Connect("r0")
	b.Connect("r1")
	b.Ack("r1", 20)
	b.Disconnect("r1")
	left := time.Now()
	b.Ack("r0", 100)
	if st := b.Stats(); time.Since(left) < lease && (st.OldestID != 21 || st.Laggard != "r1" || st.LaggardConnected) {
		t.Fatalf("within the lease: %+v, want oldest 21 held by r1 (disconnected)", st)
	}
	waitFor(t, "r1 forgotten", func() bool {
		b.Ack("r0", 100) // acks are repeated
		return b.Stats().Tuples == 0
	})
	if d := time.Since(left); d < lease {
		t.Fatalf("forgotten after %v, before its lease of %v", d, lease)
	}
	if st := b.Stats(); st.Subscribers != 1 || st.Laggard != "r0" {
		t.Fatalf("stats %+v", st)
	}
	// A subscriber that connects again within its lease keeps its place.
	b.Disconnect("r0")
	fill(t, b, 101, 110)
	b.Connect("r0")
	if st := b.Stats(); st.Tuples != 10 || st.LaggardAck != 100 {
		t.Fatalf("after reconnecting: %+v", st)
	}
}

// TestMissingSubscriberOverruns: a full buffer held back only by a
// replica that never subscribed, or by one that disconnected, discards its
// oldest tuples after the grace; the overrun is counted and the laggard
// named. Before, the producer blocked for good.
func TestMissingSubscriberOverruns(t *testing.T) {
	const grace = 200 * time.Millisecond
	var logs strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	b := NewOutputBuffer(BufferOptions{ExpectedSubscribers: 2, MaxTuples: 10, OverrunGrace: grace, Lease: time.Minute, Logger: logger})
	b.Connect("r0")
	defer b.Disconnect("r0")
	fill(t, b, 1, 10)
	b.Ack("r0", 10)
	if st := b.Stats(); st.Tuples != 10 || st.Missing != 1 {
		t.Fatalf("start-up wait: %+v", st)
	}
	start := time.Now()
	fill(t, b, 11, 15) // blocks for the grace, then overruns
	if d := time.Since(start); d < grace {
		t.Fatalf("overran after %v, before the grace of %v", d, grace)
	}
	st := b.Stats()
	if st.Overrun != 5 || st.OldestID != 6 || st.LastID != 15 {
		t.Fatalf("after the overrun: %+v", st)
	}
	// The second replica arrives, reads with a gap, then goes away.
	b.Connect("r1")
	if _, _, _, gap, _, _ := b.Read(0, MaxBatchBytes); !gap {
		t.Fatal("the late replica should see a gap")
	}
	b.Ack("r1", 12)
	b.Ack("r0", 15)
	b.Disconnect("r1")
	st = b.Stats()
	if st.Laggard != "r1" || st.LaggardAck != 12 || st.LaggardConnected || st.Missing != 0 {
		t.Fatalf("holder: %+v", st)
	}
	// 13..22 retained; the connected r0 has taken them all.
	fill(t, b, 16, 22)
	b.Ack("r0", 22)
	start = time.Now()
	fill(t, b, 23, 25)
	if d := time.Since(start); d < grace {
		t.Fatalf("overran after %v, before the grace of %v", d, grace)
	}
	if st := b.Stats(); st.Overrun != 5+3 || st.OldestID != 16 {
		t.Fatalf("after the second overrun: %+v", st)
	}
	// Within the episode, what r0 has taken (up to 22) goes at once...
	fill(t, b, 26, 32)
	if st := b.Stats(); st.Overrun != 5+3+7 || st.OldestID != 23 {
		t.Fatalf("within the episode: %+v", st)
	}
	// ...but never what the connected r0 has not taken: the producer
	// waits for it (flow control).
	ctx, cancel := context.WithTimeout(context.Background(), 4*grace)
	defer cancel()
	if err := b.Append(ctx, dataTuple(33, "x")); err == nil {
		t.Fatal("overran tuples the connected subscriber had not taken")
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "subscriber=r1") || !strings.Contains(logs.String(), "not subscribed yet") {
		t.Fatalf("warnings do not name who misses tuples:\n%s", logs.String())
	}
}

type lockedWriter struct {
	w  *strings.Builder
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestConnectedSlowSubscriberBlocks: a connected subscriber that does not
// acknowledge is flow control: the producer waits well past the grace and
// nothing is discarded, until it acknowledges.
func TestConnectedSlowSubscriberBlocks(t *testing.T) {
	const grace = 50 * time.Millisecond
	b := NewOutputBuffer(BufferOptions{MaxTuples: 10, OverrunGrace: grace})
	b.Connect("slow")
	defer b.Disconnect("slow")
	fill(t, b, 1, 10)
	done := make(chan error, 1)
	go func() { done <- b.Append(context.Background(), dataTuple(11, "x")) }()
	waitFor(t, "producer blocked", func() bool { return b.Stats().BlockedAppends == 1 })
	select {
	case err := <-done:
		t.Fatalf("append returned %v while the connected subscriber had acknowledged nothing", err)
	case <-time.After(20 * grace):
	}
	st := b.Stats()
	if st.Overrun != 0 || st.OldestID != 1 || st.BlockedSince.IsZero() || st.Laggard != "slow" || !st.LaggardConnected {
		t.Fatalf("stats while blocked: %+v", st)
	}
	b.Ack("slow", 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Overrun != 0 || !st.BlockedSince.IsZero() {
		t.Fatalf("stats after: %+v", st)
	}
}

// TestAckBeyondSentRefused: the attack of issue 8, acknowledging id 2^62
// under the real subscriber's name, ends the subscription with
// InvalidArgument and discards nothing; so does an opening ack on a data
// subscription.
func TestAckBeyondSentRefused(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	fill(t, b, 1, 100)
	b.Connect("down") // the real downstream task, which has taken nothing
	defer b.Disconnect("down")
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": b}})
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
	ctx := context.Background()

	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: ref, Subscriber: "down"}); err != nil {
		t.Fatal(err)
	}
	batch, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{AckId: 1 << 62}); err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "beyond the last id sent") {
		t.Fatalf("ack 2^62 after a batch ending at %d: %v", batch.LastId, err)
	}
	if st := b.Stats(); st.Tuples != 100 || st.OldestID != 1 {
		t.Fatalf("the refused ack discarded tuples: %+v", st)
	}

	stream, err = fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: ref, Subscriber: "down", AfterId: math.MaxInt64, AckId: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("opening ack on a data subscription: %v", err)
	}
	if st := b.Stats(); st.Tuples != 100 {
		t.Fatalf("the refused opening ack discarded tuples: %+v", st)
	}
}

// TestCallerIdentityKeysAcks: with an authenticated caller, acks are
// accounted under its identity plus the name it gives, so a caller cannot
// acknowledge in another subscriber's name; plaintext keeps the name.
func TestCallerIdentityKeysAcks(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	fill(t, b, 1, 10)
	b.Connect("down") // the real downstream, local, has taken nothing
	defer b.Disconnect("down")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions()...)
	s := NewServer(&mapResolver{bufs: map[string]*OutputBuffer{"up": b}}, nil, nil,
		WithCallerIdentity(func(context.Context) (string, bool) { return "fedstream://org/client/mallory", true }))
	fedstreampb.RegisterDataPlaneServer(srv, s)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-served }()
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RelayAcks(ctx, conn, &fedstreampb.StreamRef{Query: "q", TaskId: "up"}, "down", false, func() uint64 { return 10 })
	}()
	waitFor(t, "the relay's ack under the caller's key", func() bool {
		st := b.Stats()
		return st.Subscribers == 2 && st.Laggard == "down"
	})
	if st := b.Stats(); st.Tuples != 10 {
		t.Fatalf("an ack in another's name discarded tuples: %+v", st)
	}
	cancel()
	<-done
	if got := NewServer(&mapResolver{}, nil, nil).subscriberKey(context.Background(), "down"); got != "down" {
		t.Fatalf("plaintext key %q, want the name", got)
	}
}

// TestHeldBufferWaitsForSubscribers: the output of a copy that continues
// another (a moved task) has no subscriber until its consumers switch to
// it. Held (HoldUntilConnected), a full buffer blocks its producer well
// past the overrun grace and discards nothing; the first subscriber to
// connect ends the hold, and what it has not taken is there. (Without
// the hold the producer discarded the oldest tuples after the grace: the
// consumers that switched later missed them.)
func TestHeldBufferWaitsForSubscribers(t *testing.T) {
	const grace = 20 * time.Millisecond
	b := NewOutputBuffer(BufferOptions{MaxTuples: 10, OverrunGrace: grace, Lease: time.Minute})
	b.HoldUntilConnected()
	fill(t, b, 1, 10)
	done := make(chan error, 1)
	go func() { done <- b.Append(context.Background(), dataTuple(11, "x")) }()
	waitFor(t, "producer blocked", func() bool { return b.Stats().BlockedAppends == 1 })
	select {
	case err := <-done:
		t.Fatalf("append returned %v (stats %+v) while no subscriber had come", err, b.Stats())
	case <-time.After(20 * grace):
	}
	if st := b.Stats(); st.Overrun != 0 || st.OldestID != 1 {
		t.Fatalf("stats while held: %+v", st)
	}
	b.Connect("down")
	defer b.Disconnect("down")
	b.Ack("down", 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Overrun != 0 || st.OldestID != 2 {
		t.Fatalf("stats after the subscriber came: %+v", st)
	}
}

// TestLeaveForgetsSubscriber: a subscriber that leaves (a superseded
// copy) holds nothing any more, at once instead of after its lease; one
// whose subscription has not ended yet on the server's side is dropped
// when it ends.
func TestLeaveForgetsSubscriber(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{Lease: time.Hour})
	b.Register("old")
	b.Connect("new")
	defer b.Disconnect("new")
	fill(t, b, 1, 10)
	b.Ack("new", 10)
	if st := b.Stats(); st.Tuples != 10 || st.Laggard != "old" {
		t.Fatalf("before the leave: %+v", st)
	}
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": b}})
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
	if err := Leave(context.Background(), conn, ref, "old"); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.Tuples != 0 || st.Subscribers != 1 {
		t.Fatalf("after the leave the buffer still holds for it: %+v", st)
	}
	// Still connected when it leaves: dropped when its subscription ends.
	b.Connect("late")
	fill(t, b, 11, 15)
	b.Ack("new", 15)
	b.Forget("late")
	if st := b.Stats(); st.Subscribers != 2 {
		t.Fatalf("a connected subscriber was dropped at once: %+v", st)
	}
	b.Disconnect("late")
	if st := b.Stats(); st.Subscribers != 1 || st.Tuples != 0 {
		t.Fatalf("after its subscription ended: %+v", st)
	}
}

// TestRegisterHoldsWithoutReading: Register returns once the producer has
// registered the subscriber, also when its buffer holds nothing (a
// registration that waited for a first batch waited for its deadline
// there), reads and acknowledges nothing, and from then on the buffer
// keeps what the registered subscriber has not acknowledged.
func TestRegisterHoldsWithoutReading(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	addr := startServer(t, &mapResolver{bufs: map[string]*OutputBuffer{"up": b}})
	pool := NewPool()
	defer pool.Close()
	conn, err := pool.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ref := &fedstreampb.StreamRef{Query: "q", TaskId: "up", Consumer: "down"}
	if err := Register(ctx, conn, ref, "down/copy"); err != nil {
		t.Fatalf("register with an empty buffer: %v", err)
	}
	if st := b.Stats(); st.Subscribers != 1 || st.Connected != 0 {
		t.Fatalf("after the registration: %+v, want one subscriber, none connected", st)
	}
	fill(t, b, 1, 10)
	if st := b.Stats(); st.Tuples != 10 || st.OldestID != 1 {
		t.Fatalf("the registered subscriber did not hold the buffer: %+v", st)
	}
	if err := Register(ctx, conn, &fedstreampb.StreamRef{Query: "q", TaskId: "nope", Consumer: "down"}, "down/copy"); status.Code(err) != codes.NotFound {
		t.Fatalf("register with an unknown stream: %v, want NotFound", err)
	}
}
