package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrStopSubscription, returned by a DeliverFunc, ends the subscription
// after the batch is acknowledged; Run then returns nil.
var ErrStopSubscription = errors.New("dataplane: subscription stopped by consumer")

// ErrProtocol means an upstream sent a batch that does not decode or does
// not match its header.
var ErrProtocol = errors.New("dataplane: malformed batch")

// Batch is a decoded batch handed to a DeliverFunc: only tuples newer than
// everything delivered before (duplicates after a resubscription are
// dropped), in stream order.
//
// The tuples and their values live in memory owned by this batch alone.
// Unless the consumer calls Release, that memory is never reused, so a
// consumer may keep it. Strings (and bytes) values alias the received
// message or, for a local stream, the producer's buffer, neither of which
// is ever modified or reused: they stay valid even after Release.
type Batch struct {
	Tuples []tuple.Tuple
	// FirstID and LastID are the ids of the first and last tuple
	// delivered; the ids in between are consecutive.
	FirstID, LastID uint64
	// Offset is the producer's position offset at LastID (see
	// OutputBuffer.MarkNonStable): LastID-Offset is the stable id of the
	// stream's last stable tuple or boundary up to LastID.
	Offset uint64
	// Lineage and LineageSince name the numbering of the producer's
	// stable ids as of this batch (OutputBuffer.Diverge).
	Lineage, LineageSince uint64
	// Named: on a subscription's first batch, the ranges of the
	// UNCORRECTABLE records the producer put on its stream
	// (OutputBuffer.NoteUncorrectable), whether or not their positions
	// are still held.
	Named [][2]int64
	// For a subscriber that keeps values packed (KeepValuesPacked) or
	// delivers encodings (DeliverEncoded): Encoded holds the delivered
	// tuples as they were received, tuple i starting at Offsets[i]. With
	// DeliverEncoded, Tuples is empty; Encoded and Offsets are then the
	// consumer's to keep and never modified (Encoded is the received
	// message, or a copy of a local producer's bytes), so a consumer may
	// adopt them whole (see OutputBuffer.Adopt).
	Encoded []byte
	Offsets []int

	// The arrays Tuples and their Values were decoded into, recycled by
	// Release.
	tupleArray []tuple.Tuple
	valueArray []tuple.Value
	recyclable bool
	// msgBuf, when set, is the received message the tuples' packed values
	// alias: Release hands it back to the receive buffer pool.
	msgBuf *[]byte
}

// Len is the number of tuples delivered.
func (b *Batch) Len() int {
	if b.Tuples == nil {
		return len(b.Offsets)
	}
	return len(b.Tuples)
}

// Release hands the batch's tuple and value arrays back for reuse by
// later batches. It is optional (a batch never released is simply
// collected), but once it is called neither b nor its Tuples, nor their
// Values slices, may be used again; strings taken from the values stay
// valid. Tuples whose values are packed (Subscriber.KeepValuesPacked) are
// the exception: the received message they alias is reused too, so the
// consumer must have copied them (encoded them elsewhere) before. Call it
// at most once, and only for a batch a Subscriber delivered.
func (b *Batch) Release() {
	if !b.recyclable {
		return
	}
	b.recyclable = false
	b.Tuples, b.FirstID, b.LastID, b.Named = nil, 0, 0, nil
	b.Encoded, b.Offsets = nil, nil
	if b.msgBuf != nil {
		sharedDirtyPool.Put(b.msgBuf)
		b.msgBuf = nil
	}
	batchPool.Put(b)
}

// batchPool holds released batches with their arrays.
var batchPool sync.Pool

// decodedBatches counts the batches decoded into tuple arrays in this
// process, freshBatches those of them whose tuple array was allocated
// rather than recycled from a released batch (see DecodeStats).
var decodedBatches, freshBatches atomic.Uint64

// DecodeStats reports how many batches this process decoded into tuple
// arrays and how many of them needed a newly allocated array (no released
// batch with a large enough one was at hand). Consumers that release
// their batches keep fresh far below batches at a steady batch size; a
// consumer that never releases makes every batch fresh. For diagnostics
// and tests.
func DecodeStats() (batches, fresh uint64) { return decodedBatches.Load(), freshBatches.Load() }

// relaySends counts the acknowledgements this process's ack relays sent
// over the network (RelayAcks; a relay to a replica in this process sends
// none). See RelaySends.
var relaySends atomic.Uint64

