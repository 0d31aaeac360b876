package coordinator

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator/health"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

const healthTestQuery = `name: hq
autoscale: true
sources:
  - {name: text, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}
sinks:
  - {name: out, input: per_line}
`

// feedBottleneck reports, to every node, figures of a query whose keyed
// aggregate holds its source back: the source blocked 800 ms/s, the
// aggregate busy all the time. It stops with ctx.
func feedBottleneck(ctx context.Context, nodes []*Server, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				ms := now.UnixMilli()
				stats := []*pb.TaskStats{
					{Task: "hq/text/p0/r0", InTps: 100, OutTps: 100, Busy: 0.1, BackpressureMsPerS: 800, ReportedAtMs: ms},
					{Task: "hq/per_line/p0/r0", InTps: 100, OutTps: 100, Busy: 1, Queue: 50, ReportedAtMs: ms},
					{Task: "hq/out/p0/r0", InTps: 100, OutTps: 100, Busy: 0.05, ReportedAtMs: ms},
				}
				for _, s := range nodes {
					s.liveStats.put("w-fake", stats, now)
				}
			}
		}
	}()
}

func healthActions(t *testing.T, s *Server) []*fsm.HealthAction {
	t.Helper()
	acts, err := s.State().HealthActions(nil, "hq")
	if err != nil {
		t.Fatal(err)
	}
	return acts
}

// TestHealthBlacklistAndLeaderChange: the leader's loop diagnoses an
// under-provisioned keyed aggregate and scales it up; with no worker to
// place the new partition the rescale fails, the failure blacklists
// (under_provisioned, scale_up) and the next round only raises an alert
// instead of failing again. The action log, including a pending action,
// survives the leader's shutdown, and the next leader adopts the pending
// action and evaluates it.
func TestHealthBlacklistAndLeaderChange(t *testing.T) {
	t.Parallel()
	p := health.DefaultConfig()
	p.MinSamples, p.Persist = 3, 2
	c := newTestClusterWith(t, 3, "", "", testTimings(), func(cfg *Config) {
		cfg.Health = HealthConfig{Interval: 100 * time.Millisecond, Settle: time.Second, Policy: &p}
	})
	defer c.shutdown()
	l := c.leader()
	s := c.nodes[l]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	if _, err := c.admin(l).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(healthTestQuery), Filename: "hq.yaml"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	feedBottleneck(ctx, append([]*Server(nil), c.nodes...), &wg)

	count := func(acts []*fsm.HealthAction, action, outcome string) int {
		n := 0
		for _, a := range acts {
			if a.Action == action && (outcome == "" || a.Outcome == outcome) {
				n++
			}
		}
		return n
	}
	var acts []*fsm.HealthAction
	waitFor(t, 60*time.Second, "a failed scale-up, then an alert", func() bool {
		acts = healthActions(t, s)
		return count(acts, health.ActScaleUp, fsm.HealthFailed) >= 1 && count(acts, "none", fsm.HealthAlert) >= 1
	})
	if n := count(acts, health.ActScaleUp, ""); n != 1 {
		t.Fatalf("%d scale-up actions, want exactly 1 before the blacklist stops them: %+v", n, acts)
	}
	var alert *fsm.HealthAction
	for _, a := range acts {
		if a.Outcome == fsm.HealthAlert {
			alert = a
		}
	}
	if alert.Diagnosis != health.DiagUnderProvisioned || alert.Fragment != "per_line" || !strings.Contains(alert.Detail, "blacklisted") {
		t.Fatalf("alert %+v, want under_provisioned of per_line with scale_up blacklisted", alert)
	}
	for _, a := range acts {
		if a.Action == health.ActScaleUp && (a.FromParallelism != 1 || a.ToParallelism < 2 || a.Metrics == "" || a.AtMs == 0 || a.EvaluatedAtMs == 0) {
			t.Fatalf("scale-up entry %+v lacks its figures", a)
		}
	}
	bl, err := (&healthService{s: s}).Blacklist(context.Background(), &pb.HealthBlacklistRequest{Query: "hq"})
	if err != nil || len(bl.Pairs) != 1 || !bl.Pairs[0].Blacklisted || bl.Pairs[0].Action != health.ActScaleUp || bl.Pairs[0].Query != "hq/per_line" {
		t.Fatalf("blacklist %+v, %v", bl, err)
	}

	// A pending action, as a leader leaves one when it dies between
	// acting and evaluating.
	pending := fsm.HealthAction{ID: "hq-pending", Query: "hq", Fragment: "per_line", Diagnosis: health.DiagSlowInstance, Action: health.ActMove,
		AtMs: time.Now().UnixMilli(), Metrics: `{"throughput":1000,"up_blocked_ms":800}`, Outcome: fsm.HealthPending}
	if res, err := s.apply(ctxT(t, 10*time.Second), fsm.HealthLogType, fsm.HealthLogRequest{Action: pending}); err != nil || res.Err != nil {
		t.Fatalf("log a pending action: %v %v", err, res)
	}
	before := len(healthActions(t, s))
	c.stop(l)
	nl := c.leader()
	ns := c.nodes[nl]
	waitFor(t, 60*time.Second, "the new leader to evaluate the pending action", func() bool {
		for _, a := range healthActions(t, ns) {
			if a.ID == pending.ID {
				return a.Outcome != fsm.HealthPending
			}
		}
		return false
	})
	after := healthActions(t, ns)
	if len(after) < before {
		t.Fatalf("the new leader holds %d actions, the old one had %d", len(after), before)
	}
	for _, a := range after {
		if a.ID == pending.ID && (a.Outcome != fsm.HealthNotImproved || a.OutcomeDetail == "") {
			t.Fatalf("adopted action %+v: the bottleneck is still there, want not_improved with a reason", a)
		}
	}
	if n := count(after, health.ActScaleUp, ""); n != 1 {
		t.Fatalf("%d scale-up actions after the leader change, want still 1 (blacklisted)", n)
	}
	resp, err := (&healthService{s: ns}).Actions(context.Background(), &pb.HealthActionsRequest{Query: "hq"})
	if err != nil || len(resp.Actions) != len(after) {
		t.Fatalf("Actions: %d, %v", len(resp.Actions), err)
	}

	// Resubmitted, the query starts with a clean record: nothing reports
	// on it any more, so the loop takes no new action meanwhile.
	cancel()
	wg.Wait()
	if _, err := c.admin(nl).StopQuery(ctxT(t, 10*time.Second), &pb.StopQueryRequest{Name: "hq"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin(nl).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(healthTestQuery), Filename: "hq.yaml"}); err != nil {
		t.Fatal(err)
	}
	bl, err = (&healthService{s: ns}).Blacklist(context.Background(), &pb.HealthBlacklistRequest{Query: "hq"})
	if err != nil || len(bl.Pairs) != 0 {
		t.Fatalf("blacklist of the resubmitted query %+v, %v: want no pairs", bl, err)
	}
}

