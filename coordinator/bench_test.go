package coordinator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// medianFsync measures the machine's fsync latency in dir: the baseline
// every commit-latency figure is divided by, measured in the same run.
func medianFsync(b *testing.B, dir string, n int) time.Duration {
	f, err := os.Create(filepath.Join(dir, "fsync-probe"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	var lat []time.Duration
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	return median(lat)
}

func median(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// BenchmarkCommitLatency reports the median latency of one committed Raft
// write (a worker status change through the leader) as a multiple of the
// median fsync latency of the same disk.
func BenchmarkCommitLatency(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			c := newTestCluster(b, n, "", "")
			l := c.leader()
			srv := c.nodes[l]
			resp, err := c.workers(l).Register(ctxT(b, 5*time.Second), &pb.RegisterRequest{Addr: "127.0.0.1:9", Cores: 1, IdempotencyKey: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			fsyncMedian := medianFsync(b, c.cfgs[l].DataDir, 200)
			const writes = 300
			b.ResetTimer()
			var lat []time.Duration
			for i := 0; i < b.N; i++ {
				for j := 0; j < writes; j++ {
					status := statusReady
					if j%2 == 0 {
						status = statusDown
					}
					start := time.Now()
					res, err := srv.apply(context.Background(), fsm.SetWorkerStatusType, fsm.SetWorkerStatusRequest{WorkerID: resp.WorkerId, Status: status})
					if err != nil || res.Err != nil {
						b.Fatal(err, res)
					}
					lat = append(lat, time.Since(start))
				}
			}
			b.StopTimer()
			m := median(lat)
			b.ReportMetric(float64(m.Microseconds()), "commit-µs")
			b.ReportMetric(float64(fsyncMedian.Microseconds()), "fsync-µs")
			b.ReportMetric(float64(m)/float64(fsyncMedian), "commit/fsync")
		})
	}
}

// BenchmarkRegister1000Workers times registering 1,000 workers (16 at a
// time) with a 3-node cluster, and reports it per registration as a
// multiple of fsync latency.
func BenchmarkRegister1000Workers(b *testing.B) {
	c := newTestCluster(b, 3, "", "")
	l := c.leader()
	fsyncMedian := medianFsync(b, c.cfgs[l].DataDir, 200)
	client := c.workers(l)
	b.ResetTimer()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		registerWorkers(b, client, 1000, fmt.Sprintf("run%d", i))
		total += time.Since(start)
	}
	b.StopTimer()
	per := total / time.Duration(b.N)
	b.ReportMetric(per.Seconds(), "s/1000-workers")
	b.ReportMetric(float64(per/1000)/float64(fsyncMedian), "per-register/fsync")
}

func registerWorkers(b *testing.B, client pb.WorkerServiceClient, n int, prefix string) []string {
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := client.Register(context.Background(), &pb.RegisterRequest{
				Addr: fmt.Sprintf("127.0.0.1:%d", 10000+i), Cores: 1, Name: fmt.Sprintf("%s-w%d", prefix, i),
				IdempotencyKey: fmt.Sprintf("%s-%d", prefix, i),
			})
			if err != nil {
				b.Error(err)
				return
			}
			ids[i] = resp.WorkerId
		}(i)
	}
	wg.Wait()
	return ids
}

// fanoutQuery has (64+63+64+63+1) fragments x 5 replicas = 1,275 tasks, so
// that placing it touches every one of 1,000 workers. Neighbouring filters
// differ in parallelism so that none is fused into its upstream's fragment.
const fanoutQuery = `name: fanout
replicas: 5
sources:
  - {name: s, parallelism: 64, generator: {kind: words, rate: 1, seed: 1}}
operators:
  - {name: a, type: filter, input: s, where: "true", parallelism: 63}
  - {name: b, type: filter, input: a, where: "true", parallelism: 64}
  - {name: c, type: filter, input: b, where: "true", parallelism: 63}
sinks:
  - {name: out, input: c}
`

// BenchmarkPlacementFanout times how long one placement change (a query
// whose tasks land on every worker) takes to reach 1,000 workers blocked in
// WatchAssignments, measured from the submit call to the last watcher
// waking with the new index. Reported as a multiple of fsync latency.
func BenchmarkPlacementFanout(b *testing.B) {
	// The 1,000 workers are simulated and never heartbeat: a TTL longer
	// than the run keeps them ready.
	tm := testTimings()
	tm.HeartbeatTTL = 10 * time.Minute
	c := newTestClusterWith(b, 3, "", "", tm)
	l := c.leader()
	fsyncMedian := medianFsync(b, c.cfgs[l].DataDir, 200)
	ids := registerWorkers(b, c.workers(l), 1000, "fan")
	// Watchers use a follower, as a real deployment spreads them.
	f := (l + 1) % 3
	watch := c.workers(f)
	b.ResetTimer()
	var total, submitted time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if i > 0 {
			if _, err := c.admin(l).StopQuery(context.Background(), &pb.StopQueryRequest{Name: "fanout"}); err != nil {
				b.Fatal(err)
			}
		}
		// Each watcher first learns its current index, then blocks past it.
		start := make(chan struct{})
		var ready, woke sync.WaitGroup
		var mu sync.Mutex
		var last time.Time
		for _, id := range ids {
			ready.Add(1)
			woke.Add(1)
			go func(id string) {
				defer woke.Done()
				cur, err := watch.WatchAssignments(context.Background(), &pb.WatchAssignmentsRequest{WorkerId: id, MaxWaitMs: 1})
				ready.Done()
				if err != nil {
					b.Error(err)
					return
				}
				<-start
				// Like a real worker: a poll that hits its max wait unchanged is re-issued.
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				for {
					resp, err := watch.WatchAssignments(ctx, &pb.WatchAssignmentsRequest{WorkerId: id, MinIndex: cur.Index, MaxWaitMs: 60000})
					if err != nil {
						b.Errorf("watch %s: %v", id, err)
						return
					}
					if resp.Index > cur.Index {
						break
					}
				}
				mu.Lock()
				if t := time.Now(); t.After(last) {
					last = t
				}
				mu.Unlock()
			}(id)
		}
		ready.Wait()
		close(start)
		// Give the blocked calls a moment to reach the server.
		time.Sleep(500 * time.Millisecond)
		b.StartTimer()
		t0 := time.Now()
		if _, err := c.admin(l).SubmitQuery(context.Background(), &pb.SubmitQueryRequest{Yaml: []byte(fanoutQuery), Filename: "fanout.yaml"}); err != nil {
			b.Fatal(err)
		}
		submitted += time.Since(t0)
		woke.Wait()
		total += last.Sub(t0)
	}
	b.StopTimer()
	per := total / time.Duration(b.N)
	b.ReportMetric(per.Seconds()*1000, "ms-to-1000-watchers")
	b.ReportMetric(float64(submitted.Milliseconds())/float64(b.N), "ms-submit-committed")
	b.ReportMetric(float64(per)/float64(fsyncMedian), "fanout/fsync")
}
