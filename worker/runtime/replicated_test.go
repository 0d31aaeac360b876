package runtime

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// replicatedRun configures a run of the examples' word count and netmon
// queries with replicas: 2.
type replicatedRun struct {
	// streamTime is how much stream time the generators produce: each
	// gets limit rate*streamTime.
	streamTime time.Duration
	// speedup runs the generators this many times faster than their rate
	// (stimes, and results, are unchanged).
	speedup int
	// buffer bounds each output buffer (zero: the defaults).
	buffer dataplane.BufferOptions
	// quiet is how long a sink may produce nothing before the run fails
	// as stalled.
	quiet time.Duration
}

// exampleQuery reads an example query and gives it replicas and a
// generator limit of streamTime at its rate.
func exampleQuery(t testing.TB, file string, replicas int, streamTime time.Duration) *queryspec.Query {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", file))
	if err != nil {
		t.Fatal(err)
	}
	q, err := queryspec.Parse(file, data)
	if err != nil {
		t.Fatal(err)
	}
	q.Replicas = replicas
	g := q.Sources[0].Gen
	g.Limit = int64(float64(g.Rate) * streamTime.Seconds())
	return q
}

// runQuery runs q on two workers, replica r of every task on worker r (as
// the org places them), and returns the data tuples of every sink replica
// once its final boundary arrived. It fails when a sink produces nothing
// for run.quiet, or when any buffer overran.
func runQuery(t *testing.T, q *queryspec.Query, run replicatedRun) [][]tuple.Tuple {
	t.Helper()
	opts := Options{BoundaryInterval: 50 * time.Millisecond, SourceSpeedup: run.speedup, Buffer: run.buffer, StallAfter: 5 * time.Second}
	c := newClusterOpts(t, 2, q, func(node string, p, r int) int { return r }, opts)
	defer c.close(t)
	c.apply()
	sink := q.Sinks[0].Name
	outs := make([][]tuple.Tuple, max(1, q.Replicas))
	errs := make([]error, len(outs))
	var wg sync.WaitGroup
	for r := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[r], errs[r] = tailQuietly(c, queryspec.TaskID(q.Name, sink, 0, r), run.quiet)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s replica %d: %v (tasks %+v)", q.Name, r, err, c.states())
		}
	}
	// No buffer discarded what a subscriber had not taken.
	for _, w := range c.workers {
		for _, st := range w.rt.States() {
			tk := w.rt.task(st.TaskID)
			for _, o := range tk.outs {
				if bs := o.buf.Stats(); bs.Overrun > 0 && tk.node.Kind != queryspec.KindSink {
					// Who held it now (the worker's log names, when it
					// happened, the subscriber that missed the tuples).
					t.Errorf("%s: output to %s[%d] overran %d tuples (now: last id %d, %d subscribers, %d connected, %d expected ones never came; laggard %q acked %d, connected %v)",
						st.TaskID, o.consumer, o.partition, bs.Overrun, bs.LastID, bs.Subscribers, bs.Connected, bs.Missing, bs.Laggard, bs.LaggardAck, bs.LaggardConnected)
				}
			}
		}
	}
	return outs
}

// tailQuietly reads a sink's result stream until its final boundary, and
// gives up when nothing arrives for quiet (the query stalled).
func tailQuietly(c *cluster, sinkTask string, quiet time.Duration) ([]tuple.Tuple, error) {
	conn, err := c.pool.Conn(c.addrOf(sinkTask))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu   sync.Mutex
		last = time.Now()
		out  []tuple.Tuple
		done bool
	)
	go func() {
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			mu.Lock()
			idle := time.Since(last)
			mu.Unlock()
			if idle > quiet {
				cancel()
			}
		}
	}()
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: c.query.Name, TaskId: sinkTask}, "", true, 0)
	for ctx.Err() == nil && !done {
		_ = sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			last = time.Now()
			for _, tp := range b.Tuples {
				// The final results: a replicated query runs DCAA, and
				// a replica that took an input for failed may have sent
				// tentative results and their corrections meanwhile.
				if tp.Type == tuple.Stable {
					tp.Values = slices.Clone(tp.Values)
					out = append(out, tp)
				}
			}
			if l := b.Tuples[len(b.Tuples)-1]; l.Type == tuple.Boundary && l.STime == math.MaxInt64 {
				done = true
				return dataplane.ErrStopSubscription
			}
			return nil
		})
		if !done {
			time.Sleep(10 * time.Millisecond) // the sink may not be started yet
		}
	}
	if !done {
		return nil, fmt.Errorf("no result for %s after %d rows: the query stalled", quiet, len(out))
	}
	return out, nil
}