// RelaySends reports how many relayed acknowledgements this process sent
// over the network: one message each, which costs the relaying and the
// serving worker gRPC work whatever it carries. For diagnostics and
// benchmarks (BenchmarkDCAAOverhead's relay-msgs/op).
func RelaySends() uint64 { return relaySends.Load() }

// DeliverFunc consumes one batch; the batch is the consumer's from then
// on (the subscriber does not touch it again), so it may Release it,
// during the call or later. It may block (that is flow control: the
// subscription stops reading, the HTTP/2 window fills and the upstream's
// buffer stops draining) and should honour ctx. The batch is acknowledged
// when DeliverFunc returns nil or ErrStopSubscription.
type DeliverFunc func(ctx context.Context, b *Batch) error

// Subscriber pulls one stream, possibly over successive connections to
// different replicas of the producer: each Run resumes after the last id
// delivered, so nothing is lost or delivered twice as long as the replicas
// assign identical ids.
type Subscriber struct {
	ref   *fedstreampb.StreamRef
	name  string
	noAck bool
	// packed: deliver tuples with their values packed (tuple.DecodeHeader);
	// reuseMessages: received messages return to a pool on Release;
	// index: deliver only the batch's encoding and index (DeliverEncoded).
	packed, reuseMessages, index bool
	last                         atomic.Uint64
	// onState, when set, hears every received batch's in-band state
	// (see OnStreamState).
	onState StateFunc
	// level is the data-plane level the subscriber states (this build's
	// unless StateLevel); upstream is the level the serving worker
	// stated in its response header (0: none, an older build).
	level    int32
	upstream atomic.Int32
	// stableResume: the next Run's or RunLocal's resume point is the
	// consumer's last stable id, not a position (ResumeAfterStable).
	stableResume atomic.Bool
	// resumeTag: the lineage of the stable id resumed after
	// (ResumeAfterStableTagged), set and read between Runs only.
	resumeTag StableTag
}

// NewSubscriber prepares a subscription to ref that will resume after
// afterID. name identifies the subscriber for acknowledgement accounting (a
// downstream task uses its task id, so its replacement inherits its place);
// noAck subscribers (tail clients) never hold the upstream buffer back.
func NewSubscriber(ref *fedstreampb.StreamRef, name string, noAck bool, afterID uint64) *Subscriber {
	s := &Subscriber{ref: ref, name: name, noAck: noAck, level: rpc.DataPlaneLevel}
	s.last.Store(afterID)
	return s
}

// StateLevel makes the subscriber state data-plane level l instead of this
// build's (0: none, as builds before levels did), so the server treats it
// as a subscriber of that level. Tests use it to play an older build.
// Call it before Run.
func (s *Subscriber) StateLevel(l int32) { s.level = l }

// UpstreamLevel is the data-plane level the serving worker stated on the
// last subscription that received a message: 0 before that, or when the
// server runs a build from before levels existed.
func (s *Subscriber) UpstreamLevel() int32 { return s.upstream.Load() }

// KeepValuesPacked makes the subscriber deliver tuples whose values are
// not decoded (tuple.DecodeHeader), for a consumer that re-encodes them
// elsewhere without looking at them (a sink that renumbers its merged
// input). The received message goes back to a pool on Release, so the
// consumer must have copied what it keeps of the batch by then. Call it
// before Run.
func (s *Subscriber) KeepValuesPacked() { s.packed, s.reuseMessages = true, true }

// DeliverEncoded makes the subscriber deliver batches as they were
// received: Encoded, Offsets and IDs, with every tuple's header checked
// but no Tuples, for a consumer that forwards them unchanged (a sink
// passing its one input through). The three are the consumer's to keep.
// Call it before Run.
func (s *Subscriber) DeliverEncoded() { s.packed, s.index = true, true }

// ResumeAfter makes the next Run resume after id (a DCAA consumer going
// back to the last stable tuple it took when it moves to another
// replica). Not while Run runs.
func (s *Subscriber) ResumeAfter(id uint64) {
	s.last.Store(id)
	s.stableResume.Store(false)
}

