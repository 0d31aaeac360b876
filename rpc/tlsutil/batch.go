package tlsutil

import (
	"context"
	"crypto/tls"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// A tls.Conn writes every TLS record (at most 16 KiB) to the network
// connection beneath it with its own write call, so one large Write (gRPC
// flushes up to 256 KiB of frames at once) costs a system call per record,
// where plaintext costs one: on the data-plane benchmark the sender spent a
// fifth of its CPU in those calls. The types below hand the records of one
// Write to the network in a single call.

// recordBatcher is the network connection beneath a tls.Conn. Between
// begin and end it collects what the tls.Conn writes and end sends it at
// once; otherwise it writes through. Writes are serialised by mu, so
// records written meanwhile by the reading side (alerts, key updates) keep
// their order.
type recordBatcher struct {
	net.Conn
	mu    sync.Mutex
	depth int
	buf   []byte
}

func (b *recordBatcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.depth > 0 {
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	return b.Conn.Write(p)
}

func (b *recordBatcher) begin() {
	b.mu.Lock()
	b.depth++
	b.mu.Unlock()
}

func (b *recordBatcher) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.depth--
	if b.depth > 0 || len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	if cap(b.buf) > 1<<20 {
		b.buf = nil // do not keep an exceptional buffer for the connection's life
	} else {
		b.buf = b.buf[:0]
	}
	return err
}

// batchedConn is a tls.Conn whose Writes reach the network in one call.
type batchedConn struct {
	*tls.Conn
	raw *recordBatcher
}

func (c *batchedConn) Write(p []byte) (int, error) {
	// The handshake must not be batched: its messages wait for answers.
	// (A no-op once done.)
	if err := c.Conn.Handshake(); err != nil {
		return 0, err
	}
	c.raw.begin()
	n, err := c.Conn.Write(p)
	if ferr := c.raw.end(); err == nil && ferr != nil {
		return 0, ferr
	}
	return n, err
}

// Client is tls.Client whose Writes each reach raw in one call.
func Client(raw net.Conn, cfg *tls.Config) net.Conn {
	rb := &recordBatcher{Conn: raw}
	return &batchedConn{Conn: tls.Client(rb, cfg), raw: rb}
}

// Server is tls.Server whose Writes each reach raw in one call.
func Server(raw net.Conn, cfg *tls.Config) net.Conn {
	rb := &recordBatcher{Conn: raw}
	return &batchedConn{Conn: tls.Server(rb, cfg), raw: rb}
}

// batchingCreds are gRPC's TLS credentials with batched record writes.
type batchingCreds struct {
	credentials.TransportCredentials
}

func newCreds(cfg *tls.Config) credentials.TransportCredentials {
	return batchingCreds{credentials.NewTLS(cfg)}
}

func (b batchingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	rb := &recordBatcher{Conn: raw}
	conn, info, err := b.TransportCredentials.ClientHandshake(ctx, authority, rb)
	return wrapConn(conn, rb), info, err
}

func (b batchingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	rb := &recordBatcher{Conn: raw}
	conn, info, err := b.TransportCredentials.ServerHandshake(rb)
	return wrapConn(conn, rb), info, err
}

func (b batchingCreds) Clone() credentials.TransportCredentials {
	return batchingCreds{b.TransportCredentials.Clone()}
}

// wrapConn batches the writes of conn when it is the tls.Conn over rb
// (anything else is returned as it is).
func wrapConn(conn net.Conn, rb *recordBatcher) net.Conn {
	if tc, ok := conn.(*tls.Conn); ok {
		return &batchedConn{Conn: tc, raw: rb}
	}
	return conn
}
