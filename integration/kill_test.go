package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pacedWard is the ward query paced to run for several seconds, so that
// a worker dies mid-stream; the window is wide enough to hold state.
const pacedWard = `name: ward
replicas: 2
sources:
  - {name: vitals, generator: {kind: vitals, rate: 2500, seed: 11, limit: 25000}}
operators:
  - {name: feverish, type: filter, input: vitals, where: "temperature > 37.0"}
  - {name: per_patient, type: aggregate, input: feverish, window: {size: 100ms},
     group_by: [patient], aggregates: {n: "count()", hr: "max(heart_rate)"}, parallelism: 2}
sinks:
  - {name: out, input: per_patient}
`

// endlessWard is pacedWard without an end, for a test whose fault is
// timed by what tail printed: tail lags the query by seconds under load,
// and a fault after the input's end meets no reader (see
// TestHeldLinkBetweenWorkerProcesses). Its first results equal
// pacedWard's.
var endlessWard = strings.Replace(pacedWard, ", limit: 25000", "", 1)

// TestKilledWorkerReplicaBootstrapsFromPeer: kill -9 of the worker
// process running replica 0 of a keyed aggregate's partition while a
// replicated query runs. The org places the lost tasks again; the
// replacement of that replica starts from its live peer's snapshot (its
// worker logs the bootstrap from replica 1, and replica 1's worker logs
// the snapshot it served), and every result the CLI tail prints equals the
// reference, once.
func TestKilledWorkerReplicaBootstrapsFromPeer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	want := wardReference(t, pacedWard, 100*time.Millisecond)
	o := startOrg(t, 1, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	w := startWard(ctx, t, o)
	const lost, peer = "ward/per_patient/p0/r0", "ward/per_patient/p0/r1"
	killed := ""
	var peerProc *proc
	got := w.results(t, len(want), func(n int) {
		if killed == "" && n > len(want)/4 {
			ts := w.tasks(t)
			killed = ts[lost].Worker
			peerProc = w.procOf(t, ts[peer].Worker)
			w.procOf(t, killed).kill()
		}
	})
	if killed == "" {
		t.Fatal("the query ended before a worker was killed: the test would prove nothing")
	}
	sameWard(t, got, want)
	now := w.tasks(t)[lost]
	if now.Worker == killed || now.Generation < 2 {
		t.Fatalf("the lost replica was not placed again: %+v", now)
	}
	repl := w.procOf(t, now.Worker)
	waitFor(t, 10*time.Second, "the bootstrap in the logs", func() bool {
		return strings.Contains(repl.out.String(), "task bootstraps from a snapshot") &&
			strings.Contains(repl.out.String(), "from="+peer) &&
			strings.Contains(peerProc.out.String(), "snapshot served")
	})
}

// ward is the pacedWard query running on an org of processes, with a CLI
// tail reading its results.
type ward struct {
	o      *org
	ctx    context.Context
	stdout *bufio.Scanner
	stderr *lockedBuffer
}

// startWard waits for the org's 3 workers, submits pacedWard and starts
// `fedstream tail ward --json`.
func startWard(ctx context.Context, t *testing.T, o *org) *ward {
	t.Helper()
	return startWardQuery(ctx, t, o, pacedWard)
}

// startWardQuery is startWard for a variant of the ward query (named
// ward).
func startWardQuery(ctx context.Context, t *testing.T, o *org, query string) *ward {
	t.Helper()
	waitFor(t, 30*time.Second, "3 ready workers", func() bool {
		ws, err := o.workerList(t, 0)
		if err != nil || len(ws) != 3 {
			return false
		}
		for _, w := range ws {
			if w.Status != "ready" {
				return false
			}
		}
		return true
	})
	file := filepath.Join(t.TempDir(), "ward.yaml")
	if err := os.WriteFile(file, []byte(query), 0o644); err != nil {
		t.Fatal(err)
	}
	var sub struct{}
	if err := cli(ctx, t, &sub, "query", "submit", file, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	tail := command(ctx, t, "tail", "ward", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w := &ward{o: o, ctx: ctx, stdout: bufio.NewScanner(stdout), stderr: &lockedBuffer{}}
	tail.Stderr = w.stderr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tail.Process.Kill(); _ = tail.Wait() })
	return w
}

