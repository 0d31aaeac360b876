package dataplane

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// readAllIDs reads every retained id after `after`.
func readAllIDs(t *testing.T, b *OutputBuffer, after uint64) []uint64 {
	t.Helper()
	var ids []uint64
	for {
		data, count, last, _, _, err := b.Read(after, MaxBatchBytes)
		if err != nil {
			t.Fatal(err)
		}
		if count == 0 {
			return ids
		}
		got := decodeAll(t, data)
		if len(got) != count || got[count-1] != last {
			t.Fatalf("read %d tuples ending with %d, buffer says %d ending with %d", len(got), got[len(got)-1], count, last)
		}
		ids = append(ids, got...)
		after = last
	}
}

func TestWriterFlush(t *testing.T) {
	tests := []struct {
		name    string
		opts    BufferOptions
		tuples  int
		payload int
		// wantFirst is the oldest id retained after the flush.
		wantFirst uint64
		// flushEvery > 0 flushes after every that many tuples (large
		// staged batches become chunks without a copy).
		flushEvery int
	}{
		{"small batch", BufferOptions{}, 10, 10, 1, 0},
		{"spans chunks", BufferOptions{}, 5000, 100, 1, 0},
		{"tuple larger than a chunk", BufferOptions{}, 3, chunkSize + 10, 1, 0},
		{"ring keeps the newest", BufferOptions{Ring: true, MaxTuples: 100}, 1000, 10, 901, 0},
		{"ring bounded by bytes", BufferOptions{Ring: true, MaxBytes: 64 << 10}, 2000, 100, 0, 0},
		{"ring adopts batches, bounded by bytes", BufferOptions{Ring: true, MaxBytes: 200 << 10}, 10000, 100, 0, 400},
		{"ring adopts batches, bounded by tuples", BufferOptions{Ring: true, MaxTuples: 1000}, 10000, 100, 9001, 400},
		{"adopted batches", BufferOptions{}, 10000, 100, 1, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewOutputBuffer(tc.opts)
			w := b.NewWriter()
			payload := string(make([]byte, tc.payload))
			for id := uint64(1); id <= uint64(tc.tuples); id++ {
				if err := w.Add(dataTuple(id, payload)); err != nil {
					t.Fatal(err)
				}
				if tc.flushEvery > 0 && id%uint64(tc.flushEvery) == 0 && id < uint64(tc.tuples) {
					if err := w.Flush(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
			}
			if got := readAllIDs(t, b, 0); len(got) != 0 && tc.flushEvery == 0 {
				t.Fatalf("%d tuples visible before Flush", len(got))
			}
			if err := w.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			if w.Staged() != 0 {
				t.Fatalf("%d bytes still staged", w.Staged())
			}
			got := readAllIDs(t, b, 0)
			if len(got) == 0 || got[len(got)-1] != uint64(tc.tuples) {
				t.Fatalf("read %d ids ending %v", len(got), got[max(0, len(got)-1):])
			}
			if tc.wantFirst != 0 && got[0] != tc.wantFirst {
				t.Fatalf("oldest id %d, want %d", got[0], tc.wantFirst)
			}
			for i := 1; i < len(got); i++ {
				if got[i] != got[i-1]+1 {
					t.Fatalf("id %d after %d", got[i], got[i-1])
				}
			}
			st := b.Stats()
			if st.Tuples != len(got) || st.LastID != uint64(tc.tuples) {
				t.Fatalf("stats %+v, read %d", st, len(got))
			}
			if tc.opts.MaxBytes > 0 && st.Bytes > tc.opts.MaxBytes {
				t.Fatalf("ring holds %d bytes, bound %d", st.Bytes, tc.opts.MaxBytes)
			}
		})
	}
}

// TestWriterFlushBlocksUntilAcked: a flush larger than the buffer appends
// what fits, waits for acknowledgements, and keeps the rest staged when
// its context ends.
func TestWriterFlushBlocksUntilAcked(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{MaxTuples: 10})
	b.Register("down")
	w := b.NewWriter()
	for id := uint64(1); id <= 25; id++ {
		if err := w.Add(dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := w.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flush into a full buffer: %v", err)
	}
	if got := readAllIDs(t, b, 0); !slices.Equal(got, seq(1, 10)) {
		t.Fatalf("appended %v, want 1..10", got)
	}
	done := make(chan error, 1)
	go func() { done <- w.Flush(context.Background()) }()
	for after := uint64(10); after < 25; {
		b.Ack("down", after)
		waitFor(t, fmt.Sprintf("tuples after %d", after), func() bool { return b.Stats().LastID > after })
		after = b.Stats().LastID
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := readAllIDs(t, b, 20); !slices.Equal(got, seq(21, 25)) {
		t.Fatalf("tail %v, want 21..25", got)
	}
}

func TestWriterDiscardAndOrder(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{})
	w := b.NewWriter()
	for id := uint64(1); id <= 3; id++ {
		if err := w.Add(dataTuple(id, "a")); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(dataTuple(4, "b")); err != nil {
		t.Fatal(err)
	}
	if last := w.Discard(); last != 3 {
		t.Fatalf("Discard returned %d, want 3", last)
	}
	if err := w.Add(dataTuple(3, "c")); !errors.Is(err, ErrIDOrder) {
		t.Fatalf("reused id: %v", err)
	}
	if err := w.Add(dataTuple(5, "c")); !errors.Is(err, ErrIDOrder) {
		t.Fatalf("skipped id: %v", err)
	}
	if err := w.Add(dataTuple(4, "d")); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := w.Flush(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("flush after close: %v", err)
	}
}

// A stream with a gap (Append allows one): reads never cross it, so the
// ids of a read are consecutive, and every tuple is found by its id.
func TestBufferGap(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{})
	for _, id := range []uint64{1, 2, 3, 10, 11, 40} {
		if err := b.Append(ctx, dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
	var reads [][]uint64
	for after := uint64(0); ; {
		data, count, last, _, _, err := b.Read(after, MaxBatchBytes)
		if err != nil {
			t.Fatal(err)
		}
		if count == 0 {
			break
		}
		got := decodeAll(t, data)
		if len(got) != count || got[count-1] != last {
			t.Fatalf("after %d: read %v, buffer says %d ending with %d", after, got, count, last)
		}
		reads = append(reads, got)
		after = last
	}
	want := [][]uint64{{1, 2, 3}, {10, 11}, {40}}
	if !reflect.DeepEqual(reads, want) {
		t.Fatalf("reads %v, want %v", reads, want)
	}
	if got := readAllIDs(t, b, 10); !slices.Equal(got, []uint64{11, 40}) {
		t.Fatalf("after 10: %v", got)
	}
	if got := readAllIDs(t, b, 5); !slices.Equal(got, []uint64{10, 11, 40}) {
		t.Fatalf("after 5 (inside the gap): %v", got)
	}
}

func seq(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// Next numbers the stream itself, from 1, after a Discard from the first
// id not appended, and says when a network batch is staged.
func TestWriterNext(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{})
	w := b.NewWriter()
	tp := dataTuple(0, strings.Repeat("x", 1000))
	fulls := 0
	for i := 1; i <= 300; i++ {
		if w.Next(tp) {
			fulls++
			if err := w.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if tp.ID != uint64(i) {
			t.Fatalf("tuple %d got id %d", i, tp.ID)
		}
	}
	if fulls != 2 {
		t.Fatalf("%d full batches in 300 KB, want 2", fulls)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	w.Next(tp)
	if last := w.Discard(); last != 300 {
		t.Fatalf("Discard after a flush of 300: %d", last)
	}
	if w.Next(tp); tp.ID != 301 {
		t.Fatalf("after Discard: id %d, want 301", tp.ID)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.LastID != 301 || st.Tuples != 301 {
		t.Fatalf("buffer holds %d tuples up to %d", st.Tuples, st.LastID)
	}
}

// TestWriterFlushIdle: a flush waiting for room calls its idle function
// as the wait begins and again while it lasts (the buffer's lock
// released: idle may append to another buffer), and the wait is one
// blocked append all along, ending when the subscriber acknowledges.
func TestWriterFlushIdle(t *testing.T) {
	b := NewOutputBuffer(BufferOptions{MaxTuples: 10})
	b.Register("down")
	other := NewOutputBuffer(BufferOptions{MaxTuples: 100})
	ow := other.NewWriter()
	w := b.NewWriter()
	for id := uint64(1); id <= 15; id++ {
		if err := w.Add(dataTuple(id, "x")); err != nil {
			t.Fatal(err)
		}
	}
	calls := make(chan struct{}, 1000)
	next := uint64(1)
	idle := func() {
		// What a producer staged for its other output goes out meanwhile.
		if err := ow.Add(dataTuple(next, "y")); err != nil {
			t.Error(err)
		}
		next++
		if err := ow.Flush(context.Background()); err != nil {
			t.Error(err)
		}
		calls <- struct{}{}
	}
	done := make(chan error, 1)
	go func() { done <- w.FlushIdle(context.Background(), idle) }()
	waitFor(t, "idle called twice while the flush waits", func() bool { return len(calls) >= 2 })
	if st := b.Stats(); st.BlockedAppends != 1 || st.LastID != 10 {
		t.Fatalf("while waiting: %d blocked appends, last id %d; want 1 and 10", st.BlockedAppends, st.LastID)
	}
	waitFor(t, "the other buffer got what idle appended", func() bool { return other.Stats().LastID >= 2 })
	b.Ack("down", 10)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := readAllIDs(t, b, 10); !slices.Equal(got, seq(11, 15)) {
		t.Fatalf("tail %v, want 11..15", got)
	}
	// No wait, no idle call.
	n := len(calls)
	if err := w.Add(dataTuple(16, "x")); err != nil {
		t.Fatal(err)
	}
	b.Ack("down", 15)
	if err := w.FlushIdle(context.Background(), idle); err != nil || len(calls) != n {
		t.Fatalf("flush with room: %v, %d idle calls (want none)", err, len(calls)-n)
	}
}
