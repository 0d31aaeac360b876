package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// BenchmarkForwardBlob runs blob source (worker 0) -> map (worker 1) ->
// sink (worker 1) with the production boundary interval, and reports the
// rate at which a tail sees the records:
//
//	go test -run '^$' -bench ForwardBlob -cpuprofile /tmp/cpu.out ./worker/runtime/
func BenchmarkForwardBlob(b *testing.B) {
	benchPipeline(b, `
name: %s
replicas: 1
sources:
  - name: records
    generator: {kind: blob, seed: 1, limit: %d, rate: 0}
operators:
  - {name: project, type: map, input: records, fields: {payload: payload}}
sinks:
  - {name: out, input: project}
`, func(node string) int {
		if node == "records" {
			return 0
		}
		return 1
	})
}

// BenchmarkKeyedBlob: blob source and map on worker 0, keyed exchange to a
// 2-partition aggregate and the sink on worker 1 (the shape of the word
// count).
func BenchmarkKeyedBlob(b *testing.B) {
	benchPipeline(b, `
name: %s
replicas: 1
sources:
  - name: records
    generator: {kind: blob, seed: 1, limit: %d, rate: 0, size: 40}
operators:
  - {name: keyed, type: map, input: records, fields: {k: "seq %% 1000", payload: payload}}
  - name: counts
    type: aggregate
    input: keyed
    window: {size: 24h}
    group_by: [k]
    aggregates: {n: "count()"}
    parallelism: 2
sinks:
  - {name: out, input: counts}
`, func(node string) int {
		if node == "records" || node == "keyed" {
			return 0
		}
		return 1
	})
}

func benchPipeline(b *testing.B, yamlFmt string, place func(node string) int) {
	const records = 1_000_000
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool := dataplane.NewPool()
	defer pool.Close()
	var workers []*worker
	for range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		w := &worker{
			rt: New(Options{Logger: log, Pool: pool, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond,
				SinkBufferTuples: 2 * records, Buffer: dataplane.BufferOptions{MaxBytes: 256 << 20, MaxTuples: dataplane.DefaultMaxTuples}}),
			addr: lis.Addr().String(),
			srv:  grpc.NewServer(dataplane.ServerOptions()...),
			done: make(chan struct{}),
		}
		fedstreampb.RegisterDataPlaneServer(w.srv, w.rt.Server())
		go func() { defer close(w.done); _ = w.srv.Serve(lis) }()
		defer w.close(b)
		workers = append(workers, w)
	}
	run := 0
	var total time.Duration
	cpu0 := processCPU()
	for b.Loop() {
		run++
		q, err := queryspec.Parse("q.yaml", fmt.Appendf(nil, yamlFmt, fmt.Sprintf("bench%d", run), records))
		if err != nil {
			b.Fatal(err)
		}
		plan, err := q.FusedPlan()
		if err != nil {
			b.Fatal(err)
		}
		var placements []Placement
		for _, node := range plan.Nodes {
			for p := range node.Partitions {
				placements = append(placements, Placement{TaskID: queryspec.TaskID(q.Name, node.Name, p, 0), Fragment: node.Name,
					Partition: p, WorkerAddr: workers[place(node.Name)].addr})
			}
		}
		specs := make([][]TaskSpec, 2)
		for _, pl := range placements {
			w := place(pl.Fragment)
			specs[w] = append(specs[w], TaskSpec{TaskID: pl.TaskID, Query: q.Name, Fragment: pl.Fragment,
				Partition: pl.Partition, QueryIndex: 1, Spec: q, Placements: placements})
		}
		start := time.Now()
		workers[1].rt.Apply(context.Background(), specs[1])
		workers[0].rt.Apply(context.Background(), specs[0])
		n := tailCount(b, pool, workers[1].addr, q.Name, queryspec.TaskID(q.Name, "out", 0, 0))
		total += time.Since(start)
		if n != records && !strings.Contains(yamlFmt, "aggregate") {
			b.Fatalf("tail counted %d records, want %d", n, records)
		}
		workers[0].rt.Apply(context.Background(), nil)
		workers[1].rt.Apply(context.Background(), nil)
	}
	b.ReportMetric(float64(run*records)/total.Seconds(), "records/s")
	// CPU time per record is steadier than the rate on a shared machine.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(run*records), "cpu-ns/record")
}

// processCPU is the user+system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tailCount reads a result stream until the final boundary and returns the
// number of data tuples.
func tailCount(b *testing.B, pool *dataplane.Pool, addr, query, task string) int {
	n := 0
	tailStream(b, pool, addr, query, task, func(tp *tuple.Tuple) {
		if tp.Type.IsData() {
			n++
		}
	})
	return n
}

// tailTentative reads a result stream until the final boundary and returns
// the number of tentative tuples.
func tailTentative(b *testing.B, pool *dataplane.Pool, addr, query, task string) int {
	n := 0
	tailStream(b, pool, addr, query, task, func(tp *tuple.Tuple) {
		if tp.Type == tuple.Tentative {
			n++
		}
	})
	return n
}

// tailStream reads a result stream until the final boundary, handing each
// tuple to f.
func tailStream(b *testing.B, pool *dataplane.Pool, addr, query, task string, f func(*tuple.Tuple)) {
	conn, err := pool.Conn(addr)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: query, TaskId: task}, "", true, 0)
	for {
		err := sub.Run(ctx, conn, func(ctx context.Context, bt *dataplane.Batch) error {
			for i := range bt.Tuples {
				f(&bt.Tuples[i])
			}
			last := bt.Tuples[len(bt.Tuples)-1]
			bt.Release()
			if last.Type == tuple.Boundary && last.STime == math.MaxInt64 {
				return dataplane.ErrStopSubscription
			}
			return nil
		})
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			b.Fatalf("tail %s: %v", task, err)
		}
		time.Sleep(time.Millisecond)
	}
}
