package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wordsQuery = `
name: wc
replicas: %d
sources:
  - name: lines
    generator: {kind: words, seed: 42, limit: 20000, rate: %d}
operators:
  - name: firsts
    type: map
    input: lines
    fields: {word: "split(line, ' ')[0]", n: "len(split(line, ' '))"}
  - {name: long, type: filter, input: firsts, where: "n > 7"}
  - name: counts
    type: aggregate
    input: long
    window: {size: 2ms}
    group_by: [word]
    aggregates: {cnt: "count()", total: "sum(n)"}
    parallelism: 2
sinks:
  - {name: out, input: counts}
`

// worker is one Runtime serving on its own gRPC server, as a worker would.
type worker struct {
	rt   *Runtime
	addr string
	srv  *grpc.Server
	done chan struct{}
}

func startWorker(t testing.TB, pool *dataplane.Pool) *worker {
	t.Helper()
	return startWorkerOpts(t, pool, Options{BoundaryInterval: time.Millisecond})
}

// startWorkerOpts is startWorker with runtime options (Logger and Pool are
// set here).
func startWorkerOpts(t testing.TB, pool *dataplane.Pool, opts Options) *worker {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	level := slog.LevelWarn
	switch os.Getenv("FEDSTREAM_TEST_LOG") {
	case "info":
		level = slog.LevelInfo
	case "debug":
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	opts.Logger = log
	if opts.Pool == nil {
		opts.Pool = pool
	}
	if opts.Bulk.Listener == nil && !opts.Bulk.Disabled {
		// Snapshots cross over connections of their own, as a worker's do.
		if opts.Bulk.Listener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	w := &worker{
		rt:   New(opts),
		addr: lis.Addr().String(),
		srv:  grpc.NewServer(dataplane.ServerOptions()...),
		done: make(chan struct{}),
	}
	fedstreampb.RegisterDataPlaneServer(w.srv, w.rt.Server())
	go func() { defer close(w.done); _ = w.srv.Serve(lis) }()
	return w
}

func (w *worker) close(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.rt.Close(ctx); err != nil {
		t.Errorf("close runtime: %v", err)
	}
	w.srv.Stop()
	<-w.done
}

// cluster runs a query's tasks on workers; place picks the worker of
// each task.
type cluster struct {
	workers []*worker
	pool    *dataplane.Pool
	query   *queryspec.Query
	specs   map[*worker][]TaskSpec
	// corrected: the sink streams stableReplicas read held tentative
	// output and corrections (failure detection fired on a loaded
	// machine).
	corrected bool
}

func newCluster(t testing.TB, n int, yaml string, place func(node string, partition, replica int) int) *cluster {
	t.Helper()
	q, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return newClusterOpts(t, n, q, place, Options{BoundaryInterval: time.Millisecond})
}

// newClusterOpts is newCluster for a parsed query, with runtime options.
func newClusterOpts(t testing.TB, n int, q *queryspec.Query, place func(node string, partition, replica int) int, opts Options) *cluster {
	t.Helper()
	each := make([]Options, n)
	for i := range each {
		each[i] = opts
	}
	return newClusterEach(t, q, place, each...)
}

// newClusterEach is newClusterOpts with options per worker (one worker
// per Options).
func newClusterEach(t testing.TB, q *queryspec.Query, place func(node string, partition, replica int) int, each ...Options) *cluster {
	t.Helper()
	n := len(each)
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{pool: dataplane.NewPool(), query: q, specs: map[*worker][]TaskSpec{}}
	for _, opts := range each {
		c.workers = append(c.workers, startWorkerOpts(t, c.pool, opts))
	}
	var placements []Placement
	owner := map[string]*worker{}
	for _, node := range plan.Nodes {
		for p := range node.Partitions {
			for r := range q.Replicas {
				w := c.workers[place(node.Name, p, r)%n]
				id := queryspec.TaskID(q.Name, node.Name, p, r)
				placements = append(placements, Placement{TaskID: id, Fragment: node.Name, Partition: p, Replica: r, WorkerAddr: w.addr})
				owner[id] = w
			}
		}
	}
	for _, pl := range placements {
		w := owner[pl.TaskID]
		c.specs[w] = append(c.specs[w], TaskSpec{TaskID: pl.TaskID, Query: q.Name, Fragment: pl.Fragment,
			Partition: pl.Partition, Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements})
	}
	return c
}

func (c *cluster) apply() {
	for _, w := range c.workers {
		w.rt.Apply(context.Background(), c.specs[w])
	}
}

func (c *cluster) close(t testing.TB) {
	for _, w := range c.workers {
		w.close(t)
	}
	if err := c.pool.Close(); err != nil {
		t.Error(err)
	}
}

func (c *cluster) addrOf(taskID string) string {
	for _, specs := range c.specs {
		for _, spec := range specs {
			for _, pl := range spec.Placements {
				if pl.TaskID == taskID {
					return pl.WorkerAddr
				}
			}
		}
	}
	return ""
}

// tailStall is how long tail waits for a sink's stream to advance (a
// tuple with a later stream time than any before) before it gives up;
// tailMax bounds the whole read. A fixed 30 s for the whole stream ran
// out at load 26-44 on two cores while the stream advanced all along
// (TestDCAABothReplicasLostNamesTheLoss's reference, 20,000 records:
// stream time 29-110 s of 200 s read in 30 s; the test process had 1.0 s
// of CPU in 37 s of wall time at load 40). A stream that stops
// advancing, what the deadline is for, still fails after tailStall.
const (
	tailStall = 30 * time.Second
	tailMax   = 5 * time.Minute
)

// tail reads a sink's result stream until its final boundary.
func (c *cluster) tail(t *testing.T, sinkTask string) []tuple.Tuple {
	t.Helper()
	conn, err := c.pool.Conn(c.addrOf(sinkTask))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), tailMax)
	defer cancel()
	var stalled atomic.Bool
	stall := time.AfterFunc(tailStall, func() { stalled.Store(true); cancel() })
	defer stall.Stop()
	advanced := int64(math.MinInt64) // the latest stream time read
	query := c.query.Name
	if q, _, ok := strings.Cut(sinkTask, "/"); ok {
		query = q // the task id names its query (another may share the cluster)
	}
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: query, TaskId: sinkTask}, "", true, 0)
	var out []tuple.Tuple
	for {
		err := sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
			for _, tp := range b.Tuples {
				out = append(out, tp)
				if tp.STime > advanced {
					advanced = tp.STime
					stall.Reset(tailStall)
				}
				if tp.Type == tuple.Boundary && tp.STime == math.MaxInt64 {
					return dataplane.ErrStopSubscription // whatever follows (a REC_DONE)
				}
			}
			return nil
		})
		if err == nil {
			return out
		}
		if ctx.Err() != nil {
			var last tuple.Tuple
			if len(out) > 0 {
				last = out[len(out)-1]
			}
			why := fmt.Sprintf("not at its end after %v", tailMax)
			if stalled.Load() {
				why = fmt.Sprintf("no later stream time for %v", tailStall)
			}
			t.Fatalf("tail %s: %s: %v after %d tuples (the last %v at %d) (states %v) (stats %v)", sinkTask, why, err, len(out), last.Type, last.STime, c.states(), c.stats())
		}
		// The sink may not be started yet: retry.
		time.Sleep(10 * time.Millisecond)
	}
}

