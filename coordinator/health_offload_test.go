package coordinator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/coordinator/health"
	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/loadmgr"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// bottleneckView is the health manager's view of a running query whose
// keyed fragment frag (2 partitions, each busy all the time at 500
// tuples/s) holds back a source that would send a million tuples per
// second: DS2 asks for far more instances than the org's workers can take.
func bottleneckView(plan *queryspec.Plan, frag string) *health.Query {
	q := &health.Query{Name: plan.Query.Name}
	t0 := time.Now().Add(-6 * time.Second)
	for _, n := range plan.Nodes {
		f := health.Fragment{Name: n.Name, Parallelism: max(n.Partitions, 1), Upstreams: n.Inputs, Downstreams: n.Outputs}
		in := health.Instance{InRate: 1000, OutRate: 1000, Busy: 0.1}
		switch {
		case n.Kind == queryspec.KindSource:
			f.Source, f.SourceRate = true, 1e6
			in = health.Instance{OutRate: 1000, Busy: 0.1, BlockedMs: 800}
		case n.Kind == queryspec.KindSink:
			f.Sink = true
		case n.Name == frag:
			f.Scalable = true
			in = health.Instance{InRate: 500, OutRate: 500, Busy: 1, Queue: 50}
		}
		for k := range 6 {
			s := health.Sample{At: t0.Add(time.Duration(k) * time.Second)}
			for p := range f.Parallelism {
				i := in
				i.Partition = p
				s.Instances = append(s.Instances, i)
			}
			f.Samples = append(f.Samples, s)
		}
		q.Fragments = append(q.Fragments, f)
	}
	return q
}

// TestHealthOffloadsOnlyUnderContract: an org whose keyed aggregate is
// under-provisioned past what its workers can take (a scale-up that
// cannot be placed is not tried) offloads the aggregate's tasks to a
// partner only under a valid contract: without one the diagnosis ends as
// an alert saying so and nothing moves; once a contract is in force the
// load manager's offer rule (the org's marginal cost, with its capacity
// set to a sliver of a core, far above the contract's price) moves a task
// of the fragment to the partner, co-signed into both ledgers, and the
// action log names the move.
func TestHealthOffloadsOnlyUnderContract(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha := newXorgOrg(t, "alpha", nil, func(c *Config) {
		c.Federation.Load = loadmgr.Config{Cores: 0.001, Period: time.Hour}
		c.Health = HealthConfig{Off: true} // the test drives the loop
	})
	beta := newXorgOrg(t, "beta", fedAddr(alpha.testCluster), func(c *Config) {
		c.Federation.Load = loadmgr.Config{Period: 200 * time.Millisecond}
	})
	t.Cleanup(func() {
		for _, o := range []*xorgOrg{alpha, beta} {
			for _, stop := range o.stopW {
				stop()
			}
		}
		beta.stop(0)
		alpha.stop(0)
	})
	alpha.pin(beta.testCluster)
	beta.pin(alpha.testCluster)
	waitFor(t, 30*time.Second, "beta alive in alpha's pool", func() bool { return alpha.nodes[0].pool.Known("beta") })

	s := alpha.nodes[0]
	alpha.submit(t, "xq", 1, 0)
	waitFor(t, 30*time.Second, "the aggregate's tasks measured", func() bool {
		n := 0
		for _, ts := range s.LiveTaskStats("xq") {
			if strings.HasPrefix(ts.Task, "xq/counts/") && ts.CpuSecondsPerS > 0 {
				n++
			}
		}
		return n == 2
	})
	q, err := s.State().Query(nil, "xq")
	if err != nil || q == nil {
		t.Fatalf("query: %v", err)
	}
	plan := s.plans.plan(q)
	l := s.newHealthLoop(HealthConfig{Interval: 100 * time.Millisecond, Settle: time.Hour})
	decide := func() {
		hq := l.query("xq")
		hq.quietUntil, hq.pending = time.Time{}, nil
		l.decide(context.Background(), "xq", hq, bottleneckView(plan, "counts"), time.Now())
	}
	offloads := func() (alerts, offs []*fsm.HealthAction) {
		acts, err := s.State().HealthActions(nil, "xq")
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range acts {
			switch {
			case a.Outcome == fsm.HealthAlert:
				alerts = append(alerts, a)
			case a.Action == health.ActOffload:
				offs = append(offs, a)
			}
		}
		return alerts, offs
	}

	// No contract: an alert naming what is missing; nothing moves.
	decide()
	alerts, offs := offloads()
	if len(offs) != 0 || len(alerts) != 1 || alerts[0].Diagnosis != health.DiagUnderProvisioned ||
		!strings.Contains(alerts[0].Detail, "lacks capacity") || !strings.Contains(alerts[0].Detail, "no contract in force") {
		t.Fatalf("without a contract: alerts %+v, offloads %+v", alerts, offs)
	}
	if away := s.TasksAtPartners(); len(away) != 0 {
		t.Fatalf("tasks at partners without a contract: %v", away)
	}

	// A contract letting alpha's tasks run at beta.
	resp, err := alpha.fedClient(0).ProposeContract(ctxT(t, 20*time.Second), &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 100, ValidForMs: 3600_000, Direction: "out"})
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	var d federation.ContractDoc
	if err := json.Unmarshal(resp.ContractJson, &d); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the proposal at beta", func() bool {
		_, err := beta.nodes[0].fed.Contract(d.Terms.ID)
		return err == nil
	})
	if _, err := beta.fedClient(0).AnswerContract(ctxT(t, 20*time.Second), &pb.AnswerContractRequest{Id: d.Terms.ID, Accept: true}); err != nil {
		t.Fatalf("accept: %v", err)
	}
	waitFor(t, 10*time.Second, "the contract active at alpha", func() bool {
		ok, _ := s.load.CanOffload()
		return ok
	})

	decide()
	_, offs = offloads()
	if len(offs) != 1 || offs[0].Outcome != fsm.HealthPending || offs[0].Diagnosis != health.DiagUnderProvisioned {
		t.Fatalf("under a contract: offloads %+v, want one pending", offs)
	}
	away := s.TasksAtPartners()
	moved := ""
	for task, org := range away {
		if !strings.HasPrefix(task, "xq/counts/") || org != "beta" {
			t.Fatalf("%s went to %s: only the aggregate's tasks go, to beta", task, org)
		}
		moved = task
	}
	if moved == "" {
		t.Fatal("nothing moved to beta under the contract")
	}
	if p := l.query("xq").pending; p == nil || !strings.Contains(p.done, moved+" to beta under contract "+d.Terms.ID) {
		t.Fatalf("the pending offload does not name the move of %s: %+v", moved, p)
	}
	for _, o := range []*xorgOrg{alpha, beta} {
		waitFor(t, 10*time.Second, o.org+"'s ledger to record the move", func() bool {
			es, err := o.nodes[0].fed.Entries()
			if err != nil {
				return false
			}
			for _, e := range es {
				if e.Record.Kind == ledger.KindMove && e.Record.Contract == d.Terms.ID && e.Record.Fields[loadmgr.FieldTask] == moved {
					return true
				}
			}
			return false
		})
	}
}

