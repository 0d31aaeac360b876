// Package dataplane moves tuples between tasks: the bounded output buffer a
// producer appends to, the DataPlane gRPC server that streams buffered
// tuples to subscribers in batches, the subscriber client that pulls them
// and acknowledges, and a pool of client connections.
//
// Flow control is end to end: a slow consumer stops acknowledging, its
// producer's buffer fills, and Append blocks; the gRPC/HTTP2 windows and the
// subscriber's bounded delivery bound what is in flight in between. Time a
// producer spends blocked is accounted (BlockedNanos), it is the
// backpressure signal. Only connected subscribers exert it: one that went
// away holds a buffer for a lease, and never beyond the buffer's bound
// (see BufferOptions.OverrunGrace and docs/DATAPLANE.md).
package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fedstream/fedstream/worker/tuple"
)

// ErrClosed is returned by a closed buffer's Append and Read.
var ErrClosed = errors.New("dataplane: output buffer closed")

// ErrIDOrder is returned by Append when a tuple's id is not greater than the
// previous tuple's id (ids are per stream and strictly increasing), and by
// a Writer when a tuple's id does not follow the previous one.
var ErrIDOrder = errors.New("dataplane: tuple ids out of order")

// ErrTooLarge is returned by Append for a tuple that exceeds the buffer's
// whole byte capacity and so could never fit.
var ErrTooLarge = errors.New("dataplane: tuple larger than buffer capacity")

// Defaults for BufferOptions.
const (
	DefaultMaxBytes  = 16 << 20
	DefaultMaxTuples = 256 << 10
	// DefaultLease is how long a subscriber without a live subscription
	// keeps holding a buffer (BufferOptions.Lease).
	DefaultLease = 30 * time.Second
	// DefaultOverrunGrace is how long a full buffer held back only by
	// subscribers that are not connected waits before it discards
	// (BufferOptions.OverrunGrace).
	DefaultOverrunGrace = 3 * time.Second
	// chunkSize is the size of the blocks encoded tuples are appended to and
	// the largest batch Read returns by default.
	chunkSize = 64 << 10
)

// BufferOptions configures an OutputBuffer.
type BufferOptions struct {
	// MaxBytes and MaxTuples bound the retained (unacknowledged) tuples;
	// Append blocks while either bound would be exceeded. Zero means the
	// default.
	MaxBytes  int
	MaxTuples int
	// ExpectedSubscribers is the number of distinct acknowledging
	// subscribers (the downstream replicas) the buffer waits for at start:
	// until that many have subscribed, or for one Lease after the buffer
	// was created, nothing is discarded (within the overrun rule below).
	// Zero means one.
	ExpectedSubscribers int
	// Lease is how long a subscriber keeps holding the buffer after its
	// last subscription ended; then it is forgotten (a subscriber that
	// comes back later starts afresh, after whatever was discarded). Zero
	// means DefaultLease.
	Lease time.Duration
	// OverrunGrace: when the buffer is full and only subscribers that are
	// not connected (disconnected ones within their lease, replicas that
	// have not subscribed yet) keep it from making room, Append waits this
	// long, then discards the oldest tuples every connected subscriber has
	// taken (the oldest, if none is connected), counts them as overrun and
	// logs a warning naming the subscribers that miss them. Connected
	// subscribers are never overrun: a slow one blocks the producer (flow
	// control). Zero means DefaultOverrunGrace.
	OverrunGrace time.Duration
	// Unreplicated: the stream's consumer has no replicas (a query
	// without replicas), so nothing else can give a subscriber that is
	// not connected what an overrun would discard, and it would miss it
	// for good. While no subscriber is connected and one still holds the
	// buffer (a disconnected one within its lease, or the start-up wait
	// for the first), the overrun rule does not discard: a full buffer
	// blocks its producer (flow control) until a subscriber connects (a
	// reconnect, or the copy that replaced a lost one) or the lease ends
	// (the subscriber is gone). A replicated stream keeps the grace: a
	// failed replica must not hold back the replicas that are fine.
	Unreplicated bool
	// Logger receives the overrun warnings (nil: slog.Default()); give it
	// the stream's attributes.
	Logger *slog.Logger
	// Ring makes the buffer a ring for result streams that clients tail:
	// Append never blocks and the oldest tuples are dropped beyond capacity,
	// whatever the acknowledgements.
	Ring bool
	// Restarted marks the stream of a copy that started again without
	// the state of the copy before it (a replacement with no snapshot:
	// no live replica to bootstrap from, or the fetch failed). Its ids
	// start again from 1 and do not continue that copy's, so a reader
	// that resumes by id must not take its position from there
	// (fedstream tail; rpc.StreamRestartedHeader).
	Restarted bool
}

// chunk is a block of encoded tuples with consecutive ids: tuple i has id
// first+i (encoded tuples do not carry their ids). Bytes in
// data[:len(data)] are never modified after they are written and a chunk's
// array is never reallocated, so batches handed out by Read may alias it
// safely.
type chunk struct {
	data  []byte
	offs  []int // start offset of each tuple in data
	first uint64
	// own: the buffer allocated data (lastChunkWithRoom), so the array
	// above its length is no one else's; adopted arrays may share theirs
	// (a received message's bytes beyond a snapshot's tuples).
	own bool
}

// last is the id of the chunk's last tuple.
func (c *chunk) last() uint64 { return c.first + uint64(len(c.offs)) - 1 }

func (c *chunk) end(i int) int {
	if i+1 < len(c.offs) {
		return c.offs[i+1]
	}
	return len(c.data)
}

