package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// reconfigYAML: two source partitions with a map fused into them (a), a
// map in its own task reading both partitions (b), a sink. a and b depend
// on each other: version N of a adds N*1000 to k, version N of b labels
// the tuple vN only if k carries N*1000, MIXED otherwise. A tuple that met
// a and b of different versions is labelled MIXED.
const reconfigYAML = `name: rc
sources:
  - {name: lines, parallelism: 2, generator: {kind: words, rate: %d, seed: 5, limit: %d}}
operators:
  - {name: a, type: map, input: lines, parallelism: 2, fields: {line: line, k: "len(line) + 1000"}}
  - {name: b, type: map, input: a, fields: {line: line, k: k, path: "k - len(line) == 1000 ? 'v1' : 'MIXED'"}}
sinks:
  - {name: out, input: b}
`

// versionYAML is reconfigYAML with a and b at version v.
func versionYAML(base string, v int) string {
	s := strings.ReplaceAll(base, "1000", fmt.Sprint(v*1000))
	return strings.ReplaceAll(s, "'v1'", fmt.Sprintf("'v%d'", v))
}

type reconfigRun struct {
	t      *testing.T
	c      *cluster
	yaml   string
	faults *dataplane.Faults
	rc     fsm.QueryReconfig
	plan   *queryspec.Plan
	tasks  int
	// version gives the query's YAML at version v of its operators.
	version func(v int) string
	changed []string
	// strategy and margin of the plans addPlan adds ("": live; 0: the
	// default margin).
	strategy string
	margin   time.Duration
	// pace is the pace of the run's generators (1 unless a test sets it).
	pace *Pace

	mu  sync.Mutex
	out []tuple.Tuple
	n   int
}

// startReconfigRun runs the query over three workers: source partition p
// on worker p, b and the sink on worker 2, which dials through faults.
func startReconfigRun(t *testing.T, yaml, tracking string) *reconfigRun {
	t.Helper()
	return startReconfigRunReplicas(t, yaml, tracking, 1)
}

// startReconfigRunReplicas is startReconfigRun with replicas of every
// task: replica 1 of a source partition on the other source worker, of
// the other tasks on worker 1.
func startReconfigRunReplicas(t *testing.T, yaml, tracking string, replicas int) *reconfigRun {
	t.Helper()
	q, err := queryspec.Parse("rc.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	opts, pace := pacedOpts(t, Options{BoundaryInterval: 5 * time.Millisecond, StallAfter: 30 * time.Second})
	shared := dataplane.NewPool()
	faults := dataplane.NewFaults()
	faulty := dataplane.NewPool(faults.DialOption())
	t.Cleanup(func() { faulty.Close() })
	c := &cluster{pool: shared, query: q, specs: map[*worker][]TaskSpec{}}
	c.workers = []*worker{startWorkerOpts(t, shared, opts), startWorkerOpts(t, shared, opts), startWorkerOpts(t, faulty, opts)}
	t.Cleanup(func() { c.close(t) })
	var placements []Placement
	at := map[string]*worker{}
	for _, node := range plan.Nodes {
		for p := range node.Partitions {
			for rep := range replicas {
				w := c.workers[2-rep]
				if node.Kind == queryspec.KindSource {
					w = c.workers[(p+rep)%2]
				}
				id := queryspec.TaskID(q.Name, node.Name, p, rep)
				placements = append(placements, Placement{TaskID: id, Fragment: node.Name, Partition: p, Replica: rep, WorkerAddr: w.addr})
				at[id] = w
			}
		}
	}
	for _, pl := range placements {
		c.specs[at[pl.TaskID]] = append(c.specs[at[pl.TaskID]], TaskSpec{TaskID: pl.TaskID, Query: q.Name,
			Fragment: pl.Fragment, Partition: pl.Partition, Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements})
	}
	r := &reconfigRun{t: t, c: c, yaml: yaml, faults: faults, rc: fsm.QueryReconfig{Tracking: tracking}, plan: plan, tasks: len(placements), pace: pace,
		version: func(v int) string { return versionYAML(yaml, v) }, changed: []string{"a", "b"}}
	c.apply()
	return r
}

// tail reads the sink's result stream to its end in the background.
func (r *reconfigRun) tail() (done <-chan struct{}) {
	return r.tailOf("rc/out/p0/r0", &r.out)
}

// tailOf reads the result stream of sink task id into *dst (under r.mu)
// to its end in the background.
func (r *reconfigRun) tailOf(id string, dst *[]tuple.Tuple) (done <-chan struct{}) {
	ch := make(chan struct{})
	conn, err := r.c.pool.Conn(r.c.addrOf(id))
	if err != nil {
		r.t.Fatal(err)
	}
	// Ended with the test too: a test that stops the query leaves a
	// stream without its final boundary.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r.t.Cleanup(cancel)
	go func() {
		defer close(ch)
		defer cancel()
		sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "rc", TaskId: id}, "", true, 0)
		for ctx.Err() == nil {
			err := sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
				r.mu.Lock()
				defer r.mu.Unlock()
				for _, tp := range b.Tuples {
					tp.Values = slices.Clone(tp.Values)
					*dst = append(*dst, tp)
					if tp.Type.IsData() && dst == &r.out {
						r.n++
					}
				}
				if last := b.Tuples[len(b.Tuples)-1]; last.Type == tuple.Boundary && last.STime == math.MaxInt64 {
					return dataplane.ErrStopSubscription
				}
				return nil
			})
			if err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return ch
}

