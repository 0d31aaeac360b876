package dataplane

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/fedstream/fedstream/worker/tuple"
)

// dataTuple is the tuple with the given id. Ids are not encoded: its stime
// is the id too, so that decoding tells which tuple a buffer returned.
func dataTuple(id uint64, payload string) *tuple.Tuple {
	return &tuple.Tuple{Type: tuple.Stable, ID: id, STime: int64(id), Values: []tuple.Value{tuple.Str(payload)}}
}

// decodeAll decodes a batch of dataTuples and returns their ids, as their
// stimes tell.
func decodeAll(t *testing.T, data []byte) []uint64 {
	t.Helper()
	var ids []uint64
	r := tuple.NewBatchReader(data, 1)
	var tp tuple.Tuple
	for r.Next(&tp) {
		ids = append(ids, uint64(tp.STime))
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestBufferReadBatches(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{})
	payload := string(make([]byte, 90))
	for id := uint64(1); id <= 2000; id++ {
		if err := b.Append(ctx, dataTuple(id, payload)); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	after := uint64(0)
	batches := 0
	for {
		data, count, last, gap, wait, err := b.Read(after, MaxBatchBytes)
		if err != nil {
			t.Fatal(err)
		}
		if gap {
			t.Fatal("unexpected gap")
		}
		if count == 0 {
			if wait == nil {
				t.Fatal("empty read without a wait channel")
			}
			break
		}
		if len(data) > MaxBatchBytes {
			t.Fatalf("batch of %d bytes", len(data))
		}
		ids := decodeAll(t, data)
		if len(ids) != count || ids[len(ids)-1] != last {
			t.Fatalf("batch header count=%d last=%d, data %d ids ending %d", count, last, len(ids), ids[len(ids)-1])
		}
		got = append(got, ids...)
		after = last
		batches++
	}
	if len(got) != 2000 || got[0] != 1 || got[1999] != 2000 {
		t.Fatalf("read %d ids", len(got))
	}
	// ~200 KB in 64 KiB chunks, read in batches of up to MaxBatchBytes
	// that do not cross chunks.
	if want := 2 * (200<<10/MaxBatchBytes + 1); batches > want {
		t.Fatalf("%d batches for ~200 KB, want at most %d", batches, want)
	}
	// Resuming in the middle of a chunk.
	data, _, _, _, _, _ := b.Read(1234, 250)
	if ids := decodeAll(t, data); ids[0] != 1235 || len(ids) != 2 {
		t.Fatalf("read after 1234 (300 bytes) gave %v", ids)
	}
	if err := b.Append(ctx, dataTuple(5, "")); !errors.Is(err, ErrIDOrder) {
		t.Fatalf("out of order append: %v", err)
	}
}

func TestBufferAckTruncation(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{ExpectedSubscribers: 2})
	for id := uint64(1); id <= 100; id++ {
		if err := b.Append(ctx, dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name       string
		ack        func()
		wantOldest uint64
		wantCount  int
	}{
		{"one of two subscribers acks: nothing freed", func() { b.Ack("r0", 50) }, 1, 100},
		{"second registers without acking", func() { b.Register("r1") }, 1, 100},
		{"second acks less", func() { b.Ack("r1", 30) }, 31, 70},
		{"ack going back is ignored", func() { b.Ack("r1", 10) }, 31, 70},
		{"both past 50", func() { b.Ack("r1", 80) }, 51, 50},
		{"all acked", func() { b.Ack("r0", 100); b.Ack("r1", 100) }, 0, 0},
	}
	for _, s := range steps {
		s.ack()
		st := b.Stats()
		if st.OldestID != s.wantOldest || st.Tuples != s.wantCount {
			t.Fatalf("%s: oldest %d count %d, want %d %d", s.name, st.OldestID, st.Tuples, s.wantOldest, s.wantCount)
		}
	}
	if st := b.Stats(); st.Bytes != 0 {
		t.Fatalf("%d bytes retained after full ack", st.Bytes)
	}
	// A late subscriber starting from 0 learns it missed tuples.
	if _, _, _, gap, _, _ := b.Read(0, MaxBatchBytes); !gap {
		t.Fatal("read from 0 after truncation should report a gap")
	}
}

func TestBufferBlocksWhenFull(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{MaxTuples: 10})
	for id := uint64(1); id <= 10; id++ {
		if err := b.Append(ctx, dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
	// A full buffer with an expired context fails without appending.
	start := time.Now()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := b.Append(short, dataTuple(11, "x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append on full buffer: %v", err)
	}
	if blocked := b.BlockedNanos(); blocked <= 0 || blocked > int64(time.Since(start)) {
		t.Fatalf("blocked time %v, want in (0, %v]", time.Duration(blocked), time.Since(start))
	}
	before := b.BlockedNanos()
	done := make(chan error, 1)
	go func() { done <- b.Append(ctx, dataTuple(11, "x")) }()
	// Wait until the appender is blocked (it registered for space).
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b.Stats().BlockedAppends == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("appender never blocked")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("append returned %v while full", err)
	default:
	}
	b.Ack("down", 3)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if b.BlockedNanos() <= before {
		t.Fatal("blocked time did not grow")
	}
	if st := b.Stats(); st.Tuples != 8 || st.LastID != 11 {
		t.Fatalf("stats %+v", st)
	}
	b.Close()
	if err := b.Append(ctx, dataTuple(12, "x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
}

func TestRingBufferDropsOldest(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{Ring: true, MaxTuples: 5})
	for id := uint64(1); id <= 12; id++ {
		if err := b.Append(ctx, dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
	data, count, last, gap, _, err := b.Read(0, MaxBatchBytes)
	if err != nil || count != 5 || last != 12 || !gap {
		t.Fatalf("ring read: count %d last %d gap %v err %v", count, last, gap, err)
	}
	if ids := decodeAll(t, data); ids[0] != 8 {
		t.Fatalf("ring keeps %v", ids)
	}
	if b.BlockedNanos() != 0 {
		t.Fatal("ring buffer blocked")
	}
}

func TestReadWaitsForData(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	_, count, _, _, wait, err := b.Read(0, MaxBatchBytes)
	if err != nil || count != 0 {
		t.Fatalf("empty read: %d %v", count, err)
	}
	select {
	case <-wait:
		t.Fatal("wait closed before data")
	default:
	}
	if err := b.Append(context.Background(), dataTuple(1, "x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wait:
	case <-time.After(5 * time.Second):
		t.Fatal("wait not closed by append")
	}
}

func BenchmarkAppendRead100B(b *testing.B) {
	ctx := context.Background()
	buf := NewOutputBuffer(BufferOptions{})
	rec := dataTuple(0, string(make([]byte, 90)))
	b.ReportAllocs()
	id := uint64(0)
	for b.Loop() {
		id++
		rec.ID = id
		if err := buf.Append(ctx, rec); err != nil {
			b.Fatal(err)
		}
		if id%500 == 0 {
			buf.Ack("s", id)
		}
	}
}

// An ack that arrives after the task closed its buffer (the consumer's last
// ack in flight while the task stops) must be ignored, not crash.
func TestAckAfterClose(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{ExpectedSubscribers: 1})
	b.Register("d")
	for i := uint64(1); i <= 3; i++ {
		tu := tuple.Tuple{Type: tuple.Stable, ID: i, Values: []tuple.Value{tuple.Int(int64(i))}}
		if err := b.Append(context.Background(), &tu); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	b.Ack("d", 2)
	if st := b.Stats(); st.Tuples != 0 || st.Bytes != 0 {
		t.Fatalf("closed buffer reports %+v", st)
	}
}

// ReadIndexed returns the same tuples as Read, with each tuple's offset
// and id, across chunks and after a ring dropped its oldest tuples.
func TestReadIndexed(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{Ring: true, MaxTuples: 3000})
	w := b.NewWriter()
	for id := uint64(1); id <= 5000; id++ {
		if err := w.Add(dataTuple(id, strings.Repeat("x", int(id%300)))); err != nil {
			t.Fatal(err)
		}
		if w.Full() {
			if err := w.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var (
		after uint64
		seen  int
	)
	for {
		data, offs, base, first, gap, _, err := b.ReadIndexed(after, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		if gap != (after == 0) {
			t.Fatalf("after %d: gap %v", after, gap)
		}
		if len(offs) == 0 {
			break
		}
		rdata, count, last, _, _, _ := b.Read(after, 10_000)
		if !bytes.Equal(rdata, data) || count != len(offs) || last != first+uint64(len(offs))-1 {
			t.Fatalf("ReadIndexed and Read disagree after %d", after)
		}
		if after != 0 && first != after+1 {
			t.Fatalf("after %d: read starts at id %d", after, first)
		}
		for i := range offs {
			var tp tuple.Tuple
			at := offs[i] - base
			n, err := tuple.DecodeTuple(data[at:], &tp)
			if id := first + uint64(i); err != nil || tp.STime != int64(id) {
				t.Fatalf("tuple %d at %d: tuple %d, err %v; want tuple %d", i, at, tp.STime, err, id)
			}
			if end := len(data); i+1 < len(offs) {
				end = offs[i+1] - base
				if at+n != end {
					t.Fatalf("tuple %d ends at %d, next starts at %d", i, at+n, end)
				}
			} else if at+n != end {
				t.Fatalf("last tuple ends at %d of %d", at+n, end)
			}
		}
		seen += len(offs)
		after = first + uint64(len(offs)) - 1
	}
	if seen != 3000 || after != 5000 {
		t.Fatalf("read %d tuples up to %d; want the newest 3000 up to 5000", seen, after)
	}
}

// TestAdopt: encoded tuples adopted as they are read back unchanged, in
// a ring (dropping its oldest) and in a bounded buffer (in steps, waiting
// for acknowledgements, when they exceed its bounds); ids must increase.
func TestAdopt(t *testing.T) {
	encode := func(from, to uint64) (uint64, []int, []byte) {
		var (
			offs []int
			data []byte
		)
		for id := from; id <= to; id++ {
			offs = append(offs, len(data))
			data = tuple.AppendTuple(data, dataTuple(id, "payload"))
		}
		return from, offs, data
	}
	ctx := context.Background()

	ring := NewOutputBuffer(BufferOptions{Ring: true, MaxTuples: 25})
	for from := uint64(1); from <= 91; from += 10 {
		first, offs, data := encode(from, from+9)
		if err := ring.Adopt(ctx, first, offs, data); err != nil {
			t.Fatal(err)
		}
	}
	if got := readAllIDs(t, ring, 0); len(got) == 0 || len(got) > 25 || got[len(got)-1] != 100 || got[0] != 101-uint64(len(got)) {
		t.Fatalf("ring holds %v", got)
	}
	if first, offs, data := encode(100, 101); !errors.Is(ring.Adopt(ctx, first, offs, data), ErrIDOrder) {
		t.Fatal("adopting id 100 again was not refused")
	}

	bounded := NewOutputBuffer(BufferOptions{MaxTuples: 8})
	bounded.Register("s")
	done := make(chan error, 1)
	first, offs, data := encode(1, 20)
	go func() { done <- bounded.Adopt(ctx, first, offs, data) }()
	var got []uint64
	for len(got) < 20 {
		data, count, last, _, wait, err := bounded.Read(uint64(len(got)), MaxBatchBytes)
		if err != nil {
			t.Fatal(err)
		}
		if count == 0 {
			<-wait
			continue
		}
		got = append(got, decodeAll(t, data)...)
		bounded.Ack("s", last)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, id := range got {
		if id != uint64(i+1) {
			t.Fatalf("read %v", got)
		}
	}
}

// TestBlockedTimeCountsWhileWaiting: the blocked time Stats reports
// counts a wait for room while it goes on, not only once it ends (a
// producer blocked through a whole sensor window showed no backpressure
// in it), and never goes back: the readings during the wait grow, and
// the total after it is at least the last of them. Before, Stats read 0
// until the wait ended.
func TestBlockedTimeCountsWhileWaiting(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{MaxTuples: 1})
	if err := b.Append(ctx, dataTuple(1, "x")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Append(ctx, dataTuple(2, "x")) }()
	deadline := time.Now().Add(10 * time.Second)
	var last int64
	for readings := 0; readings < 3; {
		st := b.Stats()
		if st.BlockedAppends == 1 && st.BlockedNanos > last {
			last = st.BlockedNanos
			readings++
		}
		if st.BlockedNanos < last {
			t.Fatalf("blocked time went back from %d to %d ns", last, st.BlockedNanos)
		}
		if time.Now().After(deadline) {
			t.Fatalf("blocked time while the append waits: %d ns after %d growing readings, want it to grow as the wait goes on", st.BlockedNanos, readings)
		}
		time.Sleep(time.Millisecond)
	}
	if b.BlockedNanos() != 0 {
		t.Fatalf("BlockedNanos (waits that ended) %d while the only wait goes on", b.BlockedNanos())
	}
	b.Ack("down", 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.BlockedAppends != 0 || st.BlockedNanos < last || st.BlockedNanos != b.BlockedNanos() {
		t.Fatalf("after the wait: %d appends waiting, blocked %d ns (ended waits %d), want none, >= %d, equal", st.BlockedAppends, st.BlockedNanos, b.BlockedNanos(), last)
	}
}

// TestDiscardedChunkRoomIsReused: a subscriber that acknowledges every
// small flush before the next one empties the buffer each time; the next
// flush must go to the room left in the discarded chunk, not to a fresh
// 64 KiB chunk, and batches read before the discard keep their bytes
// while new tuples are written above them.
func TestDiscardedChunkRoomIsReused(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{ExpectedSubscribers: 1})
	b.Register("r0")
	w := b.NewWriter()
	payload := strings.Repeat("p", 40)
	id := uint64(0)
	// fresh counts the chunks not cut from the room just above the
	// previous chunk's data (the test is the only goroutine using b).
	fresh, prevEnd := 0, uintptr(0)
	// flushAck stages n tuples, flushes, reads them as a subscriber would
	// and acknowledges them: the buffer is empty again afterwards.
	flushAck := func(n int) []byte {
		for range n {
			id++
			if err := w.Add(dataTuple(id, payload)); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		c := b.chunks[len(b.chunks)-1]
		start := uintptr(unsafe.Pointer(unsafe.SliceData(c.data)))
		if start != prevEnd {
			fresh++
		}
		prevEnd = start + uintptr(len(c.data))
		b.mu.Unlock()
		data, count, last, _, _, err := b.Read(id-uint64(n), MaxBatchBytes)
		if err != nil || count != n || last != id {
			t.Fatalf("read after %d: %d tuples up to %d (%v), want %d up to %d", id-uint64(n), count, last, err, n, id)
		}
		b.Ack("r0", id)
		if st := b.Stats(); st.Tuples != 0 {
			t.Fatalf("%d tuples retained after a full ack", st.Tuples)
		}
		return data
	}
	flushAck(4)
	held := flushAck(4)
	heldCopy := bytes.Clone(held)
	heldFirst := id - 3
	for range 200 {
		flushAck(4)
	}
	// 202 flushes of about 250 bytes fit in one 64 KiB array; a chunk
	// allocated per flush was 202 arrays.
	if fresh > 2 {
		t.Fatalf("202 flushes of 4 small tuples, each acknowledged before the next, took %d new arrays: the room of discarded chunks is not reused", fresh)
	}
	if !bytes.Equal(held, heldCopy) {
		t.Fatal("a batch read before its chunk was discarded changed when later tuples were written")
	}
	if got := decodeAll(t, held); len(got) != 4 || got[0] != heldFirst || got[3] != heldFirst+3 {
		t.Fatalf("held batch decodes to %v, want %d..%d", got, heldFirst, heldFirst+3)
	}
}