// ResumeAfterStable is ResumeAfter for a consumer that resumes after
// its last stable id sid (a DCAA operator input moving to another
// replica, whose machine skips by stable id what it took): on a replica
// that went tentative before sid, the next Run or RunLocal reads that
// replica's tentative tail from its start (SubscribeRequest.resume_stable,
// OutputBuffer.ResumePosition), so its first batch may start at or below
// sid, and nothing of it is dropped as delivered before. Once a batch
// is delivered, the subscriber resumes by position again (on the same
// replica, a retry must not get the tail twice). Not while Run runs.
func (s *Subscriber) ResumeAfterStable(sid uint64) {
	s.ResumeAfterStableTagged(StableTag{ID: sid})
}

// ResumeAfterStableTagged is ResumeAfterStable after g.ID, stating its
// lineage and stream time (g.Known): a replica numbering its stable ids
// otherwise takes the resumption as an acknowledgement by stream time
// only (OutputBuffer.TaggedPosition), not of the positions up to g.ID.
// Not while Run runs.
func (s *Subscriber) ResumeAfterStableTagged(g StableTag) {
	s.last.Store(g.ID)
	s.resumeTag = g
	s.stableResume.Store(true)
}

// LastID is the id of the last tuple delivered (or the initial afterID).
func (s *Subscriber) LastID() uint64 { return s.last.Load() }

// Ref is the stream this subscriber pulls.
func (s *Subscriber) Ref() *fedstreampb.StreamRef { return s.ref }

// Acknowledgements are cumulative and need not follow every batch: a
// subscriber acknowledges once ackEveryTuples tuples or ackEveryBytes
// bytes arrived since its last acknowledgement, and otherwise at most
// ackDelay after the last delivery, so an idle stream is acknowledged
// completely and a producer blocked on a full buffer always gets room.
const (
	ackEveryTuples = 4 << 10
	ackEveryBytes  = 256 << 10
	ackDelay       = time.Millisecond
)

// acker sends a subscription's cumulative acknowledgements: at once when
// enough is unacknowledged, otherwise from a timer. mu serialises Sends
// (gRPC allows one sender at a time) and closed stops the timer's sends
// once Run returns.
type acker struct {
	mu      sync.Mutex
	send    func(id uint64) error
	acked   uint64 // last id acknowledged
	pending uint64 // last id delivered
	tuples  int    // delivered and not acknowledged
	bytes   int
	timer   *time.Timer
	armed   bool
	closed  bool
	err     error // first failed timer send, reported by the next delivery
}

func newAcker(send func(id uint64) error, acked uint64) *acker {
	a := &acker{send: send, acked: acked, pending: acked}
	a.timer = time.AfterFunc(time.Hour, a.flushTimer)
	a.timer.Stop()
	return a
}

// delivered records that every tuple up to id was delivered; now forces an
// immediate acknowledgement.
func (a *acker) delivered(id uint64, tuples, bytes int, now bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return a.err
	}
	a.pending = id
	a.tuples += tuples
	a.bytes += bytes
	if now || a.tuples >= ackEveryTuples || a.bytes >= ackEveryBytes {
		return a.flushLocked()
	}
	if !a.armed {
		a.armed = true
		a.timer.Reset(ackDelay)
	}
	return nil
}

func (a *acker) flushLocked() error {
	if a.pending <= a.acked {
		return nil
	}
	if err := a.send(a.pending); err != nil {
		return err
	}
	a.acked, a.tuples, a.bytes = a.pending, 0, 0
	return nil
}

func (a *acker) flushTimer() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.armed = false
	if a.closed || a.err != nil {
		return
	}
	a.err = a.flushLocked()
}

// close stops the timer; no acknowledgement is sent after it returns.
func (a *acker) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.timer.Stop()
}

