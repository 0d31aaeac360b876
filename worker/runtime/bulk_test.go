package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestFetchSnapshotBulk: a worker that offers fast snapshot transfer sends
// a snapshot over a connection of its own, and it arrives equal to the
// snapshot taken locally; a fetcher that cannot make that connection (it
// is refused, or never answers) gets it over the stream instead, and so
// does one that does not ask.
func TestFetchSnapshotBulk(t *testing.T) {
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterOpts(t, 1, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: time.Millisecond})
	defer c.close(t)
	c.apply()
	c.tail(t, "wc/out/p0/r0") // the whole input processed: the state no longer changes
	w := c.workers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	local, err := w.rt.SnapshotTask(ctx, "wc/counts/p0/r0", SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := local.MarshalBinary()
	conn, err := c.pool.Conn(w.addr)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	req := &fedstreampb.FetchSnapshotRequest{Query: "wc", TaskId: "wc/counts/p0/r0", Generation: 1}
	for _, tc := range []struct {
		name     string
		bulk     BulkOptions
		wantBulk uint64 // snapshots served in bulk after the fetch
	}{
		{"bulk", BulkOptions{}, 1},
		{"bulk connection refused", BulkOptions{Dial: func(context.Context, string) (net.Conn, error) {
			return nil, errors.New("no route")
		}}, 1},
		{"bulk connection never answers", BulkOptions{DialTimeout: 50 * time.Millisecond, Dial: func(ctx context.Context, _ string) (net.Conn, error) {
			<-ctx.Done() // a port a firewall drops silently
			return nil, ctx.Err()
		}}, 1},
		{"not asked", BulkOptions{Disabled: true}, 1},
	} {
		fetcher := New(Options{Logger: log, Pool: c.pool, Bulk: tc.bulk})
		got, err := fetcher.fetchSnapshot(ctx, conn, w.addr, req, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		enc, _ := got.MarshalBinary()
		if !bytes.Equal(enc, want) {
			t.Fatalf("%s: fetched snapshot (%d bytes) differs from the local one (%d bytes)", tc.name, len(enc), len(want))
		}
		if n := w.rt.SnapshotsServedBulk(); n != tc.wantBulk {
			t.Fatalf("%s: %d snapshots served in bulk, want %d", tc.name, n, tc.wantBulk)
		}
		if err := fetcher.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.rt.SnapshotsServed(); n != 4 {
		t.Fatalf("SnapshotsServed = %d, want 4", n)
	}
	// The offer of a bulk connection goes out before the snapshot is
	// taken (the size follows on the connection): a refusal after it (a
	// halted task cannot be snapshotted again live) reaches the fetcher as
	// the serving worker's answer, not as a broken transfer to retry.
	fetcher := New(Options{Logger: log, Pool: c.pool})
	defer fetcher.Close(ctx)
	halt := proto.CloneOf(req)
	halt.Halt = true
	if _, err := fetcher.fetchSnapshot(ctx, conn, w.addr, halt, nil); err != nil {
		t.Fatal(err)
	}
	_, err = fetcher.fetchSnapshot(ctx, conn, w.addr, req, nil)
	if status.Code(err) != codes.FailedPrecondition || retryableFetch(err) {
		t.Fatalf("live snapshot of a halted task: %v, want FailedPrecondition (not retryable)", err)
	}
}

// TestBulkTokens: a bulk connection is handed to the offer whose token it
// presents, once; an unknown token, a token used twice and a withdrawn
// offer are refused (the connection is closed without a byte).
func TestBulkTokens(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	b, err := newBulkServer(lis, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	present := func(token []byte) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(token); err != nil {
			t.Fatal(err)
		}
		return c
	}
	refused := func(what string, c net.Conn) {
		t.Helper()
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || n != 0 {
			t.Fatalf("%s: connection not refused (read %d, %v)", what, n, err)
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s: connection left open", what)
		}
	}
	token, conns, cancel, err := b.offer()
	if err != nil {
		t.Fatal(err)
	}
	unknown := make([]byte, bulkTokenBytes)
	_, _ = rand.Read(unknown)
	refused("unknown token", present(unknown))
	c := present(token)
	defer c.Close()
	select {
	case got := <-conns:
		defer got.Close()
		if _, err := got.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'x' {
			t.Fatalf("the handed-over connection does not reach the client: %q %v", buf, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the connection presenting the token was not handed over")
	}
	refused("token used twice", present(token))
	cancel()
	token2, _, cancel2, err := b.offer()
	if err != nil {
		t.Fatal(err)
	}
	cancel2()
	refused("withdrawn offer", present(token2))
}

// TestBulkTLS: over TLS, a bulk connection needs a worker certificate of
// the org, as FetchSnapshot does; a client's certificate is refused.
func TestBulkTLS(t *testing.T) {
	ca, err := tlsutil.NewCA("org")
	if err != nil {
		t.Fatal(err)
	}
	creds := func(role, name string) *tlsutil.Credentials {
		cert, key, err := ca.Issue(rpc.Identity{Org: "org", Role: role, Name: name}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tlsutil.New(ca.CertPEM)
		if err == nil {
			err = c.SetCertificate(cert, key)
		}
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	workers := tlsutil.Peer{Roles: []string{rpc.RoleWorker}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	b, err := newBulkServer(lis, creds(rpc.RoleWorker, "server").ServerConfig(workers, false), log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	for _, tc := range []struct {
		role string
		ok   bool
	}{{rpc.RoleWorker, true}, {rpc.RoleClient, false}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		token, conns, withdraw, err := b.offer()
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() {
			_, err := serveBulk(ctx, conns, func(emit func([]byte) error) error {
				if err := emit(data[:1<<20]); err != nil {
					return err
				}
				return emit(data[1<<20:])
			})
			served <- err
		}()
		cli := newBulkClient(BulkOptions{ClientTLS: creds(tc.role, "fetcher").ClientConfig(workers)})
		dst := make([]byte, len(data))
		dst, err = cli.receive(ctx, "127.0.0.1:1", b.port, token, dst, nil, nil)
		if tc.ok && (err != nil || !bytes.Equal(dst, data)) {
			t.Fatalf("worker certificate: %v (equal %v)", err, bytes.Equal(dst, data))
		}
		if !tc.ok && err == nil {
			t.Fatalf("%s certificate: the snapshot's bytes were received", tc.role)
		}
		cancel()
		if err := <-served; tc.ok && err != nil {
			t.Fatalf("serve: %v", err)
		}
		withdraw()
	}
}

// readSizes is a connection that records the size of every read asked
// of it.
type readSizes struct {
	net.Conn
	mu    sync.Mutex
	sizes []int
}

func (r *readSizes) Read(p []byte) (int, error) {
	r.mu.Lock()
	r.sizes = append(r.sizes, len(p))
	r.mu.Unlock()
	return r.Conn.Read(p)
}

// TestBulkTLSReadsBuffered: over TLS, the fetching worker reads its
// bulk connection through a buffer of bulkReadBufferBytes, not one TLS
// record (16 KiB) per read call. Fails without bufferedConn: crypto/tls
// asks for about one record at a time.
func TestBulkTLSReadsBuffered(t *testing.T) {
	ca, err := tlsutil.NewCA("org")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue(rpc.Identity{Org: "org", Role: rpc.RoleWorker, Name: "w"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := tlsutil.New(ca.CertPEM)
	if err == nil {
		err = creds.SetCertificate(cert, key)
	}
	if err != nil {
		t.Fatal(err)
	}
	workers := tlsutil.Peer{Roles: []string{rpc.RoleWorker}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	b, err := newBulkServer(lis, creds.ServerConfig(workers, false), log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	data := make([]byte, 2<<20)
	_, _ = rand.Read(data)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token, conns, withdraw, err := b.offer()
	if err != nil {
		t.Fatal(err)
	}
	defer withdraw()
	served := make(chan error, 1)
	go func() {
		_, err := serveBulk(ctx, conns, func(emit func([]byte) error) error { return emit(data) })
		served <- err
	}()
	var raw *readSizes
	var d net.Dialer
	cli := newBulkClient(BulkOptions{ClientTLS: creds.ClientConfig(workers), Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		raw = &readSizes{Conn: c}
		return raw, nil
	}})
	got, err := cli.receive(ctx, "127.0.0.1:1", b.port, token, make([]byte, len(data)), nil, nil)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("receive: %v (equal %v)", err, bytes.Equal(got, data))
	}
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	raw.mu.Lock()
	defer raw.mu.Unlock()
	for _, n := range raw.sizes {
		if n < bulkReadBufferBytes {
			t.Fatalf("a read of the connection asked for %d bytes, want %d (reads asked: %v)", n, bulkReadBufferBytes, raw.sizes)
		}
	}
}

// writeSizes is a connection that records the size of every write.
type writeSizes struct {
	net.Conn
	sizes []int
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return len(p), nil
}
func (w *writeSizes) Close() error { return nil }

// TestServeBulkWritesInPieces: a part of many MB (a halted snapshot's
// whole state) reaches the connection in writes of at most bulkWriteBytes,
// so that over TLS it is not encrypted into one buffer of its size before
// anything is sent.
func TestServeBulkWritesInPieces(t *testing.T) {
	conn := &writeSizes{}
	conns := make(chan net.Conn, 1)
	conns <- conn
	part := make([]byte, 5*bulkWriteBytes+7)
	if _, err := serveBulk(context.Background(), conns, func(emit func([]byte) error) error { return emit(part) }); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range conn.sizes {
		if n > bulkWriteBytes {
			t.Fatalf("a write of %d bytes, want at most %d", n, bulkWriteBytes)
		}
		total += n
	}
	if total != len(part) {
		t.Fatalf("%d bytes written, want %d", total, len(part))
	}
}

// TestBulkCloseDoesNotWaitForSilentConnections: a connection that never
// presents its token does not hold the runtime's Close for the handshake
// deadline (bulkHandshakeTimeout): close closes it.
func TestBulkCloseDoesNotWaitForSilentConnections(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	b, err := newBulkServer(lis, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Wait until the server holds the connection.
	deadline := time.Now().Add(30 * time.Second)
	for {
		b.mu.Lock()
		n := len(b.shaking)
		b.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection was never accepted")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { b.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(bulkHandshakeTimeout / 2):
		t.Fatalf("close waited for a silent connection's handshake deadline (%s)", bulkHandshakeTimeout)
	}
}

// recordingHandler keeps the level and text of every record logged.
type recordingHandler struct {
	mu   sync.Mutex
	recs []string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	s := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
	h.mu.Lock()
	h.recs = append(h.recs, s)
	h.mu.Unlock()
	return nil
}

func (h *recordingHandler) find(level, text string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.ContainsFunc(h.recs, func(s string) bool {
		return strings.HasPrefix(s, level+" ") && strings.Contains(s, text)
	})
}

// TestBulkWithdrawnOfferIsNoStranger: a connection that presents the
// token of an offer withdrawn before it came (its FetchSnapshot call
// ended first: the task could not be captured) is refused like any
// other, but logged at debug level, not warned about as an unknown
// token; an unknown token still is. Before, every fetch refused during a
// re-placement left a warning that read like a forged connection.
func TestBulkWithdrawnOfferIsNoStranger(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingHandler{}
	b, err := newBulkServer(lis, nil, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	present := func(token []byte) {
		t.Helper()
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(token); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || n != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection not refused (read %d, %v)", n, err)
		}
	}
	token, _, cancel, err := b.offer()
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	present(token)
	waitUntil(t, "the withdrawn offer's connection logged", func() bool { return rec.find("DEBUG", "withdrawn") })
	unknown := make([]byte, bulkTokenBytes)
	_, _ = rand.Read(unknown)
	present(unknown)
	waitUntil(t, "the unknown token warned about", func() bool { return rec.find("WARN", "unknown or expired token") })
	if rec.find("WARN", "withdrawn") {
		t.Fatalf("the withdrawn offer's connection was warned about: %q", rec.recs)
	}
	// The token is forgotten once used: presented again, it is unknown.
	b.mu.Lock()
	_, kept := b.withdrawn[string(token)]
	b.mu.Unlock()
	if kept {
		t.Fatal("the withdrawn token is still remembered after its connection came")
	}
}
