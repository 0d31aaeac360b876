package operator

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unsafe"
)

// Restoring from a stream. A state restored from a buffer it was received
// into (RestoreOwned, RestoreIncoming) keeps that buffer: its strings are
// substrings of it. That costs the receiving worker a buffer of the
// state's whole size, written once into fresh memory (on the project's
// VM, page faults made writing 64 MB there cost 38-56 ms against 7 ms into
// memory already touched), and it keeps every copy of a string the state
// holds many times: a count_distinct member is held once per open window
// (`bench move`: each ~1 KB member about 400 times). RestoreStream instead
// decodes the state from a reader through one small buffer that is reused
// as the bytes pass, and copies each string it keeps once per distinct
// value (interning): the restored state then holds O(distinct strings)
// bytes, not O(state), and no large buffer is written at all. The price:
// the state's bytes are gone once restored, so a restore that fails cannot
// be retried from them (the caller fetches the state again).

// ErrStreamFailed wraps the error of the reader a RestoreStream was
// reading (a transfer that broke off), as opposed to ErrBadSnapshot, a
// state that arrived but does not decode.
var ErrStreamFailed = errors.New("operator: state stream broke off")

// StreamBufferBytes is a good size for the buffered reader RestoreStream
// reads from: a few TLS records' worth, small enough to stay in cache
// and cost nothing to allocate. Strings longer than the buffer are read
// into their own allocation.
const StreamBufferBytes = 256 << 10

// streamRestorer is implemented by operators that can restore from a
// stream, decoding as they read.
type streamRestorer interface {
	restoreStream(s *stateStream, size int) error
}

// stateStream is the reader a RestoreStream reads, with the interning
// table shared by every operator restored from it.
type stateStream struct {
	r      *bufio.Reader
	intern *interner
}

// RestoreStream restores op, a new operator that nothing else uses yet,
// from the next size bytes of r (its state as Snapshot encoded it),
// reading exactly those bytes. Operators that can (an aggregate, a chain
// of operators) decode as they read and keep one copy of each distinct
// string; any other reads its own part into a buffer of that part's size
// and restores from it owned. A read error comes back wrapped in
// ErrStreamFailed; a state that does not decode is ErrBadSnapshot. On
// error op is left partly restored and r at an unknown position: discard
// both.
func RestoreStream(op Operator, r *bufio.Reader, size int) error {
	if size < 0 {
		return fmt.Errorf("%w: state of %d bytes", ErrBadSnapshot, size)
	}
	return restoreFromStream(op, &stateStream{r: r, intern: newInterner()}, size)
}

func restoreFromStream(op Operator, s *stateStream, size int) error {
	if sr, ok := op.(streamRestorer); ok {
		return sr.restoreStream(s, size)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(s.r, buf); err != nil {
		return streamErr(err)
	}
	return RestoreOwned(op, buf)
}

// streamErr wraps a read error of the stream.
func streamErr(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %w", ErrStreamFailed, err)
}

// restoreStream restores the members in turn, each from its part of the
// stream (see chain.restore for the layout).
func (c *chain) restoreStream(s *stateStream, size int) error {
	left := size
	uvarint := func(what string) (uint64, error) {
		head, err := s.r.Peek(min(binary.MaxVarintLen64, left))
		if len(head) == 0 && err != nil {
			return 0, streamErr(err)
		}
		x, k := binary.Uvarint(head)
		if k <= 0 {
			if err != nil && len(head) < min(binary.MaxVarintLen64, left) {
				return 0, streamErr(err)
			}
			return 0, fmt.Errorf("%w: chain %s truncated", ErrBadSnapshot, what)
		}
		_, _ = s.r.Discard(k) // buffered: cannot fail
		left -= k
		return x, nil
	}
	return c.restoreInTurn(uvarint, func() int { return left }, func(op Operator, part int) error {
		if err := restoreFromStream(op, s, part); err != nil {
			return err
		}
		left -= part
		return nil
	})
}

// restoreStream is restoreOwned decoding the state as it is read.
func (a *aggregate) restoreStream(s *stateStream, size int) error {
	d, err := newStreamDecoder(s, size, a.signature)
	if err != nil {
		return err
	}
	if err := a.restore(d); err != nil {
		return err
	}
	d.release()
	return nil
}

// newStreamDecoder is a decoder of the next size bytes of s: a read
// beyond what s has buffered reads more (decoder.more), and the strings
// it returns are interned copies (decoder.str).
func newStreamDecoder(s *stateStream, size int, signature string) (*decoder, error) {
	d := &decoder{size: size, st: s}
	head := len(snapshotMagic) + 1
	if !d.more(head) || len(d.b) < head || string(d.b[:len(snapshotMagic)]) != snapshotMagic {
		if d.err != nil && errors.Is(d.err, ErrStreamFailed) {
			return nil, d.err
		}
		return nil, fmt.Errorf("%w: missing header", ErrBadSnapshot)
	}
	if v := d.b[len(snapshotMagic)]; v != snapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, want %d", ErrBadSnapshot, v, snapshotVersion)
	}
	d.b = d.b[head:]
	if got := d.str(); d.err != nil || got != signature {
		if errors.Is(d.err, ErrStreamFailed) {
			return nil, d.err
		}
		return nil, fmt.Errorf("%w: taken from operator %q, restoring into %q", ErrBadSnapshot, got, signature)
	}
	return d, nil
}