// OutputBuffer is the append-only, bounded buffer of one output stream
// (one task's output to one downstream partition). The producer appends
// tuples whose ids it assigned; subscribers read batches after an id and
// acknowledge; tuples acknowledged by every expected subscriber are
// discarded. Safe for concurrent use.
type OutputBuffer struct {
	opts BufferOptions

	mu     sync.Mutex
	chunks []*chunk
	head   int // index in chunks[0] of the oldest retained tuple
	bytes  int // encoded bytes of retained tuples
	count  int // retained tuples
	lastID uint64
	// dropped is the id of the newest discarded tuple (0: none).
	dropped uint64
	// holdUntil, when set, suspends the overrun rule until a subscriber
	// connects or this time passes (HoldUntilConnected).
	holdUntil time.Time
	// subs are the acknowledging subscribers that hold the buffer: every
	// connected one, and disconnected ones within their lease.
	subs map[string]*subscriberState
	// created starts the start-up wait for ExpectedSubscribers; seen
	// names the distinct subscribers seen so far, until there are that
	// many (then it is nil and the wait is over).
	created time.Time
	seen    map[string]struct{}
	// Overrun accounting: overrun counts the tuples discarded before every
	// subscriber holding the buffer had acknowledged them; overrunning is
	// an episode of such discards (no further grace until it ends);
	// stuckSince is when Append began waiting on subscribers that are not
	// connected (zero: it is not).
	overrun     uint64
	overrunning bool
	stuckSince  time.Time
	warnedStart bool // the start-up wait was overrun (warned once)
	// blockedSince is when the Append waiting now began (zero: none).
	blockedSince time.Time
	closed       bool
	// done is closed by Close.
	done chan struct{}
	// dataCh is closed when a tuple is appended or the buffer closes;
	// spaceCh when room frees up or the buffer closes. Both are created on
	// demand so that an Append nobody waits for does not allocate.
	dataCh  chan struct{}
	spaceCh chan struct{}

	// blockedNanos is the time of the waits for room that ended.
	blockedNanos atomic.Int64
	// blocked is the number of Appends currently waiting for room, and
	// waitStarts the sum of their start times (monoNanos), under mu: the
	// waits going on add up to blocked*now - waitStarts, which Stats
	// counts in BlockedNanos as they happen.
	blocked    int
	waitStarts int64
	scratch    []byte
	// spare is the unused rest of an own chunk that was discarded whole
	// while it was the newest (every tuple in it acknowledged): the next
	// chunk is cut from it rather than allocated. A stream whose
	// subscribers keep up acknowledges each small flush before the next
	// one, and a fresh 64 KiB chunk per flush was a sixth of the reconfig
	// bench's CPU (allocation and clearing). Writing above a discarded
	// chunk's length is safe: Read hands out slices capped at what was
	// written, and nothing is written below a chunk's length.
	spare []byte
	// inband is the DCAA state the stream advertises (see inband.go).
	inband inBand
	// nonStable are the ranges of positions holding tuples outside the
	// stream's stable view (see MarkNonStable), sorted and disjoint,
	// under mu; nsBase counts such positions below the first range kept.
	nonStable []PosRange
	nsBase    uint64
	// lineage and lineageSince name the numbering of the stream's stable
	// ids (see Diverge), under mu.
	lineage, lineageSince uint64
	// named: the ranges of the UNCORRECTABLE records put on the stream
	// (NoteUncorrectable), the latest maxNamedRanges.
	named [][2]int64
	// stScan: where the last scan by stream time stopped (tagged.go),
	// under mu.
	stScan stScan
	// wanted is the highest id an acknowledging subscriber is known to
	// hold already: the position a data subscription resumed after, or a
	// relayed acknowledgement (NoteHeld). Kept apart from the
	// acknowledgements, which are clamped to what this buffer holds.
	wanted atomic.Uint64
	// renumber is set by RenumberOnFirstResume (renumber.go), under mu;
	// shift is what resumeFirst added to every id (written under mu),
	// which the Writer follows (syncShift).
	renumber renumber
	shift    atomic.Uint64
}

// NoteHeld records that an acknowledging subscriber already holds the
// stream up to id (it resumes after id, or relays that it took id from
// another copy), whatever this buffer holds. A producer that restarted
// its deterministic stream from the start without its earlier copy's
// state may produce up to Wanted without pacing: those tuples only
// bring it back to where its consumers are (see worker/runtime
// runGenerator).
func (b *OutputBuffer) NoteHeld(id uint64) {
	for {
		w := b.wanted.Load()
		if id <= w || b.wanted.CompareAndSwap(w, id) {
			return
		}
	}
}

// Wanted is the highest id NoteHeld recorded (0: none).
func (b *OutputBuffer) Wanted() uint64 { return b.wanted.Load() }

// Restarted reports BufferOptions.Restarted.
func (b *OutputBuffer) Restarted() bool { return b.opts.Restarted }

// NewOutputBuffer returns an empty buffer.
func NewOutputBuffer(opts BufferOptions) *OutputBuffer {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxTuples <= 0 {
		opts.MaxTuples = DefaultMaxTuples
	}
	if opts.ExpectedSubscribers <= 0 {
		opts.ExpectedSubscribers = 1
	}
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.OverrunGrace <= 0 {
		opts.OverrunGrace = DefaultOverrunGrace
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	b := &OutputBuffer{opts: opts, subs: make(map[string]*subscriberState), created: time.Now(), done: make(chan struct{})}
	if opts.ExpectedSubscribers > 0 && !opts.Ring {
		b.seen = make(map[string]struct{}, opts.ExpectedSubscribers)
	}
	return b
}

// subscriberState is what a buffer knows of one acknowledging subscriber.
type subscriberState struct {
	ack   uint64    // every tuple with id <= ack was taken
	conns int       // live subscriptions under this name (data or ack-only)
	left  time.Time // when conns last fell to zero: the lease runs from it
	// overrun: tuples it had not acknowledged were discarded while it was
	// not connected (warned once; cleared when it connects again).
	overrun bool
	// leaving: Forget came while it was still connected; it is dropped
	// when its last subscription ends instead of starting a lease.
	leaving bool
}

// Append adds t (its ID set by the producer) to the stream. While the
// buffer is full it blocks until subscribers acknowledge, ctx ends
// (ctx.Err() is returned) or the buffer closes (ErrClosed); blocked time is
// added to BlockedNanos. A ring buffer never blocks.
func (b *OutputBuffer) Append(ctx context.Context, t *tuple.Tuple) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if t.ID <= b.lastID {
		return fmt.Errorf("%w: id %d after %d", ErrIDOrder, t.ID, b.lastID)
	}
	b.scratch = tuple.AppendTuple(b.scratch[:0], t)
	size := len(b.scratch)
	if size > b.opts.MaxBytes {
		return fmt.Errorf("%w: %d bytes, capacity %d", ErrTooLarge, size, b.opts.MaxBytes)
	}
	if b.opts.Ring {
		for b.count > 0 && (b.bytes+size > b.opts.MaxBytes || b.count+1 > b.opts.MaxTuples) {
			b.dropOldestLocked()
		}
	} else if b.full(size) {
		if err := b.makeRoomLocked(ctx, size, nil); err != nil {
			return err
		}
	}
	b.appendLocked(t.ID, b.scratch)
	return nil
}

