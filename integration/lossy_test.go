package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/coordinator"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/worker"
	"github.com/fedstream/fedstream/worker/dataplane"
	wrt "github.com/fedstream/fedstream/worker/runtime"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// lossyQuery counts the lines of two generated partitions per 100 ms
// window, with two replicas of every task: about fifteen seconds of
// input (lossyLimit lines a partition).
const lossyQuery = `name: lossy
replicas: 2
availability: {max_delay: 300ms}
sources:
  - {name: lines, generator: {kind: words, rate: 4000, seed: 5, limit: 60000}, parallelism: 2}
operators:
  - {name: counts, type: aggregate, input: lines, window: {size: 100ms}, aggregates: {n: "count()"}}
sinks:
  - {name: out, input: counts}
`

// lossyLimit is lossyQuery's limit: the lines of each partition.
const lossyLimit = 60000

// lossyKeep is the workers' bound on the input a DCAA task keeps for its
// replay (DCAAKeepTuples): a second of the live partition's input, so
// that a false failure detection under load (a replica starved of CPU
// for a while) is corrected exactly, as DCAA promises; the failure the
// test sets up (three seconds) goes far past it. With 300 (75 ms of
// input) at load 30-75 nearly every run had a replica lose input to a
// false detection before or beside that failure, and four runs in a row
// without the precondition failed the test (6 of 8 runs).
const lossyKeep = 4000

// lossyHold is how many lines the live partition draws while the link is
// held: three times lossyKeep.
const lossyHold = 3 * lossyKeep

// TestLossyReplicaRebootstrapsFromStablePeer (issue 10 P7): a link from
// the aggregate's replica 0 to both replicas of source partition 0 is
// held silently for far longer than the input a task keeps for its
// replay, so replica 0's correction cannot make every result exact: it
// becomes lossy. The leader then replaces it by a new copy (generation
// bumped) that starts from a snapshot of its STABLE peer, replica 1
// (served by the peer's worker; the new copy did not replay), and any
// task downstream that took its UNCORRECTABLE record likewise. In the end
// no replica is lossy, and both sink replicas' results equal a
// failure-free run's, window for window, outside the range the first
// correction named: from before the failure, and from the end of that
// range (which the replacement follows) to the end of the input.
//
// The property needs its precondition: the peer replica stays exact and
// some replica of every downstream partition did not take the lossy
// copy's results. On a loaded machine a false failure detection can
// make the peer lose input too (one that outlasts the replay bound
// here, a second of input), or make every sink replica read the lossy copy and name the
// switch to its replacement: the query then stays LOSSY, as its status
// says, with nothing to bootstrap from. Such a run proves nothing
// either way, so the scenario runs again on a new org, at most four
// times (a run whose replicas are not all exact before the failure is
// over in a few seconds); any other outcome is judged.
func TestLossyReplicaRebootstrapsFromStablePeer(t *testing.T) {
	t.Parallel()
	for attempt := 1; ; attempt++ {
		why := lossyRebootstrapRun(t)
		if why == "" {
			return
		}
		if attempt == 4 {
			t.Fatalf("four runs without the precondition; the last: %s", why)
		}
		t.Logf("run %d inconclusive: %s; running the scenario again", attempt, why)
	}
}

