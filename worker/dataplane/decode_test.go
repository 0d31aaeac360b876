package dataplane

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestBatchDecoder checks decoding against the encoded tuples: duplicates
// skipped, widths that outgrow the value array, and header mismatches.
func TestBatchDecoder(t *testing.T) {
	mk := func(id uint64, width int) tuple.Tuple {
		tp := tuple.Tuple{Type: tuple.Stable, ID: id, STime: int64(id) * 1000, Version: id % 3}
		for i := range width {
			tp.Values = append(tp.Values, tuple.Str(fmt.Sprint("v", id, ".", i)), tuple.Int(int64(i)))
		}
		return tp
	}
	widths := func(ws ...int) []tuple.Tuple {
		var ts []tuple.Tuple
		for i, w := range ws {
			ts = append(ts, mk(uint64(i+1), w))
		}
		return ts
	}
	cases := []struct {
		name    string
		tuples  []tuple.Tuple
		after   uint64
		count   int // header count; -1: len(tuples)
		lastID  uint64
		wantErr bool
	}{
		{name: "plain", tuples: widths(1, 1, 1), lastID: 3},
		{name: "no values", tuples: widths(0, 0), lastID: 2},
		{name: "growing widths", tuples: widths(1, 3, 0, 5, 8, 2), lastID: 6},
		{name: "duplicates skipped", tuples: widths(2, 2, 2, 2), after: 2, lastID: 4},
		{name: "all duplicates", tuples: widths(1, 1), after: 5, lastID: 2},
		{name: "count too small", tuples: widths(1, 1), count: 1, lastID: 2, wantErr: true},
		{name: "count too large", tuples: widths(1, 1), count: 3, lastID: 2, wantErr: true},
		{name: "last id below count", tuples: widths(1, 1), lastID: 1, wantErr: true},
	}
	var dec batchDecoder
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var data []byte
			for i := range tc.tuples {
				data = tuple.AppendTuple(data, &tc.tuples[i])
			}
			count := tc.count
			if count == 0 {
				count = len(tc.tuples)
			}
			b, err := dec.decode(data, count, tc.lastID, tc.after)
			if tc.wantErr {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("err = %v, want ErrProtocol", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer b.Release()
			var want []tuple.Tuple
			for _, tp := range tc.tuples {
				if tp.ID > tc.after {
					want = append(want, tp)
				}
			}
			if len(b.Tuples) != len(want) {
				t.Fatalf("%d tuples, want %d", len(b.Tuples), len(want))
			}
			for i := range want {
				got := b.Tuples[i]
				if len(got.Values) == 0 {
					got.Values = nil
				}
				if !reflect.DeepEqual(got, want[i]) {
					t.Errorf("tuple %d = %+v, want %+v", i, got, want[i])
				}
				if cap(b.Tuples[i].Values) != len(b.Tuples[i].Values) {
					t.Errorf("tuple %d: values cap %d > len %d (appending would overwrite the next tuple)", i, cap(b.Tuples[i].Values), len(b.Tuples[i].Values))
				}
			}
			// Value slices do not overlap: overwriting one tuple's values
			// leaves the others intact.
			for i := range b.Tuples {
				for j := range b.Tuples[i].Values {
					b.Tuples[i].Values[j] = tuple.Str("overwritten")
				}
				for k := i + 1; k < len(b.Tuples); k++ {
					if !reflect.DeepEqual(b.Tuples[k].Values, want[k].Values) && len(want[k].Values) > 0 {
						t.Fatalf("writing tuple %d's values changed tuple %d", i, k)
					}
				}
			}
		})
	}
}

