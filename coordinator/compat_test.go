package coordinator

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestQuiescentPlanRefusedOnOlderWorkers plays a rolling upgrade: a worker
// registers without a data-plane level (an older build, which would run a
// quiescent plan as a live one) and runs the query. A quiescent update is
// refused, naming the worker, and commits nothing; a live one still goes.
// Once the tasks run on an upgraded worker, the quiescent plan goes too.
func TestQuiescentPlanRefusedOnOlderWorkers(t *testing.T) {
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	admin := c.admin(0)
	rcs := pb.NewReconfigServiceClient(c.conn(0, c.tokens[1]))
	old := c.startWorker(t, 0, "old-build")
	defer old.stop()
	if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(reconfigQuery), Filename: "rq.yaml"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "every task placed on the older worker", func() bool {
		tasks, err := s.State().TasksByQuery(nil, "rq")
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, tk := range tasks {
			if tk.WorkerID != old.id {
				return false
			}
		}
		return true
	})
	ws := workerStatus(t, admin)
	if l := ws[old.id].GetDataplaneLevel(); l != 0 {
		t.Fatalf("the older worker shows data-plane level %d, want 0 (none stated)", l)
	}

	v2 := strings.Replace(reconfigQuery, "38.0", "38.5", 1)
	_, err := rcs.UpdateQuery(ctxT(t, 10*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(v2), Filename: "rq.yaml", Strategy: fsm.StrategyQuiescent})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), old.id) || !strings.Contains(err.Error(), "quiescent") {
		t.Fatalf("quiescent update with a task on an older worker: %v; want FailedPrecondition naming %s", err, old.id)
	}
	if q, _ := s.State().Query(nil, "rq"); q.Reconfig != nil {
		t.Fatalf("a refused update committed a plan: %+v", q.Reconfig)
	}
	resp, err := rcs.UpdateQuery(ctxT(t, 10*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(v2), Filename: "rq.yaml"})
	if err != nil || resp.Epoch != 1 {
		t.Fatalf("live update on the older worker: %+v, %v", resp, err)
	}

	// The upgraded worker takes the tasks over (the older one goes away).
	upgraded := c.startWorker(t, 0, "new-build", rpc.DataPlaneLevel)
	defer upgraded.stop()
	if l := workerStatus(t, admin)[upgraded.id].GetDataplaneLevel(); l != rpc.DataPlaneLevel {
		t.Fatalf("the upgraded worker shows data-plane level %d, want %d", l, rpc.DataPlaneLevel)
	}
	old.stop()
	waitFor(t, 60*time.Second, "every task re-placed on the upgraded worker", func() bool {
		tasks, err := s.State().TasksByQuery(nil, "rq")
		if err != nil {
			return false
		}
		for _, tk := range tasks {
			if tk.WorkerID != upgraded.id {
				return false
			}
		}
		return true
	})
	v3 := strings.Replace(reconfigQuery, "38.0", "37.5", 1)
	if resp, err = rcs.UpdateQuery(ctxT(t, 10*time.Second), &pb.UpdateQueryRequest{Yaml: []byte(v3), Filename: "rq.yaml", Strategy: fsm.StrategyQuiescent}); err != nil || resp.Epoch != 2 {
		t.Fatalf("quiescent update once every worker is upgraded: %+v, %v", resp, err)
	}
}

// TestMoveToOlderWorkerWaitsForQuiescentPlan: while a quiescent plan is
// under way, a task may not move to a worker that would run it live.
func TestMoveToOlderWorkerWaitsForQuiescentPlan(t *testing.T) {
	q := &fsm.Query{Name: "rq", Reconfig: &fsm.QueryReconfig{Plans: []fsm.ReconfigPlan{
		{Epoch: 1, Strategy: fsm.StrategyLive, Phase: fsm.ReconfigComplete},
		{Epoch: 2, Strategy: fsm.StrategyQuiescent, Phase: fsm.ReconfigSwitched},
	}}}
	older := &fsm.Worker{ID: "w-old"}
	err := checkWorkerRunsPlans(q, older)
	if !errors.Is(err, ErrBuildTooOld) || !strings.Contains(err.Error(), "w-old") || !strings.Contains(err.Error(), "plan 2") {
		t.Fatalf("move to an older worker during a quiescent plan: %v", err)
	}
	if err := checkWorkerRunsPlans(q, &fsm.Worker{ID: "w-new", DataPlaneLevel: rpc.DataPlaneLevelQuiescent}); err != nil {
		t.Fatalf("move to an upgraded worker: %v", err)
	}
	q.Reconfig.Plans[1].Phase = fsm.ReconfigComplete
	if err := checkWorkerRunsPlans(q, older); err != nil {
		t.Fatalf("move to an older worker once the plan is complete: %v", err)
	}
}