// TestHealthMovesASlowInstance: one partition of a keyed aggregate holds a
// larger queue at the others' rate while the source is blocked: the loop
// diagnoses a slow instance and moves it, live, to another worker through
// the plan applier (the placement shows the new worker, the old one as
// moving_from).
func TestHealthMovesASlowInstance(t *testing.T) {
	t.Parallel()
	p := health.DefaultConfig()
	p.MinSamples, p.Persist = 3, 2
	c := newTestClusterWith(t, 1, "", "", testTimings(), func(cfg *Config) {
		// The move is judged a settling time after it (not in this test);
		// the warm-up before the first action is a second.
		cfg.Health = HealthConfig{Interval: 100 * time.Millisecond, Settle: time.Minute, Warmup: time.Second, Policy: &p}
	})
	defer c.shutdown()
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	for _, name := range []string{"w1", "w2", "w3"} {
		c.startWorker(t, 0, name)
	}
	q := strings.Replace(healthTestQuery, `aggregates: {n: "count()"}}`, `aggregates: {n: "count()"}, parallelism: 2}`, 1)
	if _, err := c.admin(0).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(q), Filename: "hq.yaml"}); err != nil {
		t.Fatal(err)
	}
	const slow = "hq/per_line/p1/r0"
	var from string
	waitFor(t, 30*time.Second, "the tasks placed", func() bool {
		tk, _ := s.State().Task(nil, slow)
		if tk == nil || tk.WorkerID == "" {
			return false
		}
		from = tk.WorkerID
		return true
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				ms := now.UnixMilli()
				s.liveStats.put("w-fake", []*pb.TaskStats{
					{Task: "hq/text/p0/r0", InTps: 670, OutTps: 670, Busy: 0.1, BackpressureMsPerS: 700, ReportedAtMs: ms},
					{Task: "hq/per_line/p0/r0", InTps: 340, OutTps: 340, Busy: 0.6, Queue: 100, ReportedAtMs: ms},
					{Task: slow, InTps: 330, OutTps: 330, Busy: 1, Queue: 3000, ReportedAtMs: ms},
					{Task: "hq/out/p0/r0", InTps: 670, OutTps: 670, Busy: 0.05, ReportedAtMs: ms},
				}, now)
			}
		}
	}()
	var move *fsm.HealthAction
	// The entry is written before the move is carried out.
	waitFor(t, 60*time.Second, "a move in the action log, then carried out", func() bool {
		for _, a := range healthActions(t, s) {
			if a.Action == health.ActMove {
				move = a
			}
		}
		tk, _ := s.State().Task(nil, slow)
		return move != nil && tk != nil && tk.WorkerID != from
	})
	if move.Diagnosis != health.DiagSlowInstance || move.Fragment != "per_line" || move.Outcome != fsm.HealthPending || !strings.Contains(move.Detail, "partition 1") {
		t.Fatalf("move entry %+v, want a pending move of partition 1 for a slow instance", move)
	}
	tk, _ := s.State().Task(nil, slow)
	if tk.WorkerID == from || tk.MovingFrom != from || tk.Gen() != 2 {
		t.Fatalf("task after the move: worker %s moving from %s generation %d, want a new worker, moving from %s, generation 2", tk.WorkerID, tk.MovingFrom, tk.Gen(), from)
	}
}

