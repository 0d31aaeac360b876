package runtime

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// BenchmarkDCAAOverhead is bench dcaa's replication overhead in one
// process: the network-monitoring query (three source partitions, a
// per-host aggregate over 100 ms windows in two partitions, two filters
// joined on the host) on a fixed input, drawn flat out, with k=1 (two
// independent one-replica copies) and k=2 (one query with two replicas:
// DCAA, SUnion, boundaries, acks to both replicas), placed as bench dcaa
// places them: copy or replica r's sources on worker 2+r, the rest of it
// on worker r. Both do the work of two copies; the figure is the process's
// CPU time per input record of one copy (cpu-ns/record), and the ratio
// of k2 to k1 in the same run is the overhead:
//
//	go test -run '^$' -bench DCAAOverhead -count 5 ./worker/runtime/
//
// relay-msgs/op counts the acknowledgements the ack relays sent over the
// network (a gRPC message each; none with k=1).
//
// tentative/op counts the tentative results k=2's sinks gave (a starved
// upstream taken for a failed one); a run with them measured corrections
// too.
func BenchmarkDCAAOverhead(b *testing.B) {
	for _, k := range []int{1, 2} {
		b.Run(fmt.Sprintf("k%d", k), func(b *testing.B) { benchDCAAOverhead(b, k) })
	}
}

func benchDCAAOverhead(b *testing.B, k int) {
	const records = 100_000 // per source partition and copy
	pool := dataplane.NewPool()
	defer pool.Close()
	var workers [4]*worker
	for i := range workers {
		// Sources due 20 times faster than their rate: flat out, with
		// the stimes (and boundaries) of 100 000 records a second.
		workers[i] = startWorkerOpts(b, pool, Options{BoundaryInterval: 50 * time.Millisecond, SourceSpeedup: 20,
			SinkBufferTuples: 1 << 20, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond})
		defer workers[i].close(b)
	}
	run, tentative := 0, 0
	once := func() {
		var (
			specs [4][]TaskSpec
			sinks [2]string // on worker i
			names []string
		)
		// worker places replica (copy) r of a query: its sources on
		// worker 2+r, the rest on worker r.
		add := func(replicas int, copy int) {
			worker := func(n *queryspec.Node, r int) int {
				if replicas == 1 {
					r = copy
				}
				if n.Kind == queryspec.KindSource {
					return 2 + r
				}
				return r
			}
			run++
			q, err := queryspec.Parse("q.yaml", fmt.Appendf(nil, `
name: ovh%d
replicas: %d
availability: {max_delay: "500ms"}
sources:
  - name: conns
    generator: {kind: netmon, monitors: 3, rate: 100000, seed: 7, limit: %d}
    parallelism: 3
operators:
  - name: per_src
    type: aggregate
    input: conns
    window: {size: 100ms}
    group_by: [src]
    aggregates: {conns: "count()", ports: "count_distinct(port)"}
    parallelism: 2
  - {name: busy, type: filter, input: per_src, where: "conns > 3", parallelism: 2}
  - {name: probing, type: filter, input: per_src, where: "ports > 3", parallelism: 2}
  - {name: both, type: join, left: busy, right: probing, on: [src], window: {size: 50ms}, parallelism: 2}
  - {name: alert, type: map, input: both, fields: {src: src, conns: conns, ports: ports, window_end: window_end}}
sinks:
  - {name: alerts, input: alert}
`, run, replicas, records))
			if err != nil {
				b.Fatal(err)
			}
			plan, err := q.FusedPlan()
			if err != nil {
				b.Fatal(err)
			}
			var (
				pls   []Placement
				owner []int
			)
			for _, n := range plan.Nodes {
				for p := range max(1, n.Partitions) {
					for r := range replicas {
						w := worker(n, r)
						pls = append(pls, Placement{TaskID: queryspec.TaskID(q.Name, n.Name, p, r), Fragment: n.Name,
							Partition: p, Replica: r, WorkerAddr: workers[w].addr})
						owner = append(owner, w)
					}
				}
			}
			for i, pl := range pls {
				specs[owner[i]] = append(specs[owner[i]], TaskSpec{TaskID: pl.TaskID, Query: q.Name, Fragment: pl.Fragment, Partition: pl.Partition,
					Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: pls})
			}
			for r := range replicas {
				sinks[max(r, copy)] = queryspec.TaskID(q.Name, "alerts", 0, r)
				names = append(names, q.Name)
			}
		}
		if k == 2 {
			add(2, 0)
		} else {
			add(1, 0)
			add(1, 1)
		}
		// Downstream first: a subscriber polls for an upstream not there
		// yet.
		for i := range workers {
			workers[i].rt.Apply(context.Background(), specs[i])
		}
		for i := range sinks {
			tentative += tailTentative(b, pool, workers[i].addr, names[i], sinks[i])
		}
		for _, w := range workers {
			w.rt.Apply(context.Background(), nil)
		}
	}
	// A warm-up run, not measured: the process's heap grows and its
	// pages fault in (about 16 µs each on the VMs this ran on), which the
	// first of the sub-benchmarks would otherwise pay alone.
	once()
	tentative = 0
	cpu0, relays0 := processCPU(), dataplane.RelaySends()
	for b.Loop() {
		once()
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N*2*3*records), "cpu-ns/record")
	b.ReportMetric(float64(dataplane.RelaySends()-relays0)/float64(b.N), "relay-msgs/op")
	b.ReportMetric(float64(tentative)/float64(b.N), "tentative/op")
}
