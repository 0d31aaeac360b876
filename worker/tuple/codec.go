package tuple

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unsafe"
)

// Encoding of one tuple (all integers little-endian varints as in
// encoding/binary):
//
//	type     1 byte
//	id       uvarint
//	stime    8 bytes (two's complement, little-endian)
//	version  uvarint
//	nvalues  uvarint
//	values   nvalues × (kind byte, payload)
//
// Stream times are nanoseconds since the epoch: as a varint they would take
// 9 bytes and a slow decode, fixed they take 8 and one load.
//
// Value payloads by kind: int and timestamp a varint (zigzag); float 8 bytes
// (IEEE 754 bits, little-endian); bool one byte (0 or 1); string and bytes a
// uvarint length followed by the bytes; KindInvalid (a null) no payload.
// A batch is the plain concatenation of encoded tuples.

// ErrTruncated means the input ended in the middle of a tuple.
var ErrTruncated = errors.New("tuple: truncated encoding")

// ErrBadKind means a value carried a kind byte this version does not know.
var ErrBadKind = errors.New("tuple: unknown value kind")

// ErrBadType means a tuple carried a type byte this version does not know.
var ErrBadType = errors.New("tuple: unknown tuple type")

// ErrBadValue means a value payload is malformed (a bool other than 0 or 1,
// a value count larger than the remaining input).
var ErrBadValue = errors.New("tuple: malformed value")

// AppendTuple appends the encoding of t to dst and returns the extended
// slice. It does not allocate when dst has enough capacity.
//
// Where dst has room for the longest possible encoding of a part (header,
// integer, string), that part is written in place, with putUvarint, rather
// than appended byte by byte, each append re-checking the capacity. Parts
// that might not fit are appended, so that allocation happens only when the
// encoding itself does not fit.
func AppendTuple(dst []byte, t *Tuple) []byte {
	if t.Packed() {
		return appendPacked(dst, t)
	}
	if n := len(dst); cap(dst)-n >= maxHeaderLen {
		b := dst[n : n+maxHeaderLen]
		b[0] = byte(t.Type)
		k := 1
		k += putUvarint(b[k:], t.ID)
		binary.LittleEndian.PutUint64(b[k:], uint64(t.STime))
		k += 8
		k += putUvarint(b[k:], t.Version)
		k += putUvarint(b[k:], uint64(len(t.Values)))
		dst = dst[:n+k]
	} else {
		dst = append(dst, byte(t.Type))
		dst = binary.AppendUvarint(dst, t.ID)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(t.STime))
		dst = binary.AppendUvarint(dst, t.Version)
		dst = binary.AppendUvarint(dst, uint64(len(t.Values)))
	}
	for i := range t.Values {
		v := &t.Values[i]
		switch v.Kind {
		case KindInt, KindTimestamp:
			if n := len(dst); cap(dst)-n >= 1+binary.MaxVarintLen64 {
				b := dst[n : n+1+binary.MaxVarintLen64]
				b[0] = byte(v.Kind)
				dst = dst[:n+1+putUvarint(b[1:], zigzag(v.I))]
			} else {
				dst = binary.AppendUvarint(append(dst, byte(v.Kind)), zigzag(v.I))
			}
		case KindFloat:
			dst = append(dst, byte(v.Kind))
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(v.F))
		case KindBool:
			var bit byte
			if v.I != 0 {
				bit = 1
			}
			dst = append(dst, byte(v.Kind), bit)
		case KindString, KindBytes:
			if n := len(dst); cap(dst)-n >= 1+binary.MaxVarintLen64+len(v.S) {
				b := dst[n : n+1+binary.MaxVarintLen64]
				b[0] = byte(v.Kind)
				n += 1 + putUvarint(b[1:], uint64(len(v.S)))
				dst = dst[:n+len(v.S)]
				copy(dst[n:], v.S)
			} else {
				dst = binary.AppendUvarint(append(dst, byte(v.Kind)), uint64(len(v.S)))
				dst = append(dst, v.S...)
			}
		default:
			dst = append(dst, byte(v.Kind))
		}
	}
	return dst
}