func (r *reconfigRun) received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// publish gives every task the current reconfiguration state, as the
// coordinator's assignments would.
func (r *reconfigRun) publish() { r.publishExcept("", nil) }

// publishExcept is publish, but task late (if not "") gets old instead:
// it learns the current state later, with the next publish.
func (r *reconfigRun) publishExcept(late string, old *fsm.QueryReconfig) {
	r.publishExceptOn(nil, late, old)
}

// publishExceptOn is publishExcept, late naming only the copy of the
// task on worker at (nil: any worker).
func (r *reconfigRun) publishExceptOn(at *worker, late string, old *fsm.QueryReconfig) {
	rc := r.rc
	rc.Plans = slices.Clone(r.rc.Plans)
	for w, specs := range r.c.specs {
		for i := range specs {
			specs[i].Reconfig = &rc
			if specs[i].TaskID == late && (at == nil || at == w) {
				specs[i].Reconfig = old
			}
			n := 0
			for _, in := range r.plan.Node(specs[i].Fragment).Inputs {
				n += r.plan.Node(in).Partitions
			}
			specs[i].MarkersExpected = n
		}
	}
	r.c.apply()
}

// commit adds a plan giving a and b version v (loading) and waits until
// every task acknowledged it.
func (r *reconfigRun) commit(v int) {
	r.t.Helper()
	r.waitAcked(r.addPlan(v).Epoch)
}

// waitAcked waits until every task acknowledged epoch.
func (r *reconfigRun) waitAcked(epoch uint64) {
	r.t.Helper()
	waitUntilOr(r.t, "every task acknowledged", func() bool {
		sts := r.states()
		for _, st := range sts {
			if !st.Reconfig || st.ReconfigAcked < epoch {
				return false
			}
		}
		return len(sts) == r.tasks
	}, func() { r.logAcks(epoch) })
}

// logAcks logs what each task acknowledged: what a test that gave up
// waiting for epoch waited on.
func (r *reconfigRun) logAcks(epoch uint64) {
	for id, st := range r.states() {
		r.t.Logf("%s: %s reconfig %v acked %d of %d, level %d, %v tentative %v: %s", id, st.State, st.Reconfig, st.ReconfigAcked, epoch, st.ReconfigLevel, st.Replica, st.Tentative, st.Message)
	}
	r.t.Logf("%d tasks expected", r.tasks)
}

// addPlan adds a plan giving a and b version v (loading) and hands it to
// every task.
func (r *reconfigRun) addPlan(v int) fsm.ReconfigPlan {
	r.t.Helper()
	p := r.appendPlan(v)
	r.publish()
	return p
}

// appendPlan adds a plan giving a and b version v (loading) to r.rc
// without handing it to the tasks.
func (r *reconfigRun) appendPlan(v int) fsm.ReconfigPlan {
	r.t.Helper()
	q, err := queryspec.Parse("rc.yaml", []byte(r.version(v)))
	if err != nil {
		r.t.Fatal(err)
	}
	spec, err := q.CanonicalJSON()
	if err != nil {
		r.t.Fatal(err)
	}
	p := fsm.ReconfigPlan{Epoch: uint64(len(r.rc.Plans) + 1), SpecJSON: spec, Phase: fsm.ReconfigLoading, Strategy: r.strategy, SwitchMargin: int64(r.margin)}
	for _, op := range r.changed {
		def, _ := json.Marshal(q.OperatorByName(op))
		p.Changes = append(p.Changes, fsm.OperatorChange{Operator: op, Version: v, SpecJSON: def})
	}
	r.rc.Plans = append(r.rc.Plans, p)
	return p
}

