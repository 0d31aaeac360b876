package tuple

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"slices"
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
			got := Tuple{ID: want.ID} // ids are not encoded
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
	r := NewBatchReader(batch, 41)
	var tp Tuple
	var ids []uint64
	for r.Next(&tp) {
		ids = append(ids, tp.ID)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []uint64{41, 42, 43, 44, 45}) {
		t.Fatalf("ids %v, want the batch's positions from 41", ids)
	}
	r.Reset(batch[:len(batch)-1], 1)
	n := 0
	for r.Next(&tp) {
		n++
	}
	if !errors.Is(r.Err(), ErrTruncated) || n != len(samples)-1 {
		t.Fatalf("truncated batch: read %d tuples, err %v", n, r.Err())
	}
}

// hdr is the body of an encoded STABLE tuple up to its version: type and
// an 8-byte stime 0.
func hdr() []byte { return []byte{1, 0, 0, 0, 0, 0, 0, 0, 0} }

// framed prefixes body with its size, as an encoded tuple starts.
func framed(body []byte) []byte {
	return append(binary.AppendUvarint(nil, uint64(len(body))), body...)
}

func TestDecodeErrors(t *testing.T) {
	good := AppendTuple(nil, &Tuple{Type: Stable, ID: 1, Values: []Value{Str("abc"), Float(1)}})
	tests := []struct {
		name string
		in   []byte
		want error
		// headerOK: the error is in the values, which DecodeHeader does
		// not read.
		headerOK bool
	}{
		{"empty", nil, ErrTruncated, false},
		{"size overflow", []byte(strings.Repeat("\xff", 10) + "\x01"), ErrBadValue, false},
		{"size beyond input", framed(append(hdr(), 0, 0))[:11], ErrTruncated, false},
		{"size cut", []byte{0x80}, ErrTruncated, false},
		{"zero size", []byte{0}, ErrTruncated, false},
		{"bad type", framed([]byte{9, 0, 0, 0, 0}), ErrBadType, false},
		{"zero type", framed([]byte{0, 0, 0, 0, 0}), ErrBadType, false},
		{"header cut", framed([]byte{1, 1}), ErrTruncated, false},
		{"stime cut", framed([]byte{1, 0, 0, 0, 0, 0, 0, 0}), ErrTruncated, false},
		{"version overflow", framed(append(hdr(), strings.Repeat("\xff", 10)+"\x01"...)), ErrBadValue, false},
		{"count too large", framed(append(hdr(), 0, 100, 1, 1)), ErrTruncated, false},
		{"value past size", append(framed(append(hdr(), 0, 1, byte(KindInt))), 2), ErrTruncated, true},
		{"bytes after values", framed(append(hdr(), 0, 1, byte(KindInt), 2, 0)), ErrBadValue, true},
		{"bad kind", framed(append(hdr(), 0, 1, 42)), ErrBadKind, true},
		{"bad bool", framed(append(hdr(), 0, 1, byte(KindBool), 2)), ErrBadValue, true},
		{"string cut", good[:len(good)-10], ErrTruncated, false},
		{"float cut", good[:len(good)-1], ErrTruncated, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var tp Tuple
			_, err := DecodeTuple(tc.in, &tp)
			if !errors.Is(err, tc.want) {
				t.Fatalf("DecodeTuple: err = %v, want %v", err, tc.want)
			}
			n, err := DecodeHeader(tc.in, &tp)
			switch {
			case tc.headerOK && err != nil:
				t.Fatalf("DecodeHeader: err = %v, want the header accepted", err)
			case tc.headerOK && n != int(tc.in[0])+1:
				t.Fatalf("DecodeHeader consumed %d bytes, want the size's %d", n, tc.in[0]+1)
			case !tc.headerOK && !errors.Is(err, tc.want):
				t.Fatalf("DecodeHeader: err = %v, want %v", err, tc.want)
			}
		})
	}
}

