package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// run runs the binary and returns its exit error, stdout and stderr.
func run(ctx context.Context, t *testing.T, stdin string, args ...string) (error, string, string) {
	t.Helper()
	cmd := command(ctx, t, args...)
	cmd.Env = withoutTokens(cmd.Env)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return err, out.String(), errOut.String()
}

// withoutTokens drops FEDSTREAM_TOKEN* so a developer's environment cannot
// lend the test a token.
func withoutTokens(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "FEDSTREAM_TOKEN") {
			out = append(out, kv)
		}
	}
	return out
}

func writeSecret(t *testing.T, dir, name, secret string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDataPlaneRefusesWithoutTheRightToken runs an org with tokens
// configured and checks, through the built binary and the worker process's
// data plane, that reading results needs a reader token and ingesting a
// writer token, with the messages users see.
func TestDataPlaneRefusesWithoutTheRightToken(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	o := startOrg(t, 1, 1)
	o.waitReady(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	adminFile := writeSecret(t, dir, "admin", o.adminToken)
	addr := o.grpc[0]

	// The bootstrap admin creates a reader and a writer token.
	var reader, writer struct {
		ID     string `json:"id"`
		Role   string `json:"role"`
		Secret string `json:"secret"`
	}
	if err := cli(ctx, t, &reader, "token", "create", "--role", "reader", "--description", "dashboards", "--addr", addr, "--token-file", adminFile); err != nil {
		t.Fatal(err)
	}
	if err := cli(ctx, t, &writer, "token", "create", "--role", "writer", "--ttl", "1h", "--addr", addr, "--token-file", adminFile); err != nil {
		t.Fatal(err)
	}
	if reader.Secret == "" || reader.Role != "reader" || writer.Role != "writer" {
		t.Fatalf("created %+v and %+v", reader, writer)
	}
	readerFile := writeSecret(t, dir, "reader", reader.Secret)
	writerFile := writeSecret(t, dir, "writer", writer.Secret)

	// `token list` never shows a secret.
	err, out, errOut := run(ctx, t, "", "token", "list", "--addr", addr, "--token-file", adminFile)
	if err != nil || !strings.Contains(out, reader.ID) || strings.Contains(out, reader.Secret) || strings.Contains(out, writer.Secret) {
		t.Fatalf("token list: %v\n%s%s", err, out, errOut)
	}

	// A reader cannot submit; the writer can.
	err, _, errOut = run(ctx, t, "", "query", "submit", "../examples/ingest.yaml", "--addr", addr, "--token-file", readerFile)
	if err == nil || !strings.Contains(errOut, "the token's role is reader") || !strings.Contains(errOut, "role writer") {
		t.Fatalf("reader submitted a query: %v\n%s", err, errOut)
	}
	if err, out, errOut := run(ctx, t, "", "query", "submit", "../examples/ingest.yaml", "--addr", addr, "--token-file", writerFile); err != nil {
		t.Fatalf("writer submit: %v\n%s%s", err, out, errOut)
	}

	// tail without a token is refused, saying what is needed and how.
	err, out, errOut = run(ctx, t, "", "tail", "ingest", "--addr", addr)
	if err == nil || !strings.Contains(errOut, "missing token") || !strings.Contains(errOut, "role reader") || !strings.Contains(errOut, "--token-file") {
		t.Fatalf("tail without a token: %v\nstdout %s\nstderr %s", err, out, errOut)
	}
	if strings.Contains(errOut, "rpc error") {
		t.Errorf("the user sees gRPC noise: %s", errOut)
	}
	t.Logf("tail without a token: %s", errOut)

	// ingest with a reader token reaches the worker (the reader may look
	// the query up) and the worker refuses it. The source task may still
	// be starting: retry until the worker answers.
	line := `{"time": "2024-05-01T12:00:00Z", "host": "web-1", "path": "/x", "status": 500, "latency_ms": 1}` + "\n"
	waitFor(t, 30*time.Second, "the worker to refuse ingest with a reader token", func() bool {
		err, out, errOut = run(ctx, t, line, "ingest", "ingest", "requests", "--addr", addr, "--token-file", readerFile)
		if strings.Contains(out, "ingested") {
			t.Fatalf("ingest with a reader token was accepted: %s", out)
		}
		return err != nil && strings.Contains(errOut, "the token's role is reader")
	})
	if !strings.Contains(errOut, "ingesting records") || !strings.Contains(errOut, "role writer") || strings.Contains(errOut, reader.Secret) {
		t.Fatalf("ingest with a reader token said: %s", errOut)
	}
	t.Logf("ingest with a reader token: %s", errOut)
	// The writer ingests (the worker asked the coordinators about its token).
	waitFor(t, 30*time.Second, "ingest with the writer token", func() bool {
		_, out, _ = run(ctx, t, line, "ingest", "ingest", "requests", "--addr", addr, "--token-file", writerFile)
		return strings.Contains(out, "ingested 1 of 1 line ")
	})

	// The worker's data plane itself: no token, and a reader acknowledging
	// under a task's name.
	var q struct {
		Tasks []struct {
			ID         string `json:"id"`
			WorkerAddr string `json:"worker_addr"`
		} `json:"tasks"`
	}
	if err := cli(ctx, t, &q, "query", "status", "ingest", "--addr", addr, "--token-file", readerFile); err != nil || len(q.Tasks) == 0 || q.Tasks[0].WorkerAddr == "" {
		t.Fatalf("query status: %+v, %v", q, err)
	}
	// With the org's client certificate, so that the token is what is
	// tested (a caller without a certificate is refused at the handshake:
	// security_test.go).
	ca, cert, key := tlsutil.Paths(o.tlsDir, "", "", "", rpc.RoleClient, "admin")
	clientCreds, err := tlsutil.Load(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	subscribe := func(token string, noAck bool) error {
		conn, err := rpc.Dial(q.Tasks[0].WorkerAddr, token, clientCreds.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleWorker}}))
		if err != nil {
			return err
		}
		defer conn.Close()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := pb.NewDataPlaneClient(conn).Subscribe(sctx)
		if err != nil {
			return err
		}
		_ = s.Send(&pb.SubscribeRequest{Stream: &pb.StreamRef{Query: "ingest", TaskId: q.Tasks[0].ID}, Subscriber: q.Tasks[0].ID, NoAck: noAck, AckId: 1 << 62})
		_, err = s.Recv()
		return err
	}
	if err := subscribe("", true); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "missing token") {
		t.Fatalf("data-plane subscription without a token: %v", err)
	}
	if err := subscribe(reader.Secret, false); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "org's workers only") {
		t.Fatalf("acknowledging subscription with a reader token: %v", err)
	}

	// Revoked: the coordinators refuse the writer at once.
	if err, out, errOut := run(ctx, t, "", "token", "revoke", writer.ID, "--addr", addr, "--token-file", adminFile); err != nil {
		t.Fatalf("revoke: %v\n%s%s", err, out, errOut)
	}
	err, _, errOut = run(ctx, t, line, "ingest", "ingest", "requests", "--addr", addr, "--token-file", writerFile)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(errOut, "wrong token") {
		t.Fatalf("ingest with a revoked token: %v\n%s", err, errOut)
	}
}