// appendPacked is AppendTuple for a tuple whose values are still packed:
// the header fields, then the packed value count and values as they are.
func appendPacked(dst []byte, t *Tuple) []byte {
	if n := len(dst); cap(dst)-n >= maxHeaderLen+len(t.packed) {
		b := dst[n : n+maxHeaderLen]
		b[0] = byte(t.Type)
		k := 1
		k += putUvarint(b[k:], t.ID)
		binary.LittleEndian.PutUint64(b[k:], uint64(t.STime))
		k += 8
		k += putUvarint(b[k:], t.Version)
		n += k
		dst = dst[:n+len(t.packed)]
		copy(dst[n:], t.packed)
		return dst
	}
	dst = append(dst, byte(t.Type))
	dst = binary.AppendUvarint(dst, t.ID)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(t.STime))
	dst = binary.AppendUvarint(dst, t.Version)
	return append(dst, t.packed...)
}

// maxHeaderLen bounds the encoded header: the type byte, stime and three
// varints.
const maxHeaderLen = 1 + 8 + 3*binary.MaxVarintLen64

// putUvarint is binary.PutUvarint with the common one-byte case first; b
// must hold binary.MaxVarintLen64 bytes.
func putUvarint(b []byte, x uint64) int {
	_ = b[binary.MaxVarintLen64-1]
	if x < 0x80 {
		b[0] = byte(x)
		return 1
	}
	return binary.PutUvarint(b, x)
}

// zigzag maps a signed value to the uvarint binary.PutVarint writes.
func zigzag(x int64) uint64 {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return ux
}

// EncodedSize returns len(AppendTuple(nil, t)) without encoding.
func EncodedSize(t *Tuple) int {
	if t.Packed() {
		return 1 + uvarintLen(t.ID) + 8 + uvarintLen(t.Version) + len(t.packed)
	}
	n := 1 + uvarintLen(t.ID) + 8 + uvarintLen(t.Version) + uvarintLen(uint64(len(t.Values)))
	for i := range t.Values {
		v := &t.Values[i]
		n++
		switch v.Kind {
		case KindInt, KindTimestamp:
			n += varintLen(v.I)
		case KindFloat:
			n += 8
		case KindBool:
			n++
		case KindString, KindBytes:
			n += uvarintLen(uint64(len(v.S))) + len(v.S)
		}
	}
	return n
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func varintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return uvarintLen(ux)
}

// DecodeTuple decodes one tuple from the start of src into t and returns
// the number of bytes consumed. It reuses t.Values' capacity, so decoding a
// stream of tuples into the same Tuple does not allocate.
//
// Strings (KindString and KindBytes values) are not copied: they alias src.
// They stay valid as long as src is neither modified nor reused, i.e. as
// long as the batch they came from. A consumer that keeps values beyond that
// must clone them (see Tuple.Clone or DetachStrings).
//
// On malformed input DecodeTuple returns an error wrapping ErrTruncated,
// ErrBadType, ErrBadKind or ErrBadValue; it never panics. t is then in an
// unspecified state.
func DecodeTuple(src []byte, t *Tuple) (n int, err error) {
	_, off, count, err := decodeHeader(src, t)
	if err != nil {
		return 0, err
	}
	t.packed = nil
	return decodeValues(src, off, count, t)
}