// stats is every task's figures (for a failure's message).
func (c *cluster) stats() []string {
	var all []string
	for _, w := range c.workers {
		for _, s := range w.rt.Stats() {
			all = append(all, fmt.Sprintf("%s: in %d out %d queue %d gate %+v", s.TaskID, s.InTuples, s.OutTuples, s.Queue, s.Gate))
		}
	}
	return all
}

func (c *cluster) states() []TaskState {
	var all []TaskState
	for _, w := range c.workers {
		all = append(all, w.rt.States()...)
	}
	return all
}

// reference computes the query's result straight from the generator.
func reference(t *testing.T, rate int) map[string]string {
	t.Helper()
	return referenceOf(t, rate, 20000)
}

// referenceOf is reference for a generator of limit lines.
func referenceOf(t *testing.T, rate, limit int) map[string]string {
	t.Helper()
	return windowedReference(t, rate, int64(limit), []int64{math.MinInt64}, []int64{math.MaxInt64})
}

// results turns sink output into the reference's form.
func results(t *testing.T, out []tuple.Tuple, schema *tuple.Schema) map[string]string {
	t.Helper()
	word, cnt, total, end := schema.Index("word"), schema.Index("cnt"), schema.Index("total"), schema.Index("window_end")
	got := map[string]string{}
	for _, tp := range out {
		if !tp.Type.IsData() {
			continue
		}
		k := fmt.Sprintf("%d/%s", tp.Values[end].I, tp.Values[word].S)
		if _, dup := got[k]; dup {
			t.Fatalf("window %s emitted twice", k)
		}
		got[k] = fmt.Sprintf("cnt=%d total=%d", tp.Values[cnt].I, tp.Values[total].I)
	}
	return got
}

