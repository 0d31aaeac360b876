// Package dataplane moves tuples between tasks: the bounded output buffer a
// producer appends to, the DataPlane gRPC server that streams buffered
// tuples to subscribers in batches, the subscriber client that pulls them
// and acknowledges, and a pool of client connections.
//
// Flow control is end to end: a slow consumer stops acknowledging, its
// producer's buffer fills, and Append blocks; the gRPC/HTTP2 windows and the
// subscriber's bounded delivery bound what is in flight in between. Time a
// producer spends blocked is accounted (BlockedNanos), it is the
// backpressure signal.
package dataplane

import (
	"context"
	"errors"
	"fmt"
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
	// subscribers (the downstream replicas) that must have acknowledged a
	// tuple before it is discarded. Until that many have registered nothing
	// is discarded. Zero means one.
	ExpectedSubscribers int
	// Ring makes the buffer a ring for result streams that clients tail:
	// Append never blocks and the oldest tuples are dropped beyond capacity,
	// whatever the acknowledgements.
	Ring bool
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
	acks    map[string]uint64
	closed  bool
	// dataCh is closed when a tuple is appended or the buffer closes;
	// spaceCh when room frees up or the buffer closes. Both are created on
	// demand so that an Append nobody waits for does not allocate.
	dataCh  chan struct{}
	spaceCh chan struct{}

	blockedNanos atomic.Int64
	// blocked is the number of Appends currently waiting for room.
	blocked int
	scratch []byte
}

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
	return &OutputBuffer{opts: opts, acks: make(map[string]uint64)}
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
		start := time.Now()
		b.blocked++
		err := b.waitSpaceLocked(ctx, size)
		b.blocked--
		b.blockedNanos.Add(int64(time.Since(start)))
		if err != nil {
			return err
		}
	}
	b.appendLocked(t.ID, b.scratch)
	return nil
}

func (b *OutputBuffer) full(size int) bool {
	return b.count > 0 && (b.bytes+size > b.opts.MaxBytes || b.count+1 > b.opts.MaxTuples)
}

// waitSpaceLocked waits, with b.mu held on entry and exit, until a tuple
// of size bytes fits.
func (b *OutputBuffer) waitSpaceLocked(ctx context.Context, size int) error {
	for b.full(size) {
		if b.spaceCh == nil {
			b.spaceCh = make(chan struct{})
		}
		ch := b.spaceCh
		b.mu.Unlock()
		select {
		case <-ch:
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
		b.chunks[0] = nil
		b.chunks = b.chunks[1:]
		b.head = 0
	}
}

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
			b.chunks[0] = nil
			b.chunks = b.chunks[1:]
			b.head = 0
		} else {
			b.dropOldestLocked()
		}
		freed = true
	}
	if freed && b.spaceCh != nil {
		close(b.spaceCh)
		b.spaceCh = nil
	}
}

// Register records an acknowledging subscriber by name (idempotent). A
// subscriber that resumes under the same name keeps its acknowledgement.
func (b *OutputBuffer) Register(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.acks[name]; !ok {
		b.acks[name] = 0
	}
}

// Ack records that subscriber name has taken every tuple with id <= id, and
// discards what every expected subscriber has taken. Acks never move back.
func (b *OutputBuffer) Ack(name string, id uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return // the task stopped while the ack was in flight
	}
	if id > b.acks[name] {
		b.acks[name] = id
	}
	if len(b.acks) < b.opts.ExpectedSubscribers {
		return
	}
	var low uint64 = math.MaxUint64
	for _, a := range b.acks {
		low = min(low, a)
	}
	b.truncateLocked(low)
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
	// Invariant: count and bytes describe chunks; a closed buffer holds
	// nothing, so a late Ack or Read finds an empty buffer.
	b.chunks = nil
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

// BlockedNanos is the total time Append has spent blocked on a full buffer.
func (b *OutputBuffer) BlockedNanos() int64 { return b.blockedNanos.Load() }

// BufferStats is a snapshot of a buffer's occupancy.
type BufferStats struct {
	Tuples, Bytes int
	// LastID is the id of the newest appended tuple; OldestID the oldest
	// retained one (0 when empty).
	LastID, OldestID uint64
	Subscribers      int
	BlockedNanos     int64
	// BlockedAppends is the number of Appends waiting for room right now.
	BlockedAppends int
}

// Stats returns the buffer's current occupancy.
func (b *OutputBuffer) Stats() BufferStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BufferStats{Tuples: b.count, Bytes: b.bytes, LastID: b.lastID, Subscribers: len(b.acks), BlockedNanos: b.BlockedNanos(), BlockedAppends: b.blocked}
	if b.count > 0 {
		s.OldestID = b.chunks[0].first + uint64(b.head)
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
	if len(w.offs) == 0 {
		return nil
	}
	adopted, err := w.buf.adopt(w.first, w.offs, w.data)
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
	n, err := w.buf.appendEncoded(ctx, w.first, w.offs, w.data)
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
	n, err := b.appendEncoded(ctx, first, offs, data)
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
func (b *OutputBuffer) adopt(first uint64, offs []int, data []byte) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, ErrClosed
	}
	if len(data) < adoptMin {
		return false, nil
	}
	return b.adoptLocked(first, offs, data)
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
			b.chunks[0] = nil
			b.chunks = b.chunks[1:]
			b.head = 0
			continue
		}
		b.dropOldestLocked()
	}
}

// appendEncoded appends encoded tuples (tuple i is data[offs[i]:offs[i+1]]
// with id first+i) under one lock acquisition, waiting for room as Append
// does. It returns how many were appended.
func (b *OutputBuffer) appendEncoded(ctx context.Context, first uint64, offs []int, data []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, ErrClosed
	}
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
			start := time.Now()
			b.blocked++
			err := b.waitSpaceLocked(ctx, size)
			b.blocked--
			b.blockedNanos.Add(int64(time.Since(start)))
			if err != nil {
				return i, err
			}
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
	c := &chunk{data: make([]byte, 0, max(chunkSize, size)), offs: make([]int, 0, tuples), first: id}
	b.chunks = append(b.chunks, c)
	return c
}
