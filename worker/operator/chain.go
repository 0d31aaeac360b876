package operator

import (
	"encoding/binary"
	"fmt"

	"github.com/fedstream/fedstream/worker/tuple"
)

// chain runs operators fused into one fragment: each one's output is the
// next one's input, in the same goroutine, with no encoding in between.
// Only the head may have several input ports; the rest see port 0.
type chain struct {
	ops []Operator
	// links[i] receives ops[i]'s output and feeds ops[i+1]; the last link
	// forwards to the caller's emitter, set per call.
	links []*chainLink
	out   Emitter
	err   error
}

type chainLink struct {
	c    *chain
	next int
}

// Emit passes t to the next operator, or to the chain's emitter after the
// last. Errors stop the rest of this call's cascade and are returned by the
// chain's Process or Advance.
func (l *chainLink) Emit(t *tuple.Tuple) {
	c := l.c
	if c.err != nil {
		return
	}
	if l.next == len(c.ops) {
		c.out.Emit(t)
		return
	}
	// Keep the first error: an operator further down the chain may have
	// failed inside this call, and this operator's own Process returns nil.
	if err := c.ops[l.next].Process(0, t, c.links[l.next]); err != nil && c.err == nil {
		c.err = err
	}
}

// Chain fuses ops (at least one) into one Operator. Stream time reaches every
// operator: Advance is applied to each in order, and whatever an earlier one
// emits on Advance flows through the later ones before they advance.
func Chain(ops ...Operator) Operator {
	if len(ops) == 1 {
		return ops[0]
	}
	c := &chain{ops: ops}
	for i := range ops {
		c.links = append(c.links, &chainLink{c: c, next: i + 1})
	}
	return c
}

func (c *chain) Process(port int, t *tuple.Tuple, out Emitter) error {
	c.out, c.err = out, nil
	if err := c.ops[0].Process(port, t, c.links[0]); err != nil {
		return err
	}
	return c.err
}

func (c *chain) Advance(watermark int64, out Emitter) error {
	c.out, c.err = out, nil
	for i, op := range c.ops {
		if err := op.Advance(watermark, c.links[i]); err != nil {
			return err
		}
		if c.err != nil {
			return c.err
		}
	}
	return nil
}

// Snapshot concatenates the members' snapshots, each length-prefixed.
func (c *chain) Snapshot() ([]byte, error) {
	var buf []byte
	buf = binary.AppendUvarint(buf, uint64(len(c.ops)))
	for _, op := range c.ops {
		s, err := op.Snapshot()
		if err != nil {
			return nil, err
		}
		buf = binary.AppendUvarint(buf, uint64(len(s)))
		buf = append(buf, s...)
	}
	return buf, nil
}

func (c *chain) Restore(state []byte) error { return c.restore(state, false) }

// restoreOwned is Restore from a snapshot handed over (RestoreOwned):
// each member restores its part owned.
func (c *chain) restoreOwned(state []byte) error { return c.restore(state, true) }

func (c *chain) restore(state []byte, owned bool) error {
	n, k := binary.Uvarint(state)
	if k <= 0 || n != uint64(len(c.ops)) {
		return fmt.Errorf("%w: chain of %d operators, snapshot holds %d", ErrBadSnapshot, len(c.ops), n)
	}
	state = state[k:]
	parts := make([][]byte, len(c.ops))
	for i := range c.ops {
		size, k := binary.Uvarint(state)
		if k <= 0 || size > uint64(len(state)-k) {
			return fmt.Errorf("%w: chain member %d truncated", ErrBadSnapshot, i)
		}
		parts[i] = state[k : k+int(size)]
		state = state[k+int(size):]
	}
	if len(state) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after chain", ErrBadSnapshot, len(state))
	}
	// Restore only once every part parsed, so a bad snapshot changes nothing
	// it can detect up front.
	for i, op := range c.ops {
		restore := op.Restore
		if owned {
			restore = func(b []byte) error { return RestoreOwned(op, b) }
		}
		if err := restore(parts[i]); err != nil {
			return fmt.Errorf("chain member %d: %w", i, err)
		}
	}
	return nil
}

// restoreInTurn restores the members one after the other from a state
// read in order (see restore for the layout), for the restores that read
// it as it comes (restoreStream, restoreIncoming): uvarint reads the next
// count or size (what names it in the error), left is how many bytes of
// the state are still unread, and member restores op from the next size
// bytes, reading them. Unlike restore, a bad member found late leaves the
// members before it restored: the caller discards the chain on error.
func (c *chain) restoreInTurn(uvarint func(what string) (uint64, error), left func() int, member func(op Operator, size int) error) error {
	n, err := uvarint("member count")
	if err != nil {
		return err
	}
	if n != uint64(len(c.ops)) {
		return fmt.Errorf("%w: chain of %d operators, snapshot holds %d", ErrBadSnapshot, len(c.ops), n)
	}
	for i, op := range c.ops {
		size, err := uvarint("member size")
		if err != nil {
			return err
		}
		if size > uint64(left()) {
			return fmt.Errorf("%w: chain member %d truncated", ErrBadSnapshot, i)
		}
		if err := member(op, int(size)); err != nil {
			return fmt.Errorf("chain member %d: %w", i, err)
		}
	}
	if rest := left(); rest != 0 {
		return fmt.Errorf("%w: %d trailing bytes after chain", ErrBadSnapshot, rest)
	}
	return nil
}

func (c *chain) OutputSchema() *tuple.Schema { return c.ops[len(c.ops)-1].OutputSchema() }