// makeRoomLocked waits, with b.mu held on entry and exit, until a tuple of
// size bytes fits, accounting the blocked time. idle, when not nil, is
// called (b.mu released) as the wait begins and every WaitIdleEvery while
// it lasts.
func (b *OutputBuffer) makeRoomLocked(ctx context.Context, size int, idle func()) error {
	start := time.Now()
	if b.blocked == 0 {
		b.blockedSince = start
	}
	b.blocked++
	b.waitStarts += monoNanos(start)
	err := b.waitSpaceLocked(ctx, size, idle)
	// The wait moves from the ongoing ones to the ended ones at the same
	// instant, under mu: Stats' total never goes back.
	end := time.Now()
	b.blocked--
	b.waitStarts -= monoNanos(start)
	if b.blocked == 0 {
		b.blockedSince = time.Time{}
	}
	b.stuckSince = time.Time{}
	b.blockedNanos.Add(int64(end.Sub(start)))
	return err
}

func (b *OutputBuffer) full(size int) bool {
	return b.count > 0 && (b.bytes+size > b.opts.MaxBytes || b.count+1 > b.opts.MaxTuples)
}

// WaitIdleEvery is how often a producer waiting for room calls its idle
// function (Writer.FlushIdle).
const WaitIdleEvery = 5 * time.Millisecond

