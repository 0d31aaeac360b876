package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/worker/kafka"
	"github.com/fedstream/fedstream/worker/kafka/kafkatest"
)

// kafkaOrgQuery sums payments per merchant in 1s windows, from a topic of
// two partitions to a topic of three, with two replicas of every task.
const kafkaOrgQuery = `
name: pay
replicas: 2
sources:
  - name: payments
    schema: {time: timestamp, merchant: string, amount: int}
    kafka: {brokers: [%q], topic: payments, partitions: 2}
operators:
  - name: per_merchant
    type: aggregate
    input: payments
    window: {size: 1s}
    group_by: [merchant]
    aggregates: {n: "count()", total: "sum(amount)"}
    parallelism: 2
sinks:
  - name: totals
    input: per_merchant
    kafka: {brokers: [%q], topic: totals}
`

const payEpoch = int64(1_714_564_800_000_000_000)

// payment is record i of partition p; the last one of a partition is an
// hour later than the others, so that their windows all close.
func payment(p, i int) (t int64, merchant string, amount int64) {
	return payEpoch + int64(i)*int64(10*time.Millisecond), fmt.Sprintf("m%d", (i*3+p)%7), int64((i*13 + p) % 50)
}

func payments(p, from, to int, last bool) [][]byte {
	var vs [][]byte
	line := func(t int64, m string, a int64) []byte {
		return fmt.Appendf(nil, `{"time": %d, "merchant": %q, "amount": %d}`, t, m, a)
	}
	for i := from; i < to; i++ {
		vs = append(vs, line(payment(p, i)))
	}
	if last {
		vs = append(vs, line(payEpoch+int64(time.Hour), "closing", 0))
	}
	return vs
}

// TestKafkaQueryWithLiveMoves runs a kafka query in an org over mutual
// TLS and, while payments arrive, moves the source task of Kafka
// partition 0 and then the sink's writing replica with MoveTask. The
// totals topic holds exactly the totals computed from the payments, each
// once.
func TestKafkaQueryWithLiveMoves(t *testing.T) {
	t.Parallel()
	broker := kafkatest.Start(t, map[string]int32{"payments": 2, "totals": 3})
	o := newLiveOrg(t, 3)
	const n = 900
	feed := func(from, to int, last bool) {
		t.Helper()
		for p := range 2 {
			if err := kafkatest.Produce(broker, "payments", int32(p), payments(p, from, to, last)); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := payReference(n)
	results := func() map[string]string { return payTotals(t, broker) }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: fmt.Appendf(nil, kafkaOrgQuery, broker, broker), Filename: "pay.yaml"}); err != nil {
		t.Fatal(err)
	}
	// move moves a task to the worker running no replica of its
	// partition, and waits until the move has ended.
	move := func(id string) {
		t.Helper()
		ti := o.task(t, "pay", id)
		busy := map[string]bool{}
		for _, other := range o.query(t, "pay").Tasks {
			if other.Fragment == ti.Fragment && other.Partition == ti.Partition {
				busy[other.WorkerId] = true
			}
		}
		to := ""
		for w := range o.workers {
			if !busy[w] {
				to = w
			}
		}
		resp, err := o.admin.MoveTask(ctx, &pb.MoveTaskRequest{TaskId: id, ToWorker: to})
		if err != nil {
			t.Fatalf("move %s: %v", id, err)
		}
		waitFor(t, 30*time.Second, "the move of "+id+" ends", func() bool {
			ti := o.task(t, "pay", id)
			return ti.MovingFrom == "" && ti.WorkerId == to && int(ti.Generation) == int(resp.Generation) && ti.State == states.TaskRunning
		})
	}
	feed(0, 300, false)
	waitFor(t, 30*time.Second, "results in the totals topic", func() bool { return len(results()) > 0 })
	move("pay/payments/p0/r0")
	feed(300, 600, false)
	move("pay/totals/p0/r0")
	feed(600, n, true)
	checkTotals(t, broker, want)
}

// payReference computes the totals of payments 0..n-1 of both
// partitions: "window end (ns) merchant" -> "count total".
func payReference(n int) map[string]string {
	type acc struct{ n, total int64 }
	m := map[string]*acc{}
	for p := range 2 {
		for i := range n {
			ts, merchant, amount := payment(p, i)
			k := fmt.Sprintf("%d %s", (ts/int64(time.Second)+1)*int64(time.Second), merchant)
			if m[k] == nil {
				m[k] = &acc{}
			}
			m[k].n++
			m[k].total += amount
		}
	}
	want := map[string]string{}
	for k, a := range m {
		want[k] = fmt.Sprintf("%d %d", a.n, a.total)
	}
	return want
}

