package runtime

import (
	"context"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// fakeReplicas serves hand-written output streams over the data plane,
// as the replicas of an upstream task would, so that a test decides what
// each replica's stream holds, how its positions map to stable ids, and
// when a replica goes away.
type fakeReplicas struct {
	addr string
	srv  *grpc.Server
	mu   sync.Mutex
	bufs map[string]*dataplane.OutputBuffer // by task id
}

func newFakeReplicas(t *testing.T) *fakeReplicas {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeReplicas{addr: lis.Addr().String(), srv: grpc.NewServer(dataplane.ServerOptions()...), bufs: map[string]*dataplane.OutputBuffer{}}
	fedstreampb.RegisterDataPlaneServer(f.srv, dataplane.NewServer(f, nil, nil))
	done := make(chan struct{})
	go func() { defer close(done); _ = f.srv.Serve(lis) }()
	t.Cleanup(func() { f.srv.Stop(); <-done })
	return f
}

func (f *fakeReplicas) ResolveStream(ref *fedstreampb.StreamRef) (*dataplane.OutputBuffer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.bufs[ref.TaskId]; b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("%w: %s", dataplane.ErrUnknownStream, ref.TaskId)
}

// stream creates task id's stream, a replicated query's (heartbeats,
// STABLE), and appends tuples to it: "s" a stable tuple, "b" a boundary,
// "n" a tentative tuple, UNDO or REC_DONE (outside the stable view),
// "end" the final boundary; each with its stream time in ms.
func (f *fakeReplicas) stream(t *testing.T, id string, tuples ...fakeTuple) *dataplane.OutputBuffer {
	t.Helper()
	return f.put(t, id, dataplane.BufferOptions{}, 0, fakeTuples(tuples...)...)
}

// put creates task id's stream (as stream, with options opts) holding ts
// at positions 1 on: tuples other than stable ones and boundaries are
// outside the stable view, the final boundary is the stream's end.
// divergeAfter, when not 0, gives the stream a lineage of its own
// diverging after that stable id (a replica whose correction could not
// make every result exact).
func (f *fakeReplicas) put(t *testing.T, id string, opts dataplane.BufferOptions, divergeAfter uint64, ts ...tuple.Tuple) *dataplane.OutputBuffer {
	t.Helper()
	b := dataplane.NewOutputBuffer(opts)
	b.SetHeartbeat(10 * time.Millisecond)
	b.SetStreamState(fedstreampb.ReplicaState_REPLICA_STABLE, 0)
	if divergeAfter > 0 {
		b.Diverge(divergeAfter)
	}
	for i := range ts {
		tp := *ts[i].Clone()
		pos := uint64(i + 1)
		tp.ID = pos
		switch {
		case tp.Type == tuple.Boundary && tp.STime == math.MaxInt64:
			b.SetEnd(pos)
		case tp.Type != tuple.Stable && tp.Type != tuple.Boundary:
			b.MarkNonStable(pos, pos)
		}
		if err := b.Append(context.Background(), &tp); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	f.bufs[id] = b
	f.mu.Unlock()
	return b
}

// fakeUpstreamCluster runs replica 0 of q's nodes that local picks (each
// partition) on one worker (DCAA options); every other replica is placed at fake's
// address, so the test writes the streams those it reads from.
func fakeUpstreamCluster(t *testing.T, q *queryspec.Query, local func(*queryspec.Node) bool) (*fakeReplicas, *cluster, *worker) {
	t.Helper()
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	fake := newFakeReplicas(t)
	pool := dataplane.NewPool()
	t.Cleanup(func() { pool.Close() })
	w := startWorkerOpts(t, pool, dcaaOpts)
	c := &cluster{pool: pool, query: q, specs: map[*worker][]TaskSpec{}, workers: []*worker{w}}
	t.Cleanup(func() { c.close(t) })
	var placements []Placement
	for _, node := range plan.Nodes {
		for p := range max(1, node.Partitions) {
			for r := range q.Replicas {
				addr := fake.addr
				if r == 0 && local(node) {
					addr = w.addr
				}
				placements = append(placements, Placement{TaskID: queryspec.TaskID(q.Name, node.Name, p, r), Fragment: node.Name,
					Partition: p, Replica: r, WorkerAddr: addr})
			}
		}
	}
	for _, pl := range placements {
		if pl.WorkerAddr == w.addr {
			c.specs[w] = append(c.specs[w], TaskSpec{TaskID: pl.TaskID, Query: q.Name, Fragment: pl.Fragment, Partition: pl.Partition,
				Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements})
		}
	}
	return fake, c, w
}

type fakeTuple struct {
	kind string
	ms   int
}

// kill makes replica id go away: its stream closes (the subscription
// fails) and it is no longer known.
func (f *fakeReplicas) kill(id string) {
	f.mu.Lock()
	b := f.bufs[id]
	delete(f.bufs, id)
	f.mu.Unlock()
	if b != nil {
		b.Close()
	}
}

// After a correction that could not make every result exact, the
// replicas of an upstream number their stable streams differently. Here
// the aggregate's replica 0 read upstream replica 0 (33 stable tuples and
// boundaries, no end yet); replica 0 goes away, and replica 1, which has
// fewer stable results (its correction lost some) and has ended, is read
// from the aggregate's last stable id, 33, as a position: past replica
// 1's whole stream (17 positions). Before, that subscription waited for
// ever, hearing replica 1's heartbeats (so never failed), and neither the
// aggregate nor its sink ever ended (bench dcaa's saturation runs under
// load: goroutine dumps showed operator inputs subscribed to upstream
// replicas whose tasks had finished). Replica 1 now tells it that its
// stream ended before that position (dataplane.ErrEndedBefore); the
// input realigns on it from its start by stream time (it holds nothing
// past what the input took but its end), and takes its final boundary:
// the aggregate and the sink end.
// countsOverFakeLines starts query name: an aggregate over 10 ms windows
// (max_delay 5 s, two replicas) reading a source whose two replicas the
// test writes (fakeUpstreamCluster), and its sink; up0 and up1 are the
// source replicas' task ids.
func countsOverFakeLines(t *testing.T, name string) (q *queryspec.Query, fake *fakeReplicas, c *cluster, w *worker, up0, up1 string) {
	t.Helper()
	q = mustParse(t, `name: `+name+`
replicas: 2
availability: {max_delay: 5s}
sources:
  - {name: lines, generator: {kind: words, rate: 1000, seed: 1, limit: 10}}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 10ms}, aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`)
	fake, c, w = fakeUpstreamCluster(t, q, func(n *queryspec.Node) bool { return n.Kind != queryspec.KindSource })
	return q, fake, c, w, queryspec.TaskID(q.Name, "lines", 0, 0), queryspec.TaskID(q.Name, "lines", 0, 1)
}

// stableLines is a fake source replica's stream of stable tuples at 1 to
// upTo ms with a boundary after every 10 ms (after upTo too only when
// lastBoundary).
func stableLines(upTo int, lastBoundary bool) []fakeTuple {
	var ts []fakeTuple
	for ms := 1; ms <= upTo; ms++ {
		ts = append(ts, fakeTuple{"s", ms})
		if ms%10 == 0 && (ms < upTo || lastBoundary) {
			ts = append(ts, fakeTuple{"b", ms})
		}
	}
	return ts
}

// failOverAfter waits until the aggregate of countsOverFakeLines has
// taken replica 0's stream up to stable id taken, then kills replica 0
// (up0), so that its input moves to replica 1. It returns the
// aggregate's task id.
func failOverAfter(t *testing.T, q *queryspec.Query, fake *fakeReplicas, w *worker, up0 string, taken uint64) string {
	t.Helper()
	agg := queryspec.TaskID(q.Name, "counts", 0, 0)
	waitUntil(t, "the aggregate taking replica 0's stream", func() bool {
		tk := w.rt.task(agg)
		return tk != nil && tk.inputs[0].stableTaken.Load() == taken
	})
	fake.kill(up0)
	return agg
}

func TestDCAAInputResumedPastTheReplicasEndEnds(t *testing.T) {
	q, fake, c, w, up0, up1 := countsOverFakeLines(t, "div")
	// Replica 0: 30 stable tuples, a boundary every 10 ms: stable ids
	// and positions 1 to 33.
	r0 := stableLines(30, true)
	fake.stream(t, up0, r0...)
	// Replica 1: the same first 11, then three positions outside its
	// stable view (a tentative tuple, and what stands for its UNDO and
	// REC_DONE), then fewer stable results and its end: 17 positions,
	// stable ids up to 14.
	r1 := append([]fakeTuple(nil), r0[:11]...)
	r1 = append(r1, fakeTuple{"n", 15}, fakeTuple{"n", 15}, fakeTuple{"n", 15}, fakeTuple{"s", 20}, fakeTuple{"b", 30}, fakeTuple{"end", 0})
	fake.stream(t, up1, r1...)
	c.apply()
	failOverAfter(t, q, fake, w, up0, 33)
	got := viewOf(c.tail(t, queryspec.TaskID(q.Name, "out", 0, 0)))
	if len(got.stable) == 0 || got.tentative+got.undos != 0 {
		t.Fatalf("the sink's output: %d stable, %d tentative, %d UNDO", len(got.stable), got.tentative, got.undos)
	}
}
