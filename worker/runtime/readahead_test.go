package runtime

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// countedReader counts the bytes read from r.
type countedReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestReadAheadReadsNBytesAhead: readAhead hands out exactly the first n
// bytes of its source in order, in reads of any size, and reads the
// source before it is asked (what lets decrypting overlap decoding).
func TestReadAheadReadsNBytesAhead(t *testing.T) {
	data := make([]byte, 3*readAheadBuffers*readAheadBufferBytes+12345)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	n := len(data) - 1000 // the source holds more than n
	src := &countedReader{r: bytes.NewReader(data)}
	ra := newReadAhead(src, n)
	defer ra.close()
	for deadline := time.Now().Add(10 * time.Second); src.n.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("nothing was read ahead of the first Read")
		}
	}
	var got []byte
	buf := make([]byte, 70001)
	for {
		k, err := ra.Read(buf[:1+rand.IntN(len(buf)-1)])
		got = append(got, buf[:k]...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	if !bytes.Equal(got, data[:n]) {
		t.Fatalf("got %d bytes, want the first %d of the source (equal prefix: %v)", len(got), n, bytes.HasPrefix(data, got))
	}
	if r := src.n.Load(); r != int64(n) {
		t.Fatalf("read %d bytes of the source, want %d", r, n)
	}
}

// TestReadAheadError: a source that fails (or ends) before n bytes gives
// the bytes it had, then its error; close returns with the goroutine
// blocked in a read once that read returns.
func TestReadAheadError(t *testing.T) {
	broken := errors.New("link down")
	data := bytes.Repeat([]byte("x"), readAheadBufferBytes+10)
	ra := newReadAhead(io.MultiReader(bytes.NewReader(data), &failingReader{err: broken}), 10*len(data))
	got, err := io.ReadAll(ra)
	if !errors.Is(err, broken) || len(got) != len(data) {
		t.Fatalf("got %d bytes, %v; want %d, %v", len(got), err, len(data), broken)
	}
	ra.close()

	ra = newReadAhead(bytes.NewReader(data), 2*len(data))
	if _, err := io.ReadAll(ra); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short source: %v, want io.ErrUnexpectedEOF", err)
	}
	ra.close()

	pr, pw := io.Pipe()
	ra = newReadAhead(pr, 100)
	_ = pw.CloseWithError(broken) // a blocked read returns, as when the connection closes
	ra.close()
	// broken, or io.ErrClosedPipe when close came before the read began.
	if _, err := ra.Read(make([]byte, 10)); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("after close: %v, want an error", err)
	}
}

type failingReader struct{ err error }

func (f *failingReader) Read([]byte) (int, error) { return 0, f.err }
