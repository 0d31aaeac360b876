package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const ingestMoveYAML = `
name: im
replicas: 2
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    ingest: true
operators:
  - name: per_user
    type: aggregate
    input: events
    window: {size: 1s}
    group_by: [user]
    aggregates: {n: "count()", total: "sum(amount)"}
sinks:
  - {name: out, input: per_user}
`

// TestIngestSourceMoveThroughTheCLI moves a replica of an ingest source
// with `fedstream task move` while a `fedstream ingest --close` process is
// fed lines through a pipe, and checks what `fedstream tail` prints
// against the counts computed from the input: nothing lost, nothing
// counted twice. The last part of the input is written only once the move
// ended, so the ingest process must have reconnected to the moved copy.
func TestIngestSourceMoveThroughTheCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	o := startOrg(t, 1, 3)
	o.waitReady(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	spec := filepath.Join(t.TempDir(), "im.yaml")
	if err := os.WriteFile(spec, []byte(ingestMoveYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cli(ctx, t, &struct{}{}, "query", "submit", spec, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	const moving = "im/events/p0/r0"
	status := func() map[string]wardTask {
		var q struct {
			Tasks []wardTask `json:"tasks"`
		}
		if err := cli(ctx, t, &q, "query", "status", "im", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
			t.Fatal(err)
		}
		out := map[string]wardTask{}
		for _, tk := range q.Tasks {
			out[tk.ID] = tk
		}
		return out
	}
	waitFor(t, 30*time.Second, "the source replicas placed", func() bool {
		ts := status()
		return ts[moving].Worker != "" && ts["im/events/p0/r1"].Worker != ""
	})

	const records = 6000
	base := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).UnixNano()
	var input []string
	want := map[string]string{}
	type agg struct{ n, total int64 }
	sums := map[string]agg{}
	for i := range records {
		ns := base + int64(i)*10_000_000
		user := fmt.Sprintf("u%d", i%7)
		input = append(input, fmt.Sprintf(`{"time": %d, "user": %q, "amount": %d}`, ns, user, i%5))
		end := time.Unix(0, (ns/1_000_000_000+1)*1_000_000_000).UTC().Format(time.RFC3339Nano)
		a := sums[user+"@"+end]
		a.n++
		a.total += int64(i % 5)
		sums[user+"@"+end] = a
	}
	for k, a := range sums {
		want[k] = fmt.Sprintf("n=%d total=%d", a.n, a.total)
	}

	// The source may still be starting: a first ingest of no line waits
	// until it answers (it is not closed).
	waitFor(t, 30*time.Second, "the source accepts", func() bool {
		cmd := exec.CommandContext(ctx, binary(t), "ingest", "im", "events", "--addr", o.grpc[0], "--token", o.adminToken, "--retry-for", "2s")
		cmd.Stdin = strings.NewReader("")
		return cmd.Run() == nil
	})
	ing := exec.CommandContext(ctx, binary(t), "ingest", "im", "events", "--close", "--batch", "50", "--addr", o.grpc[0], "--token", o.adminToken)
	stdin, err := ing.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var ingOut, ingErr bytes.Buffer
	ing.Stdout, ing.Stderr = &ingOut, &ingErr
	if err := ing.Start(); err != nil {
		t.Fatal(err)
	}
	write := func(from, to int) {
		if _, err := io.WriteString(stdin, strings.Join(input[from:to], "\n")+"\n"); err != nil {
			t.Fatalf("feed ingest: %v\n%s", err, ingErr.String())
		}
	}
	write(0, records/3)
	ts := status()
	from := ts[moving].Worker
	ws, err := o.workerList(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	var to string
	for _, w := range ws {
		if w.ID != from && w.ID != ts["im/events/p0/r1"].Worker {
			to = w.ID
		}
	}
	var res struct {
		Generation int `json:"generation"`
	}
	if err := cli(ctx, t, &res, "task", "move", moving, "--to", to, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	// Lines flow while the move runs (the pipe holds only so much).
	write(records/3, 2*records/3)
	waitFor(t, 60*time.Second, "the move ended", func() bool {
		tk := status()[moving]
		return tk.Worker == to && tk.Generation == 2 && tk.MovingFrom == ""
	})
	write(2*records/3, records)
	stdin.Close()
	if err := ing.Wait(); err != nil {
		t.Fatalf("ingest: %v\n%s%s", err, ingOut.String(), ingErr.String())
	}
	if w := fmt.Sprintf("ingested %d of %d lines into im/events (2 replicas)", records, records); !strings.Contains(ingOut.String(), w) {
		t.Fatalf("ingest said %q, want %q (stderr %s)", ingOut.String(), w, ingErr.String())
	}
	if !strings.Contains(ingErr.String(), "resending from line") {
		t.Errorf("the ingest process never reconnected to the moved copy:\n%s", ingErr.String())
	}

	tail := exec.CommandContext(ctx, binary(t), "tail", "im", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
	var tailOut, tailErr bytes.Buffer
	tail.Stdout, tail.Stderr = &tailOut, &tailErr
	if err := tail.Run(); err != nil {
		t.Fatalf("tail after close: %v (want exit 0)\n%s", err, tailErr.String())
	}
	got := map[string]string{}
	sc := bufio.NewScanner(&tailOut)
	for sc.Scan() {
		var r struct {
			Values map[string]any `json:"values"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("tail printed %q", sc.Text())
		}
		k := fmt.Sprintf("%s@%s", r.Values["user"], r.Values["window_end"])
		if _, dup := got[k]; dup {
			t.Fatalf("result %s printed twice", k)
		}
		got[k] = fmt.Sprintf("n=%v total=%v", r.Values["n"], r.Values["total"])
	}
	if len(got) != len(want) {
		t.Fatalf("tail printed %d results, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("result %s: %q, want %q", k, got[k], v)
		}
	}
}