// TestHealthSLOSourcesAlert: a query missing its throughput SLO whose
// operators idle and whose source is not held back is limited by its
// source: no operator is scaled (DS2 finds them large enough) and, since
// an ingest source's partitions are its producers' streams, which no live
// rescale can add, the diagnosis ends as an alert that names the rate the
// source would need and why it cannot be scaled. (A generator source is
// scaled: cmd/fedstream TestSLOScalesTheSource.)
func TestHealthSLOSourcesAlert(t *testing.T) {
	t.Parallel()
	p := health.DefaultConfig()
	p.MinSamples, p.Persist = 3, 2
	c := newTestClusterWith(t, 1, "", "", testTimings(), func(cfg *Config) {
		cfg.Health = HealthConfig{Interval: 100 * time.Millisecond, Settle: time.Second, Policy: &p}
	})
	defer c.shutdown()
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	y := strings.Replace(healthTestQuery, "autoscale: true", "slo: {throughput: 5000}", 1)
	y = strings.Replace(y, "generator: {kind: words, rate: 100, seed: 1}", "schema: {line: string}, ingest: true", 1)
	if _, err := c.admin(0).SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(y), Filename: "hq.yaml"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tk.C:
				ms := now.UnixMilli()
				s.liveStats.put("w-fake", []*pb.TaskStats{
					{Task: "hq/text/p0/r0", InTps: 100, OutTps: 100, Busy: 0.1, ReportedAtMs: ms},
					{Task: "hq/per_line/p0/r0", InTps: 100, OutTps: 100, Busy: 0.2, ReportedAtMs: ms},
					{Task: "hq/out/p0/r0", InTps: 100, OutTps: 100, Busy: 0.05, ReportedAtMs: ms},
				}, now)
			}
		}
	}()
	var alert *fsm.HealthAction
	waitFor(t, 30*time.Second, "an alert for the missed SLO", func() bool {
		for _, a := range healthActions(t, s) {
			if a.Outcome == fsm.HealthAlert {
				alert = a
				return true
			}
		}
		return false
	})
	for _, want := range []string{"scale_sources: no generator source: an ingest or kafka source", "sources text from 100 to 5000 tuples/s"} {
		if alert.Diagnosis != health.DiagSLOViolated || !strings.Contains(alert.Detail, want) {
			t.Fatalf("alert %+v: want slo_violated naming %q", alert, want)
		}
	}
	for _, a := range healthActions(t, s) {
		if a.Outcome != fsm.HealthAlert {
			t.Fatalf("action %+v: a source-bound SLO miss must change nothing", a)
		}
	}
}