// Run subscribes over conn and delivers batches until ctx ends, the stream
// fails, or deliver returns an error. It returns nil only when deliver
// returned ErrStopSubscription; a server-ended stream is an error (io.EOF
// wrapped) so the caller can resubscribe, possibly elsewhere.
func (s *Subscriber) Run(ctx context.Context, conn grpc.ClientConnInterface, deliver DeliverFunc) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // also ends the RPC, whatever the exit path
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return err
	}
	after := s.last.Load()
	open := &fedstreampb.SubscribeRequest{Stream: s.ref, AfterId: after, Subscriber: s.name, NoAck: s.noAck, DataplaneLevel: s.level,
		ResumeStable: s.stableResume.Load() && !s.noAck}
	if open.ResumeStable {
		s.resumeTag.setOn(open)
	}
	if err := stream.Send(open); err != nil {
		return recvError(stream, err)
	}
	// floor: tuples at or below it were delivered before (dropped); by
	// stable id, the server may start below after (ResumeByStableID).
	floor := after
	if open.ResumeStable {
		floor = 0
	}
	var ack *acker
	if !s.noAck {
		msg := &fedstreampb.SubscribeRequest{}
		ack = newAcker(func(id uint64) error {
			msg.AckId = id
			return stream.Send(msg)
		}, floor)
		defer ack.close()
	}
	dec := batchDecoder{packed: s.packed, index: s.index}
	rb := receivedBatch{pooled: s.reuseMessages}
	headerRead := false
	for {
		// RecvMsg into a receivedBatch (see batchCodec) rather than Recv:
		// the message lands in a pooled buffer, which a batch of packed
		// tuples hands back on Release.
		err := stream.RecvMsg(&rb)
		if err == io.EOF {
			return fmt.Errorf("dataplane: upstream ended the stream: %w", err)
		}
		if status.Code(err) == codes.OutOfRange {
			return fmt.Errorf("%w: %v", ErrEndedBefore, err)
		}
		if err != nil {
			return err
		}
		if !headerRead {
			// The server's level came with its first message.
			headerRead = true
			s.upstream.Store(headerLevel(stream))
		}
		msg := &rb.Batch
		if s.onState != nil {
			s.onState(msg.ReplicaState, msg.TentativeWatermark, msg.Count == 0)
		}
		if msg.Count == 0 {
			if rb.buf != nil {
				sharedDirtyPool.Put(rb.buf)
				rb.buf = nil
			}
			continue // a heartbeat
		}
		b, err := dec.decode(msg.Data, int(msg.Count), msg.LastId, floor)
		if err != nil {
			return err
		}
		b.Offset = msg.PositionOffset
		b.Lineage, b.LineageSince = msg.Lineage, msg.LineageSince
		b.Named = RangePairs(msg.NamedRanges)
		if s.reuseMessages {
			b.msgBuf = rb.buf
		}
		rb.buf = nil
		if b.Len() == 0 {
			b.Release()
			continue // only duplicates
		}
		// b belongs to deliver from now on (it may Release it).
		lastID, delivered := b.LastID, b.Len()
		derr := deliver(ctx, b)
		if derr != nil && !errors.Is(derr, ErrStopSubscription) {
			return derr
		}
		s.last.Store(lastID)
		s.stableResume.Store(false) // a position of this replica from now on
		floor = lastID
		if ack != nil {
			if err := ack.delivered(lastID, delivered, len(msg.Data), derr != nil); err != nil {
				return recvError(stream, err)
			}
		}
		if derr != nil {
			if ack != nil {
				ack.close()
				finish(stream, cancel)
			}
			return nil
		}
	}
}

// finishTimeout bounds how long a stopping subscriber waits for the
// upstream to confirm its last acknowledgement.
const finishTimeout = time.Second

// finish half-closes a subscription whose last acknowledgement was just
// sent and waits (briefly) for the server to end the stream: cancelling
// at once could drop that acknowledgement in flight. Batches still
// arriving are discarded.
func finish(stream fedstreampb.DataPlane_SubscribeClient, cancel context.CancelFunc) {
	if stream.CloseSend() != nil {
		return
	}
	timer := time.AfterFunc(finishTimeout, cancel)
	defer timer.Stop()
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}