// moreStream is decoder.more over a stream: the bytes the decoder has
// read are discarded from the stream's buffer and it is refilled until
// n bytes past the read position are there (fewer at the state's end).
// d.b is then all the state's bytes the buffer holds.
func (d *decoder) moreStream(n int) bool {
	off := d.off()
	left := d.size - off
	if left == 0 {
		return false
	}
	d.release()
	want := min(n, left)
	if want > d.st.r.Size() {
		want = d.st.r.Size() // longer strings are read past the buffer (strStream)
	}
	got, err := d.st.r.Peek(want)
	if len(got) < want {
		if d.err == nil {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			d.err = streamErr(err)
		}
		d.b = nil
		return false
	}
	got, _ = d.st.r.Peek(min(d.st.r.Buffered(), left))
	d.b, d.end, d.read = got, off+len(got), off
	return len(got) >= min(n, left)
}

// release discards from the stream what the decoder has read since it
// last looked at the stream's buffer.
func (d *decoder) release() {
	if off := d.off(); off > d.read {
		_, _ = d.st.r.Discard(off - d.read) // buffered: cannot fail
		d.read = off
	}
}

// strStream reads a string of n bytes from the stream: interned when it
// fits the stream's buffer, read into an allocation of its own when not.
func (d *decoder) strStream(n int) string {
	if n > d.size-d.off() {
		d.fail("string")
		return ""
	}
	if n <= len(d.b) || (n <= d.st.r.Size() && d.more(n) && n <= len(d.b)) {
		s := d.st.intern.str(d.b[:n])
		d.b = d.b[n:]
		return s
	}
	if d.err != nil {
		return ""
	}
	// Longer than the buffer: what is buffered, then the rest read
	// straight into the string's own memory.
	buf := make([]byte, n)
	k := copy(buf, d.b)
	d.b = d.b[k:]
	d.release()
	if _, err := io.ReadFull(d.st.r, buf[k:]); err != nil {
		d.err, d.b = streamErr(err), nil
		return ""
	}
	off := d.read + n - k
	d.read, d.end, d.b = off, off, nil
	return unsafe.String(unsafe.SliceData(buf), n)
}

// interner hands out one copy of each distinct string restored, carved
// from blocks of internBlock bytes (one allocation per block, not per
// string). It stops looking strings up (only copying them) when few of
// them repeat: a state of distinct strings would otherwise pay a table
// as large as itself for nothing.
type interner struct {
	m            map[string]string
	block        []byte
	lookups, hit int
}

const (
	// internBlock is the size of the blocks strings are copied into, and
	// internOwn the length from which a string gets its own allocation.
	internBlock = 64 << 10
	internOwn   = 4 << 10
	// internProbe strings are looked up before the interner decides
	// whether looking up is worth it: at least 1 in internMinHit must
	// have been seen before.
	internProbe  = 4096
	internMinHit = 8
)

func newInterner() *interner { return &interner{m: map[string]string{}} }

// str is b as a string that does not alias b: the copy made for an equal
// string before, or a new one.
func (in *interner) str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if in.m != nil {
		if s, ok := in.m[string(b)]; ok {
			in.hit++
			return s
		}
		if in.lookups++; in.lookups == internProbe && in.hit*internMinHit < in.lookups {
			in.m = nil
		}
	}
	s := in.copy(b)
	if in.m != nil {
		in.m[s] = s
	}
	return s
}

// copy is a copy of b carved from the current block.
func (in *interner) copy(b []byte) string {
	if len(b) >= internOwn {
		return string(b)
	}
	if len(in.block) < len(b) {
		in.block = make([]byte, internBlock)
	}
	n := copy(in.block, b)
	s := unsafe.String(unsafe.SliceData(in.block), n)
	in.block = in.block[n:]
	return s
}
