package coordinator

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func worker(id string, cores int32, status, zone string) *fsm.Worker {
	w := &fsm.Worker{ID: id, Cores: cores, Status: status}
	if zone != "" {
		w.Labels = map[string]string{zoneLabel: zone}
	}
	return w
}

func placedTask(query, fragment string, partition, replica int, workerID string) *fsm.Task {
	return &fsm.Task{ID: fsm.TaskID(query, fragment, partition, replica), Query: query, Fragment: fragment,
		Partition: partition, Replica: replica, WorkerID: workerID, Generation: 1}
}

// filler returns n tasks of a query "fill" placed on a worker, each its own
// partition, to use up capacity.
func filler(workerID string, n int) []*fsm.Task {
	var out []*fsm.Task
	for i := range n {
		out = append(out, placedTask("fill-"+workerID, "f", i, 0, workerID))
	}
	return out
}

// TestPlanCheck is the applier's table of checks: each case is one plan
// against one state, with the reason expected for each placement ("" =
// accepted).
func TestPlanCheck(t *testing.T) {
	t.Parallel()
	const perCore = 2
	move := func(task, from string, gen int, to string) fsm.PlannedPlacement {
		return fsm.PlannedPlacement{TaskID: task, FromWorker: from, FromGeneration: gen, ToWorker: to}
	}
	cases := []struct {
		name    string
		workers []*fsm.Worker
		tasks   []*fsm.Task
		plan    []fsm.PlannedPlacement
		want    []string // substring of each refusal, "" for accepted
	}{
		{
			name:    "capacity counts cores: a 2-core worker takes 4 tasks at 2 per core, not 5",
			workers: []*fsm.Worker{worker("a", 2, statusReady, "")},
			tasks:   append(filler("a", 3), placedTask("q", "f", 0, 0, "")),
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "", 1, "a")},
			want:    []string{""},
		},
		{
			name:    "capacity: a full worker is refused",
			workers: []*fsm.Worker{worker("a", 2, statusReady, "")},
			tasks:   append(filler("a", 4), placedTask("q", "f", 0, 0, "")),
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "", 1, "a")},
			want:    []string{"worker a is at capacity: 4 tasks on 2 cores (2 tasks per core)"},
		},
		{
			name:    "capacity: placements earlier in the plan count",
			workers: []*fsm.Worker{worker("a", 1, statusReady, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, ""), placedTask("q", "f", 1, 0, ""), placedTask("q", "f", 2, 0, "")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "", 1, "a"), move("q/f/p1/r0", "", 1, "a"), move("q/f/p2/r0", "", 1, "a")},
			want:    []string{"", "", "at capacity"},
		},
		{
			name:    "anti-affinity: a second replica of a partition on one worker is refused",
			workers: []*fsm.Worker{worker("a", 4, statusReady, ""), worker("b", 4, statusReady, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "a"), placedTask("q", "f", 0, 1, "")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r1", "", 1, "a"), move("q/f/p0/r1", "", 1, "b")},
			want:    []string{"worker a already runs a replica of partition 0 of f", ""},
		},
		{
			name:    "anti-affinity: other partitions may share a worker",
			workers: []*fsm.Worker{worker("a", 4, statusReady, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "a"), placedTask("q", "f", 1, 0, "")},
			plan:    []fsm.PlannedPlacement{move("q/f/p1/r0", "", 1, "a")},
			want:    []string{""},
		},
		{
			name: "zone spread: a second replica in the same zone is refused while another zone has room",
			workers: []*fsm.Worker{worker("a", 4, statusReady, "z1"), worker("b", 4, statusReady, "z1"),
				worker("c", 4, statusReady, "z2")},
			tasks: []*fsm.Task{placedTask("q", "f", 0, 0, "a"), placedTask("q", "f", 0, 1, "")},
			plan:  []fsm.PlannedPlacement{move("q/f/p0/r1", "", 1, "b"), move("q/f/p0/r1", "", 1, "c")},
			want:  []string{"zone spread: zone z1 already runs a replica of partition 0 of f, while worker c in zone z2 could run it", ""},
		},
		{
			name:    "zone spread: the same zone is fine when no other zone has room",
			workers: []*fsm.Worker{worker("a", 4, statusReady, "z1"), worker("b", 4, statusReady, "z1"), worker("c", 1, statusReady, "z2")},
			tasks:   append(filler("c", 2), placedTask("q", "f", 0, 0, "a"), placedTask("q", "f", 0, 1, "")),
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r1", "", 1, "b")},
			want:    []string{""},
		},
		{
			name:    "zone spread: workers without labels are not constrained",
			workers: []*fsm.Worker{worker("a", 4, statusReady, ""), worker("b", 4, statusReady, ""), worker("c", 4, statusReady, "z2")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "a"), placedTask("q", "f", 0, 1, "")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r1", "", 1, "b")},
			want:    []string{""},
		},
		{
			name:    "dead worker: down and unknown workers get nothing, unregistered ones neither",
			workers: []*fsm.Worker{worker("a", 4, statusDown, ""), worker("b", 4, statusUnknown, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "", 1, "a"), move("q/f/p0/r0", "", 1, "b"), move("q/f/p0/r0", "", 1, "zz")},
			want:    []string{"worker a is down, not ready", "worker b is unknown, not ready", "worker zz is not registered"},
		},
		{
			name:    "stale plan: the task is not on the worker the plan expected",
			workers: []*fsm.Worker{worker("a", 4, statusReady, ""), worker("b", 4, statusReady, ""), worker("c", 4, statusReady, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "b")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "a", 1, "c")},
			want:    []string{"stale plan: the task is on worker b at generation 1, the plan expected it on worker a at generation 1"},
		},
		{
			name:    "stale plan: the task is at another generation (moved away and back)",
			workers: []*fsm.Worker{worker("a", 4, statusReady, ""), worker("c", 4, statusReady, "")},
			tasks:   []*fsm.Task{{ID: "q/f/p0/r0", Query: "q", Fragment: "f", WorkerID: "a", Generation: 3}},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "a", 1, "c")},
			want:    []string{"at generation 3, the plan expected it on worker a at generation 1"},
		},
		{
			name:    "stale plan: two moves of one task in one plan, the second saw the old state",
			workers: []*fsm.Worker{worker("a", 4, statusReady, ""), worker("b", 4, statusReady, ""), worker("c", 4, statusReady, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "a")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "a", 1, "b"), move("q/f/p0/r0", "a", 1, "c")},
			want:    []string{"", "the task is on worker b at generation 2"},
		},
		{
			name:    "a task that no longer exists is refused",
			workers: []*fsm.Worker{worker("a", 4, statusReady, "")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "", 1, "a")},
			want:    []string{"task q/f/p0/r0 does not exist"},
		},
		{
			name:    "unplacing is always possible",
			workers: []*fsm.Worker{worker("a", 4, statusDown, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "a")},
			plan:    []fsm.PlannedPlacement{move("q/f/p0/r0", "a", 1, "")},
			want:    []string{""},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newPlanCheck(tc.workers, tc.tasks, perCore)
			for i, p := range tc.plan {
				got := c.check(p)
				if (tc.want[i] == "") != (got == "") || !strings.Contains(got, tc.want[i]) {
					t.Fatalf("placement %d (%s -> %s): reason %q, want %q", i, p.TaskID, p.ToWorker, got, tc.want[i])
				}
				if got == "" {
					c.commit(p)
				}
			}
		})
	}
}