// BenchmarkBatchDecoder decodes a 64 KiB batch of forward-benchmark
// records (a sequence number and an 81-byte payload).
func BenchmarkBatchDecoder(b *testing.B) {
	var data []byte
	n := 0
	for len(data) < 64<<10 {
		tp := tuple.Tuple{Type: tuple.Stable, ID: uint64(n + 1), STime: 1_700_000_000_000_000_000 + int64(n)*1000,
			Values: []tuple.Value{tuple.Int(int64(n)), tuple.Str(string(make([]byte, 81)))}}
		data = tuple.AppendTuple(data, &tp)
		n++
	}
	var dec batchDecoder
	b.ReportAllocs()
	for b.Loop() {
		bt, err := dec.decode(data, n, uint64(n), 0)
		if err != nil {
			b.Fatal(err)
		}
		bt.Release()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/tuple")
}

// TestBatchDecoderPacked: a packed decode delivers the kept tuples'
// encoding and offsets (each tuple's bytes decode to the original), and
// packed tuples that re-encode to those bytes; an index-only decode the
// same encoding and offsets with the first id.
func TestBatchDecoderPacked(t *testing.T) {
	var (
		tuples []tuple.Tuple
		data   []byte
	)
	for id := uint64(1); id <= 6; id++ {
		tp := tuple.Tuple{Type: tuple.Stable, ID: id, STime: int64(id), Values: []tuple.Value{tuple.Int(int64(id)), tuple.Str(fmt.Sprint("payload-", id))}}
		if id == 4 {
			tp = tuple.Tuple{Type: tuple.Boundary, ID: id, STime: 4}
		}
		tuples = append(tuples, tp)
		data = tuple.AppendTuple(data, &tp)
	}
	for _, after := range []uint64{0, 2, 5} {
		dec := batchDecoder{packed: true}
		b, err := dec.decode(data, len(tuples), 6, after)
		if err != nil {
			t.Fatal(err)
		}
		kept := tuples[after:]
		if len(b.Tuples) != len(kept) || len(b.Offsets) != len(kept) {
			t.Fatalf("after %d: %d tuples, %d offsets; want %d", after, len(b.Tuples), len(b.Offsets), len(kept))
		}
		for i := range kept {
			if b.Tuples[i].ID != kept[i].ID {
				t.Fatalf("after %d: tuple %d has id %d, want %d", after, i, b.Tuples[i].ID, kept[i].ID)
			}
		}
		var want []byte
		for i := range kept {
			want = tuple.AppendTuple(want, &kept[i])
		}
		if !reflect.DeepEqual(b.Encoded, want) {
			t.Fatalf("after %d: Encoded differs from the kept tuples' encoding", after)
		}
		for i := range kept {
			end := len(b.Encoded)
			if i+1 < len(b.Offsets) {
				end = b.Offsets[i+1]
			}
			if got := tuple.AppendTuple(nil, &b.Tuples[i]); !reflect.DeepEqual(got, b.Encoded[b.Offsets[i]:end]) {
				t.Fatalf("after %d: tuple %d re-encodes to %x, its bytes are %x", after, i, got, b.Encoded[b.Offsets[i]:end])
			}
			var full tuple.Tuple
			if _, err := tuple.DecodeTuple(b.Encoded[b.Offsets[i]:end], &full); err != nil || !reflect.DeepEqual(full.Values, kept[i].Values) && len(kept[i].Values) > 0 {
				t.Fatalf("after %d: tuple %d decodes to %v (%v), want %v", after, i, full.Values, err, kept[i].Values)
			}
		}
		b.Release()

		// Index only: the same encoding and offsets, the ids, no tuples.
		idx := batchDecoder{packed: true, index: true}
		ib, err := idx.decode(data, len(tuples), 6, after)
		if err != nil {
			t.Fatal(err)
		}
		if len(ib.Tuples) != 0 || ib.Len() != len(kept) || !reflect.DeepEqual(ib.Encoded, want) || ib.LastID != 6 {
			t.Fatalf("after %d: index-only batch: %d tuples, len %d, last id %d", after, len(ib.Tuples), ib.Len(), ib.LastID)
		}
		if ib.FirstID != kept[0].ID {
			t.Fatalf("after %d: first id %d, want %d", after, ib.FirstID, kept[0].ID)
		}
		if _, err := idx.decode(data, len(tuples), 5, after); !errors.Is(err, ErrProtocol) {
			t.Fatalf("after %d: last id below the count accepted: %v", after, err)
		}
		if _, err := idx.decode(data[:len(data)-1], len(tuples), 6, after); !errors.Is(err, ErrProtocol) {
			t.Fatalf("after %d: truncated batch accepted: %v", after, err)
		}
		ib.Release()
	}
}

// A delivery of encodings checks each tuple's size and header, not its
// values: a tuple whose values are malformed passes through, and whoever
// decodes it later is refused with the codec's error (a bad header or
// size is refused at once). Full decoding refuses it on arrival.
func TestBatchDecoderIndexLeavesValuesToDecoders(t *testing.T) {
	good := tuple.AppendTuple(nil, &tuple.Tuple{Type: tuple.Stable, STime: 1, Values: []tuple.Value{tuple.Int(7)}})
	bad := slices.Clone(good)
	bad[len(bad)-2] = 42 // the value's kind byte
	data := append(slices.Clone(good), bad...)

	idx := batchDecoder{packed: true, index: true}
	b, err := idx.decode(data, 2, 2, 0)
	if err != nil {
		t.Fatalf("index delivery refused a batch whose headers are sound: %v", err)
	}
	r := tuple.NewBatchReader(b.Encoded, b.FirstID)
	var tp tuple.Tuple
	n := 0
	for r.Next(&tp) {
		n++
	}
	if n != 1 || !errors.Is(r.Err(), tuple.ErrBadKind) {
		t.Fatalf("decoding the delivered batch: %d tuples, err %v; want 1 then ErrBadKind", n, r.Err())
	}
	var full batchDecoder
	if _, err := full.decode(data, 2, 2, 0); !errors.Is(err, ErrProtocol) || !errors.Is(err, tuple.ErrBadKind) {
		t.Fatalf("full decoding: %v, want ErrProtocol wrapping ErrBadKind", err)
	}
	badType := slices.Clone(good)
	badType[1] = 99
	if _, err := idx.decode(append(slices.Clone(good), badType...), 2, 2, 0); !errors.Is(err, tuple.ErrBadType) {
		t.Fatalf("index delivery of a bad type byte: %v, want ErrBadType", err)
	}
}