// waitSpaceLocked waits, with b.mu held on entry and exit, until a tuple
// of size bytes fits: subscribers acknowledge, leases end, or the overrun
// rule discards what only subscribers that are not connected still need.
// idle, when not nil, runs with b.mu released when the wait begins and
// every WaitIdleEvery while it lasts; the wait is one wait all along (the
// blocked time, the stall report and the overrun grace count from its
// start).
func (b *OutputBuffer) waitSpaceLocked(ctx context.Context, size int, idle func()) error {
	var (
		timer    *time.Timer
		idleNext time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for b.full(size) {
		now := time.Now()
		// Forgotten subscribers free room by themselves.
		b.truncateLocked(b.lowLocked(now).all)
		if !b.full(size) {
			break
		}
		wake := b.overrunLocked(now, size)
		if !b.full(size) {
			break
		}
		if idle != nil {
			if !now.Before(idleNext) {
				b.mu.Unlock()
				idle()
				b.mu.Lock()
				if b.closed {
					return ErrClosed
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				idleNext = time.Now().Add(WaitIdleEvery)
				continue // room may have come meanwhile
			}
			if wake.IsZero() || idleNext.Before(wake) {
				wake = idleNext
			}
		}
		if b.spaceCh == nil {
			b.spaceCh = make(chan struct{})
		}
		ch := b.spaceCh
		var tick <-chan time.Time
		if !wake.IsZero() {
			d := max(time.Until(wake), time.Millisecond)
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			tick = timer.C
		}
		b.mu.Unlock()
		select {
		case <-ch:
		case <-tick:
		case <-ctx.Done():
		}
		b.mu.Lock()
		if b.closed {
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

func (b *OutputBuffer) appendLocked(id uint64, enc []byte) {
	c := b.lastChunkWithRoom(id, len(enc))
	c.offs = append(c.offs, len(c.data))
	c.data = append(c.data, enc...)
	b.bytes += len(enc)
	b.count++
	b.lastID = id
	if b.dataCh != nil {
		close(b.dataCh)
		b.dataCh = nil
	}
}

// dropOldestLocked discards the oldest retained tuple.
func (b *OutputBuffer) dropOldestLocked() {
	c := b.chunks[0]
	b.dropped = c.first + uint64(b.head)
	b.bytes -= c.end(b.head) - c.offs[b.head]
	b.count--
	b.head++
	if b.head == len(c.offs) {
		b.dropFirstChunkLocked()
	}
}

// dropFirstChunkLocked discards chunks[0], all of whose tuples are gone,
// keeping the room above its data for the next chunk when it was the
// newest and the buffer's own.
func (b *OutputBuffer) dropFirstChunkLocked() {
	c := b.chunks[0]
	if len(b.chunks) == 1 && c.own && cap(c.data)-len(c.data) >= spareMin {
		b.spare = c.data[len(c.data):len(c.data)]
	}
	b.chunks[0] = nil
	b.chunks = b.chunks[1:]
	b.head = 0
}

// spareMin is the least room worth keeping from a discarded chunk: a
// smaller rest would make a chunk that fills after a batch or two.
const spareMin = 8 << 10

// truncateLocked discards every retained tuple with id <= upTo.
func (b *OutputBuffer) truncateLocked(upTo uint64) {
	freed := false
	for b.count > 0 && b.chunks[0].first+uint64(b.head) <= upTo {
		c := b.chunks[0]
		// Whole chunk acknowledged: drop it in one step.
		if c.last() <= upTo {
			b.bytes -= len(c.data) - c.offs[b.head]
			b.count -= len(c.offs) - b.head
			b.dropped = c.last()
			b.dropFirstChunkLocked()
		} else {
			b.dropOldestLocked()
		}
		freed = true
	}
	if freed {
		b.wakeSpaceLocked()
	}
	if b.overrunning && upTo >= b.dropped {
		// Every holder has what was overrun: the episode is over.
		b.overrunning = false
	}
}

// Connect records that a subscription of the named subscriber (a data or
// an ack-only one) began: while any is live the subscriber holds the
// buffer, and its lease is renewed. A subscriber that comes back under the
// same name keeps its acknowledgement. Each Connect needs one Disconnect.
func (b *OutputBuffer) Connect(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdUntil = time.Time{}
	s := b.subLocked(name, time.Now())
	s.conns++
	s.overrun, s.leaving = false, false
}

// Disconnect records that one of the named subscriber's subscriptions
// ended; with none left its lease starts.
func (b *OutputBuffer) Disconnect(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.subs[name]
	if s == nil || s.conns == 0 {
		return
	}
	if s.conns--; s.conns == 0 && s.leaving && !b.closed {
		b.forgetLocked(name)
		return
	}
	if s.conns == 0 {
		s.left = time.Now()
		// Nothing waits on a lease's end but a blocked producer: wake it
		// so that it re-evaluates (and sets its timer).
		b.wakeSpaceLocked()
	}
}

// Forget drops the named subscriber: it is gone for good (a superseded
// copy), so it holds nothing for a lease, and what only it held may be
// discarded. One still connected (its last subscription not yet ended on
// this side) is dropped when that subscription ends.
func (b *OutputBuffer) Forget(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.subs[name]
	if s == nil || b.closed {
		return
	}
	if s.conns > 0 {
		s.leaving = true
		return
	}
	b.forgetLocked(name)
}

func (b *OutputBuffer) forgetLocked(name string) {
	delete(b.subs, name)
	b.truncateLocked(b.lowLocked(time.Now()).all)
	b.wakeSpaceLocked()
}

// HoldUntilConnected suspends the overrun rule until a subscriber
// connects, or for one Lease at most: a full buffer blocks its producer
// rather than discard what no connected subscriber has taken. For the
// output of a copy that continues another (a moved task): its consumers
// are still reading the old copy and switch to it only later, so its
// buffer has no subscriber at all for a while, and what it holds (the
// old copy's untaken tail, and what the copy produces meanwhile) is
// exactly what they will ask for. Ring buffers never wait and ignore it.
func (b *OutputBuffer) HoldUntilConnected() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.opts.Ring {
		return
	}
	b.holdUntil = time.Now().Add(b.opts.Lease)
}

// Register records an acknowledging subscriber by name (idempotent)
// without a live subscription: it holds the buffer for one lease from now
// unless it connects.
func (b *OutputBuffer) Register(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subLocked(name, time.Now())
}

// subLocked returns the named subscriber's state, creating it (not
// connected, its lease starting now) when it is new.
func (b *OutputBuffer) subLocked(name string, now time.Time) *subscriberState {
	s := b.subs[name]
	if s == nil {
		s = &subscriberState{left: now}
		b.subs[name] = s
	}
	if b.seen != nil {
		b.seen[name] = struct{}{}
		if len(b.seen) >= b.opts.ExpectedSubscribers {
			b.seen = nil // every expected subscriber has come
		}
	}
	return s
}

// Ack records that subscriber name has taken every tuple with id <= id,
// and discards what every subscriber holding the buffer has taken. Acks
// never move back, and an ack beyond the last tuple appended is clamped
// to it: acknowledgements are cumulative and repeated, so a relayed one
// that runs ahead of this replica is not lost, and one from nowhere
// cannot discard tuples not yet produced. (A server refuses, before it
// calls Ack, an ack beyond what it sent on a data subscription.)
func (b *OutputBuffer) Ack(name string, id uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return // the task stopped while the ack was in flight
	}
	now := time.Now()
	s := b.subLocked(name, now)
	if id > b.lastID {
		id = b.lastID
	}
	raised := id > s.ack
	if raised {
		s.ack = id
	}
	if s.conns == 0 {
		s.left = now // an ack renews the lease
	}
	b.truncateLocked(b.lowLocked(now).all)
	if raised && s.conns > 0 && b.blocked > 0 {
		// A producer waiting for room re-evaluates even when nothing
		// was freed: a connected subscriber taking more may let the
		// overrun rule discard what only subscribers that are not
		// connected hold. Without this it waited for their lease to
		// end (30 s by default), not for the overrun grace.
		b.wakeSpaceLocked()
	}
}

// low is what the subscribers holding a buffer have taken: all is the
// highest id every holder has acknowledged (0 while the start-up wait
// holds everything); connected the highest every connected subscriber has
// acknowledged (the last id when none is connected): what an overrun may
// discard.
type low struct {
	all, connected uint64
	anyConnected   bool
}

// lowLocked computes the low-water marks, forgetting subscribers whose
// lease ended and ending the start-up wait after its lease.
func (b *OutputBuffer) lowLocked(now time.Time) low {
	l := low{all: math.MaxUint64, connected: math.MaxUint64}
	for name, s := range b.subs {
		if s.conns == 0 && now.Sub(s.left) >= b.opts.Lease {
			delete(b.subs, name)
			b.opts.Logger.Info("output buffer forgets a subscriber whose lease ended", "subscriber", name, "acked", s.ack, "lease", b.opts.Lease)
			continue
		}
		l.all = min(l.all, s.ack)
		if s.conns > 0 {
			l.connected = min(l.connected, s.ack)
			l.anyConnected = true
		}
	}
	if b.seen != nil {
		if now.Sub(b.created) >= b.opts.Lease {
			b.seen = nil // replicas that never came do not hold it forever
		} else {
			l.all = 0
		}
	}
	if !l.anyConnected {
		l.connected = b.lastID
	}
	if l.all == math.MaxUint64 {
		// Nobody holds the buffer: keep what is there (a subscriber may
		// still come) until the overrun rule makes room.
		l.all = 0
	}
	return l
}

// overrunLocked applies the overrun rule to a full buffer that cannot take
// size more bytes: when only holders that are not connected keep tuples
// every connected subscriber has taken, it discards the oldest of those as
// needed (at once within an overrun episode, otherwise once the grace has
// passed since the producer got stuck). It returns when to look again (zero:
// only an acknowledgement or a disconnection can help).
func (b *OutputBuffer) overrunLocked(now time.Time, size int) (wake time.Time) {
	l := b.lowLocked(now)
	// The next lease to end might make room without an overrun.
	for _, s := range b.subs {
		if s.conns == 0 {
			if end := s.left.Add(b.opts.Lease); wake.IsZero() || end.Before(wake) {
				wake = end
			}
		}
	}
	if b.seen != nil {
		if end := b.created.Add(b.opts.Lease); wake.IsZero() || end.Before(wake) {
			wake = end
		}
	}
	if !b.holdUntil.IsZero() {
		if now.Before(b.holdUntil) {
			// Held for subscribers to come (HoldUntilConnected): flow
			// control until one connects.
			if wake.IsZero() || b.holdUntil.Before(wake) {
				wake = b.holdUntil
			}
			return wake
		}
		b.holdUntil = time.Time{}
	}
	if b.opts.Unreplicated && !l.anyConnected && (len(b.subs) > 0 || b.seen != nil) {
		// The only consumer is away but not gone (see
		// BufferOptions.Unreplicated): flow control until it connects
		// or its lease ends; wake says when the next lease or the
		// start-up wait ends.
		b.overrunning = false
		b.stuckSince = time.Time{}
		return wake
	}
	oldest := b.oldestLocked()
	if b.count == 0 || oldest > l.connected {
		// Every retained tuple is still needed by a connected
		// subscriber: flow control, no overrun.
		b.overrunning = false
		b.stuckSince = time.Time{}
		return wake
	}
	if !b.overrunning {
		if b.stuckSince.IsZero() {
			b.stuckSince = now
		}
		if end := b.stuckSince.Add(b.opts.OverrunGrace); now.Before(end) {
			if wake.IsZero() || end.Before(wake) {
				wake = end
			}
			return wake
		}
		b.overrunning = true
	}
	// Discard the oldest tuples, no further than every connected
	// subscriber has taken, until size bytes fit.
	from := oldest
	for b.full(size) && b.count > 0 && b.oldestLocked() <= l.connected {
		b.dropOldestLocked()
		b.overrun++
	}
	b.warnOverrunLocked(from, b.dropped)
	b.wakeSpaceLocked()
	return wake
}

// warnOverrunLocked logs, once per episode and subscriber, who misses the
// tuples from..to an overrun discarded.
func (b *OutputBuffer) warnOverrunLocked(from, to uint64) {
	for name, s := range b.subs {
		if s.conns == 0 && s.ack < to && !s.overrun {
			s.overrun = true
			b.opts.Logger.Warn("output buffer full: discarding tuples a disconnected subscriber has not acknowledged; it will resume with a gap",
				"subscriber", name, "acked", s.ack, "discarded_from", from, "discarded_to", to, "grace", b.opts.OverrunGrace)
		}
	}
	if b.seen != nil && !b.warnedStart {
		b.warnedStart = true
		b.opts.Logger.Warn("output buffer full: discarding tuples downstream replicas that have not subscribed yet will miss",
			"subscribed", len(b.seen), "expected", b.opts.ExpectedSubscribers, "discarded_from", from, "discarded_to", to)
	}
}

func (b *OutputBuffer) oldestLocked() uint64 {
	if b.count == 0 {
		return 0
	}
	return b.chunks[0].first + uint64(b.head)
}

func (b *OutputBuffer) wakeSpaceLocked() {
	if b.spaceCh != nil {
		close(b.spaceCh)
		b.spaceCh = nil
	}
}

// Read returns the encoded tuples following afterID: data is a
// concatenation of count encoded tuples (at most about maxBytes, at least
// one tuple when any is available) ending with the tuple lastID. data
// aliases the buffer's memory and must not be modified. When nothing
// follows afterID, count is 0 and wait is closed once more data arrives or
// the buffer closes. gap reports that tuples after afterID were already
// discarded (a ring buffer overran, or a subscriber came late); data then
// starts at the oldest retained tuple.
func (b *OutputBuffer) Read(afterID uint64, maxBytes int) (data []byte, count int, lastID uint64, gap bool, wait <-chan struct{}, err error) {
	data, offs, _, firstID, gap, wait, err := b.ReadIndexed(afterID, maxBytes)
	if len(offs) > 0 {
		count, lastID = len(offs), firstID+uint64(len(offs))-1
	}
	return data, count, lastID, gap, wait, err
}

// ReadIndexed is Read that also returns the buffer's index of the tuples:
// tuple i has id firstID+i and starts at data[offs[i]-base:]. offs aliases
// the buffer and must not be modified. A reader that only looks at each
// tuple's type or header (a local consumer counting results) then never
// walks the encodings. The tuples come from one chunk, so their ids are
// consecutive even where the stream has a gap.
func (b *OutputBuffer) ReadIndexed(afterID uint64, maxBytes int) (data []byte, offs []int, base int, firstID uint64, gap bool, wait <-chan struct{}, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, 0, 0, false, nil, ErrClosed
	}
	gap = afterID < b.dropped
	if b.count == 0 || b.lastID <= afterID {
		if b.dataCh == nil {
			b.dataCh = make(chan struct{})
		}
		return nil, nil, 0, 0, gap, b.dataCh, nil
	}
	// Find the chunk holding the first tuple with id > afterID.
	ci := sort.Search(len(b.chunks), func(i int) bool { return b.chunks[i].last() > afterID })
	c := b.chunks[ci]
	ti := 0
	if ci == 0 {
		ti = b.head
	}
	if afterID >= c.first+uint64(ti) {
		ti = int(afterID-c.first) + 1
	}
	end := ti + 1
	for end < len(c.offs) && c.end(end)-c.offs[ti] <= maxBytes {
		end++
	}
	base = c.offs[ti]
	data = c.data[base:c.end(end-1):c.end(end-1)]
	return data, c.offs[ti:end:end], base, c.first + uint64(ti), gap, nil, nil
}

// Close wakes every waiter; later Appends and Reads return ErrClosed.
func (b *OutputBuffer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	close(b.done)
	// Invariant: count and bytes describe chunks; a closed buffer holds
	// nothing, so a late Ack or Read finds an empty buffer.
	b.chunks, b.spare = nil, nil
	b.count, b.bytes, b.head = 0, 0, 0
	if b.dataCh != nil {
		close(b.dataCh)
		b.dataCh = nil
	}
	if b.spaceCh != nil {
		close(b.spaceCh)
		b.spaceCh = nil
	}
}

// Done is closed when the buffer closes.
func (b *OutputBuffer) Done() <-chan struct{} { return b.done }

// BlockedNanos is the total time Appends have spent blocked on a full
// buffer in waits that ended (the producer's own accounting: its waits
// have ended whenever it reads this). Stats counts the waits going on
// too.
func (b *OutputBuffer) BlockedNanos() int64 { return b.blockedNanos.Load() }

// blockedNanosLocked is BlockedNanos with the waits going on counted up to
// now (b.mu held): a producer blocked for a whole sensor window shows in
// that window, not only in the one where its wait ends. It never
// decreases: each wait counts continuously from its start.
func (b *OutputBuffer) blockedNanosLocked(now time.Time) int64 {
	return b.blockedNanos.Load() + int64(b.blocked)*monoNanos(now) - b.waitStarts
}

// monoEpoch is the origin of monoNanos.
var monoEpoch = time.Now()

// monoNanos is t on the monotonic clock, in ns since monoEpoch (t must
// carry a monotonic reading: from time.Now): wall-clock steps do not move
// it.
func monoNanos(t time.Time) int64 { return int64(t.Sub(monoEpoch)) }

// BufferStats is a snapshot of a buffer's occupancy.
type BufferStats struct {
	Tuples, Bytes int
	// LastID is the id of the newest appended tuple; OldestID the oldest
	// retained one (0 when empty).
	LastID, OldestID uint64
	// Subscribers holding the buffer (connected, or within their lease);
	// Connected of them have a live subscription.
	Subscribers, Connected int
	// BlockedNanos is the time Appends have spent waiting for room, the
	// waits going on counted up to the reading.
	BlockedNanos int64
	// BlockedAppends is the number of Appends waiting for room right now;
	// BlockedSince when the first of them began (zero when none).
	BlockedAppends int
	BlockedSince   time.Time
	// Overrun is the number of tuples discarded before every subscriber
	// holding the buffer had acknowledged them (see OverrunGrace);
	// Overrunning says an episode of such discards is going on (some
	// subscriber that is not connected misses tuples).
	Overrun     uint64
	Overrunning bool
	// Laggard is the subscriber with the lowest acknowledgement, which
	// holds the buffer back, and LaggardAck that acknowledgement;
	// LaggardConnected says whether it has a live subscription. While
	// replicas expected at start-up have not subscribed, Laggard is empty
	// and Missing says how many.
	Laggard          string
	LaggardAck       uint64
	LaggardConnected bool
	Missing          int
}

// Stats returns the buffer's current occupancy.
func (b *OutputBuffer) Stats() BufferStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.lowLocked(now) // forget expired subscribers first
	s := BufferStats{Tuples: b.count, Bytes: b.bytes, LastID: b.lastID, Subscribers: len(b.subs), BlockedNanos: b.blockedNanosLocked(now),
		BlockedAppends: b.blocked, BlockedSince: b.blockedSince, Overrun: b.overrun, Overrunning: b.overrunning, OldestID: b.oldestLocked()}
	first := true
	for name, sub := range b.subs {
		if sub.conns > 0 {
			s.Connected++
		}
		if first || sub.ack < s.LaggardAck || sub.ack == s.LaggardAck && name < s.Laggard {
			s.Laggard, s.LaggardAck, s.LaggardConnected = name, sub.ack, sub.conns > 0
			first = false
		}
	}
	if b.seen != nil {
		s.Missing = b.opts.ExpectedSubscribers - len(b.seen)
	}
	return s
}

// Writer stages a producer's tuples for one OutputBuffer and appends them
// in bulk: Add encodes without taking the buffer's lock, Flush appends
// everything staged under one lock acquisition and wakes readers once.
// A Writer belongs to the single goroutine producing the stream, whose
// ids are consecutive: after the first, each tuple's id is the previous
// one's plus one.
type Writer struct {
	buf  *OutputBuffer
	data []byte
	offs []int // start of each staged tuple in data
	// first is the id of the first staged tuple; lastID is the id of the
	// last tuple staged, appendedID of the last one appended.
	first, lastID, appendedID uint64
	// shift is the buffer's renumbering these ids follow (syncShift).
	shift uint64
	// slab is the unused rest of the memory staging arrays are cut from.
	slab []byte
}

// A Writer stages up to stagingBytes, which a staged batch becomes as a
// chunk when the buffer adopts it, and a network batch (MaxBatchBytes).
// Full says to flush stagingSlack bytes before the end, so that the usual
// tuple fits without growing the staging array.
const (
	stagingBytes = MaxBatchBytes
	stagingSlack = 512
	// stagingTuples sizes the offset array of a staged batch.
	stagingTuples = 256
)

// NewWriter returns a Writer appending to b.
func (b *OutputBuffer) NewWriter() *Writer { return &Writer{buf: b} }

// Full reports whether the staged tuples make a network batch: the
// producer should Flush.
func (w *Writer) Full() bool { return len(w.data) >= stagingBytes-stagingSlack }

// Add stages t. Its ID, set by the producer, must be the previous tuple's
// plus one (any id above 0 for the Writer's first tuple).
func (w *Writer) Add(t *tuple.Tuple) error {
	w.syncShift()
	if t.ID != w.lastID+1 && (w.lastID != 0 || t.ID == 0) {
		return fmt.Errorf("%w: id %d after %d", ErrIDOrder, t.ID, w.lastID)
	}
	w.stage(t)
	return nil
}

// Next stages t as the stream's next tuple, setting its ID to the previous
// tuple's plus one (1 for the first), and reports whether the producer
// should now Flush (Full).
func (w *Writer) Next(t *tuple.Tuple) (full bool) {
	w.syncShift()
	t.ID = w.lastID + 1
	w.stage(t)
	return w.Full()
}

// stage encodes t, whose id follows the staged tuples' (Add checked it,
// Next set it), after them.
func (w *Writer) stage(t *tuple.Tuple) {
	if w.data == nil {
		w.newStaging(stagingTuples)
	}
	if len(w.offs) == 0 {
		w.first = t.ID
	}
	w.lastID = t.ID
	w.offs = append(w.offs, len(w.data))
	w.data = tuple.AppendTuple(w.data, t)
}

// newStaging gives w empty staging arrays, room for about tuples tuples.
// Until the buffer first adopts a staged batch (a stream busy enough to
// fill one) the array is a small one of its own, which grows as needed;
// after that it is the next piece of the Writer's current slab.
func (w *Writer) newStaging(tuples int) {
	switch {
	case w.data == nil:
		w.data = allocUncleared(firstStagingBytes)[:0]
	default:
		if len(w.slab) < stagingBytes {
			w.slab = allocUncleared(slabPieces * stagingBytes)
		}
		w.data = w.slab[:0:stagingBytes]
		w.slab = w.slab[stagingBytes:]
	}
	w.offs = make([]int, 0, tuples)
}

// firstStagingBytes is the first staging array of a Writer: a stream that
// never fills a batch holds no more.
const firstStagingBytes = 16 << 10

// slabPieces is how many staging arrays a busy Writer carves from one
// allocation: a separate allocation per staged batch took a fresh span
// from the heap each time and cleared it, a few microseconds per batch.
// A slab lives until its last piece (a chunk, or strings aliasing it) is
// dropped.
const slabPieces = 8

// allocUncleared returns a byte slice of length and capacity n whose
// contents are arbitrary: a Writer overwrites every byte it exposes
// (chunks are never read beyond their length), so clearing it first, as
// make does, is wasted work on the hottest path. strings.Builder.Grow is
// the standard library's way to get such memory.
func allocUncleared(n int) []byte {
	var b strings.Builder
	b.Grow(n)
	b.WriteByte(0)
	s := b.String()
	return unsafe.Slice(unsafe.StringData(s), n)
}

// Staged is the number of encoded bytes waiting for Flush.
func (w *Writer) Staged() int { return len(w.data) }

// Flush appends the staged tuples, blocking like Append while the buffer
// is full (ctx.Err() or ErrClosed end it; what was not appended stays
// staged).
func (w *Writer) Flush(ctx context.Context) error {
	return w.FlushIdle(ctx, nil)
}

// FlushIdle is Flush calling idle, when not nil, as a wait for room begins
// and every WaitIdleEvery while it lasts (the buffer's lock released): a
// producer with several outputs appends what it staged for the others
// meanwhile.
func (w *Writer) FlushIdle(ctx context.Context, idle func()) error {
	if len(w.offs) == 0 {
		return nil
	}
	// The buffer may renumber while this call waits for its lock (or for
	// room): it adds its shift since w.shift to the ids, and the Writer
	// follows (syncShift) when it returns.
	w.syncShift()
	adopted, err := w.buf.adopt(w.first, w.shift, w.offs, w.data)
	w.syncShift()
	if err != nil {
		return err
	}
	if adopted {
		// The buffer owns the staged slices now: stage into new ones.
		w.appendedID = w.lastID
		w.data = w.data[len(w.data):] // not nil: the next array is a slab's
		w.newStaging(cap(w.offs))
		return nil
	}
	n, err := w.buf.appendEncoded(ctx, w.first, w.shift, w.offs, w.data, idle)
	w.syncShift()
	if n > 0 {
		w.appendedID = w.first + uint64(n) - 1
	}
	if n == len(w.offs) {
		w.offs, w.data = w.offs[:0], w.data[:0]
		return err
	}
	// Keep the rest staged, rebased.
	base := w.offs[n]
	w.data = append(w.data[:0], w.data[base:]...)
	rest := append(w.offs[:0], w.offs[n:]...)
	for i := range rest {
		rest[i] -= base
	}
	w.offs = rest
	w.first += uint64(n)
	return err
}

// Discard drops the staged tuples and returns the id of the last tuple
// appended, after which the producer continues.
func (w *Writer) Discard() uint64 {
	w.syncShift()
	w.offs, w.data = w.offs[:0], w.data[:0]
	w.lastID = w.appendedID
	return w.appendedID
}

// adoptMin is the smallest staged batch adopt takes as a chunk of its own;
// smaller ones are copied into the last chunk, so that chunks, and the
// batches Read cuts from them, stay large.
const adoptMin = MaxBatchBytes / 2

// Adopt appends encoded tuples (tuple i is data[offs[i]:offs[i+1]], the
// last one ending data; tuple i has id first+i, first above every id
// appended before) as a chunk of their own, without copying them: the
// buffer owns both slices from then on and data must never be modified. A
// ring first drops its oldest tuples to make room; any other buffer waits
// for room like Append, or takes the tuples in several steps when they
// exceed its bounds.
func (b *OutputBuffer) Adopt(ctx context.Context, first uint64, offs []int, data []byte) error {
	if len(offs) == 0 {
		return nil
	}
	if offs[0] != 0 || first == 0 {
		return fmt.Errorf("dataplane: adopt: first id %d, offsets starting at %d", first, offs[0])
	}
	adopted, err := b.adoptAny(first, offs, data)
	if err != nil || adopted {
		return err
	}
	n, err := b.appendEncoded(ctx, first, idsAbsolute, offs, data, nil)
	if err == nil && n < len(offs) {
		err = fmt.Errorf("dataplane: adopt: appended %d of %d tuples", n, len(offs))
	}
	return err
}

// adopt makes a Writer's staged tuples a new chunk as they are, without
// copying them, when they fit the buffer's bounds now (a ring first drops
// its oldest tuples to make room). On true the buffer owns both slices
// (chunks are never written below their length, so readers of earlier
// batches are safe).
func (b *OutputBuffer) adopt(first, shift uint64, offs []int, data []byte) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, ErrClosed
	}
	if len(data) < adoptMin {
		return false, nil
	}
	return b.adoptLocked(b.shifted(first, shift), offs, data)
}

