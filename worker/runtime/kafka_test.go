package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/kafka"
	"github.com/fedstream/fedstream/worker/kafka/kafkatest"
)

// kafkaQuery reads two partitions of "events", counts and sums per user
// in 1s windows, and writes the results to "results".
const kafkaQuery = `
name: kq
replicas: %d
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    kafka: {brokers: [%q], topic: events, partitions: 2}
operators:
  - name: per_user
    type: aggregate
    input: events
    window: {size: 1s}
    group_by: [user]
    aggregates: {n: "count()", total: "sum(amount)"}
    parallelism: 2
sinks:
  - name: out
    input: per_user
    kafka: {brokers: [%q], topic: results}
`

const kafkaEpoch = int64(1_714_564_800_000_000_000) // 2024-05-01T12:00:00Z

// kafkaEvent is record i of partition p: deterministic, 10ms apart.
type kafkaEvent struct {
	time   int64
	user   string
	amount int64
}

func eventOf(p, i int) kafkaEvent {
	return kafkaEvent{time: kafkaEpoch + int64(i)*int64(10*time.Millisecond), user: fmt.Sprintf("u%d", (i*7+p)%13), amount: int64((i*31 + p) % 100)}
}

// closing is the record that ends the test's stream on partition p: far
// later than every event, so the windows of the events are all emitted.
func closing(p int) kafkaEvent {
	return kafkaEvent{time: kafkaEpoch + int64(time.Hour), user: fmt.Sprintf("end%d", p)}
}

func (e kafkaEvent) json() []byte {
	return fmt.Appendf(nil, `{"time": %q, "user": %q, "amount": %d}`, time.Unix(0, e.time).UTC().Format(time.RFC3339Nano), e.user, e.amount)
}

// kafkaReference computes the expected results of kafkaQuery for events
// 0..n-1 of both partitions, independently of the engine: "window_end
// user" -> "n total".
func kafkaReference(n int) map[string]string {
	type acc struct{ n, total int64 }
	m := map[string]*acc{}
	for p := range 2 {
		for i := range n {
			e := eventOf(p, i)
			end := (e.time/int64(time.Second) + 1) * int64(time.Second)
			k := time.Unix(0, end).UTC().Format(time.RFC3339Nano) + " " + e.user
			if m[k] == nil {
				m[k] = &acc{}
			}
			m[k].n++
			m[k].total += e.amount
		}
	}
	out := map[string]string{}
	for k, a := range m {
		out[k] = fmt.Sprintf("%d %d", a.n, a.total)
	}
	return out
}

func startKafka(t *testing.T) string {
	return kafkatest.Start(t, map[string]int32{"events": 2, "results": 3})
}

// produce writes events from..to-1 of partition p (and the closing record
// when end is set).
func produce(t *testing.T, broker string, p, from, to int, end bool) {
	t.Helper()
	if err := kafkatest.Produce(broker, "events", int32(p), eventValues(p, from, to, end)); err != nil {
		t.Error(err)
	}
}

func eventValues(p, from, to int, end bool) [][]byte {
	var vs [][]byte
	for i := from; i < to; i++ {
		vs = append(vs, eventOf(p, i).json())
	}
	if end {
		vs = append(vs, closing(p).json())
	}
	return vs
}

// sinkRecord is one committed record of the results topic.
type sinkRecord struct {
	id    uint64
	key   string
	value map[string]any
}

// readResults reads every committed record of the results topic.
func readResults(t *testing.T, broker string) []sinkRecord {
	t.Helper()
	var out []sinkRecord
	for _, r := range kafkatest.ReadCommitted(t, broker, "results") {
		rec := sinkRecord{key: string(r.Key)}
		rec.id, _ = strconv.ParseUint(r.Headers[kafka.HeaderID], 10, 64)
		if err := json.Unmarshal(r.Value, &rec.value); err != nil {
			t.Errorf("result value %q: %v", r.Value, err)
		}
		out = append(out, rec)
	}
	return out
}