// decodeValues decodes count values from src[off:] into t.Values (reusing
// its capacity) and returns the offset after them.
func decodeValues(src []byte, off int, count uint64, t *Tuple) (int, error) {
	var (
		k  int
		ux uint64
	)
	// Every value takes at least one byte: a larger count is garbage, and
	// checking it first bounds the allocation below.
	if count > uint64(len(src)-off) {
		return 0, fmt.Errorf("%w: %d values announced, %d bytes left", ErrTruncated, count, len(src)-off)
	}
	if uint64(cap(t.Values)) < count {
		t.Values = make([]Value, count)
	} else {
		t.Values = t.Values[:count]
	}
	for i := range t.Values {
		if off >= len(src) {
			return 0, fmt.Errorf("%w: value %d missing", ErrTruncated, i)
		}
		v := &t.Values[i]
		kind := Kind(src[off])
		off++
		// Each case sets every field of v. A string field is written only
		// when it changes: decoding into a reused array of the same shape
		// then stores no pointer (no write barrier).
		switch kind {
		case KindInvalid:
			v.Kind, v.I, v.F = kind, 0, 0
			if v.S != "" {
				v.S = ""
			}
		case KindInt, KindTimestamp:
			if ux, k = uvarintAt(src, off); k <= 0 {
				return 0, valueErr(i, kind, k)
			}
			off += k
			v.Kind, v.I, v.F = kind, unzigzag(ux), 0
			if v.S != "" {
				v.S = ""
			}
		case KindFloat:
			if len(src)-off < 8 {
				return 0, fmt.Errorf("%w: value %d (float) needs 8 bytes, %d left", ErrTruncated, i, len(src)-off)
			}
			v.Kind, v.I, v.F = kind, 0, math.Float64frombits(binary.LittleEndian.Uint64(src[off:]))
			if v.S != "" {
				v.S = ""
			}
			off += 8
		case KindBool:
			if off >= len(src) {
				return 0, fmt.Errorf("%w: value %d (bool) missing", ErrTruncated, i)
			}
			if src[off] > 1 {
				return 0, fmt.Errorf("%w: value %d: bool byte %d", ErrBadValue, i, src[off])
			}
			v.Kind, v.I, v.F = kind, int64(src[off]), 0
			if v.S != "" {
				v.S = ""
			}
			off++
		case KindString, KindBytes:
			var size uint64
			if off < len(src) && src[off] < 0x80 {
				size, k = uint64(src[off]), 1
			} else if size, k = uvarintLong(src, off); k <= 0 {
				return 0, valueErr(i, kind, k)
			}
			off += k
			if size > uint64(len(src)-off) {
				return 0, fmt.Errorf("%w: value %d (%s) of %d bytes, %d left", ErrTruncated, i, kind, size, len(src)-off)
			}
			v.Kind, v.I, v.F = kind, 0, 0
			if size > 0 {
				v.S = unsafe.String(&src[off], int(size))
			} else if v.S != "" {
				v.S = ""
			}
			off += int(size)
		default:
			return 0, fmt.Errorf("%w: value %d has kind byte %d", ErrBadKind, i, src[off-1])
		}
	}
	return off, nil
}

// decodeHeader decodes the header fields of the tuple at the start of src
// into t and returns the offsets of its value count and of its first
// value, and the count (already checked against the bytes left).
func decodeHeader(src []byte, t *Tuple) (countAt, off int, count uint64, err error) {
	if len(src) == 0 {
		return 0, 0, 0, fmt.Errorf("%w: empty input", ErrTruncated)
	}
	typ := Type(src[0])
	if typ < Stable || typ > RecDone {
		return 0, 0, 0, fmt.Errorf("%w: type byte %d", ErrBadType, src[0])
	}
	t.Type = typ
	off = 1
	var k int
	if t.ID, k = uvarintAt(src, off); k <= 0 {
		return 0, 0, 0, headerErr("id", k)
	}
	off += k
	if len(src)-off < 8 {
		return 0, 0, 0, fmt.Errorf("%w: stime", ErrTruncated)
	}
	t.STime = int64(binary.LittleEndian.Uint64(src[off:]))
	off += 8
	// Version, value count and string lengths are nearly always one byte:
	// that case is tested here rather than in a call (uvarintAt is too
	// large to be inlined).
	if off < len(src) && src[off] < 0x80 {
		t.Version, k = uint64(src[off]), 1
	} else if t.Version, k = uvarintLong(src, off); k <= 0 {
		return 0, 0, 0, headerErr("version", k)
	}
	off += k
	countAt = off
	if off < len(src) && src[off] < 0x80 {
		count, k = uint64(src[off]), 1
	} else if count, k = uvarintLong(src, off); k <= 0 {
		return 0, 0, 0, headerErr("value count", k)
	}
	off += k
	// Every value takes at least one byte: a larger count is garbage, and
	// checking it first bounds any allocation for the values.
	if count > uint64(len(src)-off) {
		return 0, 0, 0, fmt.Errorf("%w: %d values announced, %d bytes left", ErrTruncated, count, len(src)-off)
	}
	return countAt, off, count, nil
}

