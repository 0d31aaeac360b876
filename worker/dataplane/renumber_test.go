package dataplane

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// readNumbered reads every retained tuple after `after` and returns
// "id:k" for each, k being the tuple's stime (the order it was staged in).
func readNumbered(t *testing.T, b *OutputBuffer, after uint64) []string {
	t.Helper()
	var got []string
	for {
		data, count, last, _, _, err := b.Read(after, MaxBatchBytes)
		if err != nil {
			t.Fatal(err)
		}
		if count == 0 {
			return got
		}
		ks := decodeAll(t, data)
		for i, k := range ks {
			got = append(got, fmt.Sprintf("%d:%d", last-uint64(count)+1+uint64(i), k))
		}
		after = last
	}
}

// numbered is want's "id:k" for tuples k = 1..n numbered from first.
func numbered(first uint64, n int) []string {
	var s []string
	for k := 1; k <= n; k++ {
		s = append(s, fmt.Sprintf("%d:%d", first+uint64(k-1), k))
	}
	return s
}

// TestRenumberOnFirstResume: a stream whose producer started again
// without its earlier copy's state, numbered from 1, continues after the
// position its consumer resumes at, whenever the consumer comes: the
// tuples appended before it came, the ones staged, and the next ones.
// Before, the consumer read after its position and skipped as many of
// them.
func TestRenumberOnFirstResume(t *testing.T) {
	tests := []struct {
		name string
		// flushed are staged and flushed before the consumer comes,
		// staged only staged, after staged and flushed after it came.
		flushed, staged, after int
		renumber               bool
		resume                 uint64
		want                   []string
	}{
		{"consumer from nothing: ids stand", 3, 0, 2, true, 0, numbered(1, 5)},
		{"flushed before it came", 3, 0, 2, true, 7, numbered(8, 5)},
		{"staged when it came", 2, 2, 1, true, 7, numbered(8, 5)},
		{"nothing before it came", 0, 0, 3, true, 7, numbered(8, 3)},
		{"not asked: the consumer skips", 3, 0, 2, false, 2, []string{"3:3", "4:4", "5:5"}},
	}
	ctx := context.Background()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewOutputBuffer(BufferOptions{Unreplicated: true})
			if tc.renumber {
				b.RenumberOnFirstResume()
			}
			w := b.NewWriter()
			k := 0
			stage := func(n int) {
				for range n {
					k++
					w.Next(&tuple.Tuple{Type: tuple.Stable, STime: int64(k), Values: []tuple.Value{tuple.Str("x")}})
				}
			}
			stage(tc.flushed)
			if err := w.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			stage(tc.staged)
			b.Connect("down")
			b.resumeFirst(tc.resume)
			b.resumeFirst(tc.resume + 100) // only the first renumbers
			stage(tc.after)
			if err := w.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if got := readNumbered(t, b, tc.resume); !slices.Equal(got, tc.want) {
				t.Fatalf("read after %d: %v, want %v", tc.resume, got, tc.want)
			}
			if n := tc.flushed + tc.staged + tc.after; len(tc.want) > 0 && w.LastID() != tc.resume+uint64(n) && tc.renumber {
				t.Fatalf("writer's last id %d, want %d", w.LastID(), tc.resume+uint64(n))
			}
		})
	}
}

// TestRenumberWhileFlushWaits: the consumer comes while the producer's
// flush waits for room (its tuples partly appended): the rest follow
// the renumbered ones.
func TestRenumberWhileFlushWaits(t *testing.T) {
	ctx := context.Background()
	b := NewOutputBuffer(BufferOptions{MaxTuples: 4, Unreplicated: true})
	b.RenumberOnFirstResume()
	w := b.NewWriter()
	for k := 1; k <= 6; k++ {
		w.Next(&tuple.Tuple{Type: tuple.Stable, STime: int64(k), Values: []tuple.Value{tuple.Str("x")}})
	}
	done := make(chan error, 1)
	go func() { done <- w.Flush(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().BlockedAppends != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the flush never waited for room")
		}
		time.Sleep(time.Millisecond)
	}
	b.Connect("down")
	b.resumeFirst(10)
	if got, want := readNumbered(t, b, 10), numbered(11, 4); !slices.Equal(got, want) {
		t.Fatalf("read while the flush waits: %v, want %v", got, want)
	}
	b.Ack("down", 12)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := readNumbered(t, b, 12), []string{"13:3", "14:4", "15:5", "16:6"}; !slices.Equal(got, want) {
		t.Fatalf("read after the flush: %v, want %v", got, want)
	}
	b.Ack("down", 16)
	w.Next(&tuple.Tuple{Type: tuple.Stable, STime: 7, Values: []tuple.Value{tuple.Str("x")}})
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readNumbered(t, b, 16); !slices.Equal(got, []string{"17:7"}) {
		t.Fatalf("the next tuple: %v, want [17:7]", got)
	}
}
