package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// walkLimit bounds the example's generator so that the walk's stream
// ends (20 s of stream time at the example's 2000 lines/s: twenty
// one-second windows of about a thousand words each) and the tail with
// it, at the sink's final boundary.
const walkLimit = 40000

// walkQuery is examples/wordcount.yaml as the README's walk runs it,
// with replicas and a name of the test's and the generator bounded.
func walkQuery(t *testing.T, name string, replicas int) string {
	t.Helper()
	b, err := os.ReadFile("../examples/wordcount.yaml")
	if err != nil {
		t.Fatal(err)
	}
	q := string(b)
	for _, r := range [][2]string{
		{"name: wordcount\n", "name: " + name + "\n"},
		{"replicas: 1\n", fmt.Sprintf("replicas: %d\n", replicas)},
		{"generator: {kind: words, rate: 2000, seed: 42}", fmt.Sprintf("generator: {kind: words, rate: 2000, seed: 42, limit: %d}", walkLimit)},
	} {
		if !strings.Contains(q, r[0]) {
			t.Fatalf("examples/wordcount.yaml no longer has %q: update the walk (this test and the README's) with it", r[0])
		}
		q = strings.Replace(q, r[0], r[1], 1)
	}
	return q
}

// wordcountReference computes, straight from the generator of a word
// count query (walkQuery's shape: lines split into lower-case words,
// counted per word and tumbling window of one second), what a run left
// alone prints, keyed "window_end/word" (window_end as tail --json
// prints it).
func wordcountReference(t *testing.T, queryYAML string) map[string]int64 {
	t.Helper()
	q, err := queryspec.Parse("ref.yaml", []byte(queryYAML))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := source.NewGenerator(q.Sources[0].Gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	line := gen.Schema().Index("line")
	out := map[string]int64{}
	var tup tuple.Tuple
	for gen.Next(&tup) {
		end := (tup.STime/int64(time.Second) + 1) * int64(time.Second)
		w := time.Unix(0, end).UTC().Format(time.RFC3339Nano)
		for _, word := range strings.Fields(strings.ToLower(tup.Values[line].S)) {
			out[w+"/"+word]++
		}
	}
	return out
}

// TestWordCountWalk is the README's walk ("Moving work by hand") made
// repeatable: the example word count (two replicas) on an org of
// processes like examples/org (three coordinators, three workers), with
// `fedstream tail --json` open the whole time, scaled 2 -> 4 -> 1
// partitions with `fedstream query scale`, a partition moved with
// `fedstream task move` by worker name, then the worker running the
// sink replica the tail reads killed with SIGKILL. Every count the tail
// prints equals, window by window and word by word, a run left alone;
// no result is printed twice, ids only grow, and the tail ends by itself
// at the sink's end.
func TestWordCountWalk(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	for _, replicas := range []int{2, 1} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			t.Parallel()
			wordCountWalk(t, replicas)
		})
	}
}