// adoptAny is adopt whatever the batch's size.
func (b *OutputBuffer) adoptAny(first uint64, offs []int, data []byte) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, ErrClosed
	}
	return b.adoptLocked(first, offs, data)
}

func (b *OutputBuffer) adoptLocked(first uint64, offs []int, data []byte) (bool, error) {
	if len(offs) > b.opts.MaxTuples || len(data) > b.opts.MaxBytes {
		return false, nil
	}
	if !b.opts.Ring && (b.count+len(offs) > b.opts.MaxTuples || b.bytes+len(data) > b.opts.MaxBytes) {
		return false, nil
	}
	if first <= b.lastID {
		return false, fmt.Errorf("%w: id %d after %d", ErrIDOrder, first, b.lastID)
	}
	if b.opts.Ring {
		b.dropForLocked(len(offs), len(data))
	}
	c := &chunk{data: data, offs: offs, first: first}
	b.chunks = append(b.chunks, c)
	b.bytes += len(data)
	b.count += len(offs)
	b.lastID = c.last()
	if b.dataCh != nil {
		close(b.dataCh)
		b.dataCh = nil
	}
	return true, nil
}

// dropForLocked makes a ring take tuples more tuples of size bytes within
// its bounds by dropping its oldest ones: whole chunks while that is not
// too much, then single tuples.
func (b *OutputBuffer) dropForLocked(tuples, size int) {
	over := func() bool { return b.count+tuples > b.opts.MaxTuples || b.bytes+size > b.opts.MaxBytes }
	for b.count > 0 && over() {
		c := b.chunks[0]
		n, bytes := len(c.offs)-b.head, len(c.data)-c.offs[b.head]
		if b.count-n+tuples > b.opts.MaxTuples || b.bytes-bytes+size > b.opts.MaxBytes {
			// Still over without the whole chunk: drop it in one step.
			b.dropped = c.last()
			b.bytes -= bytes
			b.count -= n
			b.dropFirstChunkLocked()
			continue
		}
		b.dropOldestLocked()
	}
}