// TestHealthBlacklistRecovers: a partition is slow because of its data
// (its keys cost more), not its worker, so the first repair of the slow
// instance diagnosis, moving it to another worker, cannot help: after its
// settling time the move is judged not_improved, the pair (per_line,
// slow_instance, move) is blacklisted in the log, and the next step takes
// the diagnosis's next resolver, a DS2 scale-up of the aggregate, and
// never moves it again.
func TestHealthBlacklistRecovers(t *testing.T) {
	t.Parallel()
	p := health.DefaultConfig()
	p.MinSamples, p.Persist = 3, 2
	c := newTestClusterWith(t, 1, "", "", testTimings(), func(cfg *Config) {
		cfg.Health = HealthConfig{Interval: 100 * time.Millisecond, Settle: 2 * time.Second, Policy: &p}
	})
	defer c.shutdown()
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	for _, name := range []string{"w1", "w2", "w3"} {
		c.startWorker(t, 0, name)
	}
	// A source of 1000 lines/s: DS2 sizes the aggregate from it.
	q := strings.Replace(healthTestQuery, `aggregates: {n: "count()"}}`, `aggregates: {n: "count()"}, parallelism: 2}`, 1)
	q = strings.Replace(q, "rate: 100,", "rate: 1000,", 1)
	if _, err := c.admin(0).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(q), Filename: "hq.yaml"}); err != nil {
		t.Fatal(err)
	}
	const slow = "hq/per_line/p1/r0"
	waitFor(t, 30*time.Second, "the tasks placed", func() bool {
		tk, _ := s.State().Task(nil, slow)
		return tk != nil && tk.WorkerID != ""
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				// The same figures wherever partition 1 runs: its
				// slowness follows its data.
				ms := now.UnixMilli()
				s.liveStats.put("w-fake", []*pb.TaskStats{
					{Task: "hq/text/p0/r0", InTps: 670, OutTps: 670, Busy: 0.1, BackpressureMsPerS: 700, ReportedAtMs: ms},
					{Task: "hq/per_line/p0/r0", InTps: 340, OutTps: 340, Busy: 0.6, Queue: 100, ReportedAtMs: ms},
					{Task: slow, InTps: 330, OutTps: 330, Busy: 1, Queue: 3000, ReportedAtMs: ms},
					{Task: "hq/out/p0/r0", InTps: 670, OutTps: 670, Busy: 0.05, ReportedAtMs: ms},
				}, now)
			}
		}
	}()
	var move, up *fsm.HealthAction
	moves := 0
	waitFor(t, 90*time.Second, "a move judged not improved, then a scale-up", func() bool {
		move, up, moves = nil, nil, 0
		for _, a := range healthActions(t, s) {
			switch {
			case a.Action == health.ActMove:
				moves++
				if move == nil {
					move = a
				}
			case a.Action == health.ActScaleUp && move != nil:
				up = a
			}
		}
		return up != nil
	})
	if move.Diagnosis != health.DiagSlowInstance || move.Outcome != fsm.HealthNotImproved {
		t.Fatalf("first action %+v, want slow_instance move judged not_improved", move)
	}
	if moves != 1 {
		t.Fatalf("%d moves, want one: the blacklisted pair is not tried again", moves)
	}
	if up.Diagnosis != health.DiagSlowInstance || up.Fragment != "per_line" || up.FromParallelism != 2 || up.ToParallelism <= 2 ||
		!strings.Contains(up.Detail, "move: blacklisted on per_line") {
		t.Fatalf("next action %+v, want slow_instance scale_up of per_line from 2, the move skipped as blacklisted", up)
	}
	l := s.newHealthLoop(s.cfg.Health)
	if r := l.blacklist("hq").For(health.Pair{Query: "hq", Fragment: "per_line", Diagnosis: health.DiagSlowInstance, Action: health.ActMove}); !r.Blacklisted {
		t.Fatalf("pair record %+v, want (per_line, slow_instance, move) blacklisted", r)
	}
}