// payTotals reads the committed totals, failing on any written twice.
func payTotals(t *testing.T, broker string) map[string]string {
	t.Helper()
	got := map[string]string{}
	ids := map[string]bool{}
	for _, r := range kafkatest.ReadCommitted(t, broker, "totals") {
		id := r.Headers[kafka.HeaderID]
		if ids[id] {
			t.Fatalf("result id %s written twice", id)
		}
		ids[id] = true
		var v struct {
			Merchant  string `json:"merchant"`
			N         int64  `json:"n"`
			Total     int64  `json:"total"`
			WindowEnd string `json:"window_end"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("value %q: %v", r.Value, err)
		}
		end, err := time.Parse(time.RFC3339Nano, v.WindowEnd)
		if err != nil {
			t.Fatal(err)
		}
		k := strconv.FormatInt(end.UnixNano(), 10) + " " + v.Merchant
		if _, dup := got[k]; dup {
			t.Fatalf("result %s written twice", k)
		}
		got[k] = fmt.Sprintf("%d %d", v.N, v.Total)
	}
	return got
}

// checkTotals waits until the totals topic holds every total of want and
// compares them.
func checkTotals(t *testing.T, broker string, want map[string]string) {
	t.Helper()
	var got map[string]string
	waitFor(t, 60*time.Second, "every total in the topic", func() bool { got = payTotals(t, broker); return len(got) >= len(want) })
	if len(got) != len(want) {
		t.Fatalf("%d totals, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("total %s: got %q, want %q", k, got[k], v)
		}
	}
}

// TestKafkaQueryThroughBinary submits a kafka query to an org of real
// processes with the CLI, feeds its topic, moves the sink with
// "fedstream task move", and checks the totals topic against the
// reference: every total, each once.
func TestKafkaQueryThroughBinary(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	broker := kafkatest.Start(t, map[string]int32{"payments": 2, "totals": 3})
	o := startOrg(t, 1, 3)
	o.waitReady(t, 3)
	file := filepath.Join(t.TempDir(), "pay.yaml")
	if err := os.WriteFile(file, fmt.Appendf(nil, kafkaOrgQuery, broker, broker), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var sub struct {
		Tasks int `json:"tasks"`
	}
	if err := cli(ctx, t, &sub, "query", "submit", file, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	const n = 600
	for p := range 2 {
		if err := kafkatest.Produce(broker, "payments", int32(p), payments(p, 0, 300, false)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 60*time.Second, "totals in the topic", func() bool { return len(payTotals(t, broker)) > 0 })
	// Move the writing sink replica to the worker that runs no replica of it.
	var status struct {
		Tasks []struct {
			TaskID   string `json:"id"`
			WorkerID string `json:"worker"`
		} `json:"tasks"`
	}
	if err := cli(ctx, t, &status, "query", "status", "pay", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	busy := map[string]bool{}
	for _, ts := range status.Tasks {
		if strings.HasPrefix(ts.TaskID, "pay/totals/") {
			busy[ts.WorkerID] = true
		}
	}
	ws, err := o.workerList(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	to := ""
	for _, w := range ws {
		if !busy[w.ID] {
			to = w.ID
		}
	}
	var moved map[string]any
	if err := cli(ctx, t, &moved, "task", "move", "pay/totals/p0/r0", "--to", to, "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		if err := kafkatest.Produce(broker, "payments", int32(p), payments(p, 300, n, true)); err != nil {
			t.Fatal(err)
		}
	}
	checkTotals(t, broker, payReference(n))
}

// TestKafkaSinkWorkerLost stops the worker running the sink's writing
// replica while payments arrive: the leader places it again, the new copy
// starts from a snapshot of the other sink replica (which wrote nothing),
// reads back the last committed total and writes the rest. The totals
// topic holds exactly the reference totals, each once.
func TestKafkaSinkWorkerLost(t *testing.T) {
	t.Parallel()
	broker := kafkatest.Start(t, map[string]int32{"payments": 2, "totals": 3})
	o := newLiveOrg(t, 3)
	const n = 900
	feed := func(from, to int, last bool) {
		t.Helper()
		for p := range 2 {
			if err := kafkatest.Produce(broker, "payments", int32(p), payments(p, from, to, last)); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: fmt.Appendf(nil, kafkaOrgQuery, broker, broker), Filename: "pay.yaml"}); err != nil {
		t.Fatal(err)
	}
	const sink = "pay/totals/p0/r0"
	feed(0, 300, false)
	waitFor(t, 30*time.Second, "totals in the topic", func() bool { return len(payTotals(t, broker)) > 0 })
	victim := o.task(t, "pay", sink).WorkerId
	o.cancel[victim]()
	feed(300, 600, false)
	waitFor(t, 60*time.Second, "the sink placed again", func() bool {
		ti := o.task(t, "pay", sink)
		return ti.WorkerId != victim && ti.WorkerId != "" && ti.Generation >= 2 && ti.State == states.TaskRunning
	})
	feed(600, n, true)
	checkTotals(t, broker, payReference(n))
	ti := o.task(t, "pay", sink)
	if rt := o.workers[ti.WorkerId].Runtime(); !rt.StartedFromSnapshot(sink) {
		t.Fatalf("the new copy of %s did not start from its peer's snapshot", sink)
	}
}