// appendEncoded appends encoded tuples (tuple i is data[offs[i]:offs[i+1]]
// with id first+i) under one lock acquisition, waiting for room as Append
// does (calling idle while it waits, see makeRoomLocked). It returns how
// many were appended.
func (b *OutputBuffer) appendEncoded(ctx context.Context, first, shift uint64, offs []int, data []byte, idle func()) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, ErrClosed
	}
	first = b.shifted(first, shift)
	if first <= b.lastID {
		return 0, fmt.Errorf("%w: id %d after %d", ErrIDOrder, first, b.lastID)
	}
	end := func(i int) int {
		if i+1 < len(offs) {
			return offs[i+1]
		}
		return len(data)
	}
	appended := false
	defer func() {
		if appended && b.dataCh != nil {
			close(b.dataCh)
			b.dataCh = nil
		}
	}()
	for i := 0; i < len(offs); {
		size := end(i) - offs[i]
		if size > b.opts.MaxBytes {
			return i, fmt.Errorf("%w: %d bytes, capacity %d", ErrTooLarge, size, b.opts.MaxBytes)
		}
		if b.opts.Ring {
			b.dropForLocked(1, size)
		} else if b.full(size) {
			if appended && b.dataCh != nil {
				// Readers may be waiting for what is already in.
				close(b.dataCh)
				b.dataCh = nil
			}
			seen := b.shift.Load()
			if err := b.makeRoomLocked(ctx, size, idle); err != nil {
				return i, err
			}
			// Renumbered while it waited (the lock released).
			first += b.shift.Load() - seen
		}
		// As many following tuples as fit in the buffer's bounds and the
		// current chunk go in one copy.
		j := i + 1
		bytes := size
		c := b.lastChunkWithRoom(first+uint64(i), size)
		room := cap(c.data) - len(c.data)
		for j < len(offs) {
			s := end(j) - offs[j]
			if bytes+s > room || b.count+(j-i)+1 > b.opts.MaxTuples || b.bytes+bytes+s > b.opts.MaxBytes {
				break
			}
			bytes += s
			j++
		}
		base := len(c.data) - offs[i]
		for k := i; k < j; k++ {
			c.offs = append(c.offs, offs[k]+base)
		}
		c.data = append(c.data, data[offs[i]:offs[i]+bytes]...)
		b.bytes += bytes
		b.count += j - i
		b.lastID = c.last()
		appended = true
		i = j
	}
	return len(offs), nil
}