// TestCrossOrgMoveToOlderPartnerDuringPlan: a partner whose coordinators
// advertise no cross-org hosting level (an older build, which ignores
// HostedTask.ReconfigJSON) gets no task of a query whose reconfiguration
// plan is under way; one of them lagging is enough to refuse; once the plan
// is complete the move may go.
func TestCrossOrgMoveToOlderPartnerDuringPlan(t *testing.T) {
	alive, failed := serf.StatusAlive.String(), serf.StatusFailed.String()
	q := &fsm.Query{Name: "rq", Reconfig: &fsm.QueryReconfig{Plans: []fsm.ReconfigPlan{{Epoch: 1, Strategy: fsm.StrategyLive, Phase: fsm.ReconfigLoading}}}}
	older := []fedMember{{Org: "beta", Node: "b1", Status: alive, Proto: "8"}, {Org: "beta", Node: "b2", Status: alive, Proto: "8", HostLevel: "1"}}
	err := checkPartnerHostsReconfig(older, q, "beta")
	if !errors.Is(err, ErrBuildTooOld) || !strings.Contains(err.Error(), "beta") || !strings.Contains(err.Error(), "plan 1") {
		t.Fatalf("move to a partner with an older coordinator: %v", err)
	}
	if err := checkPartnerHostsReconfig(nil, q, "beta"); !errors.Is(err, ErrBuildTooOld) {
		t.Fatalf("move to a partner not in the pool: %v", err)
	}
	upgraded := []fedMember{{Org: "beta", Node: "b1", Status: failed}, {Org: "beta", Node: "b2", Status: alive, HostLevel: "1"},
		{Org: "gamma", Node: "g1", Status: alive}}
	if err := checkPartnerHostsReconfig(upgraded, q, "beta"); err != nil {
		t.Fatalf("move to an upgraded partner (its failed coordinator does not count): %v", err)
	}
	q.Reconfig.Plans[0].Phase = fsm.ReconfigComplete
	if err := checkPartnerHostsReconfig(older, q, "beta"); err != nil {
		t.Fatalf("move to an older partner with no plan under way: %v", err)
	}
	if l, seen := orgHostLevel(upgraded, "gamma"); !seen || l != 0 {
		t.Fatalf("gamma advertises no level: got %d, %v", l, seen)
	}
}

// TestPlanOnHostedTaskNeedsAbleHost: a plan on a task hosted at a partner
// is refused when the partner advertises no hosting level (it would ignore
// the plan); a quiescent one also when the partner's worker running the
// task states an older data-plane level, or has not said yet.
func TestPlanOnHostedTaskNeedsAbleHost(t *testing.T) {
	cases := []struct {
		name        string
		host        int
		seen        bool
		strategy    string
		level       int32
		known, fail bool
	}{
		{"older partner, live plan", 0, true, fsm.StrategyLive, rpc.DataPlaneLevel, true, true},
		{"partner not in the pool", 0, false, fsm.StrategyLive, 0, false, true},
		{"able partner, live plan, older worker", hostLevelReconfig, true, fsm.StrategyLive, 0, true, false},
		{"able partner, quiescent plan, older worker", hostLevelReconfig, true, fsm.StrategyQuiescent, 0, true, true},
		{"able partner, quiescent plan, level not said yet", hostLevelReconfig, true, fsm.StrategyQuiescent, 0, false, true},
		{"able partner, quiescent plan, upgraded worker", hostLevelReconfig, true, fsm.StrategyQuiescent, rpc.DataPlaneLevelQuiescent, true, false},
	}
	for _, c := range cases {
		why := hostedTaskTooOld("beta", "q/f/p0/r0", c.host, c.seen, c.strategy, c.level, c.known)
		if (why != "") != c.fail || c.fail && !strings.Contains(why, "beta") {
			t.Errorf("%s: %q, want refused %v", c.name, why, c.fail)
		}
	}
}

// TestRescaleRefusedWhereReplicatedReadersRunOlderBuilds: in a query with
// two replicas, a keyed aggregate read by another aggregate (a replicated
// operator, which must take the added partitions into its DCAA machine)
// is not rescaled while a replica of the reader runs on a worker of data-
// plane level 3: the rescale is refused up front, naming the worker, and
// the slot map stays as it was (nothing prepared, no task placed).
func TestRescaleRefusedWhereReplicatedReadersRunOlderBuilds(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	admin := c.admin(0)
	old := c.startWorker(t, 0, "old-build", rpc.DataPlaneLevelQuiescent)
	defer old.stop()
	upgraded := c.startWorker(t, 0, "new-build", rpc.DataPlaneLevel)
	defer upgraded.stop()
	const chain = `name: chain
replicas: 2
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
  - {name: total, type: aggregate, input: per_line, window: {size: 1s}, aggregates: {lines: "count()"}}
sinks:
  - {name: out, input: total}
`
	if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(chain), Filename: "chain.yaml"}); err != nil {
		t.Fatal(err)
	}
	var before *fsm.SlotMap
	waitFor(t, 30*time.Second, "every task placed and the slot map created", func() bool {
		tasks, err := s.State().TasksByQuery(nil, "chain")
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, tk := range tasks {
			if tk.WorkerID == "" {
				return false
			}
		}
		before, _ = s.State().SlotMap(nil, "chain", "per_line")
		return before != nil
	})
	tasks, _ := s.State().TasksByQuery(nil, "chain")
	readerOnOld := ""
	for _, tk := range tasks {
		if tk.Fragment == "total" && tk.WorkerID == old.id {
			readerOnOld = tk.ID
		}
	}
	if readerOnOld == "" {
		t.Fatalf("no replica of the reader placed on the older worker (replicas go to distinct workers): %+v", tasks)
	}
	_, err := admin.ScaleQuery(ctxT(t, 10*time.Second), &pb.ScaleQueryRequest{Query: "chain", Operator: "per_line", Parallelism: 2})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), old.id) || !strings.Contains(err.Error(), readerOnOld) ||
		!strings.Contains(err.Error(), "level 4") || strings.Contains(err.Error(), upgraded.id) {
		t.Fatalf("rescale read by a replica on an older worker: %v; want FailedPrecondition naming %s, %s and level 4, not %s", err, old.id, readerOnOld, upgraded.id)
	}
	after, _ := s.State().SlotMap(nil, "chain", "per_line")
	if after == nil || after.Epoch != before.Epoch || after.Next != nil || after.Partitions != before.Partitions {
		t.Fatalf("a refused rescale changed the slot map: %+v -> %+v", before, after)
	}
	if got, _ := s.State().TasksByQuery(nil, "chain"); len(got) != len(tasks) {
		t.Fatalf("a refused rescale placed tasks: %d -> %d", len(tasks), len(got))
	}
}