// lossyRebootstrapRun runs the scenario once; it returns why the run was
// inconclusive ("" when it was judged).
func lossyRebootstrapRun(t *testing.T) (inconclusive string) {
	faults := map[string]*dataplane.Faults{} // by worker name
	// pace scales the generators' wall-clock rate (stream times, and so
	// every result, stay those of rate 4000). The sources start at a
	// quarter of it, until the replicas are set up and the held replica
	// went tentative: at load 40-45 on two cores the start took 39000 of
	// the 60000 lines at full rate, two runs in a row inconclusive. The
	// hold's lines come at full rate, and the sources go slowly again
	// from the heal until the replacement runs (see there).
	pace, err := wrt.NewPace(0.25)
	if err != nil {
		t.Fatal(err)
	}
	// Nine workers for eight tasks: the placer spreads them one a worker,
	// so the aggregate's replica 0 reads source partition 0 over the
	// network (a cut link can hold it) and its replacement has a worker
	// of its own to go to.
	//
	// Workers are declared down after 4 s without a heartbeat, not the
	// in-process org's 1 s: nothing here is about lost workers, and at
	// load 25 nine workers and a coordinator in one process missed 1 s
	// now and then: a worker declared down had its tasks placed again
	// from scratch, so the lossy replica's replacement replayed instead
	// of starting from its peer's snapshot, and the run was judged on a
	// scenario it did not set up.
	o := newLiveOrgWorkers(t, 9, func(c *coordinator.Config) { c.Timings.HeartbeatTTL = 4 * time.Second }, func(i int, c *worker.Config) {
		c.BoundaryInterval = 10 * time.Millisecond
		c.DCAAKeepTuples = lossyKeep
		faults[c.Name] = dataplane.NewFaults()
		c.Faults = faults[c.Name]
		c.SourcePace = pace
	})
	t.Cleanup(func() {
		// Held links would keep the workers from stopping.
		for _, f := range faults {
			f.HealAll()
		}
	})
	faultsOf := map[string]*dataplane.Faults{} // by worker id
	ws, err := o.admin.ListWorkers(context.Background(), &pb.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Workers {
		faultsOf[w.Id] = faults[w.Name]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := o.admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(lossyQuery), Filename: "lossy.yaml"}); err != nil {
		t.Fatal(err)
	}
	const agg0, agg1, sink0, sink1 = "lossy/counts/p0/r0", "lossy/counts/p0/r1", "lossy/out/p0/r0", "lossy/out/p0/r1"
	waitFor(t, 30*time.Second, "every task running, both aggregates STABLE", func() bool {
		q := o.query(t, "lossy")
		if len(q.Tasks) != 8 {
			return false
		}
		for _, ti := range q.Tasks {
			if ti.State != states.TaskRunning {
				return false
			}
			if ti.Fragment == "counts" && ti.ReplicaState != pb.ReplicaState_REPLICA_STABLE {
				return false
			}
		}
		return true
	})
	q := o.query(t, "lossy")
	where := map[string]*pb.TaskInfo{}
	for _, ti := range q.Tasks {
		where[ti.TaskId] = ti
	}
	aggWorker := where[agg0].WorkerId
	held := []string{where["lossy/lines/p0/r0"].WorkerAddr, where["lossy/lines/p0/r1"].WorkerAddr}
	for _, id := range []string{"lossy/lines/p0/r0", "lossy/lines/p0/r1"} {
		if where[id].WorkerId == aggWorker {
			t.Fatalf("%s runs on the aggregate replica 0's worker %s: its link cannot be cut (placement %v)", id, aggWorker, where)
		}
	}
	f := faultsOf[aggWorker]
	if f == nil {
		t.Fatalf("no fault injector for worker %s", aggWorker)
	}
	inTuples := func(worker, task string) uint64 {
		for _, s := range o.workers[worker].Runtime().Stats() {
			if s.TaskID == task {
				return s.InTuples
			}
		}
		return 0
	}
	// The failure lasts until the live partition drew another three
	// seconds of input (lossyHold lines): three times what a replica
	// keeps for its replay, all of which the aggregate's replica 0
	// releases tentatively and keeps.
	live := where["lossy/lines/p1/r0"]
	drawn := func() uint64 { return inTuples(live.WorkerId, live.TaskId) }
	// Past the start first. Under load (20-50 on two cores) a replica
	// now and then took a live upstream for failed in its first seconds
	// (the peer replica UP_FAILURE from 1.3 s to 3.5 s after it started,
	// no link held yet), lost more than it keeps for the replay and was
	// lossy before the failure the scenario sets up; the run was judged
	// inconclusive only after the whole scenario. A run whose replicas
	// are not all exact once a second of input was drawn and both
	// aggregates are STABLE is inconclusive at once.
	waitFor(t, 30*time.Second, "a second of input, both aggregates STABLE", func() bool {
		if drawn() < 4000 {
			return false
		}
		for _, id := range []string{agg0, agg1} {
			if ti := o.task(t, "lossy", id); ti.ReplicaState != pb.ReplicaState_REPLICA_STABLE || ti.Tentative {
				return false
			}
		}
		return true
	})
	for _, ti := range o.query(t, "lossy").Tasks {
		if ti.Lossy || ti.Generation > 1 {
			return fmt.Sprintf("%s lost input before the failure (generation %d, lossy %v): %s", ti.TaskId, ti.Generation, ti.Lossy, ti.Message)
		}
	}
	if n := drawn(); n > lossyLimit-lossyHold-4*lossyKeep {
		// Under load the start took most of the input: the hold would
		// outlast it, and no replacement could be judged.
		return fmt.Sprintf("partition 1 had drawn %d of its %d lines before the failure", n, lossyLimit)
	}
	for _, addr := range held {
		f.CutOutgoing(addr, dataplane.Hold)
	}
	base := drawn()
	t.Logf("holding %s's links to %v; partition 1 drew %d lines", aggWorker, held, base)
	waitFor(t, 20*time.Second, "the aggregate's replica 0 tentative", func() bool { return o.task(t, "lossy", agg0).Tentative })
	// Detected: the hold's lines come at full rate. (With the whole hold
	// at full rate, the wait for detection at load ~40 ran from line 6229
	// to 58727, and the input ended before the replacement.)
	if err := pace.Set(1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "another three seconds of the live partition's input", func() bool { return drawn() >= base+lossyHold })
	t.Logf("healing; partition 1 drew %d lines", drawn())
	f.HealAll()
	// The replacement must start with input still to come (judged below),
	// but the input is fifteen seconds of wall time at pace 1 while
	// detecting the loss, replacing the replica and starting its copy
	// take as long as the machine is slow: at load ~30 on two cores the
	// hold above ran from line 8686 to 34001 (its tentative wait) and the
	// replacement was running only after all 60000 lines, three runs in
	// a row inconclusive. Until it runs, the sources go at a quarter of
	// their rate (a boundary every 40 ms, within the 100 ms detection
	// timeout), so what is left of the input outlasts it at any load.
	if err := pace.Set(0.25); err != nil {
		t.Fatal(err)
	}

	// The correction could not make every result exact: the replica
	// says which (status) and is lossy; the leader replaces it. Watched
	// both in the coordinator's view and on the worker itself, as the
	// leader may replace it within one report.
	var lossyMsg string
	waitFor(t, 30*time.Second, "the aggregate's replica 0 lossy, or replaced", func() bool {
		for _, st := range o.workers[aggWorker].Runtime().States() {
			if st.TaskID == agg0 && st.Lossy {
				lossyMsg = st.Message
			}
		}
		ti := o.task(t, "lossy", agg0)
		if ti.Lossy {
			lossyMsg = ti.Message
		}
		return ti.Lossy || ti.Generation > 1
	})
	t.Cleanup(func() {
		if t.Failed() {
			// What every copy said when the test gave up.
			for _, ti := range o.query(t, "lossy").Tasks {
				t.Logf("%s: generation %d on %s, %s %s lossy %v tentative %v: %s", ti.TaskId, ti.Generation, ti.WorkerId, ti.State, ti.ReplicaState, ti.Lossy, ti.Tentative, ti.Message)
			}
		}
	})
	if why := waitForUnless(t, 30*time.Second, "the lossy replica replaced by a running copy of the next generation", func() bool {
		ti := o.task(t, "lossy", agg0)
		return ti.Generation >= 2 && ti.State == states.TaskRunning && ti.WorkerId != ""
	}, func() string {
		if p := o.task(t, "lossy", agg1); p.Lossy || p.Generation > 1 {
			return fmt.Sprintf("the aggregate's peer replica lost input too (generation %d, lossy %v): %s", p.Generation, p.Lossy, p.Message)
		}
		return ""
	}); why != "" {
		return why
	}
	// The peer must have stayed the exact replica throughout: lossy too
	// (a false failure detection under load longer than lossyKeep),
	// it is replaced in turn, and the check above may have looked
	// before.
	if p := o.task(t, "lossy", agg1); p.Lossy || p.Generation > 1 {
		return fmt.Sprintf("the aggregate's peer replica lost input too (generation %d, lossy %v): %s", p.Generation, p.Lossy, p.Message)
	}
	t.Logf("lossy status seen: %q", lossyMsg)
	rep := o.task(t, "lossy", agg0)
	if rep.Generation != 2 {
		t.Fatalf("the aggregate's replica 0 is at generation %d, want 2 (replaced once)", rep.Generation)
	}
	if rt := o.workers[rep.WorkerId].Runtime(); !rt.StartedFromSnapshot(agg0) {
		t.Fatalf("the replacement of %s on %s did not start from a fetched snapshot: it replayed", agg0, rep.WorkerId)
	}
	if n := o.workers[where[agg1].WorkerId].Runtime().SnapshotsServed(); n == 0 {
		t.Fatalf("the STABLE peer %s (worker %s) served no snapshot", agg1, where[agg1].WorkerId)
	}
	if why := waitForUnless(t, 30*time.Second, "no lossy replica left, every task running", func() bool {
		for _, ti := range o.query(t, "lossy").Tasks {
			if ti.Lossy || ti.State != states.TaskRunning {
				return false
			}
		}
		return true
	}, func() string {
		// Replicas lossy, by partition, of any generation: after the
		// replacement a second false detection under load (load 20-28)
		// made the new copy and its peer lose the same range, and the
		// wait ran out counting only first copies.
		lossy := map[string]int{}
		for _, ti := range o.query(t, "lossy").Tasks {
			if ti.Lossy {
				lossy[ti.Fragment+"/"+fmt.Sprint(ti.Partition)]++
			}
		}
		for part, n := range lossy {
			if n == 2 {
				return "every replica of " + part + " is lossy (none to bootstrap from)"
			}
		}
		return ""
	}); why != "" {
		return why
	}
	// The replacement ran with input still to come: at least a second of
	// the live partition's input follows its start.
	replacedAt := drawn()
	if err := pace.Set(1); err != nil {
		t.Fatal(err)
	}
	if replacedAt > lossyLimit-4000 {
		// The replacement came too late to be judged (load 100-200:
		// hold from 1561 lines, the replacement after all 40000 then).
		return fmt.Sprintf("partition 1 had drawn %d of its %d lines when no lossy replica was left: the replacement would be judged on too little input", replacedAt, lossyLimit)
	}
	t.Logf("replaced; partition 1 had drawn %d of its %d lines", replacedAt, lossyLimit)
	// The aggregate's old worker is still there: only the leader's
	// re-bootstrap of a lossy replica places a running task on a ready
	// worker again.
	if st := o.workerStatus(aggWorker); st != states.WorkerReady {
		t.Fatalf("the aggregate's old worker %s is %s: the replacement may have had another cause", aggWorker, st)
	}
	for _, ti := range o.query(t, "lossy").Tasks {
		t.Logf("%s: generation %d on %s, %s %s", ti.TaskId, ti.Generation, ti.WorkerId, ti.State, ti.ReplicaState)
		// Every replacement (a lossy sink downstream too) started from
		// its peer's snapshot.
		if ti.Generation > 1 && !o.workers[ti.WorkerId].Runtime().StartedFromSnapshot(ti.TaskId) {
			t.Fatalf("the replacement of %s did not start from a fetched snapshot", ti.TaskId)
		}
	}

	// Windows compared: those ending before the failure began, and those
	// after the replacements started (stream time of the live partition's
	// next line then: record n has stime n/rate), widened to the range
	// the correction named when the test saw it (status, or a sink's
	// record; a sink that did not read the lossy replica has none).
	const perLine = int64(time.Second) / 4000
	from, to := int64(base)*perLine-int64(100*time.Millisecond), int64(replacedAt)*perLine
	widen := func(f, tt int64) { from, to = min(from, f), max(to, tt) }
	if lossyMsg != "" {
		widen(uncorrectedRange(t, lossyMsg))
	} else {
		t.Log("the leader replaced the lossy replica before the test saw its status")
	}
	want := lossyReference(t)
	// The generations the results are read at: a copy placed again while
	// a sink's stream is read (another replica made lossy by a false
	// failure detection under load longer than lossyKeep, and
	// replaced; a worker declared down) is a second failure
	// the scenario did not set up, and the read, resuming by position on
	// the new copy, is not the stream of one copy.
	gens := map[string]int32{}
	for _, ti := range o.query(t, "lossy").Tasks {
		gens[ti.TaskId] = ti.Generation
	}
	results := map[string]map[int64]int64{}
	var twice []string
	for _, sink := range []string{sink0, sink1} {
		got, marks, dup := o.stableResults(t, sink)
		results[sink] = got
		twice = append(twice, dup...)
		for _, m := range marks {
			widen(m[0], m[1])
		}
	}
	for _, ti := range o.query(t, "lossy").Tasks {
		if g := gens[ti.TaskId]; ti.Generation != g {
			return fmt.Sprintf("%s was placed again (generation %d to %d, %s: %q) while the sinks' results were read: a failure the scenario did not set up", ti.TaskId, g, ti.Generation, ti.State, ti.Message)
		}
		// An aggregate replica lossy now (the replacement, or the peer,
		// whose status the checks above read before its correction
		// ended) lost input to a second failure, which the scenario did
		// not set up: at load 40 the peer went UP_FAILURE during the
		// hold and named its loss only after the replacement started;
		// the sink that read it then held windows stable twice.
		if ti.Fragment == "counts" && ti.Lossy {
			return fmt.Sprintf("%s (generation %d) lost input too: %s", ti.TaskId, ti.Generation, ti.Message)
		}
	}
	if len(twice) > 0 {
		t.Fatal(strings.Join(twice, "; "))
	}
	for _, sink := range []string{sink0, sink1} {
		got := results[sink]
		compared, missing, wrong, extra := 0, 0, 0, 0
		for end, n := range want {
			if end > from && end <= to+int64(100*time.Millisecond) {
				continue // windows the lossy correction may have got wrong
			}
			g, ok := got[end]
			switch {
			case !ok && end > to:
				missing++
			case ok && g != n:
				wrong++
				t.Errorf("%s: window ending %d: n=%d, want %d", sink, end, g, n)
			}
			if ok {
				compared++
			}
		}
		for end := range got {
			if _, ok := want[end]; !ok {
				extra++
			}
		}
		t.Logf("%s: %d windows, %d compared with the reference outside [%d, %d] (the failure to the replacement)", sink, len(got), compared, from, to)
		if missing > 0 || wrong > 0 || extra > 0 {
			t.Fatalf("%s: %d windows after the uncorrected range missing, %d wrong, %d not in the reference", sink, missing, wrong, extra)
		}
	}
	return ""
}

