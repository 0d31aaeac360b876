package runtime

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	goruntime "runtime"
	"time"

	"github.com/fedstream/fedstream/worker/operator"
)

// Restoring from the connection. A bootstrap that restores its operators
// while the snapshot arrives (early.go) first received every byte into a
// buffer of the snapshot's size and kept it: the restored state's strings
// were substrings of it, and the whole snapshot stayed there for the
// fallback (restoring from it afterwards when the early restore failed).
// Writing a large snapshot into fresh memory is most of what receiving it
// costs (page faults), and a count_distinct member held by each of many
// open windows was kept once per window. So the first attempt of such a
// fetch decodes the operator state straight off the bulk connection
// through a small reused buffer (operator.RestoreStream: one copy per
// distinct string) and keeps only the bytes around it (head, positions,
// output tails). Its fallback cannot restore from bytes it did not keep:
// when that restore fails, the snapshot is fetched again the old way
// (received whole and restored while it arrives, with the whole snapshot
// kept for the restore after it).

// errStreamRestore means the operator state read off the connection did
// not restore (the bytes arrived but did not decode into the task's
// operators): the snapshot is fetched again and kept whole.
var errStreamRestore = errors.New("restoring the operator state off the connection failed")

// streamedFetch is what a fetch that restored off the connection got:
// the snapshot's encoding without the operator state (head and rest
// joined, see TaskSnapshot.elided) and the operators restored from it.
type streamedFetch struct {
	enc   []byte
	early *earlyOp
	// elided: the encoding's operator state was restored into early and
	// is not in enc.
	elided bool
}

// countingReader reads at most left bytes of r and records, in fo, when
// the first and the last arrived.
type countingReader struct {
	r    io.Reader
	left int
	fo   *fetchOpts
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.left == 0 {
		return 0, io.EOF
	}
	n, err := c.r.Read(p[:min(len(p), c.left)])
	if n > 0 && c.fo.firstByte.IsZero() {
		c.fo.firstByte = time.Now()
	}
	c.left -= n
	if c.left == 0 {
		c.fo.lastByte = time.Now()
		err = nil
	}
	return n, err
}

// receiveStreamed is receive restoring the operator state off the
// connection with fo.restoreStream (see above); total is the snapshot's
// size, 0 when the offer sends it inline.
func (c *bulkClient) receiveStreamed(ctx context.Context, workerAddr string, port uint32, token []byte, total int, fo *fetchOpts) (*streamedFetch, error) {
	conn, closeConn, err := c.connect(ctx, workerAddr, port, token)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	if total == 0 {
		if total, err = readSize(ctx, conn); err != nil {
			return nil, err
		}
	}
	var src io.Reader = &countingReader{r: conn, left: total, fo: fo}
	if goruntime.GOMAXPROCS(0) > 1 {
		// The next bytes are read (decrypted) while the ones before are
		// decoded (readahead.go).
		ra := newReadAhead(src, total)
		defer func() {
			closeConn() // a read that blocks returns
			ra.close()
		}()
		src = ra
	}
	if fo.tamper != nil {
		src = fo.tamper(src)
	}
	br := bufio.NewReaderSize(src, operator.StreamBufferBytes)
	// transferErr is a read of the connection that failed.
	transferErr := func(err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w: over the bulk connection: %w", ErrSnapshotTransfer, err)
	}
	// The head says where the operator state lies.
	var off, size int
	var hasOp bool
	for want := min(snapshotHeadBytes, total); ; want = min(2*want, total) {
		p, perr := br.Peek(want)
		off, size, hasOp, err = snapshotHead(p)
		if err == nil {
			break
		}
		if !errors.Is(err, errHeadShort) {
			return nil, err
		}
		if perr != nil && !errors.Is(perr, bufio.ErrBufferFull) {
			return nil, transferErr(perr)
		}
		if want == total || want >= br.Size() {
			return nil, fmt.Errorf("%w: a snapshot head longer than %d bytes", errStreamRestore, want)
		}
	}
	if !hasOp || off+size > total {
		// Nothing to restore (or a size the decoding refuses): the
		// snapshot whole, as receive reads it.
		enc := make([]byte, total)
		if _, err := io.ReadFull(br, enc); err != nil {
			return nil, transferErr(err)
		}
		return &streamedFetch{enc: enc}, nil
	}
	enc := make([]byte, off, total-size)
	if _, err := io.ReadFull(br, enc); err != nil {
		return nil, transferErr(err)
	}
	early, err := fo.restoreStream(br, size)
	if err != nil {
		if errors.Is(err, operator.ErrStreamFailed) {
			return nil, transferErr(err)
		}
		return nil, fmt.Errorf("%w: %w", errStreamRestore, err)
	}
	rest := enc[off : total-size]
	if _, err := io.ReadFull(br, rest); err != nil {
		return nil, transferErr(err)
	}
	return &streamedFetch{enc: enc[:total-size], early: early, elided: true}, nil
}