// RunLocal is Run for a producer in this process: it reads buf directly,
// with the same resumption, acknowledgement and delivery semantics, and
// without a connection. Delivered strings alias buf's memory, which is
// never modified or reused. A closed buffer ends it with an error wrapping
// ErrClosed, so the caller resubscribes.
func (s *Subscriber) RunLocal(ctx context.Context, buf *OutputBuffer, deliver DeliverFunc) error {
	if !s.noAck {
		buf.Connect(s.name)
		defer buf.Disconnect(s.name)
	}
	dec := batchDecoder{packed: s.packed, index: s.index}
	start := s.last.Load()
	if !s.noAck {
		buf.resumeFirst(start) // as Server.Subscribe
	}
	if !s.noAck && start > 0 {
		buf.NoteHeld(start) // as Server.Subscribe
	}
	from := start // the start's acknowledgement, below
	if s.stableResume.Swap(false) && !s.noAck {
		// As Server.Subscribe; from here on a position of buf.
		s.last.Store(buf.ResumePosition(start))
		from = s.last.Load()
		if g := s.resumeTag; g.Known {
			if p, same := buf.TaggedPosition(g); !same {
				from = p
			}
		}
	}
	at := s.last.Load()
	namedSent := false // the first batch carries the stream's named ranges (Batch.Named)
	for {
		if !s.noAck && (buf.endedBefore(start) || buf.endDiscardedAfter(s.last.Load())) {
			return fmt.Errorf("%w: local stream %s/%s after %d", ErrEndedBefore, s.ref.Query, s.ref.TaskId, start)
		}
		data, count, last, _, wait, err := buf.Read(s.last.Load(), localBatchBytes)
		if err != nil {
			return fmt.Errorf("dataplane: local stream %s/%s: %w", s.ref.Query, s.ref.TaskId, err)
		}
		if count == 0 && !s.noAck && at > 0 && s.last.Load() == at {
			// As Server.Subscribe: the position this subscription
			// starts from is its acknowledgement (clamped) while this
			// replica is behind it; by stream time when it resumes by
			// stable id of another lineage (TaggedPosition).
			buf.Ack(s.name, from)
		}
		if count == 0 {
			var hb <-chan time.Time
			stop := func() bool { return false }
			if s.onState != nil {
				hb, stop = heartbeatTimer(buf)
			}
			select {
			case <-wait:
			case <-hb:
				st, wm := buf.stateUpTo(s.last.Load())
				s.onState(st, wm, true)
			case <-ctx.Done():
				stop()
				return ctx.Err()
			}
			stop()
			continue
		}
		if s.onState != nil {
			st, wm := buf.stateUpTo(last)
			s.onState(st, wm, false)
		}
		b, err := dec.decode(data, count, last, s.last.Load())
		if err != nil {
			return err
		}
		if b.Len() == 0 {
			b.Release()
			continue
		}
		if s.packed && !s.reuseMessages {
			// Encoded aliases the producer's chunk, a piece of a larger
			// allocation: a consumer keeping it must keep a copy the
			// size of the batch, not pin the producer's memory.
			own := allocUncleared(len(b.Encoded))
			copy(own, b.Encoded)
			b.Encoded = own
		}
		// b belongs to deliver from now on (it may Release it).
		lastID := b.LastID
		b.Offset = buf.PositionOffset(lastID)
		b.Lineage, b.LineageSince = buf.Lineage()
		if !namedSent {
			namedSent = true
			b.Named = buf.NamedRanges()
		}
		derr := deliver(ctx, b)
		if derr != nil && !errors.Is(derr, ErrStopSubscription) {
			return derr
		}
		s.last.Store(lastID)
		if !s.noAck {
			buf.Ack(s.name, lastID) // a local acknowledgement is cheap: every batch
		}
		if derr != nil {
			return nil
		}
	}
}

// A relay sends its subscriber's progress when it moved, looking every
// relayEvery. An upstream replica behind the one read from clamps the
// acknowledgement to what it has produced, and takes the rest from a
// repetition: the serving worker applies the last one again every
// relayRefresh (Server.relayed), and the relay repeats an unchanged one
// over the network only every relayRepeat, for a worker of an older
// build, which does not. A relay to a replica in this process applies it
// every relayEvery.
//
// Until session 18 the relay itself repeated it every relayRefresh: in
// BenchmarkDCAAOverhead the relays then sent 1244-1378 messages per run
// of the k=2 query (about 810 since), most of the difference unchanged
// repetitions from relays whose consumer had not moved, against about
// 470 data batches and their acknowledgements per run of the k=1 copies
// (and 290 batches, 200 acknowledgements, 410 heartbeats of k=2's); each
// is a frame written and read with a system call on both workers for a
// few bytes, the largest cost replication added outside the operators
// and the DCAA machine. (Looking every 50 ms instead of 20 cut them to
// about 700 more: not worth the slower flow control.)
const (
	relayEvery   = 20 * time.Millisecond
	relayRefresh = 250 * time.Millisecond
	relayRepeat  = 2 * time.Second
)

