package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/worker/dataplane"
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
	t.Parallel()
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
		cmd := command(ctx, t, "ingest", "im", "events", "--addr", o.grpc[0], "--token", o.adminToken, "--retry-for", "2s")
		cmd.Stdin = strings.NewReader("")
		return cmd.Run() == nil
	})
	ing := command(ctx, t, "ingest", "im", "events", "--close", "--batch", "50", "--addr", o.grpc[0], "--token", o.adminToken)
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

	tail := command(ctx, t, "tail", "im", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
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

// TestLiveIngestSourceMove moves a replica of an ingest source with
// AdminService.MoveTask in an in-process org over mutual TLS while a
// dataplane.IngestClient (what fedstream ingest uses) sends lines without
// pause, with one and with two replicas: the client finds the moved copy
// through the coordinator's query status, and every sink replica's
// results equal the counts computed from the input.
func TestLiveIngestSourceMove(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) { liveIngestMove(t, replicas) })
	}
}

func liveIngestMove(t *testing.T, replicas int) {
	o := newLiveOrg(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	yaml := strings.Replace(ingestMoveYAML, "replicas: 2", fmt.Sprintf("replicas: %d", replicas), 1)
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(yaml), Filename: "im.yaml"}); err != nil {
		t.Fatal(err)
	}
	const moving = "im/events/p0/r0"
	resolve := imResolve(o)
	waitFor(t, 30*time.Second, "the source copies placed and running", func() bool {
		q := o.query(t, "im")
		running := 0
		for _, ti := range q.Tasks {
			if ti.Fragment == "events" && ti.State == states.TaskRunning {
				running++
			}
		}
		return running == replicas
	})
	var notes atomic.Int32
	cl, err := dataplane.NewIngestClient(ctx, dataplane.IngestClientConfig{Query: "im", Source: "events", Producer: "it",
		Resolve: resolve, Conn: func(addr string) (grpc.ClientConnInterface, error) { return o.pool.Conn(addr) },
		Note: func(string) { notes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const records, batch = 6000, 20
	base := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).UnixNano()
	want := map[string]string{}
	sums := map[string][2]int64{}
	var input []string
	for i := range records {
		ns := base + int64(i)*10_000_000
		input = append(input, fmt.Sprintf(`{"time": %d, "user": "u%d", "amount": %d}`, ns, i%7, i%5))
		k := fmt.Sprintf("u%d@%d", i%7, (ns/1_000_000_000+1)*1_000_000_000)
		s := sums[k]
		s[0]++
		s[1] += int64(i % 5)
		sums[k] = s
	}
	for k, s := range sums {
		want[k] = fmt.Sprintf("n=%d total=%d", s[0], s[1])
	}
	moved := make(chan error, 1)
	from := o.task(t, "im", moving).WorkerId
	for i := 0; i < records; i += batch {
		if i == records/3 {
			other := ""
			if replicas > 1 {
				other = o.task(t, "im", "im/events/p0/r1").WorkerId
			}
			to := ""
			for id := range o.workers {
				if id != from && id != other {
					to = id
				}
			}
			go func() {
				_, err := o.admin.MoveTask(ctx, &pb.MoveTaskRequest{TaskId: moving, ToWorker: to})
				moved <- err
			}()
		}
		if i == 2*records/3 {
			// The rest goes only to the moved copy.
			if err := <-moved; err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "the move ended", func() bool {
				ti := o.task(t, "im", moving)
				return ti.MovingFrom == "" && ti.WorkerId != from && ti.Generation == 2
			})
		}
		if err := cl.Send(ctx, []byte(strings.Join(input[i:i+batch], "\n")+"\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.CloseSource(ctx); err != nil {
		t.Fatal(err)
	}
	if res := cl.Result(); res.Accepted != records || !res.Closed || res.Copies != replicas {
		t.Fatalf("client result %+v", res)
	}
	if notes.Load() == 0 {
		t.Fatal("the client never reconnected: the move did not take the source away")
	}
	if n := o.workers[from].Runtime().SnapshotsServed(); n != 1 {
		t.Fatalf("the old worker served %d snapshots, want 1", n)
	}
	for r := range replicas {
		sink := fmt.Sprintf("im/out/p0/r%d", r)
		if got := imResults(t, ctx, o, sink); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("sink %s: %d results, want %d (they differ)", sink, len(got), len(want))
		}
	}
}