func (r *reconfigRun) states() map[string]TaskState {
	out := map[string]TaskState{}
	for _, st := range r.c.states() {
		if st.State == StateFailed {
			r.t.Fatalf("task %s failed: %s", st.TaskID, st.Message)
		}
		out[st.TaskID] = st
	}
	return out
}

// switchAll waits for every task to acknowledge every plan, then switches
// them at cuts gap apart above the highest frontier (as the coordinator
// does when the last task acknowledged).
func (r *reconfigRun) switchAll(gap time.Duration) {
	r.t.Helper()
	latest := uint64(len(r.rc.Plans))
	frontier := int64(math.MinInt64)
	waitUntilOr(r.t, "every task acknowledged", func() bool {
		frontier = math.MinInt64
		sts := r.states()
		for _, st := range sts {
			if !st.Reconfig || st.ReconfigAcked < latest {
				return false
			}
			frontier = max(frontier, st.ReconfigFrontier)
		}
		return len(sts) == r.tasks
	}, func() { r.logAcks(latest) })
	for i := range r.rc.Plans {
		if r.rc.Plans[i].Phase == fsm.ReconfigLoading {
			r.rc.Plans[i].Phase, r.rc.Plans[i].Cut = fsm.ReconfigSwitched, frontier+int64(i+1)*int64(gap)
		}
	}
	r.publish()
}

func (r *reconfigRun) level(id string) uint64 { return r.states()[id].ReconfigLevel }

// waitLevel waits until every task has the markers of epoch e.
func (r *reconfigRun) waitLevel(e uint64) {
	r.t.Helper()
	waitUntil(r.t, fmt.Sprintf("every task at level %d", e), func() bool {
		for _, st := range r.states() {
			if st.ReconfigLevel < e {
				return false
			}
		}
		return true
	})
}

func (r *reconfigRun) complete() {
	for i := range r.rc.Plans {
		r.rc.Plans[i].Phase = fsm.ReconfigComplete
	}
	r.publish()
}

// versionsOf lists the versions task id runs of its operator i.
func (r *reconfigRun) versionsOf(id string, i int) []int {
	r.t.Helper()
	for _, w := range r.c.workers {
		if tk := w.rt.task(id); tk != nil {
			if err := tk.lockProc(context.Background()); err != nil {
				r.t.Fatal(err)
			}
			defer tk.unlockProc()
			if i >= len(tk.rc.vers) || tk.rc.vers[i] == nil {
				r.t.Fatalf("task %s operator %d is not versioned", id, i)
			}
			return tk.rc.vers[i].Versions()
		}
	}
	r.t.Fatalf("no task %s", id)
	return nil
}

// check compares the output with the generator's lines (none lost or
// duplicated) and checks every output tuple's version path. It returns
// how many tuples each version path processed.
func (r *reconfigRun) check(limit int, static bool) map[string]int {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var want []string
	for p := range 2 {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 5, Limit: int64(limit), Rate: 1}, p)
		if err != nil {
			r.t.Fatal(err)
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			want = append(want, tp.Values[0].S)
		}
	}
	var got []string
	paths := map[string]int{}
	for _, tp := range r.out {
		if tp.Type != tuple.Stable {
			continue // the stable view: tentative results are corrected
		}
		line, k, path := tp.Values[0].S, tp.Values[1].I, tp.Values[2].S
		got = append(got, line)
		paths[path]++
		if path == "MIXED" {
			r.t.Fatalf("tuple %d (%q, k %d, tag %d) met a and b of different versions", tp.ID, line, k, tp.Version)
		}
		if static && path != fmt.Sprintf("v%d", tp.Version+1) {
			r.t.Fatalf("tuple %d: path %s but version tag %d", tp.ID, path, tp.Version)
		}
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		r.t.Fatalf("output has %d tuples, the generators %d: lost or duplicated tuples", len(got), len(want))
	}
	return paths
}

