package operator

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// arrive writes state into in.Buf at off in pieces of random sizes (some
// a single byte, so that every primitive of the decoder is caught short),
// then, with failAt >= 0, stops there and fails the transfer.
func arrive(in *Incoming, off int, state []byte, r *rand.Rand, failAt int) {
	pos := 0
	for pos < len(state) {
		n := 1 + r.IntN(7)
		if r.IntN(4) == 0 {
			n = 1 + r.IntN(200)
		}
		n = min(n, len(state)-pos)
		if failAt >= 0 && pos+n > failAt {
			n = failAt - pos
			copy(in.Buf[off+pos:], state[pos:pos+n])
			in.Arrived(off + pos + n)
			in.Fail(errors.New("connection cut"))
			return
		}
		copy(in.Buf[off+pos:], state[pos:pos+n])
		pos += n
		in.Arrived(off + pos)
	}
}

// TestRestoreIncomingEqualsRestore: every operator (the aggregates decode
// while the bytes arrive, the others wait for the whole state), alone and
// chained, restored from a state arriving in small random pieces at an
// offset of a larger buffer, holds exactly the state Restore gives.
func TestRestoreIncomingEqualsRestore(t *testing.T) {
	forEachRestoreCase(t, 7, func(t *testing.T, rc restoreCase, r *rand.Rand) {
		const off = 13
		in := NewIncoming(make([]byte, off+len(rc.state)+5))
		dst := rc.build()
		done := make(chan error, 1)
		go func() { done <- RestoreIncoming(dst, in, off, len(rc.state)) }()
		arrive(in, off, rc.state, r, -1)
		in.Arrived(len(in.Buf))
		which := fmt.Sprintf("seed %d chained %v", rc.seed, rc.chained)
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", which, err)
		}
		sameRestored(t, dst, rc.state, which+": the state restored while arriving")
	})
}

// TestRestoreIncomingBrokenOff: a transfer that breaks off at any point
// ends the restore with ErrIncomingFailed (never a hang, never success),
// and a state that arrived whole but is truncated is ErrBadSnapshot.
func TestRestoreIncomingBrokenOff(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	sc, state := slidingState(t, r)
	for cut := 0; cut < len(state); cut += 1 + len(state)/60 {
		in := NewIncoming(make([]byte, len(state)))
		done := make(chan error, 1)
		dst := mustNew(t, sc.def, sc.inputs...)
		go func() { done <- RestoreIncoming(dst, in, 0, len(state)) }()
		arrive(in, 0, state, r, cut)
		if err := <-done; !errors.Is(err, ErrIncomingFailed) {
			t.Fatalf("cut at %d of %d: restore returned %v, want ErrIncomingFailed", cut, len(state), err)
		}
	}
	in := NewIncoming(bytes.Clone(state[:len(state)-3]))
	in.Arrived(len(in.Buf))
	if err := RestoreIncoming(mustNew(t, sc.def, sc.inputs...), in, 0, len(in.Buf)); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("truncated state: %v, want ErrBadSnapshot", err)
	}
}
