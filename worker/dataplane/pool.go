package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
)

// Transport tuning for throughput: large HTTP/2 windows so a subscription
// is not limited to the 64 KiB default window per round trip, and large
// socket buffers.
const (
	streamWindow   = 1 << 20
	connWindow     = 4 << 20
	socketBuffer   = 256 << 10
	maxMessageSize = 16 << 20
)

// MaxMessageBytes is the largest gRPC message a worker's data-plane server
// receives or sends (grpc.MaxRecvMsgSize / MaxSendMsgSize). It is fixed at
// build time; clients such as `fedstream ingest` keep their messages
// under it.
const MaxMessageBytes = maxMessageSize

// ErrPoolClosed is returned by a closed Pool.
var ErrPoolClosed = errors.New("dataplane: connection pool closed")

// ServerOptions are the grpc.Server options a worker's data-plane server
// should use. They install the data plane's codec (the standard protobuf
// encoding, without copying batches; see batchCodec) and a buffer pool that
// does not zero reused buffers.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(newBatchCodec()),
		experimental.BufferPool(sharedDirtyPool),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.ReadBufferSize(socketBuffer),
		grpc.WriteBufferSize(socketBuffer),
		grpc.MaxRecvMsgSize(maxMessageSize),
		grpc.MaxSendMsgSize(maxMessageSize),
	}
}

// Reconnect backoff of data-plane connections. gRPC's default starts at
// 1 s and grows to 120 s: a link that returns after a cut would carry
// nothing for up to that long, holding back the tuples and markers behind
// it (a reconfiguration plan waits for them). A connection to a peer
// that does not answer is retried at most every reconnectMaxDelay; each
// retry is one dial per peer address (not per subscription), bounded by
// the connect timeout when the peer's packets are dropped.
const (
	reconnectBaseDelay  = 5 * time.Millisecond
	reconnectMaxDelay   = 20 * time.Millisecond
	reconnectMinTimeout = 20 * time.Second
)

// DialOptions are the client options for data-plane connections
// (plaintext; callers append credentials when TLS is configured).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: reconnectMinTimeout,
			Backoff: backoff.Config{BaseDelay: reconnectBaseDelay, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay}}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		experimental.WithBufferPool(sharedDirtyPool),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithReadBufferSize(socketBuffer),
		grpc.WithWriteBufferSize(socketBuffer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageSize), grpc.MaxCallSendMsgSize(maxMessageSize),
			grpc.ForceCodecV2(newBatchCodec())),
	}
}

// Over TLS, gRPC's 256 KiB read buffer only copies what the tls.Conn
// beneath it has already buffered: a tls.Conn reads whole records from
// the socket and hands out their plaintext from its own buffer, so every
// received byte was copied once more (bufio.Reader.Read was about 6 % of
// the receiving worker's CPU in the TLS data-plane benchmark). With a
// buffer of tlsReadBuffer bytes, reads of a frame's payload longer than
// it go straight from the decrypted record into the frame (bufio reads
// directly into a request at least as large as its buffer once it is
// empty): at most a couple of KiB of each 16 KiB frame pass through the
// buffer. Frame headers and small frames are still served from it, so a
// stream of small messages does not pay a tls.Conn.Read (a lock and a
// handshake check) for each header and payload. In plaintext the large
// buffer stays: there it is what saves a system call per frame.
const tlsReadBuffer = 1 << 10

// TLSServerOptions are appended to ServerOptions (after the transport
// credentials) when the server's connections use TLS.
func TLSServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ReadBufferSize(tlsReadBuffer)}
}

// TLSDialOptions are appended to DialOptions (after the transport
// credentials) when the connections use TLS.
func TLSDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithReadBufferSize(tlsReadBuffer)}
}

// Pool shares one client connection per remote worker address among all
// subscriptions to that worker.
type Pool struct {
	opts   []grpc.DialOption
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

// NewPool returns an empty pool dialing with DialOptions() followed by
// extra (later options override earlier ones).
func NewPool(extra ...grpc.DialOption) *Pool {
	return &Pool{opts: append(DialOptions(), extra...), conns: make(map[string]*grpc.ClientConn)}
}

// Conn returns the connection to addr, creating it on first use. The
// connection is owned by the pool: callers must not close it.
func (p *Pool) Conn(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrPoolClosed
	}
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, p.opts...)
	if err != nil {
		return nil, fmt.Errorf("dataplane: connect to %s: %w", addr, err)
	}
	p.conns[addr] = c
	return c, nil
}

// Close closes every connection; later Conn calls fail with ErrPoolClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var errs []error
	for addr, c := range p.conns {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close connection to %s: %w", addr, err))
		}
		delete(p.conns, addr)
	}
	return errors.Join(errs...)
}

// WaitReady waits until conn becomes ready after not being ready, or
// until d has passed or ctx ends: a failed subscription retries as soon
// as its peer is reachable again instead of sleeping its whole backoff.
// A connection already ready (the failure was not the link's) waits d.
func WaitReady(ctx context.Context, conn *grpc.ClientConn, d time.Duration) {
	WaitReadySince(ctx, conn, d, time.Time{})
}

// Early in an outage (within fastRedialFor of down, when the waiter's
// peer was first found unreachable) WaitReady has a connection in its
// reconnect backoff retry every fastRedialEvery: a link that returns is
// then found within that rather than within reconnectMaxDelay (the
// bench reconfig reconnect waited 0-24 ms for the next dial, about half
// its time, and most of its spread). Later the backoff's cadence stands:
// a failed attempt costs the dialing process about a millisecond of CPU,
// which a peer that stays away should not cost at this rate.
const (
	fastRedialFor   = 2 * time.Second
	fastRedialEvery = 2 * time.Millisecond
)

// WaitReadySince is WaitReady for a waiter whose peer has been
// unreachable since down (zero: unknown, no faster redial).
func WaitReadySince(ctx context.Context, conn *grpc.ClientConn, d time.Duration, down time.Time) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	st := conn.GetState()
	if st == connectivity.Ready {
		<-wctx.Done()
		return
	}
	conn.Connect() // an idle connection dials only when asked
	for {
		step, stepCancel := wctx, context.CancelFunc(func() {})
		fast := !down.IsZero() && time.Since(down) < fastRedialFor
		if fast {
			step, stepCancel = context.WithTimeout(wctx, fastRedialEvery)
		}
		changed := conn.WaitForStateChange(step, st)
		stepCancel()
		if wctx.Err() != nil {
			return
		}
		if !changed {
			if st == connectivity.TransientFailure {
				conn.ResetConnectBackoff() // dial now, not at the backoff's end
			}
			continue
		}
		if st = conn.GetState(); st == connectivity.Ready {
			return
		}
	}
}
