package operator

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unsafe"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Key encoding. Group keys, join keys and count_distinct members are stored
// as the byte string below. The encoding is reversible and order-preserving:
// comparing two encodings byte-wise orders them by kind, then by value
// (numbers numerically, strings lexicographically), so "sorted by key" is
// both deterministic and natural.
//
//	kind byte, then
//	int, timestamp, bool: 8 bytes big-endian of the value with the sign bit flipped
//	float: 8 bytes big-endian of the IEEE bits, transformed to sort numerically
//	string, bytes: the bytes with 0x00 escaped as 0x00 0xFF, terminated by 0x00 0x01

func appendKeyValue(b []byte, v tuple.Value) []byte {
	b = append(b, byte(v.Kind))
	switch v.Kind {
	case tuple.KindFloat:
		bits := math.Float64bits(v.F)
		if bits&(1<<63) != 0 {
			bits = ^bits
		} else {
			bits |= 1 << 63
		}
		b = binary.BigEndian.AppendUint64(b, bits)
	case tuple.KindString, tuple.KindBytes:
		for i := 0; i < len(v.S); i++ {
			c := v.S[i]
			b = append(b, c)
			if c == 0 {
				b = append(b, 0xFF)
			}
		}
		b = append(b, 0x00, 0x01)
	default:
		b = binary.BigEndian.AppendUint64(b, uint64(v.I)^(1<<63))
	}
	return b
}

// decodeKey splits a key encoding back into n values. String values are
// substrings of key, or copies when they contain an escaped 0x00.
func decodeKey(key string, n int) ([]tuple.Value, error) {
	return decodeKeyInto(make([]tuple.Value, 0, n), key, n)
}

// decodeKeyInto is decodeKey appending to vals (empty, capacity n).
func decodeKeyInto(vals []tuple.Value, key string, n int) ([]tuple.Value, error) {
	for len(key) > 0 {
		kind := tuple.Kind(key[0])
		key = key[1:]
		switch kind {
		case tuple.KindFloat:
			if len(key) < 8 {
				return nil, fmt.Errorf("%w: truncated float in key", ErrBadSnapshot)
			}
			bits := binary.BigEndian.Uint64([]byte(key[:8]))
			if bits&(1<<63) != 0 {
				bits &^= 1 << 63
			} else {
				bits = ^bits
			}
			vals = append(vals, tuple.Value{Kind: kind, F: math.Float64frombits(bits)})
			key = key[8:]
		case tuple.KindString, tuple.KindBytes:
			// Without an escaped 0x00 the value is a substring of the key
			// (keys are immutable strings): no copy.
			if end := strings.IndexByte(key, 0); end >= 0 && end+1 < len(key) && key[end+1] == 0x01 {
				vals = append(vals, tuple.Value{Kind: kind, S: key[:end]})
				key = key[end+2:]
				continue
			}
			var s []byte
		scan:
			for {
				if len(key) == 0 {
					return nil, fmt.Errorf("%w: unterminated string in key", ErrBadSnapshot)
				}
				if c := key[0]; c != 0 {
					s = append(s, c)
					key = key[1:]
					continue
				}
				if len(key) < 2 {
					return nil, fmt.Errorf("%w: unterminated string in key", ErrBadSnapshot)
				}
				switch key[1] {
				case 0xFF:
					s = append(s, 0)
					key = key[2:]
				case 0x01:
					key = key[2:]
					break scan
				default:
					return nil, fmt.Errorf("%w: bad string escape in key", ErrBadSnapshot)
				}
			}
			vals = append(vals, tuple.Value{Kind: kind, S: string(s)})
		case tuple.KindInt, tuple.KindTimestamp, tuple.KindBool:
			if len(key) < 8 {
				return nil, fmt.Errorf("%w: truncated integer in key", ErrBadSnapshot)
			}
			u := binary.BigEndian.Uint64([]byte(key[:8]))
			vals = append(vals, tuple.Value{Kind: kind, I: int64(u ^ (1 << 63))})
			key = key[8:]
		default:
			return nil, fmt.Errorf("%w: bad kind %d in key", ErrBadSnapshot, kind)
		}
	}
	if len(vals) != n {
		return nil, fmt.Errorf("%w: key has %d values, want %d", ErrBadSnapshot, len(vals), n)
	}
	return vals, nil
}

