package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestIngestAndTailThroughTheCLI feeds examples/ingest-sample.jsonl plus one
// bad line through `fedstream ingest`, as the README shows: the bad line is
// refused by number and field (exit 2), the good ones are kept, and the
// query's results arrive through `fedstream tail`.
func TestIngestAndTailThroughTheCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	o := startOrg(t, 1, 2)
	waitFor(t, 30*time.Second, "2 ready workers", func() bool {
		ws, err := o.workerList(t, 0)
		return err == nil && len(ws) == 2 && ws[0].Status == "ready" && ws[1].Status == "ready"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sub struct{}
	if err := cli(ctx, t, &sub, "query", "submit", "../examples/ingest.yaml", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	sample, err := os.ReadFile("../examples/ingest-sample.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	good := bytes.Count(sample, []byte("\n"))
	bad := `{"time": "2024-05-01T12:00:00Z", "host": "web-1", "path": "/x", "status": "oops", "latency_ms": 1}` + "\n"
	// A last line two minutes later closes the sample's windows.
	closer := `{"time": "2024-05-01T12:30:00Z", "host": "web-9", "path": "/", "status": 200, "latency_ms": 1}` + "\n"
	input := bad + string(sample) + closer

	// The source task may still be starting: retry until it accepts.
	var out, stderr bytes.Buffer
	var runErr error
	waitFor(t, 30*time.Second, "ingest accepted", func() bool {
		out.Reset()
		stderr.Reset()
		cmd := exec.CommandContext(ctx, binary(t), "ingest", "ingest", "requests", "--addr", o.grpc[0], "--token", o.adminToken)
		cmd.Stdin = strings.NewReader(input)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		runErr = cmd.Run()
		return strings.Contains(out.String(), "ingested")
	})
	var exit *exec.ExitError
	if !errors.As(runErr, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("ingest with a bad line: %v (want exit 2)\n%s%s", runErr, out.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), `line 1: field "status": want int, got string "oops"`) {
		t.Fatalf("bad line not named by number and field:\n%s", stderr.String())
	}
	if want := fmt.Sprintf("ingested %d of %d lines", good+1, good+2); !strings.Contains(out.String(), want) {
		t.Fatalf("ingest said %q, want %q", out.String(), want)
	}

	tail := exec.CommandContext(ctx, binary(t), "tail", "ingest", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tail.Process.Kill(); _ = tail.Wait() }()
	sc := bufio.NewScanner(stdout)
	hosts := map[string]bool{}
	for len(hosts) < 3 && sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("tail printed %q", sc.Text())
		}
		if r["failures"].(float64) < 1 {
			t.Fatalf("a failing_hosts row without failures: %s", sc.Text())
		}
		hosts[r["host"].(string)] = true
	}
	if len(hosts) < 3 {
		t.Fatalf("tail ended with hosts %v: %v", hosts, sc.Err())
	}
}
