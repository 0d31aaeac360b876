package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
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

// pacedWardReference computes pacedWard's results from its generator.
func pacedWardReference(t *testing.T) map[string]string {
	t.Helper()
	q, err := queryspec.Parse("ref.yaml", []byte(pacedWard))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := source.NewGenerator(q.Sources[0].Gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := gen.Schema()
	iPatient, iTemp, iHR := s.Index("patient"), s.Index("temperature"), s.Index("heart_rate")
	type agg struct{ n, hr int64 }
	windows := map[string]*agg{}
	const size = int64(100 * time.Millisecond)
	var tup tuple.Tuple
	for gen.Next(&tup) {
		if tup.Values[iTemp].F <= 37.0 {
			continue
		}
		end := (tup.STime/size + 1) * size
		key := fmt.Sprintf("%s@%s", tup.Values[iPatient].S, time.Unix(0, end).UTC().Format(time.RFC3339Nano))
		a := windows[key]
		if a == nil {
			a = &agg{hr: tup.Values[iHR].I}
			windows[key] = a
		}
		a.n++
		a.hr = max(a.hr, tup.Values[iHR].I)
	}
	out := map[string]string{}
	for k, a := range windows {
		out[k] = fmt.Sprintf("n=%d hr=%d", a.n, a.hr)
	}
	return out
}

// TestKilledWorkerReplicaBootstrapsFromPeer: kill -9 of the worker
// process running replica 0 of a keyed aggregate's partition while a
// replicated query runs. The org places the lost tasks again; the
// replacement of that replica starts from its live peer's snapshot (its
// worker logs the bootstrap from replica 1, and replica 1's worker logs
// the snapshot it served), and every result the CLI tail prints equals the
// reference, once.
func TestKilledWorkerReplicaBootstrapsFromPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	want := pacedWardReference(t)
	o := startOrg(t, 1, 3)
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
	if err := os.WriteFile(file, []byte(pacedWard), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var sub struct{}
	if err := cli(ctx, t, &sub, "query", "submit", file, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	tail := exec.CommandContext(ctx, binary(t), "tail", "ward", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	tail.Stderr = &stderr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tail.Process.Kill(); _ = tail.Wait() }()

	const lost, peer = "ward/per_patient/p0/r0", "ward/per_patient/p0/r1"
	type taskJSON struct {
		ID         string `json:"id"`
		Worker     string `json:"worker"`
		Generation int    `json:"generation"`
	}
	tasks := func() map[string]taskJSON {
		var q struct {
			Tasks []taskJSON `json:"tasks"`
		}
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		defer qcancel()
		if err := cli(qctx, t, &q, "query", "status", "ward", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
			t.Fatal(err)
		}
		out := map[string]taskJSON{}
		for _, tk := range q.Tasks {
			out[tk.ID] = tk
		}
		return out
	}
	procOf := func(workerID string) *proc {
		ws, err := o.workerList(t, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if w.ID == workerID {
				for _, p := range o.workers {
					if strings.Contains(p.out.String(), "worker="+workerID) {
						return p
					}
				}
			}
		}
		t.Fatalf("no process for worker %s", workerID)
		return nil
	}

	got := map[string]string{}
	killed := ""
	var peerProc *proc
	sc := bufio.NewScanner(stdout)
	for len(got) < len(want) && sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("tail printed a line that is not JSON: %q", sc.Text())
		}
		key := fmt.Sprintf("%s@%s", r["patient"], r["window_end"])
		if _, dup := got[key]; dup {
			t.Fatalf("duplicate result for %s", key)
		}
		got[key] = fmt.Sprintf("n=%v hr=%v", r["n"], r["hr"])
		if killed == "" && len(got) > len(want)/4 {
			ts := tasks()
			killed = ts[lost].Worker
			peerProc = procOf(ts[peer].Worker)
			procOf(killed).kill()
		}
	}
	if killed == "" {
		t.Fatal("the query ended before a worker was killed: the test would prove nothing")
	}
	if len(got) < len(want) {
		t.Fatalf("tail ended after %d of %d results: %v\nstderr: %s", len(got), len(want), sc.Err(), stderr.String())
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("result %s: got %q, want %q (%d results)", k, got[k], v, len(want))
		}
	}
	now := tasks()[lost]
	if now.Worker == killed || now.Generation < 2 {
		t.Fatalf("the lost replica was not placed again: %+v", now)
	}
	repl := procOf(now.Worker)
	waitFor(t, 10*time.Second, "the bootstrap in the logs", func() bool {
		return strings.Contains(repl.out.String(), "task bootstraps from a snapshot") &&
			strings.Contains(repl.out.String(), "from="+peer) &&
			strings.Contains(peerProc.out.String(), "snapshot served")
	})
}