// snapshotMagic starts every operator snapshot; the byte after it is the
// format version.
const (
	snapshotMagic   = "fsop"
	snapshotVersion = 1
)

// encoder builds a snapshot. All integers are varints, so equal state gives
// equal bytes regardless of platform.
type encoder struct{ b []byte }

// newEncoder writes the header: magic, version, and the operator's
// signature (its kind and definition), which Restore checks.
func newEncoder(signature string) *encoder {
	e := &encoder{b: make([]byte, 0, 64)}
	e.b = append(e.b, snapshotMagic...)
	e.b = append(e.b, snapshotVersion)
	e.str(signature)
	return e
}

func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) byte(v byte)      { e.b = append(e.b, v) }
func (e *encoder) f64(v float64)    { e.b = binary.BigEndian.AppendUint64(e.b, math.Float64bits(v)) }
func (e *encoder) str(s string) {
	e.uvarint(uint64(len(s)))
	e.b = append(e.b, s...)
}
func (e *encoder) bool(v bool) {
	if v {
		e.byte(1)
	} else {
		e.byte(0)
	}
}
func (e *encoder) value(v tuple.Value) {
	e.byte(byte(v.Kind))
	switch v.Kind {
	case tuple.KindFloat:
		e.f64(v.F)
	case tuple.KindString, tuple.KindBytes:
		e.str(v.S)
	default:
		e.varint(v.I)
	}
}

// bufferOf returns an empty buffer of capacity n whose memory is not
// zeroed first (a large state's encoding is written once: zeroing it
// before would be one more pass over every byte). Only what is appended
// is ever read.
func bufferOf(n int) []byte {
	n = max(n, 1)
	var b strings.Builder
	b.Grow(n) // allocates n bytes without zeroing them
	b.WriteByte(0)
	return unsafe.Slice(unsafe.StringData(b.String()), n)[:0]
}

