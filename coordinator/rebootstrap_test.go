package coordinator

import (
	"strings"
	"testing"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/states"
)

const lossyChainQuery = `name: q
replicas: 2
sources:
  - {name: lines, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 1s}, aggregates: {n: "count()"}}
  - {name: total, type: aggregate, input: counts, window: {size: 2s}, aggregates: {n: "sum(n)"}}
sinks:
  - {name: out, input: total}
`

// lossyFixture is a running replicated chain lines -> counts -> total ->
// out, replica r of every fragment on worker w<r>, with a spare worker w9.
func lossyFixture(t *testing.T) ([]*fsm.Worker, []*fsm.Task, []*fsm.Query, func(*fsm.Query) *queryspec.Plan) {
	t.Helper()
	spec, err := queryspec.Parse("q.yaml", []byte(lossyChainQuery))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := spec.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	workers := []*fsm.Worker{{ID: "w0", Status: statusReady, Cores: 4}, {ID: "w1", Status: statusReady, Cores: 4}, {ID: "w9", Status: statusReady, Cores: 4}}
	var tasks []*fsm.Task
	for _, n := range plan.Nodes {
		for r := range 2 {
			tasks = append(tasks, &fsm.Task{ID: fsm.TaskID("q", n.Name, 0, r), Query: "q", Fragment: n.Name, Replica: r,
				WorkerID: []string{"w0", "w1"}[r], Generation: 1, State: states.TaskRunning, ReplicaState: replicaStable})
		}
	}
	queries := []*fsm.Query{{Name: "q", Status: fsm.QueryStatusRunning, Replicas: 2}}
	return workers, tasks, queries, func(*fsm.Query) *queryspec.Plan { return plan }
}

func lossyTask(tasks []*fsm.Task, id string) *fsm.Task {
	for _, t := range tasks {
		if t.ID == id {
			return t
		}
	}
	return nil
}

// A lossy replica with a STABLE peer is re-placed (to a worker running no
// replica of its partition); lossy replicas downstream of it wait until it
// runs again; a lossy replica whose peer is lossy too, or not STABLE, or
// that is the only one, stays; nothing happens while a copy of the query
// starts.
func TestPlanRebootstrapOfLossyReplicas(t *testing.T) {
	t.Parallel()
	workers, tasks, queries, planOf := lossyFixture(t)
	if moves, stuck := planRebootstrap(workers, tasks, queries, planOf, nil); len(moves)+len(stuck) != 0 {
		t.Fatalf("no lossy replica: moves %+v, stuck %v", moves, stuck)
	}
	counts0, total0, out0 := lossyTask(tasks, "q/counts/p0/r0"), lossyTask(tasks, "q/total/p0/r0"), lossyTask(tasks, "q/out/p0/r0")
	counts0.Lossy, total0.Lossy, out0.Lossy = true, true, true
	moves, stuck := planRebootstrap(workers, tasks, queries, planOf, nil)
	if len(moves) != 1 || moves[0].TaskID != counts0.ID || moves[0].FromWorker != "w0" || moves[0].FromGeneration != 1 || moves[0].ToWorker != "w9" || moves[0].Live {
		t.Fatalf("moves %+v, want only %s from w0 generation 1 to w9, not live (downstream lossy replicas wait)", moves, counts0.ID)
	}
	if len(stuck) != 0 {
		t.Fatalf("stuck %v", stuck)
	}

	// While the replacement starts, nothing more.
	counts0.WorkerID, counts0.Generation, counts0.State, counts0.Lossy = "w9", 2, states.TaskStarting, false
	if moves, _ := planRebootstrap(workers, tasks, queries, planOf, nil); len(moves) != 0 {
		t.Fatalf("moves %+v while a copy starts", moves)
	}
	// Once it runs, the next level (total), not yet the sink.
	counts0.State = states.TaskRunning
	moves, _ = planRebootstrap(workers, tasks, queries, planOf, nil)
	if len(moves) != 1 || moves[0].TaskID != total0.ID {
		t.Fatalf("moves %+v, want %s", moves, total0.ID)
	}

	// No worker free of the partition (w9 taken): unplaced, for the
	// scheduler to place again as a new generation.
	workers = workers[:2]
	moves, _ = planRebootstrap(workers, tasks, queries, planOf, nil)
	if len(moves) != 1 || moves[0].ToWorker != "" || moves[0].FromWorker != "w0" {
		t.Fatalf("moves %+v, want %s unplaced", moves, total0.ID)
	}

	// The peer lossy too, or not STABLE: stays lossy, and says so.
	for _, peer := range []func(p *fsm.Task){
		func(p *fsm.Task) { p.Lossy = true },
		func(p *fsm.Task) { p.ReplicaState = "REPLICA_UP_FAILURE" },
		func(p *fsm.Task) { p.WorkerID = "w-down" }, // a worker not ready
	} {
		_, tasks2, _, _ := lossyFixture(t)
		lossyTask(tasks2, total0.ID).Lossy = true
		peer(lossyTask(tasks2, "q/total/p0/r1"))
		moves, stuck := planRebootstrap(workers, tasks2, queries, planOf, nil)
		named := false
		for _, x := range stuck {
			named = named || x.ID == total0.ID
		}
		if len(moves) != 0 || !named {
			t.Fatalf("peer not usable: moves %+v, stuck %v; want none, %s stuck", moves, stuck, total0.ID)
		}
	}
	// The only replica left.
	_, tasks2, _, _ := lossyFixture(t)
	lossyTask(tasks2, total0.ID).Lossy = true
	var one []*fsm.Task
	for _, x := range tasks2 {
		if x.ID != "q/total/p0/r1" {
			one = append(one, x)
		}
	}
	if moves, stuck := planRebootstrap(workers, one, queries, planOf, nil); len(moves) != 0 || len(stuck) != 1 || stuck[0].ID != total0.ID {
		t.Fatalf("only replica: moves %+v, stuck %v; want none, %s stuck", moves, stuck, total0.ID)
	}
	// query status says so.
	ready := map[string]bool{"w0": true, "w1": true}
	if note := lossyNote(lossyTask(one, total0.ID), one, ready); !strings.Contains(note, "stays so") {
		t.Fatalf("note of the only replica left: %q", note)
	}
	if note := lossyNote(lossyTask(tasks2, total0.ID), tasks2, ready); !strings.Contains(note, "to be replaced") {
		t.Fatalf("note of a replica with a STABLE peer: %q", note)
	}
}

