package runtime

import (
	"io"
	"sync"
)

// Reading a snapshot ahead of its restore. Restored off a TLS connection
// (streamfetch.go), a snapshot's bytes were decrypted and decoded on one
// goroutine, one after the other: on the fetching worker of bench move's
// 64 MB, decrypting (and the read system calls) and decoding (building
// the count_distinct sets, the page faults of a heap that never held
// them) each take tens of milliseconds, so the transfer waited for their
// sum while the other core had room. readAhead reads (decrypts) the next
// bytes on a goroutine of its own while the restore decodes the ones
// before, through a few buffers that go round: the bytes are copied once
// more, and no memory is allocated beyond those buffers. With one
// processor there is nothing to overlap: the restore reads directly.

// readAheadBuffers and readAheadBufferBytes size readAhead's buffers:
// enough that the reader rarely waits for a free one, few enough that
// they stay in cache and cost few page faults to make.
const (
	readAheadBuffers     = 3
	readAheadBufferBytes = 128 << 10
)

// readAhead is an io.Reader over the first n bytes of r, read by a
// goroutine of its own into buffers ahead of the caller. close stops
// that goroutine and waits for it; the caller must make a blocked read of
// r return first (close the connection).
type readAhead struct {
	full chan []byte // filled buffers, in order; closed after the last
	free chan []byte // buffers the caller is done with
	quit chan struct{}
	wg   sync.WaitGroup

	cur []byte // the part of the current buffer not yet read
	buf []byte // the current buffer, whole (returned to free once read)
	// err is why full was closed: io.EOF after n bytes, or r's error.
	// The goroutine sets it before it closes full, the caller reads it
	// after.
	err  error
	once sync.Once
}

func newReadAhead(r io.Reader, n int) *readAhead {
	ra := &readAhead{full: make(chan []byte, readAheadBuffers), free: make(chan []byte, readAheadBuffers), quit: make(chan struct{})}
	for range readAheadBuffers {
		ra.free <- nil // made on first use
	}
	ra.wg.Add(1)
	go ra.run(r, n)
	return ra
}

func (ra *readAhead) run(r io.Reader, left int) {
	defer ra.wg.Done()
	defer close(ra.full)
	for left > 0 {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.quit:
			ra.err = io.ErrClosedPipe
			return
		}
		if buf == nil {
			buf = make([]byte, readAheadBufferBytes)
		}
		got, err := io.ReadFull(r, buf[:min(len(buf), left)])
		left -= got
		if got > 0 {
			ra.full <- buf[:got] // never blocks: as many slots as buffers
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			ra.err = err
			return
		}
	}
	ra.err = io.EOF
}

// Read copies from the buffers in order; once the n bytes have been read
// it returns io.EOF, and r's error if it failed before them.
func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.buf != nil {
			ra.free <- ra.buf[:cap(ra.buf)] // never blocks
			ra.buf = nil
		}
		buf, ok := <-ra.full
		if !ok {
			return 0, ra.err
		}
		ra.buf, ra.cur = buf, buf
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// close stops the reading goroutine and waits for it: call it after
// making a read of r that blocks return (closing the connection).
func (ra *readAhead) close() {
	ra.once.Do(func() { close(ra.quit) })
	ra.wg.Wait()
}