// TestSchedulerPlacement is the scheduler's table: where replace puts
// tasks, and that the applier accepts every placement it plans.
func TestSchedulerPlacement(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		workers []*fsm.Worker
		tasks   []*fsm.Task
		check   func(t *testing.T, placed map[string]string, why map[string]string)
	}{
		{
			name:    "capacity in cores: load per core decides, an 8-core worker takes more than a 1-core one",
			workers: []*fsm.Worker{worker("big", 8, statusReady, ""), worker("small", 1, statusReady, "")},
			tasks: func() []*fsm.Task {
				var ts []*fsm.Task
				for p := range 18 {
					ts = append(ts, placedTask("q", "f", p, 0, ""))
				}
				return ts
			}(),
			check: func(t *testing.T, placed, _ map[string]string) {
				n := map[string]int{}
				for _, w := range placed {
					n[w]++
				}
				if n["big"] != 16 || n["small"] != 2 {
					t.Fatalf("tasks per worker = %v, want big 16 and small 2 (equal load per core)", n)
				}
			},
		},
		{
			name:    "capacity: what does not fit waits, saying why",
			workers: []*fsm.Worker{worker("a", 1, statusReady, "")},
			tasks:   append(filler("a", tasksPerCore), placedTask("q", "f", 0, 0, "")),
			check: func(t *testing.T, placed, why map[string]string) {
				if placed["q/f/p0/r0"] != "" || !strings.Contains(why["q/f/p0/r0"], "waiting for capacity") {
					t.Fatalf("placed on %q, why %q", placed["q/f/p0/r0"], why["q/f/p0/r0"])
				}
			},
		},
		{
			name: "zone spread: three replicas go to three zones",
			workers: []*fsm.Worker{worker("a1", 4, statusReady, "z1"), worker("a2", 4, statusReady, "z1"),
				worker("b1", 4, statusReady, "z2"), worker("c1", 4, statusReady, "z3")},
			tasks: []*fsm.Task{placedTask("q", "f", 0, 0, ""), placedTask("q", "f", 0, 1, ""), placedTask("q", "f", 0, 2, "")},
			check: func(t *testing.T, placed, _ map[string]string) {
				zones := map[string]bool{}
				for _, w := range placed {
					zones[w[:1]] = true
				}
				if len(zones) != 3 {
					t.Fatalf("placements %v use zones %v, want 3 zones", placed, zones)
				}
			},
		},
		{
			name:    "anti-affinity: two replicas never share a worker; the third waits",
			workers: []*fsm.Worker{worker("a", 4, statusReady, ""), worker("b", 4, statusReady, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, ""), placedTask("q", "f", 0, 1, ""), placedTask("q", "f", 0, 2, "")},
			check: func(t *testing.T, placed, why map[string]string) {
				if placed["q/f/p0/r0"] == placed["q/f/p0/r1"] || placed["q/f/p0/r2"] != "" ||
					!strings.Contains(why["q/f/p0/r2"], "replicas of a partition run on different workers") {
					t.Fatalf("placed %v why %v", placed, why)
				}
			},
		},
		{
			name:    "tasks on a down worker move, tasks on an unknown one stay",
			workers: []*fsm.Worker{worker("down", 4, statusDown, ""), worker("unk", 4, statusUnknown, ""), worker("ok", 4, statusReady, "")},
			tasks:   []*fsm.Task{placedTask("q", "f", 0, 0, "down"), placedTask("q", "f", 1, 0, "unk")},
			check: func(t *testing.T, placed, _ map[string]string) {
				if placed["q/f/p0/r0"] != "ok" || placed["q/f/p1/r0"] != "unk" {
					t.Fatalf("placed %v", placed)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			moves := replace(tc.workers, tc.tasks, nil, handOver{})
			check := newPlanCheck(tc.workers, tc.tasks, tasksPerCore)
			placed, why := map[string]string{}, map[string]string{}
			for _, tk := range tc.tasks {
				if !strings.HasPrefix(tk.Query, "fill") {
					placed[tk.ID] = tk.WorkerID
				}
			}
			for _, m := range moves {
				if reason := check.check(m); reason != "" {
					t.Fatalf("the applier refuses what the scheduler planned: %s -> %s: %s", m.TaskID, m.ToWorker, reason)
				}
				check.commit(m)
				placed[m.TaskID], why[m.TaskID] = m.ToWorker, m.Message
			}
			tc.check(t, placed, why)
		})
	}
}

