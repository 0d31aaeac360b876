package benchmark

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// tcpBufferBytes is the buffer of the raw TCP writers and readers.
const tcpBufferBytes = 256 << 10

// recordMarker starts every raw record; the reader checks it, so that it
// looks at each record instead of only counting bytes.
const recordMarker = 0xfe

// ErrBadStream means a raw TCP baseline received something other than what
// its sender writes.
var ErrBadStream = errors.New("benchmark: malformed raw stream")

// dial connects to a loopback address, giving up with ctx; the connection
// is closed if ctx ends while it is in use. With cfg it is a TLS
// connection whose handshake is done when dial returns.
func dial(ctx context.Context, addr string, cfg *tls.Config) (net.Conn, func() bool, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	if cfg != nil {
		// The same TLS connections as the data plane's (tlsutil batches
		// the records of one write into one system call).
		conn = tlsutil.Client(conn, cfg)
		if err := conn.(interface {
			HandshakeContext(context.Context) error
		}).HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	return conn, stop, nil
}

// closeWrite half-closes a TCP or TLS connection so the reader sees EOF
// after everything written, then closes it.
func closeWrite(conn net.Conn) error {
	var err error
	if tc, ok := conn.(interface{ CloseWrite() error }); ok {
		err = tc.CloseWrite()
	}
	return errors.Join(err, conn.Close())
}

// Layout of a raw record: the marker, the blob generator's sequence
// number and stime (8 bytes each, little endian), then as much of its
// payload as fits (81 bytes, the blob default, in a 100-byte record; the
// last 2 bytes stay zero). Records shorter than a field carry only the
// fields that fit.
const (
	rawSeqAt     = 1
	rawSTimeAt   = 9
	rawPayloadAt = 17
)

// encodeRawRecord writes tp (a blob record) into rec.
func encodeRawRecord(rec []byte, tp *tuple.Tuple) {
	rec[0] = recordMarker
	if len(rec) >= rawSTimeAt {
		binary.LittleEndian.PutUint64(rec[rawSeqAt:], uint64(tp.Values[0].I))
	}
	if len(rec) >= rawPayloadAt {
		binary.LittleEndian.PutUint64(rec[rawSTimeAt:], uint64(tp.STime))
	}
	if len(rec) > rawPayloadAt {
		copy(rec[rawPayloadAt:], tp.Values[1].S)
	}
}

// sendRecords generates n records with the forward pipeline's blob
// generator and writes each, as a size-byte raw record, to addr through a
// buffered writer: like the engine's source, it produces every record it
// sends. StartNanos is taken when the request arrives, before the
// connection is made, as the engine's runs are timed from before their
// tasks start and connect.
func sendRecords(ctx context.Context, addr string, n int64, size int, cfg *tls.Config) (response, error) {
	start := time.Now()
	if size < 1 || n < 0 {
		return response{}, fmt.Errorf("tcp send: record size %d and count %d must be positive", size, n)
	}
	gen, err := source.NewGenerator(blobGenerator(n), 0)
	if err != nil {
		return response{}, fmt.Errorf("tcp send: %w", err)
	}
	conn, stop, err := dial(ctx, addr, cfg)
	if err != nil {
		return response{}, fmt.Errorf("tcp send: %w", err)
	}
	defer stop()
	record := make([]byte, size)
	bw := bufio.NewWriterSize(conn, tcpBufferBytes)
	var (
		tp   tuple.Tuple
		sent int64
	)
	for gen.Next(&tp) {
		encodeRawRecord(record, &tp)
		if _, err := bw.Write(record); err != nil {
			_ = conn.Close()
			return response{}, fmt.Errorf("tcp send: %w", err)
		}
		sent++
	}
	if err := bw.Flush(); err != nil {
		_ = conn.Close()
		return response{}, fmt.Errorf("tcp send: %w", err)
	}
	if err := closeWrite(conn); err != nil {
		return response{}, fmt.Errorf("tcp send: %w", err)
	}
	return response{StartNanos: start.UnixNano(), Records: sent, Bytes: sent * int64(size)}, nil
}

// receiveRecords accepts one connection and reads the size-byte records it
// carries until EOF, checking each one's marker and (when the record has
// room for it) that its sequence number follows the previous one's, as the
// engine's reader checks ids; want (when > 0) is the count the sender
// announced.
func receiveRecords(ctx context.Context, lis net.Listener, size int, want int64) (response, error) {
	if size < 1 {
		return response{}, fmt.Errorf("tcp receive: record size %d must be positive", size)
	}
	conn, err := lis.Accept()
	if err != nil {
		return response{}, fmt.Errorf("tcp receive: %w", err)
	}
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
	buf := make([]byte, tcpBufferBytes-tcpBufferBytes%size)
	checkSeq := size >= rawSTimeAt
	var resp response
	for {
		n, err := io.ReadFull(conn, buf)
		if n%size != 0 {
			return response{}, fmt.Errorf("%w: stream ends inside a record", ErrBadStream)
		}
		for off := 0; off < n; off += size {
			if buf[off] != recordMarker {
				return response{}, fmt.Errorf("%w: record %d lacks its marker", ErrBadStream, resp.Records)
			}
			// The blob generator numbers its records from 0.
			if checkSeq {
				if seq := binary.LittleEndian.Uint64(buf[off+rawSeqAt:]); seq != uint64(resp.Records) {
					return response{}, fmt.Errorf("%w: record %d carries sequence number %d", ErrBadStream, resp.Records, seq)
				}
			}
			resp.Records++
		}
		resp.Bytes += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return response{}, fmt.Errorf("tcp receive: %w", err)
		}
	}
	resp.EndNanos = time.Now().UnixNano()
	if want > 0 && resp.Records != want {
		return response{}, fmt.Errorf("%w: got %d records, sender wrote %d", ErrBadStream, resp.Records, want)
	}
	return resp, nil
}

