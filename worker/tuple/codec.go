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
//	size     uvarint: the length of the rest of the tuple
//	type     1 byte
//	stime    8 bytes (two's complement, little-endian)
//	version  uvarint
//	nvalues  uvarint
//	values   nvalues × (kind byte, payload)
//
// A tuple's id is not in its encoding: ids are consecutive within a
// stream, so a tuple's id is its position, and whatever carries encoded
// tuples carries the id of the first (a batch on the wire, a chunk of an
// output buffer). Encoders ignore Tuple.ID and decoders leave it alone;
// the reader of a batch numbers the tuples (see BatchReader).
//
// The size prefix lets a reader find where a tuple ends from its first
// bytes: a consumer that only forwards tuples (DecodeHeader) reads the
// header and never walks the values. Stream times are nanoseconds since the
// epoch: as a varint they would take 9 bytes and a slow decode, fixed they
// take 8 and one load.
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
// a varint over 64 bits) or the values end before the tuple's size says.
var ErrBadValue = errors.New("tuple: malformed value")

// AppendTuple appends the encoding of t to dst and returns the extended
// slice. It does not allocate when dst has enough capacity.
//
// When dst has room for the longest encoding t could have, the body is
// stored without further checks (encodeBody). Otherwise each part that
// surely fits is written in place and the others are appended, so that
// allocation happens only when the encoding itself does not fit
// (appendBody).
func AppendTuple(dst []byte, t *Tuple) []byte {
	if t.Packed() {
		return appendPacked(dst, t)
	}
	// The size goes first but is known only at the end: reserve the bytes
	// that the smallest encoding t could have needs for its size, and move
	// the body up in the rare case its real size needs more.
	start := len(dst)
	lo, hi := bodyBounds(t)
	reserve := 1
	if lo >= 0x80 {
		reserve = uvarintLen(uint64(lo))
	}
	if cap(dst)-start >= reserve+hi {
		// Room for the longest possible encoding (a producer's staging
		// array nearly always has it): no capacity checks per field.
		dst = encodeBody(dst[:start+reserve], t)
	} else {
		dst = append(dst, sizeReserve[:reserve]...)
		dst = appendBody(dst, t)
	}
	if size := len(dst) - start - 1; reserve == 1 && size < 0x80 {
		dst[start] = byte(size) // the usual small tuple
		return dst
	}
	return putSize(dst, start, reserve)
}

// sizeReserve is what AppendTuple reserves for a size before writing it.
var sizeReserve [binary.MaxVarintLen64]byte

// bodyBounds bounds the length of t's encoding after its size: lo by a
// type byte, 8 for stime, one byte for each varint, and per value a kind
// byte plus a string's bytes; hi by the longest encoding of each part.
func bodyBounds(t *Tuple) (lo, hi int) {
	lo, hi = 11+len(t.Values), maxHeaderLen+len(t.Values)*(1+binary.MaxVarintLen64)
	for i := range t.Values {
		if k := t.Values[i].Kind; k == KindString || k == KindBytes {
			lo += len(t.Values[i].S)
			hi += len(t.Values[i].S)
		}
	}
	return lo, hi
}

// encodeBody is appendBody for a dst with room for bodyBounds' hi more
// bytes: it stores through one pointer instead of checking the capacity
// and the index of every part (the caller's check covers them all).
func encodeBody(dst []byte, t *Tuple) []byte {
	n := len(dst)
	base := unsafe.Pointer(unsafe.SliceData(dst))
	at := func(k int) *byte { return (*byte)(unsafe.Add(base, k)) }
	*at(n) = byte(t.Type)
	binary.LittleEndian.PutUint64(unsafe.Slice(at(n+1), 8), uint64(t.STime))
	k := n + 9
	k = putUvarintAt(base, k, t.Version)
	k = putUvarintAt(base, k, uint64(len(t.Values)))
	for i := range t.Values {
		v := &t.Values[i]
		*at(k) = byte(v.Kind)
		k++
		switch v.Kind {
		case KindInt, KindTimestamp:
			k = putUvarintAt(base, k, zigzag(v.I))
		case KindFloat:
			binary.LittleEndian.PutUint64(unsafe.Slice(at(k), 8), math.Float64bits(v.F))
			k += 8
		case KindBool:
			*at(k) = 0
			if v.I != 0 {
				*at(k) = 1
			}
			k++
		case KindString, KindBytes:
			k = putUvarintAt(base, k, uint64(len(v.S)))
			k += copy(unsafe.Slice(at(k), len(v.S)), v.S)
		}
	}
	return dst[:k]
}

// putUvarintAt writes x as a uvarint at base+k, which has room for
// binary.MaxVarintLen64 bytes, and returns the offset after it.
func putUvarintAt(base unsafe.Pointer, k int, x uint64) int {
	for x >= 0x80 {
		*(*byte)(unsafe.Add(base, k)) = byte(x) | 0x80
		x >>= 7
		k++
	}
	*(*byte)(unsafe.Add(base, k)) = byte(x)
	return k + 1
}