// TestReconfigUpgradeUnderLoad upgrades two dependent operators (a, fused
// into both source partitions, and b, in its own task reading both) while
// tuples flow: no tuple meets a and b of different versions, the tag of
// every output names the versions that processed it, and none is lost or
// duplicated. Once every task has the markers of both upstream instances
// the old versions are gone.
func TestReconfigUpgradeUnderLoad(t *testing.T) {
	const limit = 3000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), fsm.TrackingStatic)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	r.commit(2)
	if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("b runs versions %v while the plan loads, want [1 2]", v)
	}
	r.switchAll(100 * time.Millisecond)
	r.waitLevel(1)
	if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{2}) {
		t.Fatalf("b runs versions %v after every marker arrived, want [2]", v)
	}
	r.complete()
	<-done
	paths := r.check(limit, true)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("the upgrade did not happen mid-stream: %v", paths)
	}
}

// TestReconfigThreeVersionsCoexist commits a second plan before the first
// switched: b runs v1, v2 and v3 side by side, and every tuple is
// processed by one of the three consistent paths.
func TestReconfigThreeVersionsCoexist(t *testing.T) {
	const limit = 3000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), fsm.TrackingStatic)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	// The two plans must switch mid-stream: at load ~60 committing and
	// switching them took most of the 1.5 s stream, the second cut lay
	// past its end and no tuple went through v3 ("paths map[v1:5660
	// v2:340]"). The sources go at a twentieth of their rate meanwhile
	// (stream times, and so results, unchanged), and fast once both are
	// switched.
	if err := r.pace.Set(0.05); err != nil {
		t.Fatal(err)
	}
	r.commit(2)
	r.commit(3)
	if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{1, 2, 3}) {
		t.Fatalf("b runs versions %v, want [1 2 3]", v)
	}
	r.switchAll(100 * time.Millisecond)
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	r.waitLevel(2)
	if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{3}) {
		t.Fatalf("b runs versions %v after both plans' markers, want [3]", v)
	}
	r.complete()
	<-done
	paths := r.check(limit, true)
	// All three versions processed tuples, and each tuple the one its
	// stream time gives: v1 below the first cut, v2 from it to the
	// second, v3 from there (generator sources switch exactly at the
	// cuts, and nothing is re-tagged).
	if paths["v1"] == 0 || paths["v2"] == 0 || paths["v3"] == 0 {
		t.Fatalf("paths %v: not every version processed tuples", paths)
	}
	r.checkTagsByCut()
}

// checkTagsByCut checks that every stable output tuple is tagged with the
// epoch of the newest plan whose cut its stream time reached (static
// tracking, generator sources, stateless operators: a tuple keeps its
// source's stream time and tag).
func (r *reconfigRun) checkTagsByCut() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var cuts []int64 // by epoch - 1
	for _, p := range r.rc.Plans {
		if p.Phase == fsm.ReconfigLoading {
			break
		}
		cuts = append(cuts, p.Cut)
	}
	for _, tp := range r.out {
		if tp.Type != tuple.Stable {
			continue
		}
		var want uint64
		for i, cut := range cuts {
			if tp.STime >= cut {
				want = uint64(i + 1)
			}
		}
		if tp.Version != want {
			r.t.Fatalf("tuple %d at stime %d tagged %d, want %d (cuts %v)", tp.ID, tp.STime, tp.Version, want, cuts)
		}
	}
}

// TestReconfigDisconnectedUpstreamDelaysRemoval: source partition 1 is
// cut off from b during the upgrade. b gets partition 0's marker only, so
// it keeps the old version; once the link heals partition 1's marker
// arrives and the old version is removed. Nothing is lost or mixed.
func TestReconfigDisconnectedUpstreamDelaysRemoval(t *testing.T) {
	const limit = 3000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), fsm.TrackingStatic)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	// At load ~60 the 1.5 s stream ended before the sources passed the
	// cut: they go at a twentieth of their rate until the link healed
	// (stream times, and so results, unchanged).
	if err := r.pace.Set(0.05); err != nil {
		t.Fatal(err)
	}
	r.commit(2)
	r.faults.CutOutgoing(r.c.workers[1].addr, dataplane.Reset)
	r.switchAll(100 * time.Millisecond)
	waitUntil(t, "both sources past the cut, b with one marker of two", func() bool {
		st := r.states()
		m := st["rc/b/p0/r0"].ReconfigMarkers[0]
		return st["rc/lines/p0/r0"].ReconfigLevel == 1 && st["rc/lines/p1/r0"].ReconfigLevel == 1 && m.Epoch == 1 && m.Seen == 1 && m.Expected == 2
	})
	if lv := r.level("rc/b/p0/r0"); lv != 0 {
		t.Fatalf("b reached level %d without partition 1's marker", lv)
	}
	if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("b removed its old version while an upstream was disconnected: %v", v)
	}
	r.faults.HealAll()
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	r.waitLevel(1)
	if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{2}) {
		t.Fatalf("b runs %v after the upstream reconnected, want [2]", v)
	}
	r.complete()
	<-done
	r.check(limit, true)
	// The partition cut off switched at the cut too: what it sent after
	// the link healed carries the new version from the cut on.
	r.checkTagsByCut()
}