func sinkSchema(t *testing.T, q *queryspec.Query) *tuple.Schema {
	plan, err := q.Plan()
	if err != nil {
		t.Fatal(err)
	}
	return plan.Node("out").Schema
}

// TestQueryAcrossTwoWorkers runs source -> map -> filter (fused into the
// source's fragment) -> keyed aggregate (2 partitions) -> sink spread over
// two runtimes and compares with a reference computed from the generator
// directly.
func TestQueryAcrossTwoWorkers(t *testing.T) {
	c := newCluster(t, 2, fmt.Sprintf(wordsQuery, 1, 0), func(fragment string, p, r int) int {
		return map[string]int{"lines": 0, "counts": p, "out": 1}[fragment]
	})
	defer c.close(t)
	c.apply()
	out := c.tail(t, "wc/out/p0/r0")
	got := results(t, out, sinkSchema(t, c.query))
	want := reference(t, 0)
	sameResults(t, got, want)
	// Ids are consecutive from 1 and stimes never go back.
	for i, tp := range out {
		if tp.ID != uint64(i+1) {
			t.Fatalf("tuple %d has id %d", i, tp.ID)
		}
		if i > 0 && tp.STime < out[i-1].STime {
			t.Fatalf("stime goes back at id %d", tp.ID)
		}
	}
	for _, st := range c.states() {
		if st.State != StateRunning {
			t.Errorf("task %s is %s: %s", st.TaskID, st.State, st.Message)
		}
	}
}

// TestDeterminism: replicas, and independent runs, produce identical sink
// streams tuple for tuple, ids included.
func TestDeterminism(t *testing.T) {
	run := func(replicas int, place func(string, int, int) int) [][]tuple.Tuple {
		c := newCluster(t, 2, fmt.Sprintf(wordsQuery, replicas, 0), place)
		defer c.close(t)
		c.apply()
		var outs [][]tuple.Tuple
		for r := range replicas {
			outs = append(outs, c.tail(t, fmt.Sprintf("wc/out/p0/r%d", r)))
		}
		return outs
	}
	first := run(1, func(string, int, int) int { return 0 })
	// Two replicas, crossing workers at every hop.
	second := run(2, func(node string, p, r int) int { return len(node) + p + r })
	base := first[0]
	for i, out := range second {
		if !sameTuples(base, out) {
			t.Fatalf("replica %d of the second run differs from the first run (%d vs %d tuples)", i, len(out), len(base))
		}
	}
}

func sameTuples(a, b []tuple.Tuple) bool {
	return slices.EqualFunc(a, b, func(x, y tuple.Tuple) bool {
		return x.Type == y.Type && x.ID == y.ID && x.STime == y.STime && slices.Equal(x.Values, y.Values)
	})
}

// TestInputFailover stops the upstream replica a task reads from; the task
// resubscribes to the other replica, resuming after the last id, and the
// result is still exact (no loss, no duplicates).
func TestInputFailover(t *testing.T) {
	// The stop must land mid-stream for the task to have to switch. On a
	// loaded machine the test may be descheduled until the paced source
	// has finished; such a run exercised no failover and is repeated
	// (the check compares ids, not timings).
	for attempt := 1; ; attempt++ {
		if inputFailover(t) {
			return
		}
		if attempt == 5 {
			t.Fatal("the stop landed after the end of the stream in 5 runs")
		}
		t.Logf("run %d: the source had finished before it was stopped; again", attempt)
	}
}

