package worker

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/authz"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Secrets of the fake org.
const (
	joinSecret   = "join-secret-for-tests"
	readerSecret = "reader-secret-for-tests"
	writerSecret = "writer-secret-for-tests"
	adminSecret  = "admin-secret-for-tests"
)

// fakeOrg answers AuthorizeToken like the coordinators, and can revoke.
type fakeOrg struct {
	mu    sync.Mutex
	roles map[string]authz.Role // hash -> role
	asked atomic.Int32
}

func newFakeOrg() *fakeOrg {
	return &fakeOrg{roles: map[string]authz.Role{
		fsm.HashSecret(readerSecret): authz.RoleReader,
		fsm.HashSecret(writerSecret): authz.RoleWriter,
		fsm.HashSecret(adminSecret):  authz.RoleAdmin,
	}}
}

func (o *fakeOrg) ask(_ context.Context, hash string) (authz.Role, time.Time, error) {
	o.asked.Add(1)
	o.mu.Lock()
	defer o.mu.Unlock()
	if r, ok := o.roles[hash]; ok {
		return r, time.Time{}, nil
	}
	return "", time.Time{}, status.Error(codes.PermissionDenied, "wrong token: it matches no token of this org (never created, or revoked)")
}

func (o *fakeOrg) revoke(secret string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.roles, fsm.HashSecret(secret))
}

// fakeStreams serves one result stream and one ingest source, and counts
// what reached them.
type fakeStreams struct {
	buf      *dataplane.OutputBuffer
	resolved atomic.Int32
	ingested atomic.Uint64
}

func (f *fakeStreams) ResolveStream(ref *pb.StreamRef) (*dataplane.OutputBuffer, error) {
	f.resolved.Add(1)
	if ref.TaskId != "q/sink/p0/r0" {
		return nil, dataplane.ErrUnknownStream
	}
	return f.buf, nil
}

func (f *fakeStreams) Ingest(_ context.Context, _, _ string, _ uint64, lines []byte) (uint64, []*pb.LineError, error) {
	n := uint64(bytes.Count(lines, []byte("\n")))
	f.ingested.Add(n)
	return n, nil, nil
}

