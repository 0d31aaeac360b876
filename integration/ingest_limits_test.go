package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestIngestRefusesBadLinesOneByOne feeds `fedstream ingest` binary data,
// a record larger than a worker accepts in one message, the engine's
// end-of-stream time and a record dated 2200, among good records: each
// bad one is refused by its line number with a readable message, the call
// succeeds (exit 2), and the good records after them are accepted (the
// source stays open). Before, binary input failed the whole call with a
// gRPC marshalling error, a huge line ended the read, and one record at
// the end-of-stream time made every later record late.
func TestIngestRefusesBadLinesOneByOne(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	o := startOrg(t, 1, 1)
	o.waitReady(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var sub struct{}
	if err := cli(ctx, t, &sub, "query", "submit", "../examples/ingest.yaml", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	rec := func(ts string) string {
		return fmt.Sprintf(`{"time": %s, "host": "web-1", "path": "/", "status": 200, "latency_ms": 1}`, ts)
	}
	now := time.Now().UTC()
	lines := []string{
		rec(`"` + now.Format(time.RFC3339) + `"`),
		"\x00\x01\xff\xfe binary \x89PNG",
		`{"time": 9223372036854775807, "host": "x", "path": "/", "status": 1, "latency_ms": 1}`,
		rec(`"2200-01-01T00:00:00Z"`),
		`{"pad": "` + strings.Repeat("x", 17<<20) + `"}`,
		rec(`"` + now.Add(time.Second).Format(time.RFC3339) + `"`),
	}
	input := strings.Join(lines, "\n") + "\n"
	var out, stderr bytes.Buffer
	var runErr error
	waitFor(t, 30*time.Second, "ingest answered", func() bool {
		out.Reset()
		stderr.Reset()
		cmd := command(ctx, t, "ingest", "ingest", "requests", "--addr", o.grpc[0], "--token", o.adminToken)
		cmd.Stdin = strings.NewReader(input)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		runErr = cmd.Run()
		return strings.Contains(out.String(), "ingested")
	})
	var exit *exec.ExitError
	if !errors.As(runErr, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("ingest: %v (want exit 2)\n%s%s", runErr, out.String(), stderr.String())
	}
	if !strings.Contains(out.String(), "ingested 2 of 6 lines") {
		t.Fatalf("ingest said %q, want 2 of 6 lines accepted", out.String())
	}
	msgs := stderr.String()
	if !utf8.ValidString(msgs) {
		t.Fatalf("messages are not valid UTF-8: %q", msgs)
	}
	for _, want := range []string{
		`line 2: not valid UTF-8 (binary data?): "\x00\x01\xff\xfe binary \x89PNG"`,
		"line 3: time 9223372036854775807 is the engine's end-of-stream marker",
		"line 4: time 2200-01-01T00:00:00Z is about ",
		"years ahead of the source's time",
		"line 5: 17.0 MiB long; a worker accepts messages of at most 16.0 MiB",
	} {
		if !strings.Contains(msgs, want) {
			t.Errorf("stderr does not say %q:\n%s", want, msgs)
		}
	}
	if strings.Count(msgs, "\n") > 6 {
		t.Errorf("more messages than refused lines:\n%s", msgs)
	}
}
