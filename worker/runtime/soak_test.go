package runtime

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// soakQuery: a paced netmon source into a 60 s windowed aggregate with
// group-by and count_distinct, the stateful shape whose memory must not grow.
const soakQuery = `
name: soak
sources:
  - {name: conns, generator: {kind: netmon, monitors: 3, rate: %d, seed: 7}}
operators:
  - {name: per_src, type: aggregate, input: conns, window: {size: 60s},
     group_by: [src], aggregates: {conns: "count()", ports: "count_distinct(port)"}, parallelism: 2}
sinks:
  - {name: out, input: per_src}
`

// BenchmarkAggregateHeapSoak runs the windowed aggregate on steady generated
// input (FEDSTREAM_SOAK, default 10m of wall time at 20,000 records/s) and
// prints the live heap after a GC every 30 s. A flat series is the result;
// nothing is asserted (a timed assertion would flake on shared machines).
//
//	FEDSTREAM_SOAK=10m go test -run '^$' -bench AggregateHeapSoak -benchtime 1x ./worker/runtime/
func BenchmarkAggregateHeapSoak(b *testing.B) {
	d, err := time.ParseDuration(os.Getenv("FEDSTREAM_SOAK"))
	if err != nil || d <= 0 {
		d = 10 * time.Minute
	}
	const rate = 20000
	c := newCluster(b, 2, fmt.Sprintf(soakQuery, rate), func(node string, p, r int) int {
		if node == "conns" {
			return 0
		}
		return 1
	})
	defer c.close(b)
	c.apply()
	// Drain the sink so its ring buffer reaches steady state too.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var results int
	go func() {
		conn, err := c.pool.Conn(c.addrOf("soak/out/p0/r0"))
		if err != nil {
			return
		}
		sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "soak", TaskId: "soak/out/p0/r0"}, "soak-tail", true, 0)
		for ctx.Err() == nil {
			_ = sub.Run(ctx, conn, func(ctx context.Context, bt *dataplane.Batch) error {
				results += len(bt.Tuples)
				return nil
			})
			time.Sleep(10 * time.Millisecond)
		}
	}()
	start := time.Now()
	var first, peak uint64
	for time.Since(start) < d {
		time.Sleep(30 * time.Second)
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if first == 0 {
			first = ms.HeapAlloc
		}
		peak = max(peak, ms.HeapAlloc)
		fmt.Printf("soak t=%4.0fs heap_alloc=%6.1f MiB heap_objects=%d\n", time.Since(start).Seconds(), float64(ms.HeapAlloc)/(1<<20), ms.HeapObjects)
	}
	b.ReportMetric(float64(first)/(1<<20), "MiB-heap-at-30s")
	b.ReportMetric(float64(peak)/(1<<20), "MiB-heap-peak")
	b.ReportMetric(float64(peak)/float64(first), "peak/first")
}