// TestReconfigDynamicTracking: with dynamic tracking what leaves b (no
// operator downstream) carries no tag, and paths stay consistent.
func TestReconfigDynamicTracking(t *testing.T) {
	const limit = 2000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), fsm.TrackingDynamic)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	// At load ~60 the 1 s stream ended before the plan switched ("paths
	// map[v1:4000]"): the sources go at a twentieth of their rate until
	// it did (stream times, and so results, unchanged), as in
	// TestReconfigThreeVersionsCoexist.
	if err := r.pace.Set(0.05); err != nil {
		t.Fatal(err)
	}
	r.commit(2)
	r.switchAll(100 * time.Millisecond)
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	r.waitLevel(1)
	r.complete()
	<-done
	paths := r.check(limit, false)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("paths %v", paths)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, tp := range r.out {
		if tp.Type.IsData() && tp.Version != 0 {
			t.Fatalf("tuple %d left b tagged %d under dynamic tracking", tp.ID, tp.Version)
		}
	}
}

// aggregateYAML: a (fused into the sources) feeds a windowed aggregate
// whose task also runs b (fused after it). Version 2 of a and b compute
// the same values by other expressions: state compatible, so the
// aggregate's windows are shared by both versions.
const aggregateYAML = `name: rc
sources:
  - {name: lines, parallelism: 2, generator: {kind: words, rate: 2000, seed: 5, limit: %d}}
operators:
  - {name: a, type: map, input: lines, parallelism: 2, fields: {n: "len(line)"}}
  - {name: per_window, type: aggregate, input: a, window: {size: 200ms}, aggregates: {cnt: "count()", total: "sum(n)"}}
  - {name: b, type: map, input: per_window, fields: {cnt: cnt, total: total, window_end: window_end}}
sinks:
  - {name: out, input: b}
`

// TestReconfigAggregateUpgradedMidWindow upgrades the operators before
// and after a windowed aggregate while its windows are open: every
// window's count and total equal those computed from the generators with
// one version throughout (the state is shared, neither reset nor counted
// twice).
func TestReconfigAggregateUpgradedMidWindow(t *testing.T) {
	const limit = 3000
	yaml := fmt.Sprintf(aggregateYAML, limit)
	r := startReconfigRun(t, yaml, fsm.TrackingStatic)
	r.version = func(v int) string {
		s := strings.Replace(yaml, `n: "len(line)"`, `n: "len(line) * 2 - len(line)"`, 1)
		return strings.Replace(s, "total: total,", "total: total + 0,", 1)
	}
	if fr := r.plan.Node("b"); fr.Name != "per_window" {
		t.Fatalf("b runs in fragment %q, want the aggregate's", fr.Name)
	}
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 2 })
	// At load ~37 the 1.5 s stream ended before every task acknowledged
	// the plan: the aggregate task, whose input had ended, was at the
	// plan's level already and ran only b's version 2. The sources go
	// at a twentieth of their rate until the plan switched (stream
	// times, and so results, unchanged), as in
	// TestReconfigThreeVersionsCoexist.
	if err := r.pace.Set(0.05); err != nil {
		t.Fatal(err)
	}
	r.commit(2)
	if v := r.versionsOf("rc/per_window/p0/r0", 1); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("the aggregate task runs b versions %v, want [1 2]", v)
	}
	r.switchAll(50 * time.Millisecond)
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	r.waitLevel(1)
	r.complete()
	<-done
	type agg struct{ cnt, total int64 }
	want := map[int64]agg{}
	const size = int64(200 * time.Millisecond)
	for p := range 2 {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 5, Limit: limit, Rate: 2000}, p)
		if err != nil {
			t.Fatal(err)
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			end := (tp.STime/size + 1) * size
			a := want[end]
			a.cnt++
			a.total += int64(len(tp.Values[0].S))
			want[end] = a
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	got := map[int64]agg{}
	tags := map[uint64]int{}
	for _, tp := range r.out {
		if !tp.Type.IsData() {
			continue
		}
		end := tp.Values[2].I
		if _, dup := got[end]; dup {
			t.Fatalf("window %d emitted twice", end)
		}
		got[end] = agg{tp.Values[0].I, tp.Values[1].I}
		tags[tp.Version]++
	}
	if len(got) != len(want) {
		t.Fatalf("%d windows, want %d", len(got), len(want))
	}
	for end, w := range want {
		if got[end] != w {
			t.Fatalf("window %d: got %+v, want %+v", end, got[end], w)
		}
	}
	if tags[0] == 0 || tags[1] == 0 {
		t.Fatalf("windows by version tag %v: the upgrade did not happen mid-stream", tags)
	}
}