// wordCountReference computes examples/wordcount.yaml's result straight
// from its generator: "window_end/word" -> count.
func wordCountReference(t *testing.T, q *queryspec.Query) map[string]int64 {
	t.Helper()
	gen, err := source.NewGenerator(q.Sources[0].Gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	ref := map[string]int64{}
	var tp tuple.Tuple
	for gen.Next(&tp) {
		end := (tp.STime/int64(time.Second) + 1) * int64(time.Second)
		for _, w := range strings.Fields(strings.ToLower(tp.Values[0].S)) {
			ref[fmt.Sprintf("%d/%s", end, w)]++
		}
	}
	return ref
}

// checkWordCount compares a word count sink's rows with the reference and
// returns the number of windows checked.
func checkWordCount(t *testing.T, q *queryspec.Query, out []tuple.Tuple, ref map[string]int64) int {
	t.Helper()
	plan, err := q.Plan()
	if err != nil {
		t.Fatal(err)
	}
	s := plan.Node(q.Sinks[0].Name).Schema
	word, count, end := s.Index("word"), s.Index("count"), s.Index("window_end")
	got := map[string]int64{}
	windows := map[int64]bool{}
	for _, tp := range out {
		k := fmt.Sprintf("%d/%s", tp.Values[end].I, tp.Values[word].S)
		if _, dup := got[k]; dup {
			t.Fatalf("word count: row %s emitted twice", k)
		}
		got[k] = tp.Values[count].I
		windows[tp.Values[end].I] = true
	}
	if len(got) != len(ref) {
		t.Fatalf("word count: %d rows, want %d (%d windows)", len(got), len(ref), len(windows))
	}
	for k, v := range ref {
		if got[k] != v {
			t.Fatalf("word count: %s = %d, want %d", k, got[k], v)
		}
	}
	return len(windows)
}

// rows formats data tuples as sorted strings (stime and values).
func rows(out []tuple.Tuple) []string {
	var r []string
	for _, tp := range out {
		r = append(r, fmt.Sprintf("%d %v", tp.STime, tp.Values))
	}
	slices.Sort(r)
	return r
}

// checkNetmon compares a netmon sink's rows with the reference run's and
// returns the number of windows checked (distinct result stimes).
func checkNetmon(t *testing.T, out, ref []tuple.Tuple, streamTime time.Duration) int {
	t.Helper()
	got, want := rows(out), rows(ref)
	if !slices.Equal(got, want) {
		t.Fatalf("netmon: %d alert rows differ from the reference's %d", len(got), len(want))
	}
	windows := map[int64]bool{}
	for _, tp := range ref {
		windows[tp.STime] = true
	}
	// Every minute of stream time has alerts (the generator's scanners
	// probe all the time).
	if minutes := int(streamTime / time.Minute); len(windows) < minutes {
		t.Fatalf("netmon: alerts in %d windows, want %d", len(windows), minutes)
	}
	return len(windows)
}

// testReplicated runs word count and netmon with replicas: 2 side by side
// and checks every window of every sink replica.
func testReplicated(t *testing.T, run replicatedRun) {
	t.Run("wordcount", func(t *testing.T) {
		t.Parallel()
		q := exampleQuery(t, "wordcount.yaml", 2, run.streamTime)
		outs := runQuery(t, q, run)
		ref := wordCountReference(t, q)
		for r, out := range outs {
			t.Logf("wordcount replica %d: %d rows in %d windows, every one exact (%s of stream time)", r, len(out), checkWordCount(t, q, out, ref), run.streamTime)
		}
	})
	t.Run("netmon", func(t *testing.T) {
		t.Parallel()
		q := exampleQuery(t, "netmon.yaml", 2, run.streamTime)
		outs := runQuery(t, q, run)
		// The reference: the same query with one replica, as fast as it
		// goes (stimes do not depend on pacing).
		refRun := run
		refRun.speedup = 1 << 20
		ref := runQuery(t, exampleQuery(t, "netmon.yaml", 1, run.streamTime), refRun)[0]
		for r, out := range outs {
			t.Logf("netmon replica %d: %d alert rows in %d windows, every one exact (%s of stream time)", r, len(out), checkNetmon(t, out, ref, run.streamTime), run.streamTime)
		}
	})
}

// TestReplicatedQueriesNeverStall runs 2 minutes of stream time of the
// examples' word count and netmon with replicas: 2 (generators sped up,
// small buffers so that every buffer fills and trims many times) and
// checks every window of both sink replicas. Before acknowledgements were
// relayed to every upstream replica, each buffer waited for a second
// subscriber that never came, filled, and blocked its source for good.
func TestReplicatedQueriesNeverStall(t *testing.T) {
	testReplicated(t, replicatedRun{
		streamTime: 2 * time.Minute,
		speedup:    40,
		buffer:     dataplane.BufferOptions{MaxTuples: 8 << 10},
		quiet:      60 * time.Second,
	})
}

// TestReplicatedSoak is TestReplicatedQueriesNeverStall at the examples'
// own rates in real time, with the default buffers, for FEDSTREAM_SOAK of
// wall time (e.g. 10m); skipped without it.
//
//	FEDSTREAM_SOAK=10m go test -run ReplicatedSoak -timeout 30m -v ./worker/runtime/
func TestReplicatedSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("FEDSTREAM_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set FEDSTREAM_SOAK to a duration (e.g. 10m) to run the replicated soak")
	}
	testReplicated(t, replicatedRun{streamTime: d, speedup: 1, quiet: 2 * time.Minute})
}

