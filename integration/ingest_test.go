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
// refused by number and field (exit 2), the good ones are kept. Then
// `fedstream ingest --close --json` ends the source, so the last window is
// emitted without a later record to close it, and `fedstream tail --json`
// prints every result, exactly as computed from the sample here, and exits
// 0 by itself at the sink's end.
func TestIngestAndTailThroughTheCLI(t *testing.T) {
	t.Parallel()
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
	input := bad + string(sample)

	// The source task may still be starting: retry until it accepts.
	var out, stderr bytes.Buffer
	var runErr error
	waitFor(t, 30*time.Second, "ingest accepted", func() bool {
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
		t.Fatalf("ingest with a bad line: %v (want exit 2)\n%s%s", runErr, out.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), `line 1: field "status": want int, got string "oops"`) {
		t.Fatalf("bad line not named by number and field:\n%s", stderr.String())
	}
	if want := fmt.Sprintf("ingested %d of %d lines", good, good+1); !strings.Contains(out.String(), want) {
		t.Fatalf("ingest said %q, want %q", out.String(), want)
	}

	// Close the source, without lines, as JSON.
	var closed struct {
		Query    string `json:"query"`
		Source   string `json:"source"`
		Lines    int    `json:"lines"`
		Accepted int    `json:"accepted"`
		Refused  []any  `json:"refused"`
		Replicas int    `json:"replicas"`
		Closed   bool   `json:"closed"`
	}
	if err := cli(ctx, t, &closed, "ingest", "ingest", "requests", "--close", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	if !closed.Closed || closed.Lines != 0 || closed.Accepted != 0 || closed.Refused == nil || closed.Replicas != 1 || closed.Query != "ingest" || closed.Source != "requests" {
		t.Fatalf("ingest --close --json printed %+v", closed)
	}

	// What the query computes, from the sample: per host and minute, the
	// requests with status >= 500 or latency over 1000 ms.
	want := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(sample)), "\n") {
		var r struct {
			Time    time.Time `json:"time"`
			Host    string    `json:"host"`
			Status  int       `json:"status"`
			Latency float64   `json:"latency_ms"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.Status >= 500 || r.Latency > 1000 {
			end := r.Time.Truncate(time.Minute).Add(time.Minute).UTC().Format(time.RFC3339Nano)
			want[r.Host+"@"+end]++
		}
	}

	// tail prints every result and exits 0 at the sink's end.
	tail := command(ctx, t, "tail", "ingest", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
	var tailOut, tailErr bytes.Buffer
	tail.Stdout, tail.Stderr = &tailOut, &tailErr
	if err := tail.Run(); err != nil {
		t.Fatalf("tail after close: %v (want exit 0)\n%s", err, tailErr.String())
	}
	if !strings.Contains(tailErr.String(), "ended") {
		t.Errorf("tail did not say why it ended: %q", tailErr.String())
	}
	got := map[string]int{}
	sc := bufio.NewScanner(&tailOut)
	for sc.Scan() {
		var r struct {
			Sink   string         `json:"sink"`
			ID     uint64         `json:"id"`
			Type   string         `json:"type"`
			STime  string         `json:"stime"`
			Values map[string]any `json:"values"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("tail printed %q", sc.Text())
		}
		if r.Sink != "failing_hosts" || r.ID == 0 || r.Type != "STABLE" || r.STime != r.Values["window_end"] {
			t.Fatalf("result envelope: %s", sc.Text())
		}
		got[fmt.Sprintf("%s@%s", r.Values["host"], r.Values["window_end"])] = int(r.Values["failures"].(float64))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tail printed %v, want %v", got, want)
	}
}