// inputFailover runs TestInputFailover once; it reports false, having
// checked nothing about failover, when the stopped source replica had
// already produced its whole stream.
func inputFailover(t *testing.T) bool {
	// Replica r of every node on worker r, but the sources on workers 2
	// and 3 so that one can be stopped alone. The source is paced (20k
	// records at 40k/s) so the stop lands mid-stream.
	c := newCluster(t, 4, fmt.Sprintf(wordsQuery, 2, 40000), func(node string, p, r int) int {
		if node == "lines" {
			return 2 + r
		}
		return r
	})
	defer c.close(t)
	c.apply()
	victim := c.workers[2]
	// Wait until the source replica 0 has produced a part of its stream.
	deadline := time.Now().Add(20 * time.Second)
	var src *task
	for {
		src = victim.rt.task("wc/lines/p0/r0")
		if src != nil && src.outs[0].buf.Stats().LastID > 2000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("source never got going")
		}
		time.Sleep(2 * time.Millisecond)
	}
	victim.rt.Apply(context.Background(), nil)
	stoppedAt := src.outs[0].buf.Stats().LastID
	out := c.tail(t, "wc/out/p0/r0")
	got := results(t, out, sinkSchema(t, c.query))
	want := reference(t, 40000)
	sameResults(t, got, want)
	if other := c.tail(t, "wc/out/p0/r1"); !sameTuples(out, other) {
		t.Fatal("replicas differ after failover")
	}
	// Both source replicas produce the same ids: the surviving one's last
	// is the end of the stream.
	survivor := c.workers[3].rt.task("wc/lines/p0/r1")
	if survivor == nil {
		t.Fatal("source replica 1 is gone")
	}
	if end := survivor.outs[0].buf.Stats().LastID; stoppedAt >= end {
		return false
	}
	// The aggregate replica 0 read the stopped source replica and switched
	// to the other one: its figures count that.
	switches := uint64(0)
	for _, s := range c.workers[0].rt.Stats() {
		switches += s.Switches
	}
	if switches == 0 {
		t.Errorf("no subscription switch counted after the upstream replica stopped at id %d", stoppedAt)
	}
	return true
}