type dpFixture struct {
	addr    string
	auth    *dataPlaneAuth
	org     *fakeOrg
	streams *fakeStreams
	logs    *syncBuffer
	// identity is what the injected PeerIdentity reports (nil: plaintext).
	identity atomic.Pointer[rpc.Identity]
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDataPlane serves a data plane guarded by dataPlaneAuth, as
// Worker.Run builds it, on 127.0.0.1.
func startDataPlane(t *testing.T, open bool) *dpFixture {
	t.Helper()
	f := &dpFixture{org: newFakeOrg(), logs: &syncBuffer{}}
	f.streams = &fakeStreams{buf: dataplane.NewOutputBuffer(dataplane.BufferOptions{Ring: true, MaxTuples: 100})}
	for id := uint64(1); id <= 3; id++ {
		if err := f.streams.buf.Append(context.Background(), &tuple.Tuple{Type: tuple.Stable, ID: id, STime: int64(id), Values: []tuple.Value{tuple.Str("r")}}); err != nil {
			t.Fatal(err)
		}
	}
	f.auth = &dataPlaneAuth{
		org: "acme", joinToken: joinSecret, open: open,
		tokens: newTokenCache(f.org.ask),
		peerIdentity: func(context.Context) (rpc.Identity, bool) {
			if id := f.identity.Load(); id != nil {
				return *id, true
			}
			return rpc.Identity{}, false
		},
		logger: slog.New(slog.NewTextHandler(f.logs, nil)),
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(dataplane.ServerOptions(),
		grpc.ChainUnaryInterceptor(f.auth.unary), grpc.ChainStreamInterceptor(f.auth.stream))...)
	pb.RegisterDataPlaneServer(srv, dataplane.NewServer(f.streams, f.streams, slog.New(slog.DiscardHandler)))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	f.addr = lis.Addr().String()
	return f
}

func (f *dpFixture) client(t *testing.T, token string) pb.DataPlaneClient {
	t.Helper()
	conn, err := rpc.Dial(f.addr, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewDataPlaneClient(conn)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// subscribe opens a subscription and returns the error of the first
// receive (nil when a batch arrived).
func subscribe(t *testing.T, c pb.DataPlaneClient, noAck bool, subscriber string) error {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	s, err := c.Subscribe(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(&pb.SubscribeRequest{Stream: &pb.StreamRef{Query: "q", TaskId: "q/sink/p0/r0"}, Subscriber: subscriber, NoAck: noAck}); err != nil && err != io.EOF {
		return err
	}
	b, err := s.Recv()
	if err != nil {
		return err
	}
	if b.Count == 0 {
		t.Fatalf("empty batch")
	}
	return nil
}

func ingestLines(t *testing.T, c pb.DataPlaneClient) error {
	t.Helper()
	s, err := c.Ingest(testCtx(t))
	if err != nil {
		return err
	}
	if err := s.Send(&pb.IngestRequest{Query: "q", Source: "in", Lines: []byte("{}\n{}\n"), FirstLine: 1}); err != nil && err != io.EOF {
		return err
	}
	_, err = s.CloseAndRecv()
	return err
}

func wantRefused(t *testing.T, err error, code codes.Code, says ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want %s", err, code)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

func TestDataPlaneAuth(t *testing.T) {
	f := startDataPlane(t, false)
	tail := func(token string) error { return subscribe(t, f.client(t, token), true, "tail-1") }
	ack := func(token, as string) error { return subscribe(t, f.client(t, token), false, as) }

	t.Run("no token cannot tail", func(t *testing.T) {
		wantRefused(t, tail(""), codes.Unauthenticated, "missing token", "role reader", "--token-file", "FEDSTREAM_TOKEN")
	})
	t.Run("no token cannot ingest", func(t *testing.T) {
		wantRefused(t, ingestLines(t, f.client(t, "")), codes.Unauthenticated, "missing token", "role writer")
	})
	t.Run("wrong token cannot tail", func(t *testing.T) {
		wantRefused(t, tail("guessed-secret"), codes.PermissionDenied, "wrong token", "role reader")
	})
	t.Run("reader can tail", func(t *testing.T) {
		if err := tail(readerSecret); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("reader cannot ingest", func(t *testing.T) {
		wantRefused(t, ingestLines(t, f.client(t, readerSecret)), codes.PermissionDenied, "role is reader", "role writer")
	})
	t.Run("writer can ingest", func(t *testing.T) {
		before := f.streams.ingested.Load()
		if err := ingestLines(t, f.client(t, writerSecret)); err != nil {
			t.Fatal(err)
		}
		if got := f.streams.ingested.Load() - before; got != 2 {
			t.Fatalf("ingested %d lines, want 2", got)
		}
	})
	t.Run("client tokens cannot ack under a task's name", func(t *testing.T) {
		resolved := f.streams.resolved.Load()
		for _, tok := range []string{readerSecret, writerSecret, adminSecret} {
			wantRefused(t, ack(tok, "q/down/p0/r0"), codes.PermissionDenied, "org's workers only")
		}
		wantRefused(t, ack("", "q/down/p0/r0"), codes.Unauthenticated, "acknowledging subscription")
		if f.streams.resolved.Load() != resolved {
			t.Fatal("a refused subscription reached the data plane")
		}
	})
	t.Run("join token acks over plaintext", func(t *testing.T) {
		if err := ack(joinSecret, "q/down/p0/r0"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("worker certificate of the org acks", func(t *testing.T) {
		f.identity.Store(&rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: "w-2"})
		defer f.identity.Store(nil)
		if err := ack("", "q/down/p0/r0"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("another org's worker certificate cannot ack", func(t *testing.T) {
		f.identity.Store(&rpc.Identity{Org: "evil", Role: rpc.RoleWorker, Name: "w-2"})
		defer f.identity.Store(nil)
		wantRefused(t, ack("", "q/down/p0/r0"), codes.Unauthenticated)
	})
	t.Run("over TLS the join token does not make a worker", func(t *testing.T) {
		f.identity.Store(&rpc.Identity{Org: "acme", Role: rpc.RoleClient, Name: "ops"})
		defer f.identity.Store(nil)
		wantRefused(t, ack(joinSecret, "q/down/p0/r0"), codes.PermissionDenied, "certificate")
		// A client certificate with a reader token still tails.
		if err := tail(readerSecret); err != nil {
			t.Fatal(err)
		}
	})
	fetch := func(token string) error {
		stream, err := f.client(t, token).FetchSnapshot(context.Background(), &pb.FetchSnapshotRequest{Query: "q", TaskId: "q/up/p0/r0"})
		if err == nil {
			_, err = stream.Recv()
		}
		return err
	}
	t.Run("only the org's workers fetch task snapshots", func(t *testing.T) {
		for _, tok := range []string{readerSecret, writerSecret, adminSecret} {
			wantRefused(t, fetch(tok), codes.PermissionDenied, "fetching a task's snapshot")
		}
		wantRefused(t, fetch(""), codes.Unauthenticated)
		f.identity.Store(&rpc.Identity{Org: "evil", Role: rpc.RoleWorker, Name: "w-2"})
		wantRefused(t, fetch(""), codes.Unauthenticated)
		f.identity.Store(&rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: "w-2"})
		defer f.identity.Store(nil)
		// Past the authorisation, the fake data plane takes no snapshots.
		if err := fetch(""); status.Code(err) != codes.Unimplemented {
			t.Fatalf("a worker of the org: %v, want to reach the server (Unimplemented here)", err)
		}
	})
	t.Run("revoked token is refused once the cache entry expires", func(t *testing.T) {
		now := time.Now()
		f.auth.tokens.now = func() time.Time { return now }
		const secret = "short-lived-reader"
		f.org.mu.Lock()
		f.org.roles[fsm.HashSecret(secret)] = authz.RoleReader
		f.org.mu.Unlock()
		if err := tail(secret); err != nil {
			t.Fatal(err)
		}
		f.org.revoke(secret)
		if err := tail(secret); err != nil {
			t.Fatalf("within the cache time: %v", err)
		}
		now = now.Add(tokenCachePositive)
		wantRefused(t, tail(secret), codes.PermissionDenied, "wrong token")
	})

	for _, secret := range []string{readerSecret, writerSecret, adminSecret, joinSecret, "guessed-secret", "short-lived-reader"} {
		if strings.Contains(f.logs.String(), secret) {
			t.Fatalf("a token reached the log:\n%s", f.logs.String())
		}
	}
	if !strings.Contains(f.logs.String(), "data-plane call refused") {
		t.Fatalf("refusals are not logged:\n%s", f.logs.String())
	}
}

func TestDataPlaneDevModeAcceptsAll(t *testing.T) {
	f := startDataPlane(t, true)
	c := f.client(t, "")
	if err := subscribe(t, c, true, "tail-1"); err != nil {
		t.Fatal(err)
	}
	if err := subscribe(t, c, false, "q/down/p0/r0"); err != nil {
		t.Fatal(err)
	}
	if err := ingestLines(t, c); err != nil {
		t.Fatal(err)
	}
}

func TestTokenCache(t *testing.T) {
	org := newFakeOrg()
	unreachable := false
	c := newTokenCache(func(ctx context.Context, hash string) (authz.Role, time.Time, error) {
		if unreachable {
			org.asked.Add(1)
			return "", time.Time{}, status.Error(codes.Unavailable, "no coordinator")
		}
		return org.ask(ctx, hash)
	})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()
	reader, unknown := fsm.HashSecret(readerSecret), fsm.HashSecret("unknown")

	if r, err := c.role(ctx, reader); err != nil || r != authz.RoleReader {
		t.Fatalf("role = %q, %v", r, err)
	}
	_, _ = c.role(ctx, reader)
	if n := org.asked.Load(); n != 1 {
		t.Fatalf("asked the org %d times, want 1 (cached)", n)
	}
	// Refusals are cached for a shorter time.
	for range 2 {
		if _, err := c.role(ctx, unknown); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("unknown: %v", err)
		}
	}
	if n := org.asked.Load(); n != 2 {
		t.Fatalf("asked the org %d times, want 2", n)
	}
	now = now.Add(tokenCacheNegative)
	_, _ = c.role(ctx, unknown)
	_, _ = c.role(ctx, reader)
	if n := org.asked.Load(); n != 3 {
		t.Fatalf("asked the org %d times, want 3 (negative entry expired, positive not)", n)
	}
	// An unreachable org is not cached: the next call asks again.
	unreachable = true
	now = now.Add(tokenCachePositive)
	for range 2 {
		if _, err := c.role(ctx, reader); status.Code(err) != codes.Unavailable {
			t.Fatalf("unreachable: %v", err)
		}
	}
	if n := org.asked.Load(); n != 5 {
		t.Fatalf("asked the org %d times, want 5", n)
	}
	unreachable = false
	// An entry never outlives its token.
	expiring := newTokenCache(func(context.Context, string) (authz.Role, time.Time, error) {
		return authz.RoleReader, now.Add(time.Second), nil
	})
	expiring.now = c.now
	_, _ = expiring.role(ctx, reader)
	if e := expiring.entries[reader]; !e.until.Equal(now.Add(time.Second)) {
		t.Fatalf("entry until %v, want the token's expiry %v", e.until, now.Add(time.Second))
	}
	// Bounded whatever callers present.
	for i := range tokenCacheMax * 2 {
		_, _ = c.role(ctx, fsm.HashSecret(strings.Repeat("x", i+1)))
	}
	if n := len(c.entries); n > tokenCacheMax {
		t.Fatalf("cache holds %d entries, bound %d", n, tokenCacheMax)
	}
}