// TestOnlyThePlanApplierWritesPlacements fails when code of this package
// other than the plan applier proposes a placement: the legacy PlaceTasks
// command, an ApplyPlan entry, or tasks created already placed.
func TestOnlyThePlanApplierWritesPlacements(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "fsm" {
					switch n.Sel.Name {
					case "PlaceTasksType", "PlaceTasksRequest":
						t.Errorf("%s: uses fsm.%s: placements go through the plan applier", fset.Position(n.Pos()), n.Sel.Name)
					case "ApplyPlanType":
						if name != "plan_applier.go" {
							t.Errorf("%s: proposes fsm.ApplyPlanType outside the plan applier (submit a plan with submitPlan)", fset.Position(n.Pos()))
						}
					}
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Task" {
					return true
				}
				for _, e := range n.Elts {
					if kv, ok := e.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "WorkerID" {
							t.Errorf("%s: creates a task with a WorkerID: tasks are created unplaced and placed by a plan", fset.Position(kv.Pos()))
						}
					}
				}
			}
			return true
		})
	}
}

// TestSlotMapStartsWithTheFormula: the initial replicated map is exactly
// the formula the data plane routed by before maps were replicated.
func TestSlotMapStartsWithTheFormula(t *testing.T) {
	t.Parallel()
	if fsm.NumSlots != queryspec.NumSlots {
		t.Fatalf("fsm.NumSlots %d != queryspec.NumSlots %d", fsm.NumSlots, queryspec.NumSlots)
	}
	for _, parts := range []int{1, 2, 3, 4, 7, 64, 4096} {
		m := fsm.SlotMap{Ranges: fsm.ContiguousSlotMap(parts)}
		if why := fsm.CheckSlotRanges(m.Ranges, parts); why != "" {
			t.Fatalf("%d partitions: %s", parts, why)
		}
		for s, p := range m.Owners() {
			if want := queryspec.PartitionOfSlot(s, parts); p != want {
				t.Fatalf("%d partitions: slot %d -> %d, formula says %d", parts, s, p, want)
			}
		}
	}
}