// lastChunkWithRoom returns the chunk the tuple with the given id and size
// goes to: the last chunk, or a new one when the last cannot take size
// more bytes or id does not follow its last tuple (the stream has a gap).
func (b *OutputBuffer) lastChunkWithRoom(id uint64, size int) *chunk {
	tuples := 0
	if n := len(b.chunks); n > 0 {
		c := b.chunks[n-1]
		if len(c.data)+size <= cap(c.data) && id == c.last()+1 {
			return c
		}
		tuples = len(c.offs) // the next chunk will likely hold as many
	}
	var data []byte
	if cap(b.spare) >= size {
		data = b.spare
	} else {
		// Never read above its length (see spare), so not cleared.
		data = allocUncleared(max(chunkSize, size))[:0]
	}
	b.spare = nil
	c := &chunk{data: data, offs: make([]int, 0, tuples), first: id, own: true}
	b.chunks = append(b.chunks, c)
	return c
}

// LastID is the id of the last tuple staged (0 before the first): after a
// successful Flush, the last tuple of the stream.
// It counts a renumbering the Writer has not followed yet (syncShift).
func (w *Writer) LastID() uint64 { return w.lastID + w.buf.shift.Load() - w.shift }

// ResumeWith continues a stream that an earlier producer wrote up to the
// last of the given tuples, holding those tuples again (encoded as Adopt
// takes them, ids first...): readers that had not taken them yet find
// them here, as they would have on the earlier producer. The buffer owns
// both slices from then on. The buffer must be empty and nothing staged.
func (w *Writer) ResumeWith(ctx context.Context, first uint64, offs []int, data []byte) error {
	if len(offs) == 0 || first == 0 {
		return fmt.Errorf("%w: resume with %d tuples from id %d", ErrIDOrder, len(offs), first)
	}
	if err := w.ResumeAfter(first - 1); err != nil {
		return err
	}
	if err := w.buf.Adopt(ctx, first, offs, data); err != nil {
		return err
	}
	last := first + uint64(len(offs)) - 1
	w.lastID, w.appendedID = last, last
	return nil
}

// ResumeAfter continues a stream that an earlier producer (a task this one
// was restored from) wrote up to id: the next tuple staged gets id+1, and
// a reader asking for tuples at or before id is told of a gap (they are
// not here). The buffer must be empty and nothing staged.
func (w *Writer) ResumeAfter(id uint64) error {
	if len(w.offs) > 0 || w.lastID != 0 {
		return fmt.Errorf("%w: resume after %d on a writer that staged up to %d", ErrIDOrder, id, w.lastID)
	}
	b := w.buf
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.count > 0 || b.lastID != 0 {
		return fmt.Errorf("%w: resume after %d on a buffer holding up to %d", ErrIDOrder, id, b.lastID)
	}
	b.lastID, b.dropped = id, id
	w.lastID, w.appendedID = id, id
	return nil
}