// A replacement bootstraps from a STABLE peer, never from a lossy one.
func TestBootstrapSourcePrefersStableNeverLossy(t *testing.T) {
	t.Parallel()
	addrs := map[string]string{"w0": "a0", "w1": "a1", "w2": "a2", "w9": "a9"}
	ready := func(string) bool { return true }
	me := &fsm.Task{ID: "q/counts/p0/r0", Query: "q", Fragment: "counts", Replica: 0, WorkerID: "w9", Generation: 2}
	peer := func(r int, w, rs string, lossy bool) *fsm.Task {
		return &fsm.Task{ID: fsm.TaskID("q", "counts", 0, r), Query: "q", Fragment: "counts", Replica: r, WorkerID: w, Generation: 1,
			State: states.TaskRunning, ReplicaState: rs, Lossy: lossy}
	}
	up := "REPLICA_UP_FAILURE"
	for _, c := range []struct {
		name  string
		peers []*fsm.Task
		want  string // worker address, "" none
	}{
		{"stable after up-failure", []*fsm.Task{me, peer(1, "w1", up, false), peer(2, "w2", replicaStable, false)}, "a2"},
		{"lossy stable skipped", []*fsm.Task{me, peer(1, "w1", replicaStable, true), peer(2, "w2", up, false)}, "a2"},
		{"only lossy", []*fsm.Task{me, peer(1, "w1", replicaStable, true)}, ""},
		{"no dcaa state", []*fsm.Task{me, peer(1, "w1", "", false)}, "a1"},
	} {
		src := bootstrapSource(me, c.peers, addrs, ready)
		got := ""
		if src != nil {
			got = src.WorkerAddr
		}
		if got != c.want {
			t.Errorf("%s: bootstrap from %q, want %q", c.name, got, c.want)
		}
	}
}

// A live move of a lossy replica is refused (its new copy would start
// from the inexact state without knowing it); a non-live re-placement,
// which bootstraps from a peer, is not.
func TestLiveMoveOfLossyReplicaRefused(t *testing.T) {
	t.Parallel()
	workers, tasks, _, _ := lossyFixture(t)
	counts0 := lossyTask(tasks, "q/counts/p0/r0")
	live := fsm.PlannedPlacement{TaskID: counts0.ID, FromWorker: "w0", FromGeneration: 1, ToWorker: "w9", Live: true}
	if why := newPlanCheck(workers, tasks, tasksPerCore).check(live); why != "" {
		t.Fatalf("live move of a replica that is not lossy refused: %s", why)
	}
	counts0.Lossy = true
	if why := newPlanCheck(workers, tasks, tasksPerCore).check(live); !strings.Contains(why, "lossy") {
		t.Fatalf("live move of a lossy replica: %q, want a refusal naming it lossy", why)
	}
	live.Live = false
	if why := newPlanCheck(workers, tasks, tasksPerCore).check(live); why != "" {
		t.Fatalf("re-placement of a lossy replica refused: %s", why)
	}
}
