package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/worker/tuple"
)

// testOrg is an in-process org (one coordinator, two workers, mutual TLS)
// shared by the tests of the client commands in this file.
type testOrg struct {
	fed *devFederation
	f   *clientFlags
}

func startTestOrg(t *testing.T) *testOrg {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an org in process")
	}
	ctx := context.Background()
	fed, err := startDev(ctx, devOptions{org: "edges", coordinators: 1, workers: 2, dataDir: t.TempDir(),
		logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fed.stop)
	o := &testOrg{fed: fed, f: &clientFlags{addr: fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: fed.tlsDir}}}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := fed.waitReady(wctx, o.f, 2); err != nil {
		t.Fatalf("org not ready: %v", err)
	}
	return o
}

// submit submits a query and waits until every task of it runs.
func (o *testOrg) submit(t *testing.T, yaml string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, cctx, done, err := o.f.admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.SubmitQuery(cctx, &pb.SubmitQueryRequest{Yaml: []byte(yaml), Filename: "q.yaml"})
	done()
	if err != nil {
		t.Fatal(err)
	}
	for {
		c, cctx, done, err := o.f.admin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		q, err := c.GetQuery(cctx, &pb.GetQueryRequest{Name: resp.Name})
		done()
		running := err == nil && len(q.Tasks) > 0
		if running {
			for _, task := range q.Tasks {
				running = running && task.State == states.TaskRunning
			}
		}
		if running {
			return resp.Name
		}
		select {
		case <-ctx.Done():
			t.Fatalf("query %s not running: %v %v", resp.Name, err, q)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// run runs one fedstream client command in process against the org.
func (o *testOrg) run(ctx context.Context, stdin string, args ...string) (stdout, stderr string, err error) {
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append(args, "--addr", o.f.addr, "--tls-dir", o.f.tls.dir))
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// runAsync runs a command in the background; wait returns its result.
func (o *testOrg) runAsync(ctx context.Context, stdin string, args ...string) (wait func() (string, string, error)) {
	var (
		wg             sync.WaitGroup
		stdout, stderr string
		err            error
	)
	wg.Add(1)
	go func() { defer wg.Done(); stdout, stderr, err = o.run(ctx, stdin, args...) }()
	return func() (string, string, error) { wg.Wait(); return stdout, stderr, err }
}

const edgesIngestQuery = `
name: edges
replicas: 2
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    ingest: true
operators:
  - name: per_user
    type: aggregate
    input: events
    window: {size: 1m}
    group_by: [user]
    aggregates: {n: "count()", total: "sum(amount)"}
sinks:
  - {name: totals, input: per_user}
  - {name: raw, input: events}
`

// TestTailUnknownQueryOrSink: tail of a query or sink that does not exist
// fails with an error naming it, well before the 8 s given here (before,
// it waited silently: 10 s for a query, forever for a sink in some
// cases; tail returns nil when its context ends, so waiting shows as no
// error).
func TestTailUnknownQueryOrSink(t *testing.T) {
	o := startTestOrg(t)
	o.submit(t, edgesIngestQuery)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tail", "nosuch"}, `no query named "nosuch"`},
		{[]string{"tail", "edges", "--sink", "nosuch"}, `query edges has no sink named "nosuch" (it has: totals, raw)`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		_, _, err := o.run(ctx, "", c.args...)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: error %v, want one saying %q", c.args, err, c.want)
		}
	}
}

// ingestJSON is what ingest --json prints.
type ingestJSON struct {
	Query    string `json:"query"`
	Source   string `json:"source"`
	Lines    int    `json:"lines"`
	Accepted int    `json:"accepted"`
	Refused  []struct {
		Line  int    `json:"line"`
		Error string `json:"error"`
	} `json:"refused"`
	Replicas int  `json:"replicas"`
	Closed   bool `json:"closed"`
}

// tailResult is one line of tail --json.
type tailResult struct {
	Sink   string         `json:"sink"`
	ID     uint64         `json:"id"`
	Type   string         `json:"type"`
	STime  string         `json:"stime"`
	Values map[string]any `json:"values"`
}

func parseTail(t *testing.T, out string) []tailResult {
	t.Helper()
	var rs []tailResult
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r tailResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("tail printed %q: %v", line, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// TestIngestCloseAndTailEnd: with replicas: 2, ingest --json prints JSON
// (it printed text), one bad line is reported by number in it (exit 2),
// and ingest --close reaches both replicas: the last window, which no
// later record closes, is emitted, and tail (on each sink) exits 0 by
// itself at the end. tail --count and --idle end a tail of a running
// query, and a stopped query ends a tail with exit 0.
func TestIngestCloseAndTailEnd(t *testing.T) {
	o := startTestOrg(t)
	o.submit(t, edgesIngestQuery)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	input := strings.Join([]string{
		`{"time": "2024-05-01T12:00:01Z", "user": "ann", "amount": 5}`,
		`{"time": "2024-05-01T12:00:02Z", "user": "bob", "amount": "x"}`,
		`{"time": "2024-05-01T12:00:03Z", "user": "ann", "amount": 7}`,
		`{"time": "2024-05-01T12:01:04Z", "user": "bob", "amount": 1}`,
	}, "\n") + "\n"
	out, _, err := o.run(ctx, input, "ingest", "edges", "events", "--json")
	var exit *exitError
	if !errors.As(err, &exit) || exit.code != 2 {
		t.Fatalf("ingest with a bad line: %v, want exit 2\n%s", err, out)
	}
	var rep ingestJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("ingest --json printed %q: %v", out, err)
	}
	if rep.Query != "edges" || rep.Source != "events" || rep.Lines != 4 || rep.Accepted != 3 || rep.Replicas != 2 || rep.Closed ||
		len(rep.Refused) != 1 || rep.Refused[0].Line != 2 || !strings.Contains(rep.Refused[0].Error, `line 2: field "amount"`) {
		t.Fatalf("ingest --json: %+v", rep)
	}

	// The window of 12:00 is emitted (bob's 12:01 record closed it); the
	// one of 12:01 waits for a later record. --count and --idle end tails.
	out, _, err = o.run(ctx, "", "tail", "edges", "--json", "--count", "1")
	if err != nil {
		t.Fatalf("tail --count 1: %v", err)
	}
	if rs := parseTail(t, out); len(rs) != 1 || rs[0].Values["user"] != "ann" || rs[0].Values["total"] != float64(12) {
		t.Fatalf("tail --count 1 printed %q", out)
	}
	out, errOut, err := o.run(ctx, "", "tail", "edges", "--json", "--idle", "1s")
	if err != nil || len(parseTail(t, out)) != 1 || !strings.Contains(errOut, "no result for 1s") {
		t.Fatalf("tail --idle 1s: %v\n%s%s", err, out, errOut)
	}

	out, _, err = o.run(ctx, "", "ingest", "edges", "events", "--close", "--json")
	if err != nil {
		t.Fatalf("ingest --close: %v", err)
	}
	rep = ingestJSON{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || !rep.Closed || rep.Replicas != 2 || rep.Lines != 0 {
		t.Fatalf("ingest --close --json printed %q (%v)", out, err)
	}
	for _, sink := range []string{"totals", "raw"} {
		out, errOut, err = o.run(ctx, "", "tail", "edges", "--sink", sink, "--json")
		if err != nil {
			t.Fatalf("tail %s after close: %v", sink, err)
		}
		if !strings.Contains(errOut, "ended") {
			t.Errorf("tail %s: stderr %q", sink, errOut)
		}
		rs := parseTail(t, out)
		var got []string
		for _, r := range rs {
			got = append(got, fmt.Sprintf("%v@%v", r.Values["user"], r.Values["time"]))
			if r.Sink != sink {
				t.Errorf("result of sink %q: %+v", sink, r)
			}
		}
		want := []string{"ann@2024-05-01T12:00:01Z", "ann@2024-05-01T12:00:03Z", "bob@2024-05-01T12:01:04Z"}
		if sink == "totals" {
			got = got[:0]
			for _, r := range rs {
				got = append(got, fmt.Sprintf("%v n=%v total=%v end=%v", r.Values["user"], r.Values["n"], r.Values["total"], r.Values["window_end"]))
			}
			want = []string{"ann n=2 total=12 end=2024-05-01T12:01:00Z", "bob n=1 total=1 end=2024-05-01T12:02:00Z"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("tail %s after close: %v, want %v", sink, got, want)
		}
	}
	// Later lines are refused: the source is closed.
	_, _, err = o.run(ctx, `{"time": "2024-05-01T12:05:00Z", "user": "ann", "amount": 1}`+"\n", "ingest", "edges", "events")
	if err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("ingest after close: %v", err)
	}

	// A stopped query ends a tail with exit 0.
	o.submit(t, strings.ReplaceAll(edgesIngestQuery, "name: edges", "name: edges2"))
	wait := o.runAsync(ctx, "", "tail", "edges2", "--sink", "raw")
	c, cctx, done, err := o.f.admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.StopQuery(cctx, &pb.StopQueryRequest{Name: "edges2"})
	done()
	if err != nil {
		t.Fatal(err)
	}
	if _, errOut, err := wait(); err != nil || !strings.Contains(errOut, "stopped") {
		t.Fatalf("tail of a stopped query: %v %q", err, errOut)
	}
}

// TestTailJSONEnvelope: user fields named like the envelope keys (id,
// sink, type, stime) keep their values under "values"; before, the
// envelope overwrote them. NaN and infinities print as strings,
// timestamps as RFC 3339 in UTC, values in schema order.
func TestTailJSONEnvelope(t *testing.T) {
	schema := tuple.NewSchema([]tuple.Field{
		{Name: "id", Kind: tuple.KindString},
		{Name: "sink", Kind: tuple.KindInt},
		{Name: "type", Kind: tuple.KindFloat},
		{Name: "stime", Kind: tuple.KindTimestamp},
		{Name: "a", Kind: tuple.KindFloat},
	})
	tp := &tuple.Tuple{Type: tuple.Stable, ID: 7, STime: 60e9, Values: []tuple.Value{
		tuple.Str("user-id"), tuple.Int(-3), tuple.Float(math.NaN()), tuple.Timestamp(0), tuple.Float(math.Inf(-1)),
	}}
	var b bytes.Buffer
	if err := resultPrinter(&b, true)(tp, schema, "out"); err != nil {
		t.Fatal(err)
	}
	want := `{"sink":"out","id":7,"type":"STABLE","stime":"1970-01-01T00:01:00Z","values":{"id":"user-id","sink":-3,"type":"NaN","stime":"1970-01-01T00:00:00Z","a":"-Inf"}}` + "\n"
	if b.String() != want {
		t.Fatalf("tail --json printed\n%s want\n%s", b.String(), want)
	}
}

// TestExampleCommandsExist: every fedstream command quoted in the
// comments of examples/*.yaml names a real command with its positional
// arguments and only flags it has (the ingest example named a --source
// flag that never existed).
func TestExampleCommandsExist(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("examples: %v %v", files, err)
	}
	seen := 0
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			cmdline, ok := strings.CutPrefix(strings.TrimSpace(strings.TrimPrefix(line, "#")), "fedstream ")
			if !ok || !strings.HasPrefix(line, "#") {
				continue
			}
			seen++
			if i := strings.IndexAny(cmdline, "<|"); i >= 0 {
				cmdline = cmdline[:i]
			}
			words := strings.Fields(cmdline)
			cmd, rest, err := newRootCmd().Find(words)
			if err != nil || !cmd.Runnable() {
				t.Errorf("%s: %q: no such command (%v)", file, line, err)
				continue
			}
			var positional []string
			for _, w := range rest {
				name, isFlag := strings.CutPrefix(w, "--")
				if !isFlag {
					positional = append(positional, w)
					continue
				}
				name, _, _ = strings.Cut(name, "=")
				if cmd.Flags().Lookup(name) == nil {
					t.Errorf("%s: %q: fedstream %s has no flag --%s", file, line, cmd.Name(), name)
				}
			}
			if cmd.Args != nil {
				if err := cmd.Args(cmd, positional); err != nil {
					t.Errorf("%s: %q: %v", file, line, err)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no fedstream command found in the examples' comments")
	}
}