// putSize writes the length of dst[start+reserve:] as a uvarint in the
// reserve bytes before it. When the length needs more bytes than reserved,
// the body moves up; when it needs fewer, the uvarint is padded (decoders
// accept padded varints), so the body never moves down.
func putSize(dst []byte, start, reserve int) []byte {
	size := uint64(len(dst) - start - reserve)
	need := uvarintLen(size)
	if need > reserve {
		end := len(dst)
		dst = append(dst, sizeReserve[:need-reserve]...)
		copy(dst[start+need:], dst[start+reserve:end])
		reserve = need
	}
	b := dst[start : start+reserve]
	for i := range reserve - 1 {
		b[i] = byte(size) | 0x80
		size >>= 7
	}
	b[reserve-1] = byte(size)
	return dst
}

// appendBody appends t's encoding after its size.
func appendBody(dst []byte, t *Tuple) []byte {
	if n := len(dst); cap(dst)-n >= maxHeaderLen {
		b := dst[n : n+maxHeaderLen]
		b[0] = byte(t.Type)
		k := 1
		binary.LittleEndian.PutUint64(b[k:], uint64(t.STime))
		k += 8
		k += putUvarint(b[k:], t.Version)
		k += putUvarint(b[k:], uint64(len(t.Values)))
		dst = dst[:n+k]
	} else {
		dst = append(dst, byte(t.Type))
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
	size := packedBodyLen(t)
	if n := len(dst); cap(dst)-n >= maxHeaderLen+binary.MaxVarintLen64+len(t.packed) {
		b := dst[n : n+maxHeaderLen+binary.MaxVarintLen64]
		k := putUvarint(b, uint64(size))
		b[k] = byte(t.Type)
		k++
		binary.LittleEndian.PutUint64(b[k:], uint64(t.STime))
		k += 8
		k += putUvarint(b[k:], t.Version)
		n += k
		dst = dst[:n+len(t.packed)]
		copy(dst[n:], t.packed)
		return dst
	}
	dst = binary.AppendUvarint(dst, uint64(size))
	dst = append(dst, byte(t.Type))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(t.STime))
	dst = binary.AppendUvarint(dst, t.Version)
	return append(dst, t.packed...)
}

// packedBodyLen is the length of a packed tuple's encoding after its size.
func packedBodyLen(t *Tuple) int {
	return 1 + 8 + uvarintLen(t.Version) + len(t.packed)
}

// maxHeaderLen bounds the encoded header after the size: the type byte,
// stime and two varints.
const maxHeaderLen = 1 + 8 + 2*binary.MaxVarintLen64

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
	n := bodyLen(t)
	return uvarintLen(uint64(n)) + n
}