// Two tuples whose size prefixes are written with and without padding,
// and a body whose size needs more bytes than its smallest possible
// encoding suggested, decode alike.
func TestSizePrefix(t *testing.T) {
	tp := Tuple{Type: Stable, ID: 5, Values: []Value{Str("abc")}}
	enc := AppendTuple(nil, &tp)
	padded := append([]byte{enc[0] | 0x80, 0}, enc[1:]...)
	var got Tuple
	if n, err := DecodeTuple(padded, &got); err != nil || n != len(padded) || got.Values[0].S != "abc" {
		t.Fatalf("padded size: %d, %v, %v", n, err, got.Values)
	}
	// 110 one-byte ints: at least 12+220 bytes, so two size bytes are
	// reserved; ints of two bytes each still fit. 60 ints whose zigzag
	// needs 3 bytes: at least 12+120 (two bytes reserved) and in fact more.
	// Around 128: 56 ints of 2 bytes reserve one byte (12+112 < 128) and
	// need two (12+168 >= 128), so the body moves.
	for _, n := range []int{1, 56, 60, 110} {
		vals := make([]Value, n)
		for i := range vals {
			vals[i] = Int(int64(i) * 1000)
		}
		tp := Tuple{Type: Stable, ID: 9, Values: vals}
		enc := AppendTuple([]byte("pre"), &tp)
		if len(enc)-3 != EncodedSize(&tp) {
			t.Fatalf("%d ints: encoded %d bytes, EncodedSize %d", n, len(enc)-3, EncodedSize(&tp))
		}
		if m, err := DecodeTuple(enc[3:], &got); err != nil || m != len(enc)-3 || !slices.Equal(got.Values, vals) {
			t.Fatalf("%d ints: decoded %d of %d bytes, %v", n, m, len(enc)-3, err)
		}
	}
}

// A tuple decoded by DecodeHeader re-encodes, under a new version, to exactly
// what the fully decoded tuple encodes to, and decoding that yields the values
// DecodeTuple yields.
func TestDecodeHeaderPassThrough(t *testing.T) {
	for _, want := range sampleTuples() {
		t.Run(want.Type.String(), func(t *testing.T) {
			enc := AppendTuple(nil, &want)
			var full, packed Tuple
			if _, err := DecodeTuple(enc, &full); err != nil {
				t.Fatal(err)
			}
			packed.Values = make([]Value, 0, 4) // a reused tuple's leftovers
			n, err := DecodeHeader(enc, &packed)
			if err != nil || n != len(enc) {
				t.Fatalf("DecodeHeader = %d, %v; want %d bytes", n, err, len(enc))
			}
			if !packed.Packed() || len(packed.Values) != 0 {
				t.Fatalf("Packed() = %v with %d values", packed.Packed(), len(packed.Values))
			}
			if packed.Type != want.Type || packed.STime != want.STime || packed.Version != want.Version {
				t.Fatalf("header %+v, want %+v", packed, want)
			}
			for _, v := range []uint64{0, 300, math.MaxUint64} {
				full.Version, packed.Version = v, v
				wantEnc := AppendTuple([]byte("x"), &full)
				if got := AppendTuple([]byte("x"), &packed); !bytes.Equal(got, wantEnc) {
					t.Fatalf("version %d: packed re-encoding %x, want %x", v, got, wantEnc)
				}
				if got := AppendTuple(make([]byte, 1, 1+EncodedSize(&packed)), &packed); !bytes.Equal(got[1:], wantEnc[1:]) {
					t.Fatalf("version %d: in-place packed re-encoding %x, want %x", v, got, wantEnc)
				}
				if got := EncodedSize(&packed); got != len(wantEnc)-1 {
					t.Fatalf("version %d: EncodedSize %d, want %d", v, got, len(wantEnc)-1)
				}
			}
			c := packed.Clone()
			var again Tuple
			if _, err := DecodeTuple(AppendTuple(nil, &packed), &again); err != nil || !slices.Equal(again.Values, full.Values) && len(full.Values) > 0 {
				t.Fatalf("packed re-encoding decodes to %v (%v), want %v", again.Values, err, full.Values)
			}
			if !c.Packed() || !bytes.Equal(AppendTuple(nil, c), AppendTuple(nil, &full)) {
				t.Fatal("a clone of a packed tuple does not encode like the original")
			}
			// Values set on a packed tuple win over the packed bytes.
			var p2 Tuple
			if _, err := DecodeHeader(enc, &p2); err != nil {
				t.Fatal(err)
			}
			p2.Values = []Value{Int(7)}
			want2 := Tuple{Type: p2.Type, ID: p2.ID, STime: p2.STime, Version: p2.Version, Values: []Value{Int(7)}}
			if !bytes.Equal(AppendTuple(nil, &p2), AppendTuple(nil, &want2)) {
				t.Fatal("values set after DecodeHeader were ignored")
			}
		})
	}
}

