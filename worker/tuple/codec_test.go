package tuple

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func sampleTuples() []Tuple {
	return []Tuple{
		{Type: Boundary, ID: 1, STime: 50_000_000},
		{Type: Stable, ID: 2, STime: -5, Version: 3, Values: []Value{Int(-1), Int(math.MaxInt64), Int(math.MinInt64)}},
		{Type: Tentative, ID: math.MaxUint64, STime: math.MaxInt64, Values: []Value{
			Float(3.25), Float(math.Inf(-1)), Str(""), Str("héllo"), Bool(true), Bool(false),
			Timestamp(1_700_000_000_000_000_000), Bytes([]byte{0, 1, 2}), {Kind: KindInvalid},
		}},
		{Type: Undo, ID: 7},
		{Type: RecDone, ID: 8, STime: math.MinInt64},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, want := range sampleTuples() {
		t.Run(want.Type.String(), func(t *testing.T) {
			enc := AppendTuple(nil, &want)
			if got := EncodedSize(&want); got != len(enc) {
				t.Fatalf("EncodedSize = %d, encoding has %d bytes", got, len(enc))
			}
			var got Tuple
			n, err := DecodeTuple(enc, &got)
			if err != nil {
				t.Fatalf("DecodeTuple: %v", err)
			}
			if n != len(enc) {
				t.Fatalf("consumed %d of %d bytes", n, len(enc))
			}
			if len(want.Values) == 0 {
				want.Values = got.Values[:0]
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded %+v, want %+v", got, want)
			}
		})
	}
}

func TestBatchReader(t *testing.T) {
	var batch []byte
	samples := sampleTuples()
	for i := range samples {
		batch = AppendTuple(batch, &samples[i])
	}
	r := NewBatchReader(batch)
	var tp Tuple
	var ids []uint64
	for r.Next(&tp) {
		ids = append(ids, tp.ID)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(samples) || ids[len(ids)-1] != 8 {
		t.Fatalf("ids %v", ids)
	}
	r.Reset(batch[:len(batch)-1])
	n := 0
	for r.Next(&tp) {
		n++
	}
	if !errors.Is(r.Err(), ErrTruncated) || n != len(samples)-1 {
		t.Fatalf("truncated batch: read %d tuples, err %v", n, r.Err())
	}
}

func TestDecodeErrors(t *testing.T) {
	good := AppendTuple(nil, &Tuple{Type: Stable, ID: 1, Values: []Value{Str("abc"), Float(1)}})
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"bad type", []byte{9, 1, 0, 0, 0}, ErrBadType},
		{"zero type", []byte{0, 1, 0, 0, 0}, ErrBadType},
		{"header cut", []byte{1, 1}, ErrTruncated},
		{"id overflow", append([]byte{1}, strings.Repeat("\xff", 10)+"\x01"...), ErrBadValue},
		{"count too large", []byte{1, 1, 0, 0, 100, 1, 1}, ErrTruncated},
		{"bad kind", []byte{1, 1, 0, 0, 1, 42}, ErrBadKind},
		{"bad bool", []byte{1, 1, 0, 0, 1, byte(KindBool), 2}, ErrBadValue},
		{"string cut", good[:len(good)-10], ErrTruncated},
		{"float cut", good[:len(good)-1], ErrTruncated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var tp Tuple
			_, err := DecodeTuple(tc.in, &tp)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestDecodedStringsAliasAndClone(t *testing.T) {
	enc := AppendTuple(nil, &Tuple{Type: Stable, Values: []Value{Str("abc")}})
	var tp Tuple
	if _, err := DecodeTuple(enc, &tp); err != nil {
		t.Fatal(err)
	}
	c := tp.Clone()
	copy(enc[len(enc)-3:], "xyz")
	if tp.Values[0].S != "xyz" {
		t.Fatalf("decoded string should alias the batch, got %q", tp.Values[0].S)
	}
	if c.Values[0].S != "abc" {
		t.Fatalf("clone changed with the batch: %q", c.Values[0].S)
	}
}

func FuzzDecodeTuple(f *testing.F) {
	for _, s := range sampleTuples() {
		f.Add(AppendTuple(nil, &s))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var tp Tuple
		n, err := DecodeTuple(data, &tp)
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrBadKind) &&
				!errors.Is(err, ErrBadType) && !errors.Is(err, ErrBadValue) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if n <= 0 || n > len(data) {
			t.Fatalf("consumed %d of %d bytes", n, len(data))
		}
		// A successful decode re-encodes to something that decodes to the
		// same tuple (encodings are not unique: varints may be padded).
		again := AppendTuple(nil, &tp)
		var tp2 Tuple
		if _, err := DecodeTuple(again, &tp2); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(again, AppendTuple(nil, &tp2)) {
			t.Fatalf("re-encoding is not stable")
		}
	})
}

// record100 is a typical ~100-byte record.
func record100() *Tuple {
	return &Tuple{Type: Stable, ID: 123456, STime: 1_700_000_000_000_000_000, Values: []Value{
		Timestamp(1_700_000_000_000_000_000), Str("10.0.13.7"), Str("192.168.200.14"), Int(443),
		Str("some words of payload text go here, forty-ish."), Float(0.75),
	}}
}

func TestZeroAllocsSteadyState(t *testing.T) {
	rec := record100()
	buf := make([]byte, 0, 4096)
	var out Tuple
	allocs := testing.AllocsPerRun(100, func() {
		buf = AppendTuple(buf[:0], rec)
		if _, err := DecodeTuple(buf, &out); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per encode+decode, want 0", allocs)
	}
}

func BenchmarkEncode100B(b *testing.B) {
	rec := record100()
	buf := make([]byte, 0, 64<<10)
	b.SetBytes(int64(EncodedSize(rec)))
	b.ReportAllocs()
	for b.Loop() {
		if len(buf) > 60<<10 {
			buf = buf[:0]
		}
		buf = AppendTuple(buf, rec)
	}
}

func BenchmarkDecode100B(b *testing.B) {
	rec := record100()
	var batch []byte
	for len(batch) < 60<<10 {
		batch = AppendTuple(batch, rec)
	}
	size := EncodedSize(rec)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	var r BatchReader
	var t Tuple
	r.Reset(batch)
	for b.Loop() {
		if !r.Next(&t) {
			r.Reset(batch)
			r.Next(&t)
		}
	}
}