// TestReconfigTaskMovedDuringUpgrade moves b to another worker (a live
// move: the new copy starts from the old one's snapshot) while a plan is
// under way: the new copy runs both versions, reaches the plan's level
// from the markers that follow, and the output stays consistent, nothing
// lost or duplicated.
func TestReconfigTaskMovedDuringUpgrade(t *testing.T) {
	const limit = 3000
	r := startReconfigRun(t, fmt.Sprintf(reconfigYAML, 2000, limit), fsm.TrackingStatic)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 300 })
	r.commit(2)
	r.switchAll(300 * time.Millisecond)
	r.c.liveMove(t, "rc/b/p0/r0", r.c.workers[2], r.c.workers[0])
	if v := r.versionsOf("rc/b/p0/r0", 0); len(v) == 0 || v[len(v)-1] != 2 {
		t.Fatalf("the moved copy of b runs versions %v", v)
	}
	r.waitLevel(1)
	if v := r.versionsOf("rc/b/p0/r0", 0); !slices.Equal(v, []int{2}) {
		t.Fatalf("the moved copy of b runs %v after the markers, want [2]", v)
	}
	r.complete()
	<-done
	paths := r.check(limit, true)
	if paths["v1"] == 0 || paths["v2"] == 0 {
		t.Fatalf("paths %v", paths)
	}
}

// statefulYAML: a windowed aggregate per group g, followed by b in its
// task. Version 2 (statefulV2) changes the aggregate's shape: it renames
// and reorders its functions and adds max(n); b then reports it as extra
// (-1 in version 1).
const statefulYAML = `name: rc
sources:
  - {name: lines, parallelism: 2, generator: {kind: words, rate: 2000, seed: 5, limit: %d}}
operators:
  - {name: a, type: map, input: lines, parallelism: 2, fields: {n: "len(line)", g: "len(line) %% 3"}}
  - {name: per_window, type: aggregate, input: a, window: {size: 200ms}, group_by: [g], aggregates: {cnt: "count()", total: "sum(n)"}}
  - {name: b, type: map, input: per_window, fields: {g: g, cnt: cnt, total: total, extra: "0 - 1", window_end: window_end}}
sinks:
  - {name: out, input: b}
`

func statefulV2(yaml string) string {
	s := strings.Replace(yaml, `aggregates: {cnt: "count()", total: "sum(n)"}`, `aggregates: {sum_n: "sum(n)", cnt: "count()", longest: "max(n)"}`, 1)
	return strings.Replace(s, `total: total, extra: "0 - 1"`, `total: sum_n, extra: longest`, 1)
}

// TestReconfigStatefulAggregateMigrated upgrades a windowed aggregate
// itself while tuples flow, mid-window, with b after it depending on its
// new function: the functions both versions have stay exact over every
// window (as if one version had run throughout), the new one follows the
// documented migration rule (it covers the tuples tagged with the new
// epoch; 0 when none of the group's), each window's rows come from one
// version and carry its tag (b of the same version), and no row is lost
// or duplicated. The reference is computed from the generators and the
// plan's cut alone. Every task has two replicas, which load the plan at
// different moments: their outputs are identical, tags included.
func TestReconfigStatefulAggregateMigrated(t *testing.T) {
	const limit = 3000
	yaml := fmt.Sprintf(statefulYAML, limit)
	r := startReconfigRunReplicas(t, yaml, fsm.TrackingStatic, 2)
	r.version = func(v int) string { return statefulV2(yaml) }
	r.changed = []string{"per_window", "b"}
	var replica1 []tuple.Tuple
	done1 := r.tailOf("rc/out/p0/r1", &replica1)
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 2 })
	r.commit(2)
	if v := r.versionsOf("rc/per_window/p0/r0", 0); !slices.Equal(v, []int{1, 2}) {
		t.Fatalf("the aggregate runs versions %v while the plan loads, want [1 2]", v)
	}
	r.switchAll(50 * time.Millisecond)
	r.waitLevel(1)
	if v := r.versionsOf("rc/per_window/p0/r0", 0); !slices.Equal(v, []int{2}) {
		t.Fatalf("the aggregate runs versions %v after the markers, want [2]", v)
	}
	r.complete()
	<-done
	<-done1
	r.checkStateful(limit, replica1)
}

