package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
)

// cutConn is a connection carrying a task snapshot whose reads fail
// halfway through the snapshot's operator state: a transfer cut in the
// middle of what the new copy restores while it arrives.
type cutConn struct {
	net.Conn
	got   []byte
	limit int // 0 until the head is parsed
	// opSize is the operator state's size once known.
	opSize *atomic.Int64
}

func (c *cutConn) Read(p []byte) (int, error) {
	if c.limit > 0 && len(c.got) >= c.limit {
		_ = c.Conn.Close()
		return 0, errors.New("connection cut by the test")
	}
	if c.limit > 0 {
		p = p[:min(len(p), c.limit-len(c.got))]
	} else {
		p = p[:min(len(p), 64)] // small reads until the head is known
	}
	n, err := c.Conn.Read(p)
	c.got = append(c.got, p[:n]...)
	// The snapshot follows its size (8 bytes: the offer is inline).
	if c.limit == 0 && len(c.got) > 8 {
		if off, size, has, herr := snapshotHead(c.got[8:]); herr == nil && has {
			c.limit = max(8+off+size/2, len(c.got))
			c.opSize.Store(int64(size))
		}
	}
	return n, err
}

// TestMoveRestoresWhileTransferring: the new copy of a moved aggregate
// restores its operator state while the bytes arrive over the bulk
// connection (BootstrapTiming.Streamed); when that connection is cut in
// the middle of the state, the half-restored operators are dropped, the
// fetch is tried again and restores into new ones, and the sink's stream
// is identical to an unmoved run's: nothing lost, nothing twice.
func TestMoveRestoresWhileTransferring(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	want := unmovedStream(t)

	// The first bulk connection is cut in the middle of the operator
	// state; the next ones are whole.
	var dials, cuts atomic.Int32
	var opSize atomic.Int64
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil || dials.Add(1) > 1 {
			return c, err
		}
		cuts.Add(1)
		return &cutConn{Conn: c, opSize: &opSize}, nil
	}
	r := startMoveRun(t, moving, 300, func(o *Options) { o.Bulk = BulkOptions{Dial: dial} })
	defer r.close(t)
	r.move(t, moving, r.from, r.to, true)
	if cuts.Load() != 1 || dials.Load() < 2 {
		t.Fatalf("%d bulk connections, %d cut: the test did not cut a transfer and retry (snapshot of %d bytes)", dials.Load(), cuts.Load(), r.from.rt.LastServed().Bytes)
	}
	if opSize.Load() < 100 {
		t.Fatalf("an operator state of %d bytes: too small for a cut in its middle to prove anything", opSize.Load())
	}
	// The first attempt restored off the connection; the retry keeps the
	// whole snapshot and restores while it arrives.
	if b := r.to.rt.LastBootstrap(); !b.Streamed || b.Interned || b.LastByte.IsZero() || b.Decoded.Before(b.LastByte) {
		t.Fatalf("the new copy did not restore while the bytes arrived: %+v", b)
	}
	r.sameAsUnmoved(t, want, "")
	r.noTaskFailed(t, "")
}

// TestSnapshotHead: the operator state's place found in the head of an
// encoded task snapshot is where the whole decoding finds it, for every
// prefix long enough, and a shorter prefix says it is short.
func TestSnapshotHead(t *testing.T) {
	s := &TaskSnapshot{TaskID: "q/agg/p3/r1", Query: "q", Fragment: "agg", Partition: 3, Replica: 1,
		Operator: []byte("operator state bytes"), Released: 7, Seq: 9}
	enc, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var dec TaskSnapshot
	if err := dec.unmarshal(enc, true); err != nil {
		t.Fatal(err)
	}
	for n := 0; n <= len(enc); n++ {
		off, size, has, err := snapshotHead(enc[:n])
		if errors.Is(err, errHeadShort) {
			continue
		}
		if err != nil || !has || string(enc[off:off+size]) != string(dec.Operator) {
			t.Fatalf("prefix %d: head says %d+%d (%v, %v)", n, off, size, has, err)
		}
		if n < off {
			t.Fatalf("prefix %d: head parsed before its end (%d)", n, off)
		}
	}
	s.Operator = nil
	enc, _ = s.MarshalBinary()
	if _, _, has, err := snapshotHead(enc); err != nil || has {
		t.Fatalf("snapshot without operator state: has %v, %v", has, err)
	}
}

// garbleReader passes a task snapshot's bytes through until the middle
// of its operator state, then hands out 0xFF bytes instead of the rest:
// the state arrives whole but stops decoding halfway (a string or count
// of all-ones bytes is refused), a restore failure rather than a broken
// transfer.
type garbleReader struct {
	r     io.Reader
	got   []byte
	limit int // 0 until the head is parsed
}

func (g *garbleReader) Read(p []byte) (int, error) {
	if g.limit == 0 {
		p = p[:min(len(p), 64)]
	}
	n, err := g.r.Read(p)
	for i := range n {
		if g.limit > 0 && len(g.got) >= g.limit {
			p[i] = 0xFF
			continue
		}
		g.got = append(g.got, p[i])
	}
	if g.limit == 0 {
		if off, size, has, herr := snapshotHead(g.got); herr == nil && has {
			g.limit = off + size/2
		}
	}
	return n, err
}

// TestMoveFallsBackWhenStreamRestoreFails: a moved aggregate's new copy
// restores its operator state off the connection without keeping it
// (BootstrapTiming.Interned); when that restore fails halfway through
// the state (bytes that do not decode), the snapshot is fetched again
// whole and restored the old way (while it arrives, Streamed), and the
// sink's stream is identical to an unmoved run's: nothing lost, nothing
// twice. A move without the failure restores interned.
func TestMoveFallsBackWhenStreamRestoreFails(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	want := unmovedStream(t)

	for _, garble := range []bool{true, false} {
		run := newMoveRun(t, moving)
		from, to := run.from, run.to
		var garbled atomic.Int32
		if garble {
			to.rt.tamperStream = func(r io.Reader) io.Reader {
				if garbled.Add(1) > 1 {
					return r
				}
				return &garbleReader{r: r}
			}
		}
		run.waitEmitted(t, 300)
		run.move(t, moving, from, to, true)
		b := to.rt.LastBootstrap()
		switch {
		case garble && (garbled.Load() != 1 || to.rt.StreamFallbacks() != 1):
			t.Fatalf("%d restores off the connection garbled, %d fetched again: the test did not make one fail", garbled.Load(), to.rt.StreamFallbacks())
		case garble && (b.Interned || !b.Streamed):
			t.Fatalf("after the failed restore the snapshot was not fetched whole and restored while arriving: %+v", b)
		case !garble && (!b.Interned || to.rt.StreamFallbacks() != 0):
			t.Fatalf("the new copy did not restore its state off the connection: %+v, %d fallbacks", b, to.rt.StreamFallbacks())
		}
		run.sameAsUnmoved(t, want, fmt.Sprintf("garble %v: ", garble))
		run.noTaskFailed(t, fmt.Sprintf("garble %v: ", garble))
		run.close(t)
	}
}