// waitForUnless waits for cond as waitFor does, but gives up early with
// the reason unless returns when it returns one.
func waitForUnless(t *testing.T, timeout time.Duration, what string, cond func() bool, unless func() string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if why := unless(); why != "" {
			return why
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ""
}

// uncorrectedRange reads the stream-time range a task's status names as
// not corrected (see runtime uncorrectableNote).
func uncorrectedRange(t *testing.T, msg string) (from, to int64) {
	t.Helper()
	m := regexp.MustCompile(`from (the start|\S+) to (\S+) could not be corrected`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("status %q names no uncorrected range", msg)
	}
	from = math.MinInt64
	if m[1] != "the start" {
		ft, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatal(err)
		}
		from = ft.UnixNano()
	}
	tt, err := time.Parse(time.RFC3339Nano, m[2])
	if err != nil {
		t.Fatal(err)
	}
	return from, tt.UnixNano()
}

// lossyReference is lossyQuery's failure-free result: the lines of both
// partitions counted per window, by window end.
func lossyReference(t *testing.T) map[int64]int64 {
	t.Helper()
	const size = int64(100 * time.Millisecond)
	out := map[int64]int64{}
	for p := range 2 {
		gen, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 5, Limit: lossyLimit, Rate: 4000}, p)
		if err != nil {
			t.Fatal(err)
		}
		var tp tuple.Tuple
		for gen.Next(&tp) {
			out[(tp.STime/size+1)*size]++
		}
	}
	return out
}

