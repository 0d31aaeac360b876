package runtime

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker/operator"
)

// Fast snapshot transfer. A snapshot's bytes are the bulk of a move, and
// one gRPC stream moves them at a fraction of what the connection under
// it can: every 16 KiB HTTP/2 frame is copied through gRPC's buffers on
// both sides and paced by flow control. So a worker that offers it sends
// a snapshot over a connection of its own: the fetching worker asks for it
// on the FetchSnapshot call (which the data plane has authenticated and
// authorized as for any call: the org's workers only), the serving worker
// answers with the port of its bulk listener and a random one-time token,
// the fetching worker connects there (mutual TLS with the data plane's
// certificates when the data plane uses TLS), presents the token, and
// receives the snapshot's bytes written straight from the encoding in
// large writes. The call ends once they are written. The token is what
// authorizes the connection: only the caller of the authorized call
// learns it, it is good for one connection and expires with the call.

// BulkOptions configure fast snapshot transfer (Options.Bulk).
type BulkOptions struct {
	// Listener accepts the connections that fetch snapshots; its port is
	// offered to fetching workers, which dial it on the host they reached
	// the data plane at. The runtime owns it and closes it on Close. Nil:
	// this runtime does not serve snapshots that way (it still fetches
	// them that way from workers that do).
	Listener net.Listener
	// ServerTLS, when set, makes accepted connections TLS. It must
	// require and verify a client certificate as the data plane does
	// (tlsutil.Credentials.ServerConfig for the worker role).
	ServerTLS *tls.Config
	// ClientTLS, when set, makes dialed connections TLS (the data plane's
	// client configuration: tlsutil.Credentials.ClientConfig).
	ClientTLS *tls.Config
	// Dial opens a connection to a peer's bulk listener (nil: a plain
	// net.Dialer). Fault injection and byte counting wrap it.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// DialTimeout bounds connecting to a peer's bulk listener before the
	// fetch falls back to the stream (default 5s): a port a firewall
	// drops silently must not hold the fetch for its whole deadline.
	DialTimeout time.Duration
	// Disabled makes the runtime fetch snapshots over the FetchSnapshot
	// stream only (never asking for a connection of their own).
	Disabled bool
}

// ErrBulkRefused means a bulk connection presented no token, or one that
// is unknown or expired.
var ErrBulkRefused = errors.New("bulk snapshot connection refused: unknown or expired token")

// errBulkWithdrawn refuses a connection presenting the token of an offer
// withdrawn before it came: the FetchSnapshot call that made it ended
// first (the task could not be captured, e.g. a DCAA replica holding
// tentative results; the caller then retries or starts otherwise). The
// fetching worker was told so on the call: nothing to warn about.
var errBulkWithdrawn = fmt.Errorf("%w: the offer was withdrawn (its snapshot call ended first)", ErrBulkRefused)

// bulkTokenBytes is the size of a transfer token: random, so unguessable.
const bulkTokenBytes = 16

// bulkHandshakeTimeout bounds a connection's TLS handshake and token,
// bulkAcceptTimeout how long an offer waits for its connection, and
// defaultBulkDialTimeout is BulkOptions.DialTimeout's default.
const (
	bulkHandshakeTimeout   = 10 * time.Second
	bulkAcceptTimeout      = 10 * time.Second
	defaultBulkDialTimeout = 5 * time.Second
	// withdrawnFor is how long a withdrawn offer's token is remembered:
	// a connection dialed before the withdrawal arrives within the
	// dial and handshake timeouts.
	withdrawnFor = defaultBulkDialTimeout + bulkHandshakeTimeout
)

// bulkServer accepts bulk connections and hands each to the FetchSnapshot
// call whose token it presents.
type bulkServer struct {
	lis  net.Listener
	cfg  *tls.Config
	port uint32
	log  interface {
		Warn(msg string, args ...any)
		Debug(msg string, args ...any)
	}

	mu      sync.Mutex
	pending map[string]chan net.Conn
	// withdrawn holds the tokens of offers withdrawn within the last
	// withdrawnFor, and when: a connection presenting one is refused as
	// any other, but is no stranger (see errBulkWithdrawn).
	withdrawn map[string]time.Time
	// shaking are the connections between accept and their token, which
	// close closes so that it need not wait for their deadline.
	shaking map[net.Conn]bool
	closed  bool
	wg      sync.WaitGroup
}