// Ids are positions, not part of a tuple's encoding.
func TestIDNotEncoded(t *testing.T) {
	a := Tuple{Type: Stable, ID: 1, Values: []Value{Int(5)}}
	b := a
	b.ID = math.MaxUint64
	if !bytes.Equal(AppendTuple(nil, &a), AppendTuple(nil, &b)) || EncodedSize(&a) != EncodedSize(&b) {
		t.Fatal("tuples that differ only in id encode differently")
	}
	got := Tuple{ID: 77}
	if _, err := DecodeTuple(AppendTuple(nil, &a), &got); err != nil || got.ID != 77 {
		t.Fatalf("DecodeTuple changed the id to %d (%v)", got.ID, err)
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
			// DecodeHeader may accept a tuple whose values are bad (it
			// does not read them), but nothing with a bad size or header.
			var hp Tuple
			if _, herr := DecodeHeader(data, &hp); herr != nil && !sameClass(err, herr) {
				t.Fatalf("DecodeHeader refused with %v, DecodeTuple with %v", herr, err)
			}
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
		// same tuple (encodings are not unique: varints may be padded),
		// whichever path the encoder takes.
		again := AppendTuple(nil, &tp)
		if roomy := AppendTuple(make([]byte, 3, len(data)+(len(tp.Values)+4)*binary.MaxVarintLen64), &tp); !bytes.Equal(roomy[3:], again) {
			t.Fatalf("encodings with and without room differ: % x and % x", roomy[3:], again)
		}
		var tp2 Tuple
		if _, err := DecodeTuple(again, &tp2); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(again, AppendTuple(nil, &tp2)) {
			t.Fatalf("re-encoding is not stable")
		}
		// DecodeHeader accepts what DecodeTuple accepts, and its
		// pass-through re-encoding matches the decoded one's.
		var hp Tuple
		hn, herr := DecodeHeader(data, &hp)
		if herr != nil || hn != n {
			t.Fatalf("DecodeHeader = %d, %v; DecodeTuple consumed %d", hn, herr, n)
		}
		var tp3 Tuple
		if _, err := DecodeTuple(AppendTuple(nil, &hp), &tp3); err != nil {
			t.Fatalf("decode packed re-encoding: %v", err)
		}
		if !bytes.Equal(AppendTuple(nil, &tp3), again) {
			t.Fatalf("packed re-encoding differs from the decoded one")
		}
	})
}

// sameClass reports whether a and b wrap the same one of the codec's errors.
func sameClass(a, b error) bool {
	for _, class := range []error{ErrTruncated, ErrBadKind, ErrBadType, ErrBadValue} {
		if errors.Is(a, class) && errors.Is(b, class) {
			return true
		}
	}
	return false
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
	r.Reset(batch, 1)
	for b.Loop() {
		if !r.Next(&t) {
			r.Reset(batch, 1)
			r.Next(&t)
		}
	}
}

