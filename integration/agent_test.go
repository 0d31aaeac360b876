package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/worker"
)

// inProcessOrg runs coordinators in this process on OS-chosen ports.
type inProcessOrg struct {
	t     *testing.T
	cfgs  []coordinator.Config
	nodes []*coordinator.Server
}

func newInProcessOrg(t *testing.T, n int) *inProcessOrg {
	o := &inProcessOrg{t: t}
	dir := t.TempDir()
	tm := coordinator.FastTimings()
	tm.HeartbeatTTL, tm.LeaderGrace = time.Second, time.Second
	for i := 0; i < n; i++ {
		o.cfgs = append(o.cfgs, coordinator.Config{
			Org: "acme", NodeID: fmt.Sprintf("c%d", i+1), DataDir: filepath.Join(dir, fmt.Sprintf("c%d", i+1)),
			GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
			BootstrapExpect: n, Timings: tm, Logger: logging.Discard(),
		})
	}
	o.nodes = make([]*coordinator.Server, n)
	var join []string
	for i := range o.cfgs {
		o.cfgs[i].Join = join
		o.start(i)
		join = append(join, o.cfgs[i].SerfAddr)
	}
	t.Cleanup(func() {
		for i := range o.nodes {
			o.stop(i)
		}
	})
	return o
}

func (o *inProcessOrg) start(i int) {
	srv, err := coordinator.New(o.cfgs[i])
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		o.t.Fatalf("start %s: %v", o.cfgs[i].NodeID, err)
	}
	o.cfgs[i].GRPCAddr, o.cfgs[i].RaftAddr, o.cfgs[i].SerfAddr = srv.GRPCAddr(), srv.RaftAddr(), srv.SerfAddr()
	o.nodes[i] = srv
}

func (o *inProcessOrg) stop(i int) {
	if o.nodes[i] != nil {
		_ = o.nodes[i].Shutdown()
		o.nodes[i] = nil
	}
}

func (o *inProcessOrg) grpcAddrs() []string {
	var out []string
	for _, c := range o.cfgs {
		out = append(out, c.GRPCAddr)
	}
	return out
}

// workerStatus reads a worker's status from any running node's state.
func (o *inProcessOrg) workerStatus(id string) string {
	for _, n := range o.nodes {
		if n == nil || !n.IsLeader() {
			continue
		}
		w, err := n.State().Worker(nil, id)
		if err == nil && w != nil {
			return w.Status
		}
	}
	return ""
}

func runWorker(t *testing.T, coords []string) *worker.Worker {
	w, err := worker.New(worker.Config{Org: "acme", Name: "w1", Coordinators: coords, Cores: 2, Logger: logging.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// TestWorkerSurvivesCoordinatorLoss: the worker's preferred coordinator dies;
// it keeps heartbeating through the others and is never marked down.
func TestWorkerSurvivesCoordinatorLoss(t *testing.T) {
	o := newInProcessOrg(t, 3)
	w := runWorker(t, o.grpcAddrs()[:1]) // it knows one; the org tells it the rest
	waitFor(t, 20*time.Second, "worker registered and ready", func() bool {
		return w.ID() != "" && o.workerStatus(w.ID()) == "ready"
	})
	o.stop(0)
	// Well past TTL + grace of the new leader, the worker must still be ready.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if st := o.workerStatus(w.ID()); st == "down" {
			t.Fatalf("worker marked down after losing its coordinator")
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, "worker ready under the new leader", func() bool { return o.workerStatus(w.ID()) == "ready" })
}

// TestWorkerRegistersAgainWhenForgotten: the org loses its state (a fresh
// cluster on the same addresses); the worker is told it is unknown and
// registers again under a new id.
func TestWorkerRegistersAgainWhenForgotten(t *testing.T) {
	o := newInProcessOrg(t, 1)
	w := runWorker(t, o.grpcAddrs())
	waitFor(t, 20*time.Second, "worker registered", func() bool { return w.ID() != "" && o.workerStatus(w.ID()) == "ready" })
	first := w.ID()
	o.stop(0)
	o.cfgs[0].DataDir = filepath.Join(t.TempDir(), "fresh")
	o.start(0)
	waitFor(t, 20*time.Second, "worker registered again under a new id", func() bool {
		id := w.ID()
		return id != first && id != "" && o.workerStatus(id) == "ready"
	})
}