// TestHealthNoScaleDownSoonAfterScaleUp: the loop's resolver filter
// refuses a scale-down (of an operator, or of a source's partitions) of a
// fragment scaled up less than ten settling times ago, from the action
// log in Raft; other fragments, other actions and a scale-up older than
// that are not held back.
func TestHealthNoScaleDownSoonAfterScaleUp(t *testing.T) {
	t.Parallel()
	c, s := startHandSteppedHealth(t)
	defer c.shutdown()
	now := time.Now()
	for _, a := range []fsm.HealthAction{
		{ID: "up", Query: "hq", Fragment: "per_line", Diagnosis: health.DiagUnderProvisioned, Action: health.ActScaleUp, FromParallelism: 1, ToParallelism: 3, AtMs: now.Add(-20 * time.Second).UnixMilli(), Outcome: fsm.HealthPending},
		{ID: "src", Query: "hq", Fragment: "text", Diagnosis: health.DiagSLOViolated, Action: health.ActScaleSources, FromParallelism: 1, ToParallelism: 3, AtMs: now.Add(-25 * time.Second).UnixMilli(), Outcome: fsm.HealthPending},
	} {
		res, err := s.apply(ctxT(t, 10*time.Second), fsm.HealthLogType, fsm.HealthLogRequest{Action: a})
		if err == nil {
			err = res.Err
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	l := s.newHealthLoop(HealthConfig{Settle: 3 * time.Second})
	for _, tc := range []struct {
		at         time.Time
		frag, diag string
		act        string
		ok         bool
	}{
		{now, "per_line", health.DiagOverProvisioned, health.ActScaleDown, false},
		{now, "text", health.DiagOverProvisioned, health.ActScaleSources, false},
		{now, "per_line", health.DiagUnderProvisioned, health.ActScaleUp, true},
		{now.Add(11 * time.Second), "per_line", health.DiagOverProvisioned, health.ActScaleDown, true}, // 31 s after it: ten settling times passed
		{now.Add(11 * time.Second), "text", health.DiagOverProvisioned, health.ActScaleSources, true},
	} {
		ok, why := l.allowed("hq", tc.at)(tc.frag, tc.diag, tc.act)
		if ok != tc.ok || !ok && !strings.Contains(why, "no scale-down so soon after a scale-up") {
			t.Errorf("%s %s/%s at +%s: allowed %v (%s), want %v", tc.frag, tc.diag, tc.act, tc.at.Sub(now), ok, why, tc.ok)
		}
	}
}