// TestUvarintAtMatchesBinary checks the word-at-a-time varint decoder
// against encoding/binary on every length, padded (overlong) encodings,
// overflows and truncations, at every position relative to the input end.
func TestUvarintAtMatchesBinary(t *testing.T) {
	var inputs [][]byte
	for shift := 0; shift < 64; shift++ {
		for _, x := range []uint64{1 << shift, 1<<shift - 1, 1<<shift + 1} {
			inputs = append(inputs, binary.AppendUvarint(nil, x))
		}
	}
	inputs = append(inputs,
		binary.AppendUvarint(nil, math.MaxUint64),
		[]byte{0x80, 0x00},                          // padded zero
		[]byte{0xff, 0x80, 0x80, 0x80, 0x00},        // padded 127
		append(bytes.Repeat([]byte{0x80}, 7), 0x00), // padded zero, 8 bytes
		append(bytes.Repeat([]byte{0x80}, 8), 0x00), // padded zero, 9 bytes
		bytes.Repeat([]byte{0xff}, 9),
		append(bytes.Repeat([]byte{0xff}, 9), 0x01),
		append(bytes.Repeat([]byte{0xff}, 9), 0x02), // overflows
		bytes.Repeat([]byte{0x80}, 10),
		bytes.Repeat([]byte{0x80}, 12),
		append(bytes.Repeat([]byte{0x80}, 10), 0x00), // 11 bytes: overflow
	)
	for _, in := range inputs {
		for lead := 0; lead < 3; lead++ {
			for cut := 0; cut <= len(in); cut++ {
				for tail := 0; tail < 12; tail += 3 {
					src := append(append(bytes.Repeat([]byte{0x85}, lead), in[:cut]...), bytes.Repeat([]byte{0x81}, tail)...)
					wantX, wantK := binary.Uvarint(src[lead:])
					gotX, gotK := uvarintAt(src, lead)
					if gotX != wantX || gotK != wantK {
						t.Fatalf("uvarintAt(% x, %d) = %d, %d; binary.Uvarint = %d, %d", src, lead, gotX, gotK, wantX, wantK)
					}
				}
			}
		}
	}
}

// TestAppendTupleMatchesReference compares AppendTuple with a plain
// byte-by-byte encoder written from the format description.
func TestAppendTupleMatchesReference(t *testing.T) {
	reference := func(t *Tuple) []byte {
		dst := []byte{byte(t.Type)}
		dst = binary.LittleEndian.AppendUint64(dst, uint64(t.STime))
		dst = binary.AppendUvarint(dst, t.Version)
		dst = binary.AppendUvarint(dst, uint64(len(t.Values)))
		for _, v := range t.Values {
			dst = append(dst, byte(v.Kind))
			switch v.Kind {
			case KindInt, KindTimestamp:
				dst = binary.AppendVarint(dst, v.I)
			case KindFloat:
				dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(v.F))
			case KindBool:
				dst = append(dst, byte(boolBit(v.I != 0)))
			case KindString, KindBytes:
				dst = binary.AppendUvarint(dst, uint64(len(v.S)))
				dst = append(dst, v.S...)
			}
		}
		return framed(dst)
	}
	tuples := append(sampleTuples(), *record100(),
		Tuple{Type: Stable, ID: 300, STime: -300, Version: 1 << 40, Values: []Value{
			Str(strings.Repeat("x", 200)), Int(-64), Int(64), Bool(true), {Kind: KindBool, I: 5}, Bytes(make([]byte, 20000)),
		}})
	for i := range tuples {
		want := reference(&tuples[i])
		// Small capacities take the appending path, a large one the
		// unchecked one (room for any encoding of the tuple).
		for _, prefix := range [][]byte{nil, []byte("abc"), make([]byte, 5, 6), make([]byte, 7, 1<<16)} {
			got := AppendTuple(slices.Clone(prefix), &tuples[i])
			if !bytes.Equal(got[len(prefix):], want) || !bytes.Equal(got[:len(prefix)], prefix) {
				t.Fatalf("tuple %d: AppendTuple = % x, want % x", i, got, want)
			}
		}
		// Capacity for exactly the encoding is enough: no reallocation.
		exact := make([]byte, 3, 3+len(want))
		if got := AppendTuple(exact, &tuples[i]); &got[0] != &exact[0] || !bytes.Equal(got[3:], want) {
			t.Fatalf("tuple %d: AppendTuple into exact capacity reallocated or differs", i)
		}
	}
}