// checkKafkaResults compares the results topic with the reference: every
// result exactly once (by id and by content), keyed by its user.
func checkKafkaResults(t *testing.T, recs []sinkRecord, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	ids := map[uint64]bool{}
	for _, r := range recs {
		if ids[r.id] {
			t.Fatalf("result id %d written twice", r.id)
		}
		ids[r.id] = true
		user, _ := r.value["user"].(string)
		if want := fmt.Sprintf(`{"user":%q}`, user); r.key != want {
			t.Fatalf("result key %q, want %q", r.key, want)
		}
		k := fmt.Sprintf("%v %s", r.value["window_end"], user)
		if _, dup := got[k]; dup {
			t.Fatalf("result %s written twice", k)
		}
		got[k] = fmt.Sprintf("%v %v", r.value["n"], r.value["total"])
	}
	if len(got) != len(want) {
		var missing []string
		for k := range want {
			if _, ok := got[k]; !ok {
				missing = append(missing, k)
			}
		}
		sort.Strings(missing)
		t.Fatalf("got %d results, want %d (missing e.g. %v)", len(got), len(want), missing[:min(3, len(missing))])
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("result %s: got %q, want %q", k, got[k], v)
		}
	}
}

// waitResults waits until the results topic holds n records.
func waitResults(t *testing.T, broker string, n int) []sinkRecord {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		recs := readResults(t, broker)
		if len(recs) >= n || time.Now().After(deadline) {
			return recs
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func kafkaCluster(t *testing.T, broker string, replicas, workers int, place func(node string, partition, replica int) int) *cluster {
	t.Helper()
	q, err := queryspec.Parse("kq.yaml", fmt.Appendf(nil, kafkaQuery, replicas, broker, broker))
	if err != nil {
		t.Fatal(err)
	}
	return newClusterOpts(t, workers, q, place, Options{BoundaryInterval: time.Millisecond})
}

// TestKafkaQueryExactResults reads a topic through an aggregate into a
// kafka sink with two replicas of every task: the results topic holds
// exactly the reference results, each once, although both sink replicas
// produce them.
func TestKafkaQueryExactResults(t *testing.T) {
	broker := startKafka(t)
	const n = 600
	for p := range 2 {
		produce(t, broker, p, 0, n, true)
	}
	c := kafkaCluster(t, broker, 2, 2, func(_ string, p, r int) int { return p + r })
	defer c.close(t)
	c.apply()
	want := kafkaReference(n)
	recs := waitResults(t, broker, len(want))
	checkKafkaResults(t, recs, want)
	// Both replicas produced every result; only replica 0 wrote.
	for _, id := range []string{"kq/out/p0/r0", "kq/out/p0/r1"} {
		w := c.workers[0]
		if w.rt.task(id) == nil {
			w = c.workers[1]
		}
		waitUntil(t, id+" produced every result", func() bool { return w.rt.task(id).outs[0].buf.Stats().LastID > uint64(len(want)) })
		if (w.rt.task(id).kafkaOut != nil) != strings.HasSuffix(id, "r0") {
			t.Fatalf("%s writes to Kafka: %v", id, w.rt.task(id).kafkaOut != nil)
		}
	}
	checkKafkaResults(t, readResults(t, broker), want)
}

// kafkaSinkTask is the writing copy of the query's sink.
const kafkaSinkTask = "kq/out/p0/r0"

func writtenBy(w *worker, id string) uint64 {
	if tk := w.rt.task(id); tk != nil && tk.kafkaOut != nil {
		return tk.kafkaOut.written.Load()
	}
	return 0
}

// TestKafkaSinkRestartWritesNothingTwice stops the sink with a
// stop-and-copy snapshot taken while its writer was held back, lets the
// old copy write what the snapshot holds unwritten, and starts the sink on
// another worker from that snapshot: the copy holds again results that
// are already in Kafka, reads back the last one committed and writes only
// what follows. Every result is in the topic exactly once.
func TestKafkaSinkRestartWritesNothingTwice(t *testing.T) {
	broker := startKafka(t)
	const n, half = 600, 300
	for p := range 2 {
		produce(t, broker, p, 0, half, false)
	}
	c := kafkaCluster(t, broker, 1, 2, func(string, int, int) int { return 0 })
	defer c.close(t)
	from, to := c.workers[0], c.workers[1]
	var holding atomic.Bool
	held := make(chan struct{})
	var heldOnce sync.Once
	release := make(chan struct{})
	from.rt.kafkaBeforeWrite = func(ctx context.Context) {
		if holding.Load() {
			heldOnce.Do(func() { close(held) })
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	}
	c.apply()
	waitUntil(t, "the sink wrote results", func() bool { return writtenBy(from, kafkaSinkTask) > 20 })
	holding.Store(true)
	for p := range 2 {
		produce(t, broker, p, half, half+100, false)
	}
	// A write already past the hook when holding began still lands: count
	// from the first write that is held, or the snapshot may find every
	// result already written.
	waitUntil(t, "a write held back", func() bool { return isClosed(held) })
	before := writtenBy(from, kafkaSinkTask)
	buf := from.rt.task(kafkaSinkTask).outs[0].buf
	waitUntil(t, "results wait to be written", func() bool { return buf.Stats().LastID > before+20 })
	snap, err := from.rt.SnapshotTask(context.Background(), kafkaSinkTask, SnapshotOptions{Halt: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Outputs[0].TailOffs) == 0 {
		t.Fatal("the snapshot holds no unwritten results")
	}
	last := snap.Outputs[0].LastID
	close(release)
	waitUntil(t, "the old copy wrote what the snapshot holds", func() bool { return writtenBy(from, kafkaSinkTask) >= last })
	dec := reencoded(t, snap)
	committed := uint64(0)
	for _, r := range readResults(t, broker) {
		committed = max(committed, r.id)
	}
	c.moveTask(t, kafkaSinkTask, from, to, dec)
	waitUntil(t, "the new copy read back the last committed result", func() bool { return writtenBy(to, kafkaSinkTask) >= committed })
	for p := range 2 {
		produce(t, broker, p, half+100, n, true)
	}
	want := kafkaReference(n)
	checkKafkaResults(t, waitResults(t, broker, len(want)), want)
	noLossReported(t, to)
}

// TestKafkaSinkStopsBehindKafka stops the sink, from a stop-and-copy
// snapshot, while its writer is held back with results not yet written:
// the old copy writes nothing more, and the copy started from the
// snapshot writes those results, each once, continuing exactly after the
// position the old writer had reached (whose last ids are boundaries, not
// results: no loss is reported).
func TestKafkaSinkStopsBehindKafka(t *testing.T) {
	broker := startKafka(t)
	const n, half = 600, 300
	for p := range 2 {
		produce(t, broker, p, 0, half, false)
	}
	c := kafkaCluster(t, broker, 1, 2, func(string, int, int) int { return 0 })
	defer c.close(t)
	from, to := c.workers[0], c.workers[1]
	var holding atomic.Bool
	held := make(chan struct{})
	var heldOnce sync.Once
	from.rt.kafkaBeforeWrite = func(ctx context.Context) {
		if holding.Load() {
			heldOnce.Do(func() { close(held) })
			<-ctx.Done() // held until the copy stops
		}
	}
	c.apply()
	waitUntil(t, "the sink wrote results", func() bool { return writtenBy(from, kafkaSinkTask) > 20 })
	holding.Store(true)
	for p := range 2 {
		produce(t, broker, p, half, half+100, false)
	}
	waitUntil(t, "a write held back", func() bool { return isClosed(held) }) // see TestKafkaSinkRestartWritesNothingTwice
	before := writtenBy(from, kafkaSinkTask)
	buf := from.rt.task(kafkaSinkTask).outs[0].buf
	waitUntil(t, "results wait to be written", func() bool { return buf.Stats().LastID > before+20 })
	snap, err := from.rt.SnapshotTask(context.Background(), kafkaSinkTask, SnapshotOptions{Halt: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Outputs[0].TailOffs) == 0 {
		t.Fatal("the snapshot holds no unwritten results")
	}
	c.moveTask(t, kafkaSinkTask, from, to, snap)
	for p := range 2 {
		produce(t, broker, p, half+100, n, true)
	}
	want := kafkaReference(n)
	checkKafkaResults(t, waitResults(t, broker, len(want)), want)
	noLossReported(t, to)
}

// TestKafkaSourceMovesBeforeItsFirstRecord moves kafka source tasks that
// start at the end of their partitions (start: latest), or at an offset,
// before any record arrives: the snapshot names that offset, not the
// beginning of the partition, so the new copy does not read the records
// before it, which the old copy never emitted.
func TestKafkaSourceMovesBeforeItsFirstRecord(t *testing.T) {
	for _, start := range []string{"latest", "50"} {
		t.Run(start, func(t *testing.T) {
			broker := startKafka(t)
			const n, old = 400, 50
			for p := range 2 {
				produce(t, broker, p, 0, old, false) // offsets 0..49: before the start
			}
			yaml := strings.Replace(fmt.Sprintf(kafkaQuery, 1, broker, broker), "partitions: 2}", "partitions: 2, start: "+start+"}", 1)
			q, err := queryspec.Parse("kq.yaml", []byte(yaml))
			if err != nil {
				t.Fatal(err)
			}
			c := newClusterOpts(t, 2, q, func(string, int, int) int { return 0 }, Options{BoundaryInterval: time.Millisecond})
			defer c.close(t)
			c.apply()
			from, to := c.workers[0], c.workers[1]
			for p := range 2 {
				id := fmt.Sprintf("kq/events/p%d/r0", p)
				waitUntil(t, id+" knows where it starts", func() bool {
					_, err := from.rt.SnapshotTask(context.Background(), id, SnapshotOptions{})
					return err == nil
				})
				c.move(t, id, from, to, false)
				if got := to.rt.task(id).genRestore.records; got != old {
					t.Fatalf("%s resumed at offset %d, want %d", id, got, old)
				}
			}
			for p := range 2 {
				produce(t, broker, p, 0, n, true)
			}
			want := kafkaReference(n)
			checkKafkaResults(t, waitResults(t, broker, len(want)), want)
		})
	}
}

// TestKafkaSinkDuplicateCopiesWriteOnce runs a second copy of the sink,
// started from a snapshot of the first while the first goes on writing,
// and feeds both for a while: each one's start fences the other (they
// share the transactional id) and resumes after the last committed
// result. The topic holds every result exactly once.
func TestKafkaSinkDuplicateCopiesWriteOnce(t *testing.T) {
	broker := startKafka(t)
	const n, half = 900, 300
	for p := range 2 {
		produce(t, broker, p, 0, half, false)
	}
	c := kafkaCluster(t, broker, 1, 2, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	from, to := c.workers[0], c.workers[1]
	waitUntil(t, "the sink wrote results", func() bool { return writtenBy(from, kafkaSinkTask) > 20 })

	// The duplicate: generation 2 on the other worker, bootstrapped from
	// a live (not halted) snapshot of the running copy, which stays.
	var dup TaskSpec
	for _, s := range c.specs[from] {
		if s.TaskID == kafkaSinkTask {
			dup = s
		}
	}
	dup.Generation = 2
	dup.Bootstrap = &SnapshotSource{WorkerAddr: from.addr, TaskID: kafkaSinkTask, Generation: 1}
	c.specs[to] = append(c.specs[to], dup)
	to.rt.Apply(context.Background(), c.specs[to])
	if tk := to.rt.task(kafkaSinkTask); tk == nil || !tk.restored {
		t.Fatalf("the duplicate did not start from a snapshot (states %v)", c.states())
	}
	// Both copies run and write while the rest arrives in small pieces.
	for i := half; i < n; i += 50 {
		for p := range 2 {
			produce(t, broker, p, i, min(i+50, n), i+50 >= n)
		}
	}
	want := kafkaReference(n)
	waitUntil(t, "both copies produced every result", func() bool {
		a, b := from.rt.task(kafkaSinkTask), to.rt.task(kafkaSinkTask)
		return a.outs[0].buf.Stats().LastID > uint64(len(want)) && b.outs[0].buf.Stats().LastID > uint64(len(want))
	})
	// The old copy goes (as at the end of a move); the duplicate stays.
	oldWrites := from.rt.task(kafkaSinkTask).kafkaOut.writes.Load()
	c.specs[from] = slicesDeleteTask(c.specs[from], kafkaSinkTask)
	from.rt.Apply(context.Background(), c.specs[from])
	checkKafkaResults(t, waitResults(t, broker, len(want)), want)
	t.Logf("transactions committed: first copy %d, duplicate %d", oldWrites, to.rt.task(kafkaSinkTask).kafkaOut.writes.Load())
	noLossReported(t, to)
}

// noLossReported fails if the sink on w found ids missing from its
// stream that Kafka does not have: boundaries the old copy had passed are
// not results.
func noLossReported(t *testing.T, w *worker) {
	t.Helper()
	if n := w.rt.task(kafkaSinkTask).kafkaOut.gaps.Load(); n != 0 {
		t.Fatalf("the sink reported %d possible losses (%s)", n, w.rt.task(kafkaSinkTask).State().Message)
	}
}

func slicesDeleteTask(specs []TaskSpec, id string) []TaskSpec {
	var out []TaskSpec
	for _, s := range specs {
		if s.TaskID != id {
			out = append(out, s)
		}
	}
	return out
}

// TestKafkaSourceMovesLive moves a kafka source task while records
// arrive: the new copy starts from the old one's snapshot, reads from the
// offset after the last record the old copy emitted, and continues its
// stream. Every record is counted exactly once, and the sink's stream is
// identical, tuple for tuple, to an unmoved run's.
func TestKafkaSourceMovesLive(t *testing.T) {
	const n, half = 800, 300
	const moving = "kq/events/p0/r0"
	run := func(move bool) []sinkRecord {
		broker := startKafka(t)
		for p := range 2 {
			produce(t, broker, p, 0, half, false)
		}
		c := kafkaCluster(t, broker, 1, 2, func(string, int, int) int { return 0 })
		defer c.close(t)
		c.apply()
		from, to := c.workers[0], c.workers[1]
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := half; i < n; i += 25 {
				for p := range 2 {
					produce(t, broker, p, i, min(i+25, n), i+25 >= n)
				}
				time.Sleep(5 * time.Millisecond) // pacing, not synchronisation
			}
		}()
		// Each record is followed by a boundary (records are 10ms
		// apart): move once the second half is flowing.
		waitUntil(t, "the source emitted records", func() bool {
			tk := from.rt.task(moving)
			return tk != nil && tk.outs[0].buf.Stats().LastID > 2*(half+50)
		})
		if move {
			c.move(t, moving, from, to, false)
			tk := to.rt.task(moving)
			if tk == nil || !tk.restored || tk.genRestore == nil || tk.genRestore.records == 0 {
				t.Error("the new copy of the source did not start from a snapshot's offset")
			} else {
				t.Logf("the new copy resumed at offset %d", tk.genRestore.records)
			}
		}
		<-done
		want := kafkaReference(n)
		recs := waitResults(t, broker, len(want))
		checkKafkaResults(t, recs, want)
		return recs
	}
	moved, unmoved := run(true), run(false)
	byID := func(rs []sinkRecord) map[uint64]string {
		m := map[uint64]string{}
		for _, r := range rs {
			b, _ := json.Marshal(r.value)
			m[r.id] = string(b)
		}
		return m
	}
	a, b := byID(moved), byID(unmoved)
	for id, v := range b {
		if a[id] != v {
			t.Fatalf("result %d: moved run %s, unmoved run %s", id, a[id], v)
		}
	}
}

// TestKafkaSinkBackpressure runs the query with buffers far smaller than
// what it produces: the sink's result stream holds each result until
// Kafka has committed it, and the sink waits instead of dropping any.
// The sink reads a keyed aggregate, so it merges and renumbers whatever
// the aggregate's parallelism (a keyed fragment can be rescaled, so its
// consumers never pass one partition's batches through).
func TestKafkaSinkBackpressure(t *testing.T) {
	for _, parallelism := range []int{1, 2} {
		t.Run(fmt.Sprintf("aggregate_partitions_%d", parallelism), func(t *testing.T) {
			broker := startKafka(t)
			const n = 600
			for p := range 2 {
				produce(t, broker, p, 0, n, true)
			}
			yaml := strings.Replace(fmt.Sprintf(kafkaQuery, 1, broker, broker), "parallelism: 2\n", fmt.Sprintf("parallelism: %d\n", parallelism), 1)
			q, err := queryspec.Parse("kq.yaml", []byte(yaml))
			if err != nil {
				t.Fatal(err)
			}
			c := newClusterOpts(t, 1, q, func(string, int, int) int { return 0 },
				Options{BoundaryInterval: time.Millisecond, SinkBufferTuples: 16, Buffer: dataplane.BufferOptions{MaxTuples: 64}})
			defer c.close(t)
			c.apply()
			if pass := c.workers[0].rt.task(kafkaSinkTask).passThrough; pass {
				t.Fatalf("pass-through sink %v with %d aggregate partitions", pass, parallelism)
			}
			want := kafkaReference(n)
			checkKafkaResults(t, waitResults(t, broker, len(want)), want)
			if st := c.workers[0].rt.task(kafkaSinkTask).outs[0].buf.Stats(); st.Overrun != 0 {
				t.Fatalf("the sink's stream overran %d results", st.Overrun)
			}
		})
	}
}

// TestKafkaMissingTopics: a source or a sink whose topic does not exist
// says so in its task's message instead of waiting in silence.
func TestKafkaMissingTopics(t *testing.T) {
	broker := kafkatest.Start(t, map[string]int32{"other": 1})
	c := kafkaCluster(t, broker, 1, 1, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	for _, id := range []string{"kq/events/p0/r0", kafkaSinkTask} {
		topic := "events"
		if id == kafkaSinkTask {
			topic = "results"
		}
		waitUntil(t, id+" reports its missing topic", func() bool {
			st := c.workers[0].rt.task(id).State()
			return st.State == StateRunning && strings.Contains(st.Message, "kafka") && strings.Contains(st.Message, topic)
		})
		t.Log(c.workers[0].rt.task(id).State().Message)
	}
}

// isClosed reports whether ch is closed, without blocking.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