// results reads the tail until it printed n results, calling each with
// the count so far; a result printed twice fails the test.
func (w *ward) results(t *testing.T, n int, each func(n int)) map[string]string {
	t.Helper()
	got := map[string]string{}
	for len(got) < n && w.stdout.Scan() {
		var r map[string]any
		if err := json.Unmarshal(w.stdout.Bytes(), &r); err != nil {
			t.Fatalf("tail printed a line that is not JSON: %q", w.stdout.Text())
		}
		v, _ := r["values"].(map[string]any)
		key := fmt.Sprintf("%s@%s", v["patient"], v["window_end"])
		if _, dup := got[key]; dup {
			t.Fatalf("duplicate result for %s", key)
		}
		got[key] = fmt.Sprintf("n=%v hr=%v", v["n"], v["hr"])
		each(len(got))
	}
	if len(got) < n {
		t.Fatalf("tail ended after %d of %d results: %v\nstderr: %s", len(got), n, w.stdout.Err(), w.stderr.String())
	}
	return got
}

func sameWard(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("result %s: got %q, want %q (%d results)", k, got[k], v, len(want))
		}
	}
}

type wardTask struct {
	ID         string `json:"id"`
	Worker     string `json:"worker"`
	Generation int    `json:"generation"`
	MovingFrom string `json:"moving_from"`
	State      string `json:"state"`
}

// tasks is `query status ward --json`, by task id.
func (w *ward) tasks(t *testing.T) map[string]wardTask {
	t.Helper()
	var q struct {
		Tasks []wardTask `json:"tasks"`
	}
	// Tried again on an error, as workerListNow (a CLI process can miss
	// its timeout under load).
	waitFor(t, 30*time.Second, "the ward query's status", func() bool {
		ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
		defer cancel()
		return cli(ctx, t, &q, "query", "status", "ward", "--addr", w.o.grpc[0], "--token", w.o.adminToken) == nil
	})
	out := map[string]wardTask{}
	for _, tk := range q.Tasks {
		out[tk.ID] = tk
	}
	return out
}

// procOf is the process of a worker, found by the id it logged when it
// registered.
func (w *ward) procOf(t *testing.T, workerID string) *proc {
	t.Helper()
	for _, p := range w.o.workers {
		if strings.Contains(p.out.String(), "worker="+workerID) {
			return p
		}
	}
	t.Fatalf("no process for worker %s", workerID)
	return nil
}

// TestTaskMoveCommand moves a partition of the running keyed aggregate
// with `fedstream task move` between worker processes while the CLI tail
// reads: every result equals the reference, once. A move onto the worker
// running the partition's other replica is refused with the reason.
func TestTaskMoveCommand(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	want := wardReference(t, pacedWard, 100*time.Millisecond)
	o := startOrg(t, 1, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	w := startWard(ctx, t, o)
	const moving, other = "ward/per_patient/p1/r0", "ward/per_patient/p1/r1"
	var from, to string
	got := w.results(t, len(want), func(n int) {
		if from != "" || n < len(want)/4 {
			return
		}
		ts := w.tasks(t)
		from = ts[moving].Worker
		ws, err := o.workerList(t, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, wk := range ws {
			if wk.ID != from && wk.ID != ts[other].Worker {
				to = wk.ID
			}
		}
		if err := cli(ctx, t, &struct{}{}, "task", "move", moving, "--to", ts[other].Worker, "--addr", o.grpc[0], "--token", o.adminToken); err == nil || !strings.Contains(err.Error(), "already runs") {
			t.Errorf("move onto the other replica's worker: %v, want a refusal naming the replica it runs", err)
		}
		var res struct {
			Task       string `json:"task"`
			From       string `json:"from_worker"`
			To         string `json:"to_worker"`
			Generation int    `json:"generation"`
		}
		if err := cli(ctx, t, &res, "task", "move", moving, "--to", to, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
			t.Fatal(err)
		}
		if res.Task != moving || res.From != from || res.To != to || res.Generation != 2 {
			t.Fatalf("task move --json: %+v", res)
		}
	})
	if from == "" {
		t.Fatal("the query ended before the move: the test would prove nothing")
	}
	sameWard(t, got, want)
	waitFor(t, 20*time.Second, "the move ended", func() bool {
		tk := w.tasks(t)[moving]
		return tk.Worker == to && tk.Generation == 2 && tk.MovingFrom == ""
	})
}