// checkStateful checks the rows of a statefulYAML run upgraded by one
// plan against the reference from the generators and the plan's cut
// (see TestReconfigStatefulAggregateMigrated), and, with replica1, that
// the second sink replica's rows are the same.
func (r *reconfigRun) checkStateful(limit int64, replica1 []tuple.Tuple) {
	t := r.t
	t.Helper()
	cut := r.rc.Plans[0].Cut

	type key struct{ end, g int64 }
	type ref struct {
		cnt, total, maxNew int64
		anyNew, anyOld     bool
	}
	want := map[key]*ref{}
	windowNew := map[int64]bool{}
	const size = int64(200 * time.Millisecond)
	for p := range 2 {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 5, Limit: limit, Rate: 2000}, p)
		if err != nil {
			t.Fatal(err)
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			n := int64(len(tp.Values[0].S))
			k := key{(tp.STime/size + 1) * size, n % 3}
			w := want[k]
			if w == nil {
				w = &ref{}
				want[k] = w
			}
			w.cnt++
			w.total += n
			if tp.STime >= cut {
				w.anyNew, w.maxNew = true, max(w.maxNew, n)
				windowNew[k.end] = true
			} else {
				w.anyOld = true
			}
		}
	}
	straddled := 0
	for _, w := range want {
		if w.anyNew && w.anyOld {
			straddled++
		}
	}
	if straddled == 0 {
		t.Fatalf("no group of a window holds tuples from both sides of the cut %d: not upgraded mid-window", cut)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	got := map[key]bool{}
	tags := map[uint64]int{}
	for _, tp := range r.out {
		if !tp.Type.IsData() {
			continue
		}
		g, cnt, total, extra, end := tp.Values[0].I, tp.Values[1].I, tp.Values[2].I, tp.Values[3].I, tp.Values[4].I
		k := key{end, g}
		w := want[k]
		if w == nil || got[k] {
			t.Fatalf("row %+v: not in the reference, or emitted twice", k)
		}
		got[k] = true
		tag := tp.Version
		if r.rc.Tracking == fsm.TrackingDynamic {
			// Tags cleared where nothing downstream depends on them: the
			// version is b's, read from extra (-1 only in version 1).
			if tag != 0 {
				t.Fatalf("row %+v left the aggregate's task tagged %d under dynamic tracking", k, tag)
			}
			if extra != -1 {
				tag = 1
			}
		}
		tags[tag]++
		if cnt != w.cnt || total != w.total {
			t.Fatalf("row %+v (tag %d): cnt %d total %d, want %d %d (one version throughout)", k, tag, cnt, total, w.cnt, w.total)
		}
		switch tag {
		case 0:
			if extra != -1 || windowNew[end] {
				t.Fatalf("row %+v: tag 0 with extra %d, window holds new-epoch tuples %v", k, extra, windowNew[end])
			}
		case 1:
			if extra != w.maxNew {
				t.Fatalf("row %+v: longest %d, want %d (max over the new epoch's tuples)", k, extra, w.maxNew)
			}
		default:
			t.Fatalf("row %+v: tag %d", k, tag)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: lost rows", len(got), len(want))
	}
	if tags[0] == 0 || tags[1] == 0 {
		t.Fatalf("rows by tag %v: the upgrade did not happen mid-stream", tags)
	}
	if replica1 != nil {
		sameReplicaRows(t, r.out, replica1)
	}
}

// sameReplicaRows fails the test unless two sink replicas' streams hold
// the same data tuples, ids and version tags included.
func sameReplicaRows(t *testing.T, out0, out1 []tuple.Tuple) {
	t.Helper()
	data := func(ts []tuple.Tuple) []tuple.Tuple {
		return slices.DeleteFunc(slices.Clone(ts), func(tp tuple.Tuple) bool { return !tp.Type.IsData() })
	}
	r0, r1 := data(out0), data(out1)
	if len(r0) != len(r1) {
		t.Fatalf("replica 0 produced %d rows, replica 1 %d", len(r0), len(r1))
	}
	for i := range r0 {
		a, b := r0[i], r1[i]
		if a.ID != b.ID || a.STime != b.STime || a.Version != b.Version || !slices.Equal(a.Values, b.Values) {
			t.Fatalf("row %d differs between replicas: %+v and %+v", i, a, b)
		}
	}
}

// TestReconfigStatefulAggregateMovedDuringUpgrade moves the upgraded
// aggregate's task (a live move: the new copy starts from the old one's
// snapshot, shared state, added column and window epochs included) after
// the sources passed the cut: its rows still match the reference.
func TestReconfigStatefulAggregateMovedDuringUpgrade(t *testing.T) {
	const limit = 3000
	yaml := fmt.Sprintf(statefulYAML, limit)
	r := startReconfigRun(t, yaml, fsm.TrackingStatic)
	r.version = func(v int) string { return statefulV2(yaml) }
	r.changed = []string{"per_window", "b"}
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 2 })
	// At load ~60 the stream ended before the plan switched ("no group
	// of a window holds tuples from both sides of the cut"): the sources
	// go at a twentieth of their rate until the aggregate moved (stream
	// times, and so results, unchanged).
	if err := r.pace.Set(0.05); err != nil {
		t.Fatal(err)
	}
	r.commit(2)
	r.switchAll(50 * time.Millisecond)
	waitUntil(t, "both sources past the cut", func() bool {
		st := r.states()
		return st["rc/lines/p0/r0"].ReconfigLevel == 1 && st["rc/lines/p1/r0"].ReconfigLevel == 1
	})
	r.c.liveMove(t, "rc/per_window/p0/r0", r.c.workers[2], r.c.workers[0])
	if err := r.pace.Set(restSpeed); err != nil {
		t.Fatal(err)
	}
	if v := r.versionsOf("rc/per_window/p0/r0", 0); len(v) == 0 || v[len(v)-1] != 2 {
		t.Fatalf("the moved copy of the aggregate runs versions %v", v)
	}
	r.waitLevel(1)
	r.complete()
	<-done
	r.checkStateful(limit, nil)
}