// wordCountWalk is TestWordCountWalk with the query's replicas. With one
// replica the kill -9 loses the state of the killed worker's tasks: the
// windows open at the kill may come out short, every other one must be
// exact, and the tail, whose sink copy started again without state, says
// so and goes on with that copy's results (before, it printed nothing
// until the new copy's ids passed its old position, then went on with
// every window in between skipped).
func wordCountWalk(t *testing.T, replicas int) {
	query := walkQuery(t, "wc", replicas)
	want := wordcountReference(t, query)
	o := startOrg(t, 3, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	o.waitReady(t, 3)
	file := filepath.Join(t.TempDir(), "wc.yaml")
	if err := os.WriteFile(file, []byte(query), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(out any, args ...string) error {
		cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
		defer ccancel()
		return cli(cctx, t, out, append(args, "--addr", o.grpc[0], "--token", o.adminToken)...)
	}
	if err := run(&struct{}{}, "query", "submit", file); err != nil {
		t.Fatal(err)
	}
	tail := command(ctx, t, "tail", "wc", "--json", "--addr", o.grpc[0], "--token", o.adminToken)
	stdout, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	tailErr := &lockedBuffer{}
	tail.Stderr = tailErr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tail.Process.Kill(); _ = tail.Wait() })

	type task struct {
		ID         string `json:"id"`
		Worker     string `json:"worker"`
		State      string `json:"state"`
		Generation int    `json:"generation"`
		MovingFrom string `json:"moving_from"`
	}
	tasks := func() (map[string]task, error) {
		var q struct {
			Tasks []task `json:"tasks"`
		}
		if err := run(&q, "query", "status", "wc"); err != nil {
			return nil, err
		}
		m := map[string]task{}
		for _, tk := range q.Tasks {
			m[tk.ID] = tk
		}
		return m, nil
	}
	workerName := func(id string) (string, *proc, error) {
		ws, err := o.workerList(t, 0)
		if err != nil {
			return "", nil, err
		}
		for _, w := range ws {
			if w.ID != id {
				continue
			}
			for i, p := range o.workers {
				if strings.Contains(p.out.String(), "worker="+id) {
					return fmt.Sprintf("w%d", i+1), p, nil
				}
			}
		}
		return "", nil, fmt.Errorf("no process for worker %s", id)
	}

	// The walk, one step after the other, in the background while the
	// tail reads: started once results flow, each step waits for the
	// one before to have taken effect.
	const sink, moving, peer = "wc/word_counts/p0/r0", "wc/counts/p0/r0", "wc/counts/p0/r1"
	var (
		mu      sync.Mutex
		steps   []string
		walkErr error
		killed  string
	)
	note := func(s string) { mu.Lock(); steps = append(steps, s); mu.Unlock() }
	var printed atomic.Int64
	started := make(chan struct{})
	walked := make(chan struct{})
	go func() {
		defer close(walked)
		select {
		case <-started:
		case <-ctx.Done():
			return
		}
		walkErr = func() error {
			for _, p := range []int{4, 1} {
				var res struct {
					Partitions int `json:"partitions"`
				}
				if err := run(&res, "query", "scale", "wc", "--operator", "counts", "--parallelism", fmt.Sprint(p)); err != nil {
					return err
				}
				if res.Partitions != p {
					return fmt.Errorf("query scale --parallelism %d printed %d partitions", p, res.Partitions)
				}
				note(fmt.Sprintf("scaled to %d", p))
			}
			ts, err := tasks()
			if err != nil {
				return err
			}
			// Move the partition's replica 0 to the worker that runs
			// neither replica, named as a newcomer names it.
			busy := map[string]bool{ts[moving].Worker: true, ts[peer].Worker: true}
			ws, err := o.workerList(t, 0)
			if err != nil {
				return err
			}
			to := ""
			for _, w := range ws {
				if !busy[w.ID] {
					to = w.ID
				}
			}
			name, _, err := workerName(to)
			if err != nil {
				return err
			}
			if err := run(&struct{}{}, "task", "move", moving, "--to", name); err != nil {
				return err
			}
			for {
				ts, err := tasks()
				if err != nil {
					return err
				}
				if tk := ts[moving]; tk.Worker == to && tk.MovingFrom == "" && tk.State == "running" {
					break
				}
				if ctx.Err() != nil {
					return fmt.Errorf("the move of %s to %s did not end", moving, name)
				}
				time.Sleep(100 * time.Millisecond)
			}
			note("moved " + moving + " to " + name)
			// kill -9 the worker of the sink replica the tail reads,
			// once a third of the windows came (with one replica, a tail
			// that waited for the new copy's ids to pass its position
			// would skip as many).
			for printed.Load() < int64(len(want)/3) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				time.Sleep(20 * time.Millisecond)
			}
			victim, p, err := workerName(ts[sink].Worker)
			if err != nil {
				return err
			}
			p.kill()
			mu.Lock()
			killed = ts[sink].Worker
			mu.Unlock()
			note("killed " + victim)
			return nil
		}()
	}()

	// Read the tail to its end: every result once, ids growing.
	got := map[string]int64{}
	var lastID uint64
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var r struct {
			ID     uint64 `json:"id"`
			Type   string `json:"type"`
			Values struct {
				Word      string `json:"word"`
				Count     int64  `json:"count"`
				WindowEnd string `json:"window_end"`
			} `json:"values"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("tail printed a line that is not JSON: %q", sc.Text())
		}
		if r.Type != "STABLE" {
			continue // tentative results and corrections are allowed; the stable ones must be exact
		}
		k := r.Values.WindowEnd + "/" + r.Values.Word
		if replicas > 1 {
			// With one replica the restarted sink numbers from 1 again
			// and may give again a result the killed copy had produced.
			if r.ID <= lastID {
				t.Fatalf("tail printed id %d after id %d", r.ID, lastID)
			}
			if _, dup := got[k]; dup {
				t.Fatalf("tail printed %s twice", k)
			}
		}
		lastID = r.ID
		got[k] = r.Values.Count
		if printed.Add(1) == int64(len(want)/10) {
			close(started)
		}
	}
	if err := tail.Wait(); err != nil {
		t.Fatalf("tail: %v\n%s", err, tailErr.String())
	}
	if !strings.Contains(tailErr.String(), "sink ended") {
		t.Errorf("the tail ended without saying the sink ended: %q", tailErr.String())
	}
	<-walked
	mu.Lock()
	defer mu.Unlock()
	if walkErr != nil {
		t.Fatalf("the walk failed after %v: %v", steps, walkErr)
	}
	if killed == "" {
		t.Fatalf("the stream ended after only %v: the walk would prove nothing", steps)
	}
	t.Logf("walk: %v", steps)

	missing, wrong := 0, 0
	differ := map[string]int{} // window -> keys missing or wrong
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing++
		case g != v:
			wrong++
		default:
			continue
		}
		differ[k[:strings.IndexByte(k, '/')]]++
		if replicas > 1 && wrong+missing <= 5 {
			t.Errorf("window/word %s: count %d (printed %v), want %d", k, g, ok, v)
		}
	}
	if replicas > 1 && (missing > 0 || wrong > 0 || len(got) != len(want)) {
		t.Fatalf("tail printed %d counts, want %d: %d missing, %d differ", len(got), len(want), missing, wrong)
	}
	if replicas == 1 {
		// Only the windows open at the kill may differ: the aggregate's
		// and the sink's (one or two windows behind the source).
		if len(differ) > 3 {
			t.Fatalf("%d windows differ from a run left alone (%v), want at most the 3 open at the kill: the tail skipped results", len(differ), differ)
		}
		if !strings.Contains(tailErr.String(), "started again without the state") {
			t.Fatalf("the tail did not say its sink copy started again without state: %q", tailErr.String())
		}
		t.Logf("windows open at the kill, short: %v", differ)
	}

	// The replicas on the killed worker were placed again and started
	// from their live peers' snapshots (not replayed).
	ts, err := tasks()
	if err != nil {
		t.Fatal(err)
	}
	if tk := ts[sink]; tk.Worker == killed || tk.Generation < 2 {
		t.Fatalf("the sink replica on the killed worker was not placed again: %+v", tk)
	}
	n := 0
	for id := range ts {
		if strings.HasPrefix(id, "wc/counts/") {
			n++
		}
	}
	if n != replicas {
		t.Fatalf("%d tasks of counts after scaling to 1 partition, want %d (one per replica)", n, replicas)
	}
	if replicas == 1 {
		return // no peer to bootstrap from
	}
	_, repl, err := workerName(ts[sink].Worker)
	if err != nil {
		t.Fatal(err)
	}
	bootstrapped := false
	for _, l := range strings.Split(repl.out.String(), "\n") {
		if strings.Contains(l, "task bootstraps from a snapshot") && strings.Contains(l, "task="+sink+" ") {
			bootstrapped = true
		}
	}
	if !bootstrapped {
		t.Fatalf("the replacement of %s did not log a bootstrap from its peer", sink)
	}
}