// uvarintSize and varintSize are the lengths of the encoder's uvarint
// and varint encodings of v.
func uvarintSize(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

func varintSize(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return uvarintSize(u)
}

// valueSize is the length of the encoder's encoding of v.
func valueSize(v tuple.Value) int {
	switch v.Kind {
	case tuple.KindFloat:
		return 1 + 8
	case tuple.KindString, tuple.KindBytes:
		return 1 + uvarintSize(uint64(len(v.S))) + len(v.S)
	}
	return 1 + varintSize(v.I)
}

// decoder reads a snapshot. The first error sticks; callers check err once
// at the end (and before trusting a count to size an allocation).
type decoder struct {
	b   []byte
	err error
	// whole is the snapshot as one string (copied once) and size its
	// length: strings read (keys, members, values) are substrings of it
	// rather than one allocation each. Restored state therefore shares
	// that one copy, which is freed once none of its strings is held.
	whole string
	size  int
	// end is where b ends in the state: size, unless the state is still
	// arriving (in set, restoreIncoming), when b holds only what has
	// arrived and a read beyond it waits for more (more).
	end   int
	state []byte
	in    *view
	// st, when set, is the stream the state is read from (RestoreStream):
	// b is what its buffer holds of the state from the read position on,
	// read the offset up to which the stream has been told the bytes
	// were consumed, and strings are interned copies.
	st   *stateStream
	read int
}

// off is the position of b in the state.
func (d *decoder) off() int { return d.end - len(d.b) }

// more waits until at least n bytes past the read position have arrived
// (fewer at the state's end) and extends b to all that has: false when the
// state is not arriving or is complete, or its transfer broke off (then
// d.err says so).
func (d *decoder) more(n int) bool {
	if d.st != nil && d.end < d.size && d.err == nil {
		return d.moreStream(n)
	}
	if d.in == nil || d.end == d.size || d.err != nil {
		return false
	}
	off := d.off()
	got, err := d.in.wait(off + n)
	if got > d.end {
		d.b, d.end = d.state[off:got], got
	}
	if err != nil && got < off+n {
		if d.err == nil {
			d.err = err
		}
		d.b = nil
		return false
	}
	return true
}

// newDecoder checks the header against the operator's signature.
func newDecoder(state []byte, signature string) (*decoder, error) {
	return newDecoderOf(state, signature, string(state))
}

// newOwnedDecoder is newDecoder for a snapshot handed over to the
// restored state (see RestoreOwned): its strings are substrings of state
// itself, not of a copy.
func newOwnedDecoder(state []byte, signature string) (*decoder, error) {
	return newDecoderOf(state, signature, unsafe.String(unsafe.SliceData(state), len(state)))
}

func newDecoderOf(state []byte, signature, whole string) (*decoder, error) {
	if len(state) < len(snapshotMagic)+1 || string(state[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: missing header", ErrBadSnapshot)
	}
	if v := state[len(snapshotMagic)]; v != snapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, want %d", ErrBadSnapshot, v, snapshotVersion)
	}
	d := &decoder{b: state[len(snapshotMagic)+1:], whole: whole, size: len(state), end: len(state)}
	if got := d.str(); d.err != nil || got != signature {
		return nil, fmt.Errorf("%w: taken from operator %q, restoring into %q", ErrBadSnapshot, got, signature)
	}
	return d, nil
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or corrupt %s", ErrBadSnapshot, what)
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n == 0 && d.more(binary.MaxVarintLen64) {
		v, n = binary.Uvarint(d.b)
	}
	if n <= 0 {
		d.fail("unsigned integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a collection length and checks it against the bytes left, so
// a corrupt length cannot force a huge allocation. minSize is the smallest
// encoding of one element.
func (d *decoder) count(minSize int) int {
	v := d.uvarint()
	if d.err != nil {
		return 0
	}
	if minSize < 1 {
		minSize = 1
	}
	if v > uint64((d.size-d.off())/minSize) {
		d.fail("collection length")
		return 0
	}
	return int(v)
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n == 0 && d.more(binary.MaxVarintLen64) {
		v, n = binary.Varint(d.b)
	}
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 && !d.more(1) || len(d.b) < 1 {
		d.fail("byte")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bool() bool { return d.byte() != 0 }

func (d *decoder) f64() float64 {
	if len(d.b) < 8 && !d.more(8) || len(d.b) < 8 {
		d.fail("float")
		return 0
	}
	v := math.Float64frombits(binary.BigEndian.Uint64(d.b))
	d.b = d.b[8:]
	return v
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if d.st != nil {
		if n > uint64(d.size-d.off()) {
			d.fail("string")
			return ""
		}
		return d.strStream(int(n))
	}
	if n > uint64(len(d.b)) && (n > uint64(d.size-d.off()) || !d.more(int(n)) || n > uint64(len(d.b))) {
		d.fail("string")
		return ""
	}
	var s string
	if off := d.off(); d.whole != "" {
		s = d.whole[off : off+int(n)] // the snapshot buffer may be reused: never alias it
	} else {
		s = string(d.b[:n])
	}
	d.b = d.b[n:]
	return s
}

func (d *decoder) value() tuple.Value {
	kind := tuple.Kind(d.byte())
	switch kind {
	case tuple.KindFloat:
		return tuple.Value{Kind: kind, F: d.f64()}
	case tuple.KindString, tuple.KindBytes:
		return tuple.Value{Kind: kind, S: d.str()}
	case tuple.KindInt, tuple.KindTimestamp, tuple.KindBool:
		return tuple.Value{Kind: kind, I: d.varint()}
	case tuple.KindInvalid:
		// The encoder writes a zero varint after the kind (the min or max
		// of an accumulator no tuple updated: a function a version added
		// to a live aggregate, VersionedAggregate).
		d.varint()
		return tuple.Value{}
	}
	d.fail("value kind")
	return tuple.Value{}
}

// finish reports the first decoding error, or trailing garbage.
func (d *decoder) finish() error {
	if d.err != nil {
		return d.err
	}
	if n := d.size - d.off(); n != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadSnapshot, n)
	}
	return nil
}

// schemaSignature describes a schema for snapshot signatures.
func schemaSignature(s *tuple.Schema) string {
	b := make([]byte, 0, 16*s.Len())
	b = append(b, '{')
	for i, f := range s.Fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, f.Name...)
		b = append(b, ':')
		b = append(b, f.Kind.String()...)
	}
	return string(append(b, '}'))
}

// cloneValue deep-copies a value so it survives the caller reusing the
// memory its string aliases.
func cloneValue(v tuple.Value) tuple.Value {
	if v.S != "" {
		v.S = strings.Clone(v.S)
	}
	return v
}