// RelayAcks keeps an ack-only subscription to ref over conn under name,
// acknowledging progress() (the id up to which the subscriber has taken
// the stream, read from another replica: ids are the same on every
// replica) until ctx ends (it then returns nil) or the subscription fails.
// The upstream replica thus keeps what this subscriber might still need
// after switching to it, and discards what it has taken. stable: progress
// is a stable id (a DCAA consumer), which the upstream maps to its own
// position of it (SubscribeRequest.ack_stable).
func RelayAcks(ctx context.Context, conn grpc.ClientConnInterface, ref *fedstreampb.StreamRef, name string, stable bool, progress func() uint64) error {
	return RelayAcksTagged(ctx, conn, ref, name, stable, untagged(progress))
}

// untagged makes a progress function of ids a tagged one that states no
// lineage.
func untagged(progress func() uint64) func() (uint64, StableTag) {
	return func() (uint64, StableTag) { return progress(), StableTag{} }
}

// RelayAcksTagged is RelayAcks for a DCAA consumer (stable) that knows
// the lineage of its stable ids: progress returns the id to acknowledge
// (what an older server applies) and the tag (StableTag) a server of this
// build applies instead when it is known (OutputBuffer.TaggedPosition).
func RelayAcksTagged(ctx context.Context, conn grpc.ClientConnInterface, ref *fedstreampb.StreamRef, name string, stable bool, progress func() (uint64, StableTag)) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(rctx)
	if err != nil {
		return err
	}
	last, tag := progress()
	open := &fedstreampb.SubscribeRequest{Stream: ref, Subscriber: name, AckOnly: true, AckStable: stable, AckId: last}
	tag.setOn(open)
	if err := stream.Send(open); err != nil {
		return recvError(stream, err)
	}
	// The server sends nothing on an ack-only subscription: a Recv
	// returning means it ended it.
	ended := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		ended <- err
	}()
	ticker := time.NewTicker(relayEvery)
	defer ticker.Stop()
	msg := &fedstreampb.SubscribeRequest{}
	lastSent := time.Now()
	for {
		select {
		case <-ctx.Done():
			cancel()
			<-ended
			return nil
		case err := <-ended:
			if err == nil || err == io.EOF {
				err = fmt.Errorf("dataplane: upstream ended the ack relay: %w", io.EOF)
			}
			return err
		case now := <-ticker.C:
			id, g := progress()
			if id == last && g == tag && now.Sub(lastSent) < relayRepeat {
				continue
			}
			msg.Reset()
			msg.AckId = id
			g.setOn(msg)
			if err := stream.Send(msg); err != nil {
				cancel()
				err = <-ended
				return err
			}
			relaySends.Add(1)
			last, tag, lastSent = id, g, now
		}
	}
}

// RelayAcksLocal is RelayAcks for an upstream replica in this process.
func RelayAcksLocal(ctx context.Context, buf *OutputBuffer, name string, stable bool, progress func() uint64) error {
	return RelayAcksLocalTagged(ctx, buf, name, stable, untagged(progress))
}

// RelayAcksLocalTagged is RelayAcksTagged for an upstream replica in
// this process.
func RelayAcksLocalTagged(ctx context.Context, buf *OutputBuffer, name string, stable bool, progress func() (uint64, StableTag)) error {
	buf.Connect(name)
	defer buf.Disconnect(name)
	ticker := time.NewTicker(relayEvery)
	defer ticker.Stop()
	for {
		id, g := progress()
		id = buf.relayedPosition(stable, id, g)
		buf.NoteHeld(id)  // as Server.Subscribe's relay
		buf.Ack(name, id) // clamped, cheap: every time
		select {
		case <-ctx.Done():
			return nil
		case <-buf.Done():
			return fmt.Errorf("dataplane: ack relay: %w", ErrClosed)
		case <-ticker.C:
		}
	}
}

// localBatchBytes bounds the batches RunLocal reads: a chunk at most.
const localBatchBytes = chunkSize