// newBulkServer starts accepting on lis (nil: no server).
func newBulkServer(lis net.Listener, cfg *tls.Config, log interface {
	Warn(string, ...any)
	Debug(string, ...any)
}) (*bulkServer, error) {
	if lis == nil {
		return nil, nil
	}
	_, p, err := net.SplitHostPort(lis.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("bulk listener address %s: %w", lis.Addr(), err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("bulk listener address %s: no port", lis.Addr())
	}
	b := &bulkServer{lis: lis, cfg: cfg, port: uint32(port), log: log, pending: map[string]chan net.Conn{}, withdrawn: map[string]time.Time{}, shaking: map[net.Conn]bool{}}
	b.wg.Add(1)
	go b.accept()
	return b, nil
}

// accept runs until the listener is closed.
func (b *bulkServer) accept() {
	defer b.wg.Done()
	for {
		c, err := b.lis.Accept()
		if err != nil {
			b.mu.Lock()
			closed := b.closed
			b.mu.Unlock()
			if !closed {
				b.log.Warn("bulk snapshot listener stopped", "err", err)
			}
			return
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			_ = c.Close()
			return
		}
		b.shaking[c] = true
		b.wg.Add(1)
		b.mu.Unlock()
		go func() {
			defer b.wg.Done()
			err := b.handshake(c)
			b.mu.Lock()
			delete(b.shaking, c)
			closed := b.closed
			b.mu.Unlock()
			if err != nil {
				_ = c.Close()
			}
			switch {
			case err == nil || closed:
			case errors.Is(err, errBulkWithdrawn):
				b.log.Debug("bulk snapshot connection refused", "remote", c.RemoteAddr().String(), "err", err)
			default:
				b.log.Warn("bulk snapshot connection refused", "remote", c.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

// handshake authenticates c (TLS), reads its token and hands it to the
// offer that issued the token.
func (b *bulkServer) handshake(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(bulkHandshakeTimeout)); err != nil {
		return err
	}
	conn := c
	if b.cfg != nil {
		conn = tlsutil.Server(c, b.cfg)
	}
	token := make([]byte, bulkTokenBytes)
	if _, err := io.ReadFull(conn, token); err != nil {
		return fmt.Errorf("%w: %w", ErrBulkRefused, err)
	}
	b.mu.Lock()
	ch, ok := b.pending[string(token)]
	delete(b.pending, string(token))
	_, withdrawn := b.withdrawn[string(token)]
	delete(b.withdrawn, string(token))
	b.mu.Unlock()
	if !ok {
		if withdrawn {
			return errBulkWithdrawn
		}
		return ErrBulkRefused
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return err
	}
	ch <- conn // buffered: never blocks
	return nil
}

// offer registers a new token; the connection presenting it arrives on
// the channel. cancel withdraws the offer.
func (b *bulkServer) offer() (token []byte, conns <-chan net.Conn, cancel func(), err error) {
	token = make([]byte, bulkTokenBytes)
	if _, err := rand.Read(token); err != nil {
		return nil, nil, nil, err
	}
	ch := make(chan net.Conn, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, nil, errors.New("bulk snapshot listener closed")
	}
	b.pending[string(token)] = ch
	return token, ch, func() {
		b.mu.Lock()
		if _, open := b.pending[string(token)]; open {
			// Not taken: its connection may still come.
			now := time.Now()
			for k, at := range b.withdrawn {
				if now.Sub(at) > withdrawnFor {
					delete(b.withdrawn, k)
				}
			}
			b.withdrawn[string(token)] = now
		}
		delete(b.pending, string(token))
		b.mu.Unlock()
		select {
		case c := <-ch: // arrived after all: nobody will use it
			_ = c.Close()
		default:
		}
	}, nil
}

// close stops accepting and waits for the connections being accepted.
func (b *bulkServer) close() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.closed = true
	for c := range b.shaking {
		_ = c.Close()
	}
	b.mu.Unlock()
	_ = b.lis.Close()
	b.wg.Wait()
}

// serveBulk waits for the connection of an offer and writes the parts
// (emitted by write) to it, or gives up when ctx ends or nobody came
// within bulkAcceptTimeout.
func serveBulk(ctx context.Context, conns <-chan net.Conn, write func(emit func([]byte) error) error) (firstSent time.Time, _ error) {
	var conn net.Conn
	select {
	case conn = <-conns:
	case <-ctx.Done():
		return firstSent, ctx.Err()
	case <-time.After(bulkAcceptTimeout):
		return firstSent, errors.New("the fetching worker did not connect for the snapshot's bytes")
	}
	defer conn.Close()
	// A call that ends (the caller gave up) unblocks a write.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	if err := write(func(p []byte) error {
		for len(p) > 0 {
			n := min(len(p), bulkWriteBytes)
			if firstSent.IsZero() {
				firstSent = time.Now()
			}
			if _, err := conn.Write(p[:n]); err != nil {
				return err
			}
			p = p[n:]
		}
		return nil
	}); err != nil {
		return firstSent, err
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		return firstSent, cw.CloseWrite()
	}
	return firstSent, nil
}

// ServeBulk makes the runtime serve snapshots over connections accepted
// on lis (see BulkOptions.Listener, ServerTLS), from now until Close,
// which closes lis. It may be called once, and not after Close.
func (r *Runtime) ServeBulk(lis net.Listener, serverTLS *tls.Config) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.bulkSrv.Load() != nil {
		_ = lis.Close()
		return errors.New("runtime: bulk snapshot listener after Close, or twice")
	}
	b, err := newBulkServer(lis, serverTLS, r.log)
	if err != nil {
		_ = lis.Close()
		return err
	}
	r.bulkSrv.Store(b)
	return nil
}

// bulkWriteBytes bounds one write to a bulk connection. A halted
// snapshot is one part of its whole size: written at once over TLS, every
// record of it would be gathered into one buffer of that size (tlsutil
// sends the records of one write in one system call), encrypting
// everything before sending anything. Large enough that a write's fixed
// costs do not count.
const bulkWriteBytes = 512 << 10

// bulkClient fetches snapshots over offered connections.
type bulkClient struct {
	cfg         *tls.Config
	dial        func(ctx context.Context, addr string) (net.Conn, error)
	dialTimeout time.Duration
}

func newBulkClient(o BulkOptions) *bulkClient {
	if o.Disabled {
		return nil
	}
	dial := o.Dial
	if dial == nil {
		var d net.Dialer
		dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	timeout := o.DialTimeout
	if timeout <= 0 {
		timeout = defaultBulkDialTimeout
	}
	return &bulkClient{cfg: o.ClientTLS, dial: dial, dialTimeout: timeout}
}

// bulkReadBufferBytes is the read buffer beneath a fetching worker's TLS
// on a bulk connection (bufferedConn): a loopback socket often holds
// several hundred KiB when the reader comes back.
const bulkReadBufferBytes = 256 << 10

// bufferedConn is a connection whose reads come through a buffer.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// errBulkConnect means the offered connection could not be made; the
// fetch is then made again without asking for one.
var errBulkConnect = errors.New("cannot connect for the snapshot's bytes")

// bulkNotifyBytes is how far the bytes received may run ahead of what an
// Incoming was told has arrived: a few TLS records, so that a restore
// decoding them is woken per batch of records rather than per record.
const bulkNotifyBytes = 64 << 10

// connect connects to port on workerAddr's host and presents token. The
// connection is closed by the function returned, or when ctx ends.
func (c *bulkClient) connect(ctx context.Context, workerAddr string, port uint32, token []byte) (net.Conn, func(), error) {
	host, _, err := net.SplitHostPort(workerAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: worker address %q: %w", errBulkConnect, workerAddr, err)
	}
	addr := net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
	// A port that a firewall drops silently must not hold the fetch for
	// its whole deadline: the stream is the fallback.
	dctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	raw, err := c.dial(dctx, addr)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %w", errBulkConnect, addr, err)
	}
	conn := raw
	if c.cfg != nil {
		// crypto/tls reads the connection about one record (16 KiB) at a
		// time: unbuffered, a snapshot of 64 MiB costs some 4,000 read
		// system calls on the fetching worker (in one process, 64 MiB of
		// bench move's state over mutual TLS: about 34 ms of read calls
		// per transfer, 9 ms buffered). Buffered, one call takes what
		// the socket holds, up to bulkReadBufferBytes, for one more copy
		// of the bytes.
		tc := tlsutil.Client(&bufferedConn{Conn: raw, r: bufio.NewReaderSize(raw, bulkReadBufferBytes)}, c.cfg)
		hctx, cancel := context.WithTimeout(ctx, bulkHandshakeTimeout)
		err := tc.(interface {
			HandshakeContext(context.Context) error
		}).HandshakeContext(hctx)
		cancel()
		if err != nil {
			_ = raw.Close()
			return nil, nil, fmt.Errorf("%w: %s: TLS: %w", errBulkConnect, addr, err)
		}
		conn = tc
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	closeConn := func() {
		stop()
		_ = conn.Close()
	}
	if _, err := conn.Write(token); err != nil {
		closeConn()
		return nil, nil, fmt.Errorf("%w: %s: %w", errBulkConnect, addr, err)
	}
	return conn, closeConn, nil
}

// readSize reads the size an inline offer sends first (8 bytes,
// big-endian, at most MaxFetchedSnapshotBytes).
func readSize(ctx context.Context, conn io.Reader) (int, error) {
	var size [8]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, fmt.Errorf("%w: the size over the bulk connection: %w", ErrSnapshotTransfer, err)
	}
	n := binary.BigEndian.Uint64(size[:])
	if n == 0 || n > MaxFetchedSnapshotBytes {
		return 0, fmt.Errorf("%w: announced size %d", ErrSnapshotTransfer, n)
	}
	return int(n), nil
}

// receive connects to port on workerAddr's host, presents token and reads
// exactly len(dst) bytes into dst; with dst nil (an inline offer), first
// their size (8 bytes, big-endian, at most MaxFetchedSnapshotBytes) and
// then the bytes into a buffer of that size. It returns the buffer.
// started, when not nil, is called with the buffer before the first byte
// of it is read, and returns an Incoming over it to tell as the bytes
// arrive (or nil); fo (when not nil) learns when the first and last came.
func (c *bulkClient) receive(ctx context.Context, workerAddr string, port uint32, token, dst []byte, started func([]byte) *operator.Incoming, fo *fetchOpts) ([]byte, error) {
	conn, closeConn, err := c.connect(ctx, workerAddr, port, token)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	if dst == nil {
		n, err := readSize(ctx, conn)
		if err != nil {
			return nil, err
		}
		dst = make([]byte, n)
	}
	var in *operator.Incoming
	if started != nil {
		in = started(dst)
	}
	got, told := 0, 0
	for got < len(dst) {
		n, err := conn.Read(dst[got:])
		if n > 0 && got == 0 && fo != nil {
			fo.firstByte = time.Now()
		}
		got += n
		if in != nil && (got-told >= bulkNotifyBytes || got == len(dst)) {
			in.Arrived(got)
			told = got
		}
		if got == len(dst) {
			break
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if ctx.Err() != nil {
				err = ctx.Err()
			} else {
				err = fmt.Errorf("%w: %d of %d bytes over the bulk connection: %w", ErrSnapshotTransfer, got, len(dst), err)
			}
			if in != nil {
				in.Fail(err)
			}
			return nil, err
		}
	}
	if fo != nil {
		fo.lastByte = time.Now()
	}
	return dst, nil
}