// TestUnknownStreamAndFailedTask: a stream nobody produces is NotFound,
// and a task that cannot be built is reported failed with the reason.
func TestUnknownStreamAndFailedTask(t *testing.T) {
	pool := dataplane.NewPool()
	defer pool.Close()
	w := startWorker(t, pool)
	defer w.close(t)
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	w.rt.Apply(context.Background(), []TaskSpec{{TaskID: "wc/nope/p0/r0", Query: "wc", Fragment: "nope", QueryIndex: 1, Spec: q}})
	st := w.rt.States()
	if len(st) != 1 || st[0].State != StateFailed || !strings.Contains(st[0].Message, `no fragment "nope"`) {
		t.Fatalf("states %+v", st)
	}
	conn, err := pool.Conn(w.addr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dataplane.Subscribe(context.Background(), conn, &fedstreampb.StreamRef{Query: "wc", TaskId: "wc/lines/p0/r0", Consumer: "firsts"}, 0, "x",
		func(context.Context, *dataplane.Batch) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Fatalf("subscribe to unknown stream: %v", err)
	}
	w.rt.Apply(context.Background(), nil)
	if len(w.rt.States()) != 0 {
		t.Fatal("task not removed")
	}
}

const ingestQuery = `
name: ing
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    ingest: true
sinks:
  - {name: out, input: events}
`

// TestIngest: good lines are accepted, bad and late ones are reported by
// line number, and a boundary follows each request.
func TestIngest(t *testing.T) {
	c := newCluster(t, 1, ingestQuery, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	conn, err := c.pool.Conn(c.workers[0].addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Ingest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []*fedstreampb.IngestRequest{
		{Query: "ing", Source: "events", FirstLine: 1, Lines: []byte(
			`{"time": 1000, "user": "a", "amount": 5}` + "\n" +
				`{"time": 2000, "user": "b", "amount": "x"}` + "\n" +
				`{"time": 3000, "user": "c", "amount": 7}` + "\n")},
		{FirstLine: 4, Lines: []byte(
			`{"time": 2500, "user": "late", "amount": 1}` + "\n" +
				`{"time": 4000, "user": "d", "amount": 9}`)},
	}
	for _, r := range reqs {
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Accepted != 3 || len(resp.Errors) != 2 || resp.Errors[0].Line != 2 || resp.Errors[1].Line != 4 ||
		!strings.Contains(resp.Errors[1].Error, "late") {
		t.Fatalf("response %+v", resp)
	}

	// The sink, with a single input, passes the source's stream through as
	// it is: every accepted line in order, then the boundary at the last
	// stime (4000).
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "ing", TaskId: "ing/out/p0/r0"}, "", true, 0)
	var users []string
	var lastBoundary int64
	err = sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
		for _, tp := range b.Tuples {
			if tp.Type.IsData() {
				users = append(users, tp.Values[1].S)
			} else if tp.Type == tuple.Boundary {
				lastBoundary = tp.STime
			}
		}
		if lastBoundary >= 4000 {
			return dataplane.ErrStopSubscription
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(users, []string{"a", "c", "d"}) {
		t.Fatalf("sink released %v", users)
	}

	// Unknown source.
	stream, err = fedstreampb.NewDataPlaneClient(conn).Ingest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&fedstreampb.IngestRequest{Query: "ing", Source: "nope", Lines: []byte("{}")})
	if _, err := stream.CloseAndRecv(); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Fatalf("ingest to unknown source: %v", err)
	}
}

// TestCloseStopsBlockedTasks: a runtime whose outputs nobody reads (its
// source blocks on a full buffer) still closes promptly.
func TestCloseStopsBlockedTasks(t *testing.T) {
	pool := dataplane.NewPool()
	defer pool.Close()
	w := startWorker(t, pool)
	w.rt.opts.Buffer = dataplane.BufferOptions{MaxTuples: 100}
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	id := "wc/lines/p0/r0"
	w.rt.Apply(context.Background(), []TaskSpec{{TaskID: id, Query: "wc", Fragment: "lines", QueryIndex: 1, Spec: q}})
	deadline := time.Now().Add(10 * time.Second)
	// The source's fragment feeds the keyed aggregate's partitions; whichever
	// buffer fills first blocks it.
	blocked := func() bool {
		for _, o := range w.rt.task(id).outs {
			if o.buf.Stats().BlockedAppends > 0 {
				return true
			}
		}
		return false
	}
	for !blocked() {
		if time.Now().After(deadline) {
			t.Fatalf("source never blocked: %+v", w.rt.States())
		}
		time.Sleep(time.Millisecond)
	}
	w.close(t)
	if st := w.rt.States(); len(st) != 0 {
		t.Fatalf("states after close: %+v", st)
	}
}

// TestUpstreamMoves: the source task moves to another worker mid-stream;
// Apply with the new placements makes the downstream resubscribe there and
// resume after the last id, so the result stays exact.
func TestUpstreamMoves(t *testing.T) {
	c := newCluster(t, 3, fmt.Sprintf(wordsQuery, 1, 20000), func(node string, p, r int) int {
		if node == "lines" {
			return 0
		}
		return 1
	})
	defer c.close(t)
	c.apply()
	old, dest := c.workers[0], c.workers[2]
	const id = "wc/lines/p0/r0"
	deadline := time.Now().Add(20 * time.Second)
	for {
		if tk := old.rt.task(id); tk != nil && tk.outs[0].buf.Stats().LastID > 2000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("source never got going")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Move: start it on dest, tell the others, stop it on the old worker.
	var moved []TaskSpec
	for _, s := range c.specs[c.workers[1]] {
		pls := slices.Clone(s.Placements)
		for i := range pls {
			if pls[i].TaskID == id {
				pls[i].WorkerAddr = dest.addr
			}
		}
		s.Placements = pls
		moved = append(moved, s)
	}
	src := c.specs[old][0]
	src.Placements = moved[0].Placements
	dest.rt.Apply(context.Background(), []TaskSpec{src})
	c.workers[1].rt.Apply(context.Background(), moved)
	c.specs[c.workers[1]] = moved
	// firsts and long run in the source's fragment: the aggregate reads it.
	counts := c.workers[1].rt.task("wc/counts/p0/r0")
	waitUntil(t, "counts resubscribed to the new location", func() bool {
		in := counts.inputs[0]
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.cancelCur != nil && in.current.WorkerAddr == dest.addr
	})
	old.rt.Apply(context.Background(), nil)

	got := results(t, c.tail(t, "wc/out/p0/r0"), sinkSchema(t, c.query))
	want := reference(t, 20000)
	sameResults(t, got, want)
}

// sameResults fails unless the sink's rows equal the reference's.
func sameResults(t *testing.T, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d result rows, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("window/word %s: got %q, want %q", k, got[k], v)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitUntilOr(t, what, cond, nil)
}

// waitUntilOr is waitUntil calling onTimeout (when not nil) before it
// fails: to log what the test waited on.
func waitUntilOr(t *testing.T, what string, cond func() bool, onTimeout func()) {
	t.Helper()
	// Generous: on a loaded 2-core machine (load 8-15) a condition that
	// holds within 3 s on a quiet one has been seen to need over 20 s.
	// Only a failing test waits this long.
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			if onTimeout != nil {
				onTimeout()
			}
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