const keyedQuery = `
name: %s
replicas: 1
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: tok, type: split, input: text, field: line, as: word}
  - {name: counts, type: aggregate, input: tok, group_by: [word], window: {size: 1s}, aggregates: {n: "count()"}, parallelism: 3}
sinks:
  - {name: out, input: counts}
`

func taskOf(t *testing.T, c *testCluster, node int, id string) *fsm.Task {
	t.Helper()
	tk, err := c.nodes[node].State().Task(nil, id)
	if err != nil || tk == nil {
		t.Fatalf("task %s: %v, %v", id, tk, err)
	}
	return tk
}

// TestRacingPlansExactlyOneWins: two managers plan, from the same state,
// to move one task to two different workers. Through the real leader's
// applier exactly one plan wins; the other is refused as stale, with a
// reason naming where the task is now.
func TestRacingPlansExactlyOneWins(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	var ws []*fakeWorker
	for _, n := range []string{"w1", "w2", "w3"} {
		ws = append(ws, c.startWorker(t, l, n))
	}
	waitReady(t, c, l, len(ws))
	submit(t, c.admin(l), "race", 1)
	const id = "race/text/p0/r0"
	var from *fsm.Task
	waitFor(t, 10*time.Second, "task placed", func() bool {
		from, _ = c.nodes[l].State().Task(nil, id)
		return from != nil && from.WorkerID != ""
	})
	workers, _ := c.nodes[l].State().Workers(nil)
	var targets []string
	for _, w := range workers {
		if w.ID != from.WorkerID {
			targets = append(targets, w.ID)
		}
	}
	if len(targets) < 2 {
		t.Fatalf("need two other workers, have %v", targets)
	}
	start := make(chan struct{})
	outs := make([]*planOutcome, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, source := range []string{fsm.PlanSourceMove, fsm.PlanSourceHealth} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			outs[i], errs[i] = c.nodes[l].submitPlan(ctxT(t, 10*time.Second), fsm.ApplyPlanRequest{
				Source: source, StateIndex: c.nodes[l].State().LatestIndex(),
				Placements: []fsm.PlannedPlacement{{TaskID: id, FromWorker: from.WorkerID, FromGeneration: from.Gen(), ToWorker: targets[i]}},
			})
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i := range outs {
		if errs[i] != nil {
			t.Fatalf("plan %d: %v", i, errs[i])
		}
		r := outs[i].Result
		switch {
		case len(r.Placed) == 1 && len(r.Refused) == 0:
			if winner >= 0 {
				t.Fatalf("both plans won: %+v and %+v", outs[0].Result, outs[1].Result)
			}
			winner = i
		case len(r.Placed) == 0 && len(r.Refused) == 1:
		default:
			t.Fatalf("plan %d: neither won nor refused: %+v", i, r)
		}
	}
	if winner < 0 {
		t.Fatalf("no plan won: %+v / %+v", outs[0].Result, outs[1].Result)
	}
	loser := outs[1-winner].Result.Refused[0]
	wantReason := fmt.Sprintf("stale plan: the task is on worker %s at generation 2, the plan expected it on worker %s at generation 1", targets[winner], from.WorkerID)
	if loser.TaskID != id || !strings.Contains(loser.Reason, wantReason) {
		t.Fatalf("loser's refusal = %+v, want reason %q", loser, wantReason)
	}
	now := taskOf(t, c, l, id)
	if now.WorkerID != targets[winner] || now.Generation != 2 {
		t.Fatalf("task after the race = %+v, want on %s at generation 2", now, targets[winner])
	}
	// query status shows the new copy's generation.
	q, err := c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "race"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range q.Tasks {
		if ti.TaskId == id && ti.Generation != 2 {
			t.Fatalf("query status shows generation %d, want 2", ti.Generation)
		}
	}
}

// TestRefusalIsTheWaitingTasksReason: a plan placing an unplaced task on a
// down worker is refused, and the task shows the refusal as its reason.
func TestRefusalIsTheWaitingTasksReason(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	w1 := c.startWorker(t, l, "w1")
	waitReady(t, c, l, 1)
	submit(t, c.admin(l), "waits", 1)
	const id = "waits/text/p0/r0"
	waitFor(t, 10*time.Second, "the task placed on w1", func() bool {
		tk, _ := c.nodes[l].State().Task(nil, id)
		return tk != nil && tk.WorkerID == w1.id
	})
	w1.stop()
	waitFor(t, 10*time.Second, "w1 down and the task unplaced", func() bool {
		tk, _ := c.nodes[l].State().Task(nil, id)
		w, _ := c.nodes[l].State().Worker(nil, w1.id)
		return tk != nil && tk.WorkerID == "" && w != nil && w.Status == statusDown
	})
	tk := taskOf(t, c, l, id)
	out, err := c.nodes[l].submitPlan(ctxT(t, 10*time.Second), fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove,
		Placements: []fsm.PlannedPlacement{{TaskID: id, FromGeneration: tk.Gen(), ToWorker: w1.id}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Result.Refused) != 1 || !strings.Contains(out.Result.Refused[0].Reason, "is down, not ready") {
		t.Fatalf("result = %+v", out.Result)
	}
	waitFor(t, 5*time.Second, "the refusal stored as the task's reason", func() bool {
		tk, _ := c.nodes[l].State().Task(nil, id)
		return tk != nil && tk.Message == out.Result.Refused[0].Reason
	})
	if tk := taskOf(t, c, l, id); tk.Generation != 2 {
		t.Fatalf("the copy lost with its worker ended generation 1; task = %+v", tk)
	}
}

// TestSubmitCreatesSlotMapsAndAssignmentsCarryThem: a keyed fragment gets
// its slot map (epoch 1, the formula) when its query is placed; each of
// its tasks learns its slot set and the epoch, every task of the query the
// map; a reassignment bumps the epoch and a stale one is refused.
func TestSubmitCreatesSlotMapsAndAssignmentsCarryThem(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	w := c.startWorker(t, l, "w1")
	waitReady(t, c, l, 1)
	if _, err := c.admin(l).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{
		Yaml: []byte(fmt.Sprintf(keyedQuery, "keyed")), Filename: "keyed.yaml"}); err != nil {
		t.Fatal(err)
	}
	st := c.nodes[l].State()
	var m *fsm.SlotMap
	waitFor(t, 10*time.Second, "slot map of counts", func() bool {
		m, _ = st.SlotMap(nil, "keyed", "counts")
		return m != nil
	})
	if m.Epoch != 1 || m.Partitions != 3 || !slices.Equal(m.Ranges, fsm.ContiguousSlotMap(3)) {
		t.Fatalf("initial slot map = %+v", m)
	}
	if maps, _ := st.SlotMaps(nil, "keyed"); len(maps) != 1 {
		t.Fatalf("slot maps of keyed = %d, want 1 (only counts is keyed)", len(maps))
	}
	resp, err := c.workers(l).WatchAssignments(ctxT(t, 10*time.Second), &pb.WatchAssignmentsRequest{WorkerId: w.id})
	if err != nil {
		t.Fatal(err)
	}
	checkAssignments := func(resp *pb.WatchAssignmentsResponse, epoch uint64, owners []int) {
		t.Helper()
		if len(resp.Queries) != 1 || len(resp.Queries[0].SlotMaps) != 1 || resp.Queries[0].SlotMaps[0].Epoch != epoch {
			t.Fatalf("view slot maps = %v", resp.Queries)
		}
		seen := 0
		for _, a := range resp.Assignments {
			if a.Generation != 1 {
				t.Fatalf("assignment %s generation %d", a.TaskId, a.Generation)
			}
			if a.Fragment != "counts" {
				if a.SlotEpoch != 0 || len(a.Slots) != 0 {
					t.Fatalf("unkeyed task %s carries slots", a.TaskId)
				}
				continue
			}
			if a.SlotEpoch != epoch {
				t.Fatalf("assignment %s epoch %d, want %d", a.TaskId, a.SlotEpoch, epoch)
			}
			for _, r := range a.Slots {
				for s := r.First; s <= r.Last; s++ {
					if owners[s] != int(a.Partition) {
						t.Fatalf("%s owns slot %d, which the map gives to %d", a.TaskId, s, owners[s])
					}
					seen++
				}
			}
		}
		if seen != fsm.NumSlots {
			t.Fatalf("the assignments own %d slots, want %d", seen, fsm.NumSlots)
		}
	}
	checkAssignments(resp, 1, m.Owners())

	// Reassign: partition 2 gives its slots to partition 0.
	owners := m.Owners()
	for s := range owners {
		if owners[s] == 2 {
			owners[s] = 0
		}
	}
	update := fsm.SlotMapUpdate{Query: "keyed", Fragment: "counts", QueryIndex: m.QueryIndex, ExpectedEpoch: 1, Partitions: 3, Ranges: fsm.RangesOf(owners)}
	out, err := c.nodes[l].submitPlan(ctxT(t, 10*time.Second), fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, SlotMaps: []fsm.SlotMapUpdate{update}})
	if err != nil || len(out.Result.SlotMaps) != 1 || len(out.Result.Refused) != 0 {
		t.Fatalf("reassignment: %+v, %v", out, err)
	}
	// The same plan again is stale: the map is at epoch 2 now.
	out, err = c.nodes[l].submitPlan(ctxT(t, 10*time.Second), fsm.ApplyPlanRequest{Source: fsm.PlanSourceRescale, SlotMaps: []fsm.SlotMapUpdate{update}})
	if err != nil || len(out.Result.Refused) != 1 || !strings.Contains(out.Result.Refused[0].Reason, "at epoch 2, the plan expected epoch 1") {
		t.Fatalf("stale reassignment: %+v, %v", out, err)
	}
	resp, err = c.workers(l).WatchAssignments(ctxT(t, 10*time.Second), &pb.WatchAssignmentsRequest{WorkerId: w.id, MinIndex: resp.Index})
	if err != nil {
		t.Fatal(err)
	}
	checkAssignments(resp, 2, owners)
}