// wordsGenerator is the generator both word counts read: the engine's
// words source, partition 0.
func wordsGenerator(records, seed int64) *queryspec.Generator {
	return &queryspec.Generator{Kind: queryspec.GenWords, Seed: seed, Limit: records}
}

// partitionOf is the engine's keyed exchange: hash slot of the key, then
// the partition owning the slot.
func partitionOf(word string, keyBuf []tuple.Value, partitions int) int {
	keyBuf[0] = tuple.Str(word)
	return queryspec.PartitionOfSlot(queryspec.Slot(keyBuf), partitions)
}

// sendWordCount is the sending half of the hand-written word count: it
// generates the lines, splits them into words and sends each word (a
// uvarint length and the bytes) to the partition owning it, one connection
// per partition. The response counts lines (Records), their bytes and the
// words sent.
func sendWordCount(ctx context.Context, addr string, records, seed int64, partitions int, cfg *tls.Config) (response, error) {
	if partitions < 1 || records < 0 {
		return response{}, fmt.Errorf("wc send: partitions %d and records %d must be positive", partitions, records)
	}
	// Timed from the request, before connecting (see sendRecords).
	start := time.Now()
	gen, err := source.NewGenerator(wordsGenerator(records, seed), 0)
	if err != nil {
		return response{}, fmt.Errorf("wc send: %w", err)
	}
	conns := make([]net.Conn, 0, partitions)
	writers := make([]*bufio.Writer, 0, partitions)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range partitions {
		c, stop, err := dial(ctx, addr, cfg)
		if err != nil {
			return response{}, fmt.Errorf("wc send: %w", err)
		}
		defer stop()
		conns = append(conns, c)
		writers = append(writers, bufio.NewWriterSize(c, tcpBufferBytes))
	}
	var (
		tp     tuple.Tuple
		keyBuf = make([]tuple.Value, 1)
		frame  = make([]byte, 0, binary.MaxVarintLen64)
		resp   response
	)
	for gen.Next(&tp) {
		line := tp.Values[0].S
		// The split operator's tokeniser: the same rules, no allocation.
		for s, e := operator.NextToken(line, 0); s < e; s, e = operator.NextToken(line, e) {
			word := line[s:e]
			bw := writers[partitionOf(word, keyBuf, partitions)]
			frame = binary.AppendUvarint(frame[:0], uint64(len(word)))
			_, _ = bw.Write(frame)
			if _, err := bw.WriteString(word); err != nil {
				return response{}, fmt.Errorf("wc send: %w", err)
			}
			resp.Words++
		}
		resp.Records++
		resp.Bytes += int64(len(line))
	}
	for i, bw := range writers {
		if err := bw.Flush(); err != nil {
			return response{}, fmt.Errorf("wc send: %w", err)
		}
		if err := closeWrite(conns[i]); err != nil {
			return response{}, fmt.Errorf("wc send: %w", err)
		}
	}
	conns = nil
	resp.StartNanos = start.UnixNano()
	return resp, nil
}

// receiveWordCount is the receiving half: one goroutine per partition
// connection counts into its own map; the maps are merged at the end
// (partitions own disjoint keys). Records is the number of words counted.
func receiveWordCount(ctx context.Context, lis net.Listener, partitions int) (response, error) {
	if partitions < 1 {
		return response{}, fmt.Errorf("wc receive: partitions %d must be positive", partitions)
	}
	type result struct {
		counts map[string]int64
		err    error
	}
	results := make(chan result, partitions)
	var wg sync.WaitGroup
	defer wg.Wait()
	var acceptErr error
	for range partitions {
		conn, err := lis.Accept()
		if err != nil {
			acceptErr = fmt.Errorf("wc receive: %w", err)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
			counts, err := countWords(bufio.NewReaderSize(conn, tcpBufferBytes))
			results <- result{counts, err}
		}()
	}
	if acceptErr != nil {
		_ = lis.Close()
		return response{}, acceptErr
	}
	resp := response{Counts: map[string]int64{}}
	var errs []error
	for range partitions {
		r := <-results
		errs = append(errs, r.err)
		for w, n := range r.counts {
			resp.Counts[w] += n
			resp.Records += n
		}
	}
	resp.EndNanos = time.Now().UnixNano()
	if err := errors.Join(errs...); err != nil {
		return response{}, fmt.Errorf("wc receive: %w", err)
	}
	return resp, nil
}

// countWords reads words (uvarint length, bytes) until EOF and counts
// them.
func countWords(r *bufio.Reader) (map[string]int64, error) {
	counts := map[string]*int64{}
	var word []byte
	for {
		n, err := binary.ReadUvarint(r)
		if err == io.EOF {
			out := make(map[string]int64, len(counts))
			for w, c := range counts {
				out[w] = *c
			}
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadStream, err)
		}
		if n > 1<<16 {
			return nil, fmt.Errorf("%w: word of %d bytes", ErrBadStream, n)
		}
		if uint64(cap(word)) < n {
			word = make([]byte, n)
		}
		word = word[:n]
		if _, err := io.ReadFull(r, word); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadStream, err)
		}
		c := counts[string(word)] // no allocation for the lookup
		if c == nil {
			c = new(int64)
			counts[string(word)] = c
		}
		*c++
	}
}