// stableResults tails a sink's result stream from its start to its final
// boundary and returns its stable view (UNDOs applied, tentative results
// left out) by window end, and the UNCORRECTABLE ranges it carried. A
// window stable twice fails.
func (o *liveOrg) stableResults(t *testing.T, sink string) (map[int64]int64, [][2]int64, []string) {
	t.Helper()
	schema := outSchema(t, lossyQuery)
	end, n := schema.Index("window_end"), schema.Index("n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type entry struct {
		pos    uint64
		stable bool
		end, n int64
	}
	var kept []entry
	var marks [][2]int64
	sub := dataplane.NewSubscriber(&pb.StreamRef{Query: "lossy", TaskId: sink}, "", true, 0)
	for {
		conn, err := o.pool.Conn(o.task(t, "lossy", sink).WorkerAddr)
		if err != nil {
			t.Fatal(err)
		}
		err = sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
			for _, tp := range b.Tuples {
				switch {
				case tp.Type == tuple.Boundary && tp.STime == math.MaxInt64:
					return dataplane.ErrStopSubscription
				case tp.Type == tuple.Undo:
					cut := len(kept)
					for cut > 0 && kept[cut-1].pos > uint64(tp.STime) {
						cut--
					}
					for _, e := range kept[cut:] {
						if e.stable {
							return fmt.Errorf("an UNDO to %d takes back a stable result at %d", tp.STime, e.pos)
						}
					}
					kept = kept[:cut]
				case tp.Type == tuple.Uncorrectable:
					if f, to, ok := tuple.UncorrectableRange(&tp); ok {
						marks = append(marks, [2]int64{f, to})
					}
				case tp.Type.IsData():
					kept = append(kept, entry{pos: tp.ID, stable: tp.Type == tuple.Stable, end: tp.Values[end].I, n: tp.Values[n].I})
				}
			}
			return nil
		})
		if err == nil || errors.Is(err, dataplane.ErrStopSubscription) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("tail %s: %v", sink, err)
		}
		time.Sleep(20 * time.Millisecond) // the sink is not running yet: retry
	}
	got := map[int64]int64{}
	var twice []string
	for _, e := range kept {
		if !e.stable {
			continue
		}
		if _, dup := got[e.end]; dup {
			twice = append(twice, fmt.Sprintf("%s: the window ending %d is a stable result twice", sink, e.end))
		}
		got[e.end] = e.n
	}
	return got, marks, twice
}