// DecodeHeader decodes the header of the tuple at the start of src into t
// and returns the encoded tuple's length, leaving the values packed: Values
// becomes empty and AppendTuple re-encodes them by copying their bytes (a
// consumer that needs them decodes the tuple with DecodeTuple). The values
// are checked as thoroughly as DecodeTuple checks them (same errors), only
// not stored; the packed bytes alias src like DecodeTuple's strings do.
//
// A consumer that only forwards tuples (a sink) reads them this way.
func DecodeHeader(src []byte, t *Tuple) (n int, err error) {
	start, off, count, err := decodeHeader(src, t)
	if err != nil {
		return 0, err
	}
	var k int
	// The values are skipped, not decoded; the common one-byte varints
	// (small ints, short lengths) are tested inline.
	for i := range int(count) {
		if off >= len(src) {
			return 0, fmt.Errorf("%w: value %d missing", ErrTruncated, i)
		}
		kind := Kind(src[off])
		off++
		switch kind {
		case KindInvalid:
		case KindInt, KindTimestamp:
			if off < len(src) && src[off] < 0x80 {
				off++
			} else if k = uvarintEnd(src, off); k <= 0 {
				return 0, valueErr(i, kind, k)
			} else {
				off += k
			}
		case KindFloat:
			if len(src)-off < 8 {
				return 0, fmt.Errorf("%w: value %d (float) needs 8 bytes, %d left", ErrTruncated, i, len(src)-off)
			}
			off += 8
		case KindBool:
			if off >= len(src) {
				return 0, fmt.Errorf("%w: value %d (bool) missing", ErrTruncated, i)
			}
			if src[off] > 1 {
				return 0, fmt.Errorf("%w: value %d: bool byte %d", ErrBadValue, i, src[off])
			}
			off++
		case KindString, KindBytes:
			var size uint64
			if off < len(src) && src[off] < 0x80 {
				size, k = uint64(src[off]), 1
			} else if size, k = uvarintLong(src, off); k <= 0 {
				return 0, valueErr(i, kind, k)
			}
			off += k
			if size > uint64(len(src)-off) {
				return 0, fmt.Errorf("%w: value %d (%s) of %d bytes, %d left", ErrTruncated, i, kind, size, len(src)-off)
			}
			off += int(size)
		default:
			return 0, fmt.Errorf("%w: value %d has kind byte %d", ErrBadKind, i, src[off-1])
		}
	}
	t.Values = t.Values[:0]
	t.packed = src[start:off:off]
	return off, nil
}

// uvarintAt decodes the uvarint at src[off:] (off <= len(src)) like
// binary.Uvarint: k > 0 bytes read, 0 truncated, < 0 overflow.
//
// One-byte values (version, value count, short lengths) return at once.
// When 8 bytes are readable, longer ones are decoded without a per-byte
// loop: one 8-byte load, the first byte without the continuation bit found
// with TrailingZeros, and the 7-bit groups packed together in three
// shift-and-mask steps. Anything else (a short tail, 10-byte or overlong
// encodings) goes through binary.Uvarint, so results are identical.
func uvarintAt(src []byte, off int) (x uint64, k int) {
	if off < len(src) && src[off] < 0x80 {
		return uint64(src[off]), 1
	}
	return uvarintLong(src, off)
}

