package tuple

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// Encoding of one tuple (all integers little-endian varints as in
// encoding/binary):
//
//	type     1 byte
//	id       uvarint
//	stime    varint (zigzag)
//	version  uvarint
//	nvalues  uvarint
//	values   nvalues × (kind byte, payload)
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
func AppendTuple(dst []byte, t *Tuple) []byte {
	dst = append(dst, byte(t.Type))
	dst = binary.AppendUvarint(dst, t.ID)
	dst = binary.AppendVarint(dst, t.STime)
	dst = binary.AppendUvarint(dst, t.Version)
	dst = binary.AppendUvarint(dst, uint64(len(t.Values)))
	for i := range t.Values {
		v := &t.Values[i]
		dst = append(dst, byte(v.Kind))
		switch v.Kind {
		case KindInt, KindTimestamp:
			dst = binary.AppendVarint(dst, v.I)
		case KindFloat:
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(v.F))
		case KindBool:
			if v.I != 0 {
				dst = append(dst, 1)
			} else {
				dst = append(dst, 0)
			}
		case KindString, KindBytes:
			dst = binary.AppendUvarint(dst, uint64(len(v.S)))
			dst = append(dst, v.S...)
		}
	}
	return dst
}

// EncodedSize returns len(AppendTuple(nil, t)) without encoding.
func EncodedSize(t *Tuple) int {
	n := 1 + uvarintLen(t.ID) + varintLen(t.STime) + uvarintLen(t.Version) + uvarintLen(uint64(len(t.Values)))
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
	if len(src) == 0 {
		return 0, fmt.Errorf("%w: empty input", ErrTruncated)
	}
	typ := Type(src[0])
	if typ < Stable || typ > RecDone {
		return 0, fmt.Errorf("%w: type byte %d", ErrBadType, src[0])
	}
	t.Type = typ
	off := 1
	var k int
	if t.ID, k = binary.Uvarint(src[off:]); k <= 0 {
		return 0, headerErr("id", k)
	}
	off += k
	if t.STime, k = binary.Varint(src[off:]); k <= 0 {
		return 0, headerErr("stime", k)
	}
	off += k
	if t.Version, k = binary.Uvarint(src[off:]); k <= 0 {
		return 0, headerErr("version", k)
	}
	off += k
	count, k := binary.Uvarint(src[off:])
	if k <= 0 {
		return 0, headerErr("value count", k)
	}
	off += k
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
		*v = Value{Kind: Kind(src[off])}
		off++
		switch v.Kind {
		case KindInvalid:
		case KindInt, KindTimestamp:
			if v.I, k = binary.Varint(src[off:]); k <= 0 {
				return 0, valueErr(i, v.Kind, k)
			}
			off += k
		case KindFloat:
			if len(src)-off < 8 {
				return 0, fmt.Errorf("%w: value %d (float) needs 8 bytes, %d left", ErrTruncated, i, len(src)-off)
			}
			v.F = math.Float64frombits(binary.LittleEndian.Uint64(src[off:]))
			off += 8
		case KindBool:
			if off >= len(src) {
				return 0, fmt.Errorf("%w: value %d (bool) missing", ErrTruncated, i)
			}
			if src[off] > 1 {
				return 0, fmt.Errorf("%w: value %d: bool byte %d", ErrBadValue, i, src[off])
			}
			v.I = int64(src[off])
			off++
		case KindString, KindBytes:
			size, k := binary.Uvarint(src[off:])
			if k <= 0 {
				return 0, valueErr(i, v.Kind, k)
			}
			off += k
			if size > uint64(len(src)-off) {
				return 0, fmt.Errorf("%w: value %d (%s) of %d bytes, %d left", ErrTruncated, i, v.Kind, size, len(src)-off)
			}
			if size > 0 {
				v.S = unsafe.String(&src[off], int(size))
			}
			off += int(size)
		default:
			return 0, fmt.Errorf("%w: value %d has kind byte %d", ErrBadKind, i, src[off-1])
		}
	}
	return off, nil
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

// Clone returns a deep copy of t whose strings share no memory with t.
func (t *Tuple) Clone() *Tuple {
	c := *t
	c.Values = append([]Value(nil), t.Values...)
	DetachStrings(c.Values)
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