// TestStalledTaskReportsWhy: a source whose consumer is connected but
// never acknowledges blocks on its full output buffer; after StallAfter
// it is reported stalled with the consumer and the subscriber that holds
// it, and running again once the subscriber acknowledges. Before, it
// showed running throughout.
func TestStalledTaskReportsWhy(t *testing.T) {
	pool := dataplane.NewPool()
	defer pool.Close()
	w := startWorkerOpts(t, pool, Options{BoundaryInterval: time.Millisecond, StallAfter: 300 * time.Millisecond,
		Buffer: dataplane.BufferOptions{MaxTuples: 100}})
	defer w.close(t)
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	const id = "wc/lines/p0/r0"
	w.rt.Apply(context.Background(), []TaskSpec{{TaskID: id, Query: "wc", Fragment: "lines", QueryIndex: 1, Spec: q}})
	conn, err := pool.Conn(w.addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The source feeds both partitions of counts; hold partition 0 with a
	// subscriber that reads and does not acknowledge, drain partition 1.
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: &fedstreampb.StreamRef{Query: "wc", TaskId: id, Consumer: "counts"}, Subscriber: "idle-consumer"}); err != nil {
		t.Fatal(err)
	}
	last := make(chan uint64, 1)
	go func() {
		for {
			b, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case <-last:
			default:
			}
			last <- b.LastId
		}
	}()
	drain := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "wc", TaskId: id, Consumer: "counts", Partition: 1}, "drain", false, 0)
	go func() { _ = drain.Run(ctx, conn, func(context.Context, *dataplane.Batch) error { return nil }) }()

	state := func() TaskState {
		for _, st := range w.rt.States() {
			if st.TaskID == id {
				return st
			}
		}
		return TaskState{}
	}
	waitUntil(t, "the source reported stalled", func() bool { return state().State == StateStalled })
	st := state()
	for _, want := range []string{"output blocked", "consumer counts partition 0", "subscriber idle-consumer (connected) has not acknowledged since id 0"} {
		if !strings.Contains(st.Message, want) {
			t.Fatalf("reason %q lacks %q", st.Message, want)
		}
	}
	// The consumer acknowledges what it got: the source moves again.
	go func() {
		for {
			select {
			case id := <-last:
				if stream.Send(&fedstreampb.SubscribeRequest{AckId: id}) != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	waitUntil(t, "the source running again", func() bool { return state().State == StateRunning })
}

// TestIdleTasksAreNotStalled: a paced source with little to send, and
// downstream tasks whose input brings nothing new, stay running.
func TestIdleTasksAreNotStalled(t *testing.T) {
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(wordsQuery, 1, 5)))
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterOpts(t, 1, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: time.Second, StallAfter: 100 * time.Millisecond})
	defer c.close(t)
	c.apply()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		for _, st := range c.states() {
			if st.State == StateStalled {
				t.Fatalf("%s reported stalled: %s", st.TaskID, st.Message)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOverrunShowsInTaskStatus: a consumer that went away for good (its
// lease ended) does not hold the source back past the buffer bound and
// the grace; the source keeps running and its status says which output
// overruns. (Within its lease, the consumer of a query without replicas
// holds the source back: TestUnreplicatedConsumerAwayIsWaitedFor.)
func TestOverrunShowsInTaskStatus(t *testing.T) {
	tk, _, _, _ := sourceWithConsumerAway(t, dataplane.BufferOptions{MaxTuples: 100, OverrunGrace: 100 * time.Millisecond, Lease: 300 * time.Millisecond})
	waitUntil(t, "the source's status tells of the overrun", func() bool {
		st := tk.State()
		return st.State == StateRunning && strings.Contains(st.Message, "consumer counts partition 0 overruns")
	})
	if n := tk.outs[0].buf.Stats().Overrun; n == 0 {
		t.Fatal("no overrun counted")
	}
}

// TestDCAAInputsRecycleBatches: the operator tasks of a replicated query
// (DCAA machines) hand the batches their inputs decoded back to the
// decoder's pool once their tuples are released, as the stable merge of an
// unreplicated query does: most batches are decoded into recycled arrays.
// Before, the machine copied the tuples it kept and never handed a batch
// back, so every batch its inputs decoded was allocated afresh.
func TestDCAAInputsRecycleBatches(t *testing.T) {
	q := exampleQuery(t, "netmon.yaml", 2, 20*time.Second)
	batches0, fresh0 := dataplane.DecodeStats()
	outs := runQuery(t, q, replicatedRun{streamTime: 20 * time.Second, speedup: 1 << 20, quiet: 60 * time.Second})
	batches, fresh := dataplane.DecodeStats()
	batches, fresh = batches-batches0, fresh-fresh0
	for r, out := range outs {
		if len(out) == 0 {
			t.Fatalf("replica %d: no results", r)
		}
	}
	t.Logf("%d batches decoded into tuple arrays, %d of them into fresh arrays", batches, fresh)
	if batches < 100 {
		t.Fatalf("only %d batches decoded: the run is too short to tell", batches)
	}
	if fresh*2 > batches {
		t.Errorf("%d of %d decoded batches needed fresh arrays: the DCAA inputs do not hand their batches back", fresh, batches)
	}
}