// uvarintLong is uvarintAt past its one-byte case (but also correct for it).
func uvarintLong(src []byte, off int) (x uint64, k int) {
	if len(src)-off >= 8 {
		w := binary.LittleEndian.Uint64(src[off:])
		if ends := ^w & 0x8080808080808080; ends != 0 {
			last := bits.TrailingZeros64(ends) // bit 7 of the final byte
			w &= (uint64(1) << (last + 1)) - 1
			return packVarintGroups(w), (last + 1) / 8
		}
		if len(src)-off >= 9 {
			if b8 := src[off+8]; b8 < 0x80 {
				return packVarintGroups(w) | uint64(b8)<<56, 9
			}
		}
	}
	return binary.Uvarint(src[off:])
}

// uvarintEnd is the length k of the uvarint at src[off:], with
// uvarintLong's results (0 truncated, < 0 overflow) but without its value:
// skipping a value only needs to find its last byte.
func uvarintEnd(src []byte, off int) int {
	if len(src)-off >= 8 {
		w := binary.LittleEndian.Uint64(src[off:])
		if ends := ^w & 0x8080808080808080; ends != 0 {
			return (bits.TrailingZeros64(ends) + 1) / 8
		}
	}
	_, k := uvarintLong(src, off)
	return k
}

// packVarintGroups concatenates the low 7 bits of each byte of w (little
// endian) into a 56-bit value.
func packVarintGroups(w uint64) uint64 {
	w &= 0x7f7f7f7f7f7f7f7f
	w = w&0x007f007f007f007f | (w&0x7f007f007f007f00)>>1
	w = w&0x00003fff00003fff | (w&0x3fff00003fff0000)>>2
	return w&0x000000000fffffff | (w&0x0fffffff00000000)>>4
}

// unzigzag maps a zigzag-encoded uvarint back to the signed value, as
// binary.Varint does.
func unzigzag(ux uint64) int64 {
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

func headerErr(field string, k int) error {
	if k == 0 {
		return fmt.Errorf("%w: %s", ErrTruncated, field)
	}
	return fmt.Errorf("%w: %s overflows 64 bits", ErrBadValue, field)
}

func valueErr(i int, kind Kind, k int) error {
	if k == 0 {
		return fmt.Errorf("%w: value %d (%s)", ErrTruncated, i, kind)
	}
	return fmt.Errorf("%w: value %d (%s) overflows 64 bits", ErrBadValue, i, kind)
}

// BatchReader iterates over the tuples of an encoded batch:
//
//	r := tuple.NewBatchReader(data)
//	var t tuple.Tuple
//	for r.Next(&t) { ... }
//	if err := r.Err(); err != nil { ... }
//
// The zero value reads an empty batch; Reset reuses a reader.
type BatchReader struct {
	data []byte
	off  int
	err  error
}

// NewBatchReader returns a reader over data. Decoded strings alias data.
func NewBatchReader(data []byte) *BatchReader { return &BatchReader{data: data} }

// Reset makes r read data from the start.
func (r *BatchReader) Reset(data []byte) { *r = BatchReader{data: data} }

// Next decodes the next tuple into t. It returns false at the end of the
// batch or on the first malformed tuple (then Err says what is wrong).
func (r *BatchReader) Next(t *Tuple) bool {
	if r.err != nil || r.off >= len(r.data) {
		return false
	}
	n, err := DecodeTuple(r.data[r.off:], t)
	if err != nil {
		r.err = fmt.Errorf("at byte %d of batch: %w", r.off, err)
		return false
	}
	r.off += n
	return true
}

// Err returns the decoding error that stopped Next, if any.
func (r *BatchReader) Err() error { return r.err }

// Clone returns a deep copy of t whose strings (and packed values) share
// no memory with t.
func (t *Tuple) Clone() *Tuple {
	c := *t
	c.Values = append([]Value(nil), t.Values...)
	DetachStrings(c.Values)
	if t.packed != nil {
		c.packed = append([]byte{}, t.packed...)
	}
	return &c
}

// DetachStrings replaces every string in vals by a private copy, so the
// values outlive the batch they were decoded from.
func DetachStrings(vals []Value) {
	for i := range vals {
		if vals[i].S != "" {
			vals[i].S = strings.Clone(vals[i].S)
		}
	}
}