// bodyLen is the length of t's encoding after its size.
func bodyLen(t *Tuple) int {
	if t.Packed() {
		return packedBodyLen(t)
	}
	n := 1 + 8 + uvarintLen(t.Version) + uvarintLen(uint64(len(t.Values)))
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
// the number of bytes consumed. t.ID is left as it is (ids are not
// encoded). It reuses t.Values' capacity, so decoding a
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
	frame, _, off, count, err := decodeHeader(src, t)
	if err != nil {
		return 0, err
	}
	t.packed = nil
	if off, err = decodeValues(frame, off, count, t); err != nil {
		return 0, err
	}
	if off != len(frame) {
		return 0, fmt.Errorf("%w: the values end %d bytes before the tuple's size says", ErrBadValue, len(frame)-off)
	}
	return off, nil
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

// decodeHeader decodes the size and header fields of the tuple at the
// start of src into t. It returns the tuple's encoding (frame, a prefix of
// src), the offsets in frame of the value count and of the first value,
// and the count (already checked against the bytes left).
func decodeHeader(src []byte, t *Tuple) (frame []byte, countAt, off int, count uint64, err error) {
	if n := shortHeader(src, t); n > 0 {
		return src[:n:n], 11, 12, uint64(src[11]), nil
	}
	if len(src) == 0 {
		return nil, 0, 0, 0, fmt.Errorf("%w: empty input", ErrTruncated)
	}
	size, k := uint64(src[0]), 1
	if size >= 0x80 {
		if size, k = uvarintLong(src, 0); k <= 0 {
			return nil, 0, 0, 0, headerErr("size", k)
		}
	}
	if size > uint64(len(src)-k) {
		return nil, 0, 0, 0, fmt.Errorf("%w: tuple of %d bytes, %d left", ErrTruncated, size, len(src)-k)
	}
	src = src[:k+int(size)]
	off = k
	if off == len(src) {
		return nil, 0, 0, 0, fmt.Errorf("%w: type", ErrTruncated)
	}
	typ := Type(src[off])
	if typ < Stable || typ > lastType {
		return nil, 0, 0, 0, fmt.Errorf("%w: type byte %d", ErrBadType, src[off])
	}
	t.Type = typ
	off++
	if len(src)-off < 8 {
		return nil, 0, 0, 0, fmt.Errorf("%w: stime", ErrTruncated)
	}
	t.STime = int64(binary.LittleEndian.Uint64(src[off:]))
	off += 8
	// Version, value count and string lengths are nearly always one byte:
	// that case is tested here rather than in a call (uvarintAt is too
	// large to be inlined).
	if off < len(src) && src[off] < 0x80 {
		t.Version, k = uint64(src[off]), 1
	} else if t.Version, k = uvarintLong(src, off); k <= 0 {
		return nil, 0, 0, 0, headerErr("version", k)
	}
	off += k
	countAt = off
	if off < len(src) && src[off] < 0x80 {
		count, k = uint64(src[off]), 1
	} else if count, k = uvarintLong(src, off); k <= 0 {
		return nil, 0, 0, 0, headerErr("value count", k)
	}
	off += k
	// Every value takes at least one byte: a larger count is garbage, and
	// checking it first bounds any allocation for the values.
	if count > uint64(len(src)-off) {
		return nil, 0, 0, 0, fmt.Errorf("%w: %d values announced, %d bytes left", ErrTruncated, count, len(src)-off)
	}
	return src, countAt, off, count, nil
}

// PeekType returns the type of the tuple encoded at the start of enc
// without decoding anything else, or 0 (no type) when enc does not start
// with a size and a type byte. The type is not checked.
func PeekType(enc []byte) Type {
	if len(enc) > 1 && enc[0] < 0x80 {
		return Type(enc[1]) // a one-byte size: small enough to inline
	}
	return peekTypeLong(enc)
}

// peekTypeLong is PeekType past its one-byte size.
func peekTypeLong(enc []byte) Type {
	if _, k := uvarintAt(enc, 0); k > 0 && k < len(enc) {
		return Type(enc[k])
	}
	return 0
}

// shortHeader decodes the header of the usual tuple, under 128 bytes with
// its version and value count under 128, with a single bounds check, and
// returns the tuple's length (its value count at 11, its values from 12).
// For anything else it returns 0 and leaves t alone: decodeHeader's
// general path decodes it, with the same results.
func shortHeader(src []byte, t *Tuple) int {
	if len(src) < 12 {
		return 0
	}
	size := int(src[0])
	h := (*[11]byte)(src[1:12])
	typ := Type(h[0])
	if size < 11 || size >= 0x80 || size >= len(src) || typ < Stable || typ > lastType || h[9] >= 0x80 || int(h[10]) > size-11 {
		return 0
	}
	t.Type = typ
	t.STime = int64(binary.LittleEndian.Uint64(h[1:9]))
	t.Version = uint64(h[9])
	return 1 + size
}

// DecodeHeader decodes the header of the tuple at the start of src into t
// and returns the encoded tuple's length, leaving the values packed: Values
// becomes empty and AppendTuple re-encodes them by copying their bytes (a
// consumer that needs them decodes the tuple with DecodeTuple). The packed
// bytes alias src like DecodeTuple's strings do.
//
// DecodeHeader checks the size and the header as DecodeTuple does (same
// errors) but not the values: it never reads them, which is what makes it
// cheap. A tuple with malformed values passes here and is refused by
// whoever decodes it. A consumer that only forwards tuples (a sink) reads
// them this way.
func DecodeHeader(src []byte, t *Tuple) (n int, err error) {
	if n := shortHeader(src, t); n > 0 {
		t.Values = t.Values[:0]
		t.packed = src[11:n:n]
		return n, nil
	}
	frame, countAt, _, _, err := decodeHeader(src, t)
	if err != nil {
		return 0, err
	}
	t.Values = t.Values[:0]
	t.packed = frame[countAt:len(frame):len(frame)]
	return len(frame), nil
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
//	r := tuple.NewBatchReader(data, firstID)
//	var t tuple.Tuple
//	for r.Next(&t) { ... }
//	if err := r.Err(); err != nil { ... }
//
// The zero value reads an empty batch; Reset reuses a reader.
type BatchReader struct {
	data []byte
	off  int
	next uint64 // id of the next tuple
	err  error
}

// NewBatchReader returns a reader over data, whose first tuple has id
// firstID (and each next one the next id). Decoded strings alias data.
func NewBatchReader(data []byte, firstID uint64) *BatchReader {
	return &BatchReader{data: data, next: firstID}
}

// Reset makes r read data, whose first tuple has id firstID, from the
// start.
func (r *BatchReader) Reset(data []byte, firstID uint64) {
	*r = BatchReader{data: data, next: firstID}
}

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
	t.ID = r.next
	r.next++
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