func boolBit(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// BenchmarkDecodeForward decodes the records of the forward benchmark
// (a sequence number and an 81-byte payload, stimes 1µs apart).
func BenchmarkDecodeForward(b *testing.B) {
	var batch []byte
	n := 0
	for len(batch) < 60<<10 {
		rec := Tuple{Type: Stable, ID: uint64(500_000 + n), STime: 1_700_000_000_000_000_000 + int64(n)*1000,
			Values: []Value{Int(int64(n)), Str(strings.Repeat("p", 81))}}
		batch = AppendTuple(batch, &rec)
		n++
	}
	b.SetBytes(int64(len(batch)))
	b.ReportAllocs()
	var r BatchReader
	var t Tuple
	for b.Loop() {
		r.Reset(batch, 1)
		for r.Next(&t) {
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/tuple")
}

func BenchmarkDecodeHeader100B(b *testing.B) {
	rec := record100()
	var batch []byte
	for len(batch) < 60<<10 {
		batch = AppendTuple(batch, rec)
	}
	b.SetBytes(int64(EncodedSize(rec)))
	b.ReportAllocs()
	var t Tuple
	off := 0
	for b.Loop() {
		if off == len(batch) {
			off = 0
		}
		n, err := DecodeHeader(batch[off:], &t)
		if err != nil {
			b.Fatal(err)
		}
		off += n
	}
}

// BenchmarkEncodeBlob encodes the forward benchmark's record shape: a
// sequence number and an 81-byte payload.
func BenchmarkEncodeBlob(b *testing.B) {
	rec := &Tuple{Type: Stable, ID: 3_000_000, STime: 1_700_000_000_000_000_000, Values: []Value{Int(2_999_999), Str(strings.Repeat("p", 81))}}
	buf := make([]byte, 0, 128<<10)
	b.SetBytes(int64(EncodedSize(rec)))
	for b.Loop() {
		if len(buf)+200 > cap(buf) {
			buf = buf[:0]
		}
		buf = AppendTuple(buf, rec)
	}
}

// TestPutUvarintMatchesBinary: the 8-byte-store encoding writes exactly
// binary.PutUvarint's bytes, around every group boundary.
func TestPutUvarintMatchesBinary(t *testing.T) {
	var xs []uint64
	for shift := range 64 {
		xs = append(xs, 1<<shift, 1<<shift-1, 1<<shift+1)
	}
	xs = append(xs, 0, math.MaxUint64, 0x0123456789abcdef, 1<<56-1)
	for _, x := range xs {
		got := make([]byte, binary.MaxVarintLen64)
		want := make([]byte, binary.MaxVarintLen64)
		n, m := putUvarint(got, x), binary.PutUvarint(want, x)
		if n != m || !bytes.Equal(got[:n], want[:m]) {
			t.Fatalf("%#x: putUvarint = %x, binary.PutUvarint = %x", x, got[:n], want[:m])
		}
	}
}

func TestPeekType(t *testing.T) {
	for _, tp := range sampleTuples() {
		if got := PeekType(AppendTuple(nil, &tp)); got != tp.Type {
			t.Fatalf("PeekType = %v, want %v", got, tp.Type)
		}
	}
	long := Tuple{Type: Undo, Values: []Value{Str(strings.Repeat("x", 300))}}
	if got := PeekType(AppendTuple(nil, &long)); got != Undo {
		t.Fatalf("PeekType of a tuple with a two-byte size = %v, want UNDO", got)
	}
	for _, in := range [][]byte{nil, {5}, {0x80, 0x01}, {0xff}} {
		if got := PeekType(in); got != 0 {
			t.Fatalf("PeekType(% x) = %v, want 0", in, got)
		}
	}
}

// BenchmarkDecodeHeaderBlob reads the headers of a batch of the forward
// benchmark's records, as a pass-through sink indexes a received batch.
func BenchmarkDecodeHeaderBlob(b *testing.B) {
	var batch []byte
	n := 0
	for len(batch) < 120<<10 {
		rec := Tuple{Type: Stable, ID: uint64(3_000_000 + n), STime: 1_700_000_000_000_000_000 + int64(n)*1000,
			Values: []Value{Int(int64(2_999_999 + n)), Str(strings.Repeat("p", 81))}}
		batch = AppendTuple(batch, &rec)
		n++
	}
	var t Tuple
	for b.Loop() {
		for off := 0; off < len(batch); {
			k, err := DecodeHeader(batch[off:], &t)
			if err != nil {
				b.Fatal(err)
			}
			off += k
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/tuple")
}