// TestReconfigStatefulAggregateDynamicTracking: the aggregate upgrade
// under dynamic tracking (tags kept up to the aggregate, which depends on
// them, cleared after it) follows the same rules.
func TestReconfigStatefulAggregateDynamicTracking(t *testing.T) {
	const limit = 3000
	yaml := fmt.Sprintf(statefulYAML, limit)
	r := startReconfigRun(t, yaml, fsm.TrackingDynamic)
	r.version = func(v int) string { return statefulV2(yaml) }
	r.changed = []string{"per_window", "b"}
	done := r.tail()
	waitUntil(t, "output flowing", func() bool { return r.received() > 2 })
	r.commit(2)
	r.switchAll(50 * time.Millisecond)
	r.waitLevel(1)
	r.complete()
	<-done
	r.checkStateful(limit, nil)
}

// TestReconfigHandedToAFailedTask: a task that could not be built (here a
// fragment its query does not have) is handed a reconfiguration like any
// task of its query: nothing is built for it and the worker goes on.
// Before, prebuild dereferenced the failed task's missing node and the
// worker process crashed.
func TestReconfigHandedToAFailedTask(t *testing.T) {
	base := fmt.Sprintf(reconfigYAML, 10, 10)
	q, err := queryspec.Parse("rc.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	next, err := queryspec.Parse("rc.yaml", []byte(versionYAML(base, 2)))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := next.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	plan := fsm.ReconfigPlan{Epoch: 1, SpecJSON: spec, Phase: fsm.ReconfigLoading}
	for _, op := range []string{"a", "b"} {
		def, _ := json.Marshal(next.OperatorByName(op))
		plan.Changes = append(plan.Changes, fsm.OperatorChange{Operator: op, Version: 2, SpecJSON: def})
	}
	pool := dataplane.NewPool()
	t.Cleanup(func() { pool.Close() })
	w := startWorkerOpts(t, pool, Options{BoundaryInterval: 5 * time.Millisecond})
	t.Cleanup(func() { w.close(t) })
	task := TaskSpec{TaskID: "rc/nope/p0/r0", Query: "rc", Fragment: "nope", QueryIndex: 1, Spec: q}
	w.rt.Apply(context.Background(), []TaskSpec{task})
	task.Reconfig = &fsm.QueryReconfig{Plans: []fsm.ReconfigPlan{plan}}
	w.rt.Apply(context.Background(), []TaskSpec{task})
	if sts := w.rt.States(); len(sts) != 1 || sts[0].State != StateFailed {
		t.Fatalf("states %+v, want the one failed task", sts)
	}
}
