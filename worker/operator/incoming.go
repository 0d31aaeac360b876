package operator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// Incoming is a buffer that fills from its start while a reader already
// decodes what has arrived: a snapshot received from another worker,
// restored while its bytes cross (RestoreIncoming) instead of after the
// last one. One goroutine writes into Buf and calls Arrived; others wait
// for a prefix (Wait). Every wait ends: once the buffer is full, or once
// the writer calls Fail (which it must on any error, ctx included).
type Incoming struct {
	// Buf is the whole buffer, of the final size: the writer fills it in
	// order; a reader reads only the prefix Wait reported.
	Buf []byte

	mu   sync.Mutex
	n    int
	err  error
	wake chan struct{} // closed and replaced when n grows or err is set
}

// ErrIncomingFailed wraps the error that ended an Incoming's writing
// before the buffer was full: a restore waiting for its bytes fails with
// it.
var ErrIncomingFailed = errors.New("operator: incoming state broke off")

// NewIncoming is an empty Incoming over buf (len(buf) is the size to
// come).
func NewIncoming(buf []byte) *Incoming {
	return &Incoming{Buf: buf, wake: make(chan struct{})}
}

// Arrived records that Buf[:n] is written (n only grows).
func (in *Incoming) Arrived(n int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if n <= in.n || in.err != nil {
		return
	}
	in.n = min(n, len(in.Buf))
	close(in.wake)
	in.wake = make(chan struct{})
}

// Fail ends the writing: waits for bytes that have not arrived fail with
// err. It does nothing once the buffer is full or after a first Fail.
func (in *Incoming) Fail(err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.err != nil || in.n == len(in.Buf) {
		return
	}
	in.err = fmt.Errorf("%w: %w", ErrIncomingFailed, err)
	close(in.wake)
	in.wake = make(chan struct{})
}

// Wait blocks until Buf[:upTo] has arrived (upTo is capped at the
// buffer's size) and returns how much has, at least upTo; or returns the
// writer's error (ErrIncomingFailed) when it stopped short of upTo.
func (in *Incoming) Wait(upTo int) (int, error) {
	upTo = min(upTo, len(in.Buf))
	for {
		in.mu.Lock()
		n, err, wake := in.n, in.err, in.wake
		in.mu.Unlock()
		if n >= upTo {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		<-wake
	}
}

// view is a range of an Incoming (a chain member's state, an operator
// state inside a task snapshot): offsets relative to its start.
type view struct {
	in        *Incoming
	off, size int
}

// wait is Incoming.Wait within the view.
func (v view) wait(upTo int) (int, error) {
	n, err := v.in.Wait(v.off + min(upTo, v.size))
	return min(max(n-v.off, 0), v.size), err
}

func (v view) buf() []byte { return v.in.Buf[v.off : v.off+v.size : v.off+v.size] }

// incomingRestorer is implemented by operators that can restore while
// their state arrives.
type incomingRestorer interface {
	restoreIncoming(v view) error
}

// RestoreIncoming restores op, a new operator that nothing else uses yet,
// from the state in in.Buf[off:off+size] while it arrives: an operator
// that can (an aggregate, a chain of operators) decodes each part as soon
// as its bytes are there, so that restoring ends right after the last
// byte, and keeps substrings of in.Buf as RestoreOwned does (the caller
// hands the buffer over); any other waits for the whole state and restores
// from it owned. On error op is left partly restored: discard it.
func RestoreIncoming(op Operator, in *Incoming, off, size int) error {
	if off < 0 || size < 0 || off+size > len(in.Buf) {
		return fmt.Errorf("%w: state at %d+%d beyond the %d bytes to come", ErrBadSnapshot, off, size, len(in.Buf))
	}
	return restoreView(op, view{in: in, off: off, size: size})
}

func restoreView(op Operator, v view) error {
	if r, ok := op.(incomingRestorer); ok {
		return r.restoreIncoming(v)
	}
	if _, err := v.wait(v.size); err != nil {
		return err
	}
	return RestoreOwned(op, v.buf())
}

// restoreIncoming restores the members in turn, each from its part as it
// arrives (see chain.restore for the layout).
func (c *chain) restoreIncoming(v view) error {
	off := 0
	uvarint := func(what string) (uint64, error) {
		for {
			n, err := v.wait(off + binary.MaxVarintLen64)
			x, k := binary.Uvarint(v.buf()[off:n])
			if k > 0 {
				off += k
				return x, nil
			}
			if k < 0 || n == v.size {
				return 0, fmt.Errorf("%w: chain %s truncated", ErrBadSnapshot, what)
			}
			if err != nil {
				return 0, err
			}
		}
	}
	return c.restoreInTurn(uvarint, func() int { return v.size - off }, func(op Operator, size int) error {
		if err := restoreView(op, view{in: v.in, off: v.off + off, size: size}); err != nil {
			return err
		}
		off += size
		return nil
	})
}

// restoreIncoming is restoreOwned decoding each part of the state as soon
// as it has arrived.
func (a *aggregate) restoreIncoming(v view) error {
	d, err := newIncomingDecoder(v, a.signature)
	if err != nil {
		return err
	}
	return a.restore(d)
}

// newIncomingDecoder is newOwnedDecoder over a state still arriving: a
// read beyond what has arrived waits for it (decoder.more).
func newIncomingDecoder(v view, signature string) (*decoder, error) {
	head := len(snapshotMagic) + 1
	n, err := v.wait(head)
	if err != nil {
		return nil, err
	}
	state := v.buf()
	if n < head || string(state[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: missing header", ErrBadSnapshot)
	}
	if ver := state[len(snapshotMagic)]; ver != snapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, want %d", ErrBadSnapshot, ver, snapshotVersion)
	}
	var whole string
	if len(state) > 0 {
		whole = unsafe.String(unsafe.SliceData(state), len(state))
	}
	d := &decoder{b: state[head:n], whole: whole, size: len(state), end: n, state: state, in: &v}
	if got := d.str(); d.err != nil || got != signature {
		if errors.Is(d.err, ErrIncomingFailed) {
			return nil, d.err
		}
		return nil, fmt.Errorf("%w: taken from operator %q, restoring into %q", ErrBadSnapshot, got, signature)
	}
	return d, nil
}