// recvError turns a failed Send into the stream's real status: gRPC
// reports io.EOF from Send and the cause from Recv.
func recvError(stream fedstreampb.DataPlane_SubscribeClient, err error) error {
	if err == io.EOF {
		if _, rerr := stream.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// batchDecoder decodes batches. Each batch gets tuple and value arrays
// of its own: released ones (see Batch.Release) or fresh ones sized from
// the previous batch, so that a batch costs at most two allocations, not
// some per tuple.
type batchDecoder struct {
	valuesPerTuple int
	// packed leaves every tuple's values packed (tuple.DecodeHeader);
	// index delivers only the batch's encoding and index.
	packed, index bool
}

// newBatch returns a batch whose arrays hold count tuples and (unless the
// values stay packed) values for count tuples of the usual width.
func (d *batchDecoder) newBatch(count int) *Batch {
	b, _ := batchPool.Get().(*Batch)
	if b == nil {
		b = &Batch{}
	}
	b.recyclable = true
	decodedBatches.Add(1)
	// Fresh arrays get some slack so that a recycled batch serves the
	// next, slightly larger one too.
	if cap(b.tupleArray) < count {
		b.tupleArray = make([]tuple.Tuple, count+count/4)
		freshBatches.Add(1)
	}
	if n := count * max(1, d.valuesPerTuple); !d.packed && cap(b.valueArray) < n {
		b.valueArray = make([]tuple.Value, n+n/4)
	}
	b.Tuples = b.tupleArray[:count]
	return b
}

// batchIDs checks a batch header (count tuples, the last one lastID; the
// ids are consecutive) and returns the first tuple's id and how many
// tuples, from the first, were delivered before (id <= after: duplicates
// after a resubscription).
func batchIDs(count int, lastID, after uint64) (first uint64, skip int, err error) {
	if count <= 0 || lastID < uint64(count) {
		return 0, 0, fmt.Errorf("%w: header says %d tuples ending with id %d", ErrProtocol, count, lastID)
	}
	first = lastID - uint64(count) + 1
	if after >= first {
		skip = int(min(after-first+1, uint64(count)))
	}
	return first, skip, nil
}

// decode decodes count tuples from data, keeping those with id > after,
// and checks them against the header (count, lastID).
func (d *batchDecoder) decode(data []byte, count int, lastID, after uint64) (_ *Batch, err error) {
	first, skip, err := batchIDs(count, lastID, after)
	if err != nil {
		return nil, err
	}
	if d.index || d.packed {
		return d.decodeHeaders(data, count, first, skip)
	}
	b := d.newBatch(count - skip)
	defer func() {
		if err != nil {
			b.Release()
		}
	}()
	values := b.valueArray[:cap(b.valueArray)]
	used := 0 // values[:used] belong to decoded tuples
	var scratch tuple.Tuple
	n, off := 0, 0
	for off < len(data) {
		if n == count {
			return nil, fmt.Errorf("%w: header says %d tuples, data holds more", ErrProtocol, count)
		}
		if n < skip {
			// Delivered before a resubscription: checked, not kept.
			k, err := tuple.DecodeTuple(data[off:], &scratch)
			if err != nil {
				return nil, fmt.Errorf("%w: at byte %d of batch: %w", ErrProtocol, off, err)
			}
			off += k
			n++
			continue
		}
		t := &b.Tuples[n-skip]
		// Decode straight into the value array: DecodeTuple reuses the
		// capacity it is given, and allocates only when the array is full.
		t.Values = values[used:used:len(values)]
		k, err := tuple.DecodeTuple(data[off:], t)
		if err != nil {
			return nil, fmt.Errorf("%w: at byte %d of batch: %w", ErrProtocol, off, err)
		}
		t.ID = first + uint64(n)
		off += k
		n++
		nv := len(t.Values)
		if nv > 0 && used+nv <= len(values) && &t.Values[0] == &values[used] {
			used += nv
		} else if nv > 0 {
			// The array was full: the tuple got its own; start a new
			// array for the rest.
			values = make([]tuple.Value, (count-n)*max(nv, d.valuesPerTuple))
			used = 0
			// The earlier array stays with the tuples decoded into it;
			// Release recycles the larger one.
			b.valueArray = values
		}
		t.Values = t.Values[:nv:nv]
		d.valuesPerTuple = max(d.valuesPerTuple, nv)
	}
	if err := b.trim(n, count, first, skip, lastID); err != nil {
		return nil, err
	}
	return b, nil
}

// trim checks that a decoded batch held as many tuples as its header says
// (n decoded, count announced) and sets its ids (tuples from first+skip to
// lastID delivered).
func (b *Batch) trim(n, count int, first uint64, skip int, lastID uint64) error {
	if n != count {
		return fmt.Errorf("%w: header says %d tuples, data holds %d", ErrProtocol, count, n)
	}
	if skip < count {
		b.FirstID, b.LastID = first+uint64(skip), lastID
	}
	return nil
}

// decodeHeaders is decode for a subscriber that keeps values packed or
// delivers encodings: each tuple's size and header are checked, and the
// batch's encoding and offsets kept. With packed values each kept tuple's
// header goes to Tuples; delivering encodings, nobody reads the headers,
// so they go to one scratch tuple instead of an array of them.
func (d *batchDecoder) decodeHeaders(data []byte, count int, first uint64, skip int) (_ *Batch, err error) {
	var b *Batch
	keep := !d.index
	if keep {
		b = d.newBatch(count - skip)
	} else {
		if b, _ = batchPool.Get().(*Batch); b == nil {
			b = &Batch{}
		}
		b.recyclable = true
		b.Tuples = nil
	}
	defer func() {
		if err != nil {
			b.Release()
		}
	}()
	b.Offsets = make([]int, 0, count-skip)
	var scratch tuple.Tuple
	n, off, start := 0, 0, 0 // start: offset of the first tuple kept
	for off < len(data) {
		if n == count {
			return nil, fmt.Errorf("%w: header says %d tuples, data holds more", ErrProtocol, count)
		}
		t := &scratch
		if keep && n >= skip {
			t = &b.Tuples[n-skip]
		}
		k, err := tuple.DecodeHeader(data[off:], t)
		if err != nil {
			return nil, fmt.Errorf("%w: at byte %d of batch: %w", ErrProtocol, off, err)
		}
		t.ID = first + uint64(n)
		at := off
		off += k
		n++
		if n <= skip {
			start = off
			continue // already delivered before a resubscription
		}
		b.Offsets = append(b.Offsets, at-start)
	}
	if err := b.trim(n, count, first, skip, first+uint64(count)-1); err != nil {
		return nil, err
	}
	b.Encoded = data[start:len(data):len(data)]
	return b, nil
}

// Subscribe is the one-shot form of NewSubscriber(ref, name, false,
// afterID).Run(ctx, conn, deliver); it returns the last id delivered.
func Subscribe(ctx context.Context, conn grpc.ClientConnInterface, ref *fedstreampb.StreamRef, afterID uint64, name string, deliver DeliverFunc) (uint64, error) {
	s := NewSubscriber(ref, name, false, afterID)
	err := s.Run(ctx, conn, deliver)
	return s.LastID(), err
}

// Leave tells the producer behind conn that subscriber name of stream ref
// is gone for good (see OutputBuffer.Forget): it stops holding tuples for
// it. A subscriber with a live subscription there is not forgotten.
func Leave(ctx context.Context, conn grpc.ClientConnInterface, ref *fedstreampb.StreamRef, name string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: ref, Subscriber: name, Leave: true}); err != nil {
		return recvError(stream, err)
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	if _, err := stream.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// Register makes name a subscriber of the stream ref names on the worker
// behind conn, from what its buffer holds now, without reading or
// acknowledging anything: from then on the buffer keeps every tuple name
// has not acknowledged, for one lease or until a subscription under name
// acknowledges (a copy of a task registering before its starting
// snapshot). It is an ack-only subscription that ends at once: it returns
// nil once the producer's worker has registered name, whether or not the
// buffer holds anything.
func Register(ctx context.Context, conn grpc.ClientConnInterface, ref *fedstreampb.StreamRef, name string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: ref, Subscriber: name, AckOnly: true}); err != nil {
		return recvError(stream, err)
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	// The server sends nothing on an ack-only subscription; it ends it
	// (nil status) once it has read the half-close, after registering.
	if _, err := stream.Recv(); err != io.EOF {
		if err == nil {
			err = errors.New("dataplane: data on an ack-only subscription")
		}
		return err
	}
	return nil
}

// headerLevel reads the data-plane level a serving worker stated in the
// response header of stream (0 when it stated none or garbage).
func headerLevel(stream grpc.ClientStream) int32 {
	md, err := stream.Header()
	if err != nil {
		return 0
	}
	v := md.Get(rpc.DataPlaneLevelHeader)
	if len(v) == 0 {
		return 0
	}
	l, err := strconv.ParseInt(v[0], 10, 32)
	if err != nil || l < 0 {
		return 0
	}
	return int32(l)
}