// TestSubmitPlacesThroughTheApplier: submit returns with the tasks placed
// by a plan (not created placed), and a submit on a node without a plan
// applier leaves them to the scheduler instead of failing.
func TestSubmitPlacesThroughTheApplier(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	c.startWorker(t, l, "w1")
	waitReady(t, c, l, 1)
	if _, err := c.nodes[l].submitPlan(context.Background(), fsm.ApplyPlanRequest{Source: fsm.PlanSourceMove}); err != nil {
		t.Fatalf("empty plan: %v", err)
	}
	resp := submit(t, c.admin(l), "placed", 1)
	tasks, _ := c.nodes[l].State().TasksByQuery(nil, "placed")
	for _, tk := range tasks {
		if tk.WorkerID == "" {
			t.Fatalf("task %s unplaced after submit returned", tk.ID)
		}
		if tk.CreateIndex != resp.Index || tk.ModifyIndex <= resp.Index {
			t.Fatalf("task %s created at %d, modified at %d: want created by the submit (%d) and placed by a later plan", tk.ID, tk.CreateIndex, tk.ModifyIndex, resp.Index)
		}
	}
}

// TestSlotMapsWithoutPlacement: a keyed query whose tasks cannot be placed
// yet (no worker) still gets its slot maps, from the scheduler's plan, as
// does a query of an older build that never had any.
func TestSlotMapsWithoutPlacement(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	if _, err := c.admin(l).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{
		Yaml: []byte(fmt.Sprintf(keyedQuery, "nowhere")), Filename: "nowhere.yaml"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "slot map of an unplaced keyed query", func() bool {
		m, _ := c.nodes[l].State().SlotMap(nil, "nowhere", "counts")
		return m != nil && m.Epoch == 1
	})
	if tasks, _ := c.nodes[l].State().TasksByWorker(nil, ""); len(tasks) == 0 {
		t.Fatal("tasks placed without a worker")
	}
	if missing := c.nodes[l].missingSlotMaps(); len(missing) != 0 {
		t.Fatalf("still missing: %+v", missing)
	}
}
