package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/fedstream/fedstream/worker/dataplane"
)

// Ingest message sizing. A worker refuses any message larger than
// dataplane.MaxMessageBytes, failing the whole call with a bare gRPC
// "message larger than max" error. The CLI therefore closes a batch at
// ingestBatchBytes, well under that limit, and refuses a single line too
// long to fit in a message by itself, on its own line number.
const (
	ingestBatchBytes = 4 << 20
	// ingestMaxLine leaves room for the request's other fields.
	ingestMaxLine = dataplane.MaxMessageBytes - 64<<10
)

// lineReader reads lines of any length without holding more than max
// bytes of one: a longer line is skipped and reported by its length.
type lineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

func newLineReader(in io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(in, 64<<10), max: max}
}

// next returns the next line without its newline. For a line longer than
// max, line is nil and size is its length. err is io.EOF after the last
// line.
func (lr *lineReader) next() (line []byte, size int, err error) {
	lr.buf = lr.buf[:0]
	size = 0
	for {
		frag, err := lr.r.ReadSlice('\n')
		size += len(frag)
		if size <= lr.max+1 { // +1: the newline
			lr.buf = append(lr.buf, frag...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && size == 0:
			return nil, 0, io.EOF
		case err != nil && err != io.EOF:
			return nil, size, err
		}
		if n := len(frag); n > 0 && frag[n-1] == '\n' {
			size--
		}
		if size > lr.max {
			return nil, size, nil
		}
		return lr.buf[:size], size, nil
	}
}

// tooLongLine is the refusal of a line that cannot fit in one message.
func tooLongLine(lineNo uint64, size int) string {
	return fmt.Sprintf("line %d: %s long; a worker accepts messages of at most %s (its data-plane gRPC receive limit, fixed at build time), so one record may be at most %s: split the record; refused",
		lineNo, mib(size), mib(dataplane.MaxMessageBytes), mib(ingestMaxLine))
}

func mib(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
