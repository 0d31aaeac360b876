package coordinator

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// xorgFlowQuery: two paced endless generators into a union, whose output
// flows continuously (6,000 tuples a second, as the dev demo's union) and never fills a buffer in
// the few minutes a test runs.
const xorgFlowQuery = `
name: %s
sources:
  - {name: a, generator: {kind: words, seed: 1, rate: 3000}}
  - {name: b, generator: {kind: words, seed: 2, rate: 3000}}
operators:
  - {name: both, type: union, inputs: [a, b]}
sinks:
  - {name: out, input: both}
`

// A task whose output flows continuously moves to the partner and its
// move ends once the partner's copy has caught up, long before the
// catch-up bound. Before, the owner compared the copy's position, a sync
// old, with the old copy's of the last 50 ms: the copy was always behind
// by the rate times that age, and the move ended only at the bound (in
// the dev soak, every such move; with a short partner timeout the
// owner's wait ran out first and the move rolled back).
func TestCrossOrgMoveOfAFlowingTaskCatchesUp(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	const bound = 10 * time.Minute
	alpha, beta, contract := xorgPair(t, calmFailureDetection, func(c *Config) { c.Timings.MoveCatchUpBound = bound })
	const query, moving = "xf", "xf/both/p0/r0"
	if _, err := alpha.admin(0).SubmitQuery(ctxT(t, 20*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(xorgFlowQuery, query)), Filename: query + ".yaml"}); err != nil {
		t.Fatal(err)
	}
	a := alpha.nodes[0]
	waitFor(t, 60*time.Second, "the query's tasks running", func() bool {
		ts, err := a.State().TasksByQuery(nil, query)
		if err != nil || len(ts) == 0 {
			return false
		}
		for _, tk := range ts {
			if tk.State != states.TaskRunning {
				return false
			}
		}
		return true
	})
	// Far less than the bound, far more than a move takes on a loaded
	// machine (a snapshot of a union, a few syncs).
	const within = 150 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	began := time.Now()
	if err := alpha.moveOut(ctx, t, moving, "beta", contract); err != nil {
		tk := alpha.task(t, moving)
		t.Fatalf("the move of a flowing task to beta did not end within %s (catch-up bound %s): %v; the task is on %s generation %d moving from %q, position %s, old copy's %s",
			within, bound, err, tk.WorkerID, tk.Gen(), tk.MovingFrom, posText(tk.MovePosition), posText(tk.MovingFromPosition))
	}
	t.Logf("the move ended after %s", time.Since(began).Round(time.Millisecond))
	tk := alpha.task(t, moving)
	if tk.WorkerID != partnerWorkerID("beta") || tk.MovingFrom != "" {
		t.Fatalf("after the move the task is on %s moving from %q, want at beta", tk.WorkerID, tk.MovingFrom)
	}
	// beta's worker was given alpha's wait for the move to fetch the
	// snapshot in (SnapshotSource.timeout_ms), not only its own minute.
	rec, err := beta.nodes[0].State().HostedTask(nil, "alpha", moving)
	if want := (bound + 2*alpha.nodes[0].cfg.Timings.PartnerTimeout).Milliseconds(); err != nil || rec == nil || rec.BootstrapTimeoutMs != want {
		t.Fatalf("beta's record of the task: %+v (%v); want its bootstrap timeout %d ms", rec, err, want)
	}
}

// The owner compares a partner's report with the old copy's position
// noted no later than the report was received (the sync's start less its
// age), never with a later one.
func TestCaughtUpAcrossComparesAtTheReportsTime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var x xorgMemory
	x.oldPositions = map[string]map[string][]positionAt{"beta": {"q/u/p0/r0@2": {
		{at: t0, pos: 100}, {at: t0.Add(250 * time.Millisecond), pos: 250}, {at: t0.Add(500 * time.Millisecond), pos: 400},
	}}}
	for _, c := range []struct {
		name string
		pos  uint64
		sent time.Time
		age  time.Duration
		want bool
	}{
		{"fresh report, behind the latest note", 300, t0.Add(500 * time.Millisecond), 0, false},
		{"fresh report at the latest note", 400, t0.Add(500 * time.Millisecond), 0, true},
		{"a report 300 ms old compared with the note before it", 100, t0.Add(500 * time.Millisecond), 300 * time.Millisecond, true},
		{"a report 300 ms old, behind that note", 99, t0.Add(500 * time.Millisecond), 300 * time.Millisecond, false},
		{"a report 250 ms old at the note 250 ms before", 250, t0.Add(500 * time.Millisecond), 250 * time.Millisecond, true},
		{"a report older than every note", 1000, t0.Add(500 * time.Millisecond), time.Second, false},
		{"between notes: the earlier one", 100, t0.Add(200 * time.Millisecond), 0, true},
	} {
		if got := x.caughtUpAcross("beta", "q/u/p0/r0@2", c.pos, c.sent, c.age); got != c.want {
			t.Errorf("%s: caught up %v, want %v", c.name, got, c.want)
		}
	}
	if x.caughtUpAcross("gamma", "q/u/p0/r0@2", 1000, t0.Add(time.Second), 0) || x.caughtUpAcross("beta", "q/u/p0/r0@3", 1000, t0.Add(time.Second), 0) {
		t.Error("caught up without a note of that move")
	}
}
