package runtime

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// unevenReader hands out b in reads of irregular sizes (at most 17,000
// bytes, about a TLS record), then err (io.EOF when nil).
type unevenReader struct {
	b   []byte
	rng *rand.Rand
	err error
}

func (r *unevenReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 1+r.rng.IntN(17000))], r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestReadAheadDeliversEveryByteInOrder: what Read returns is the source,
// byte for byte, whatever the sizes of the reads on either side, then the
// source's end (or its error).
func TestReadAheadDeliversEveryByteInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]byte, 5*readAheadChunkBytes+12345) // more chunks than go round
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	failed := errors.New("connection reset")
	for _, srcErr := range []error{nil, failed} {
		ra := startReadAhead(&unevenReader{b: want, rng: rand.New(rand.NewPCG(5, 6)), err: srcErr})
		var got bytes.Buffer
		p := make([]byte, 4096)
		var err error
		for err == nil {
			var n int
			n, err = ra.Read(p[:1+rng.IntN(len(p))])
			got.Write(p[:n])
		}
		ra.stop()
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("source error %v: got %d bytes, not the source's %d (or not in order)", srcErr, got.Len(), len(want))
		}
		wantErr := io.EOF
		if srcErr != nil {
			wantErr = srcErr
		}
		if !errors.Is(err, wantErr) {
			t.Fatalf("after the bytes: %v, want %v", err, wantErr)
		}
	}
}

// TestReadAheadStops: stop returns whether the reading goroutine waits
// for the reader to take a chunk (nobody reads) or on a blocked read of
// the source that its owner ends (closes the connection).
func TestReadAheadStops(t *testing.T) {
	stopped := func(ra *readAhead, before func()) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			if before != nil {
				before()
			}
			ra.stop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("stop did not return")
		}
	}
	// Nobody reads: the goroutine fills every chunk and waits to hand
	// over another.
	stopped(startReadAhead(&unevenReader{b: make([]byte, 10*readAheadChunkBytes), rng: rand.New(rand.NewPCG(3, 4))}), nil)
	// A read of the source blocks until its owner closes it.
	pr, pw := io.Pipe()
	ra := startReadAhead(pr)
	if _, err := pw.Write([]byte("some")); err != nil {
		t.Fatal(err)
	}
	stopped(ra, func() { _ = pw.CloseWithError(io.ErrClosedPipe) })
}
