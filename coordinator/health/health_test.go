package health

import (
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"
)

// A recorded window is built sample by sample: each function gives the
// figures of partition p in sample k (0 = oldest).
type gen func(k, p int) Instance

func window(n, parts int, g gen) []Sample {
	t0 := time.Unix(1000, 0)
	out := make([]Sample, n)
	for k := range n {
		out[k].At = t0.Add(time.Duration(k) * time.Second)
		for p := range parts {
			in := g(k, p)
			in.Partition = p
			out[k].Instances = append(out[k].Instances, in)
		}
	}
	return out
}

func steady(in Instance) gen { return func(int, int) Instance { return in } }

// pipeline is src -> op (keyed, parts partitions) -> out, with n samples.
func pipeline(n, parts int, src, op, sink gen) *Query {
	return &Query{Name: "q", Fragments: []Fragment{
		{Name: "src", Source: true, Parallelism: 1, Downstreams: []string{"op"}, Samples: window(n, 1, src)},
		{Name: "op", Scalable: true, Parallelism: parts, Upstreams: []string{"src"}, Downstreams: []string{"out"}, Samples: window(n, parts, op)},
		{Name: "out", Sink: true, Parallelism: 1, Upstreams: []string{"op"}, Samples: window(n, 1, sink)},
	}}
}

var (
	// A source's InRate is the records it draws: the query's throughput.
	calmSrc  = steady(Instance{InRate: 1000, OutRate: 1000, Busy: 0.1})
	calmOp   = steady(Instance{InRate: 500, OutRate: 500, Busy: 0.5, Queue: 10})
	calmSink = steady(Instance{InRate: 1000, Busy: 0.05})
	blocked  = steady(Instance{OutRate: 1000, Busy: 0.1, BlockedMs: 600})
	busyOp   = steady(Instance{InRate: 500, OutRate: 500, Busy: 1, Queue: 50})
)

func symptomsOf(syms []Symptoms, frag string) []string {
	for _, s := range syms {
		if s.Fragment == frag {
			return s.Names()
		}
	}
	return nil
}

func TestDetectors(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct {
		name  string
		q     *Query
		want  []string // symptoms of op
		below bool
	}{
		{"calm", pipeline(6, 2, calmSrc, calmOp, calmSink), nil, false},
		{"too few samples", pipeline(c.MinSamples-1, 2, blocked, busyOp, calmSink), nil, false},
		{"backpressure", pipeline(6, 2, blocked, busyOp, calmSink), []string{SymBackpressure}, false},
		{"backpressure in one of the latest samples only", pipeline(6, 2, func(k, p int) Instance {
			if k == 4 {
				return Instance{OutRate: 1000, BlockedMs: 900}
			}
			return Instance{OutRate: 1000, Busy: 0.1}
		}, calmOp, calmSink), nil, false},
		{"large queue", pipeline(6, 2, calmSrc, steady(Instance{InRate: 500, Busy: 0.9, Queue: 5000}), calmSink), []string{SymLargeQueue}, false},
		{"growing queue", pipeline(6, 2, calmSrc, func(k, p int) Instance {
			return Instance{InRate: 500, Busy: 0.9, Queue: float64(100 + 300*k)}
		}, calmSink), []string{SymGrowingQueue}, false},
		{"backlog held upstream, growing", pipeline(6, 2, func(k, p int) Instance {
			return Instance{OutRate: 2000, Busy: 0.02, Unacked: float64(300 * k)}
		}, busyOp, calmSink), []string{SymGrowingQueue}, false},
		{"backlog held upstream, large", pipeline(6, 2, steady(Instance{OutRate: 1000, Busy: 0.1, Unacked: 5000}), busyOp, calmSink), []string{SymLargeQueue}, false},
		{"backlog held upstream, steady and small", pipeline(6, 2, steady(Instance{OutRate: 1000, Busy: 0.1, Unacked: 400}), calmOp, calmSink), nil, false},
		{"queue skew", pipeline(6, 3, calmSrc, func(k, p int) Instance {
			if p == 1 {
				return Instance{InRate: 300, Busy: 0.9, Queue: 900}
			}
			return Instance{InRate: 300, Busy: 0.5, Queue: 20}
		}, calmSink), []string{SymQueueSkew}, false},
		{"rate skew", pipeline(6, 3, calmSrc, func(k, p int) Instance {
			if p == 2 {
				return Instance{InRate: 800, Busy: 0.6}
			}
			return Instance{InRate: 200, Busy: 0.2}
		}, calmSink), []string{SymRateSkew}, false},
		{"idle capacity", pipeline(6, 4, calmSrc, steady(Instance{InRate: 100, Busy: 0.1}), calmSink), []string{SymIdle}, false},
		{"idle but busy once", pipeline(6, 4, calmSrc, func(k, p int) Instance {
			if k == 2 && p == 3 {
				return Instance{InRate: 100, Busy: 0.5}
			}
			return Instance{InRate: 100, Busy: 0.1}
		}, calmSink), nil, false},
		{"idle during a backlog upstream of the sink", &Query{Name: "q", Fragments: []Fragment{
			{Name: "src", Source: true, Parallelism: 1, Downstreams: []string{"a"}, Samples: window(6, 1, blocked)},
			{Name: "a", Scalable: true, Parallelism: 1, Upstreams: []string{"src"}, Downstreams: []string{"op"}, Samples: window(6, 1, busyOp)},
			{Name: "op", Scalable: true, Parallelism: 4, Upstreams: []string{"a"}, Samples: window(6, 4, steady(Instance{InRate: 100, Busy: 0.1}))},
		}}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			syms, below, _ := Detect(tc.q, c)
			if got := symptomsOf(syms, "op"); !slices.Equal(got, tc.want) {
				t.Errorf("symptoms of op %v, want %v (all: %+v)", got, tc.want, syms)
			}
			if below != tc.below {
				t.Errorf("below SLO %v, want %v", below, tc.below)
			}
		})
	}
}

// TestSLODetector: the throughput an SLO is held to is what the sources
// take; the sink's rate plays no part (a windowed query's sink sees
// nothing between its windows' ends).
func TestSLODetector(t *testing.T) {
	c := DefaultConfig()
	silentSink := steady(Instance{})
	for _, tc := range []struct {
		name  string
		slo   float64
		src   gen
		sink  gen
		below bool
	}{
		{"met", 1000, calmSrc, calmSink, false},
		{"met, the sink silent (a window not yet closed)", 1000, calmSrc, silentSink, false},
		{"within the margin", 1040, calmSrc, calmSink, false},
		{"below", 2000, calmSrc, calmSink, true},
		{"below, whatever the sink gets", 2000, calmSrc, steady(Instance{InRate: 5000}), true},
		{"below once only", 1000, func(k, p int) Instance {
			if k == 5 {
				return Instance{InRate: 400, OutRate: 400}
			}
			return Instance{InRate: 1000, OutRate: 1000}
		}, calmSink, false},
		{"no SLO", 0, calmSrc, calmSink, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := pipeline(6, 2, tc.src, calmOp, tc.sink)
			q.SLO = tc.slo
			if _, below, _ := Detect(q, c); below != tc.below {
				t.Errorf("below %v, want %v", below, tc.below)
			}
		})
	}
}

func TestDiagnosers(t *testing.T) {
	c := DefaultConfig()
	for _, tc := range []struct {
		name      string
		q         *Query
		slo       float64
		want      string
		partition int
	}{
		{"similar rates and queues: under-provisioned", pipeline(6, 3, blocked, busyOp, calmSink), 0, DiagUnderProvisioned, -1},
		{"larger queue at a similar rate: slow instance", pipeline(6, 3, blocked, func(k, p int) Instance {
			if p == 2 {
				return Instance{InRate: 330, Busy: 1, Queue: 3000}
			}
			return Instance{InRate: 340, Busy: 0.6, Queue: 100}
		}, calmSink), 0, DiagSlowInstance, 2},
		{"larger queue and higher rate: data skew", pipeline(6, 3, blocked, func(k, p int) Instance {
			if p == 0 {
				return Instance{InRate: 900, Busy: 1, Queue: 3000}
			}
			return Instance{InRate: 300, Busy: 0.4, Queue: 100}
		}, calmSink), 0, DiagDataSkew, 0},
		{"10% more keys: a larger queue at a 10% higher rate is data skew", pipeline(6, 3, blocked, func(k, p int) Instance {
			if p == 1 {
				return Instance{InRate: 1000, Busy: 1, Queue: 3000}
			}
			return Instance{InRate: 909, Busy: 0.91, Queue: 100}
		}, calmSink), 0, DiagDataSkew, 1},
		{"backlog held upstream, one partition far faster: data skew", pipeline(6, 3, func(k, p int) Instance {
			return Instance{OutRate: 1200, Busy: 0.05, Unacked: float64(500 + 300*k)}
		}, func(k, p int) Instance {
			if p == 0 {
				return Instance{InRate: 600, Busy: 0.6, Queue: 2}
			}
			return Instance{InRate: 300, Busy: 0.45, Queue: 1}
		}, calmSink), 0, DiagDataSkew, 0},
		{"idle: over-provisioned", pipeline(6, 4, calmSrc, steady(Instance{InRate: 250, Busy: 0.1}), calmSink), 0, DiagOverProvisioned, -1},
		{"throughput below the SLO without backpressure", pipeline(6, 2, calmSrc, calmOp, calmSink), 5000, DiagSLOViolated, -1},
		{"calm", pipeline(6, 2, calmSrc, calmOp, calmSink), 0, "", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.q.SLO = tc.slo
			syms, below, why := Detect(tc.q, c)
			ds := Diagnose(tc.q, syms, below, why, c)
			if tc.want == "" {
				if len(ds) != 0 {
					t.Fatalf("diagnoses %+v, want none", ds)
				}
				return
			}
			if len(ds) != 1 || ds[0].Name != tc.want || ds[0].Fragment != "op" || ds[0].Partition != tc.partition {
				t.Fatalf("diagnoses %+v, want %s of op partition %d", ds, tc.want, tc.partition)
			}
		})
	}
}

func allowAll(string, string, string) (bool, string) { return true, "" }

// TestScaleUpInOneStep: DS2's true rates size a throttled bottleneck in
// one step from what it can do per useful second and what the source
// wants to send when the source's rate is known; inferred from how long
// the source was blocked (it may be catching up), a step goes at most
// twice as far as what flows now.
func TestScaleUpInOneStep(t *testing.T) {
	c := DefaultConfig()
	// One instance takes 1000 tuples/s at 100% busy; the source wants
	// 10000/s (blocked 90% of the time at 1000/s).
	src := steady(Instance{OutRate: 1000, Busy: 0.1, BlockedMs: 900})
	op := steady(Instance{InRate: 1000, OutRate: 1000, Busy: 1, Queue: 200})
	for _, tc := range []struct {
		rate   float64
		lo, hi int
	}{{10000, 10, 11}, {0, 2, 3}} {
		q := pipeline(6, 1, src, op, steady(Instance{InRate: 1000}))
		q.Fragments[0].SourceRate = tc.rate
		syms, below, why := Detect(q, c)
		dec, _ := Choose(q, Diagnose(q, syms, below, why, c), c, allowAll)
		if dec == nil || dec.Action != ActScaleUp || dec.From != 1 || dec.To < tc.lo || dec.To > tc.hi {
			t.Fatalf("source rate %v: decision %+v, want scale_up 1 -> %d..%d", tc.rate, dec, tc.lo, tc.hi)
		}
	}
}

// TestNoScaleUpBeyondDemand: a fragment that still shows a backlog but
// already has the instances its demand needs (the backlog of an earlier
// shortage, still growing for a moment) is not scaled further; a large
// backlog that shrinks is no symptom at all.
func TestNoScaleUpBeyondDemand(t *testing.T) {
	c := DefaultConfig()
	// 3 instances of true rate 1000/s (busy 0.7 at 700/s), demand 2000/s.
	src := func(k, p int) Instance { return Instance{OutRate: 2000, Busy: 0.02, Unacked: float64(5000 + 300*k)} }
	op := steady(Instance{InRate: 700, OutRate: 700, Busy: 0.7})
	q := pipeline(6, 3, src, op, calmSink)
	q.Fragments[0].SourceRate = 2000
	syms, below, why := Detect(q, c)
	ds := Diagnose(q, syms, below, why, c)
	dec, alerts := Choose(q, ds, c, allowAll)
	if len(ds) != 1 || ds[0].Name != DiagUnderProvisioned || dec != nil || len(alerts) != 1 || !strings.Contains(strings.Join(alerts[0].Skipped, ";"), "needs 3 instances") {
		t.Fatalf("diagnoses %+v decision %+v alerts %+v, want under-provisioned left alone (3 instances suffice)", ds, dec, alerts)
	}
	shrinking := pipeline(6, 3, func(k, p int) Instance { return Instance{OutRate: 2000, Busy: 0.02, Unacked: float64(9000 - 1000*k)} }, op, calmSink)
	if syms, _, _ := Detect(shrinking, c); len(symptomsOf(syms, "op")) != 0 {
		t.Fatalf("a draining backlog gave symptoms %+v", syms)
	}
}

func TestScaleDownOnlyWithoutBacklog(t *testing.T) {
	c := DefaultConfig()
	// op: 8 instances each 10% busy at 125/s: true rate 1250, demand 1000:
	// 2 instances at the 60% scale-down utilisation.
	idle := steady(Instance{InRate: 125, OutRate: 125, Busy: 0.1})
	q := pipeline(6, 8, steady(Instance{OutRate: 1000, Busy: 0.1}), idle, calmSink)
	q.Fragments[0].SourceRate = 1000
	syms, below, why := Detect(q, c)
	dec, _ := Choose(q, Diagnose(q, syms, below, why, c), c, allowAll)
	if dec == nil || dec.Action != ActScaleDown || dec.To != 2 {
		t.Fatalf("decision %+v, want scale_down 8 -> 2", dec)
	}
	// The same idle op behind a backlogged fragment: no scale down.
	q2 := &Query{Name: "q", Fragments: []Fragment{
		{Name: "src", Source: true, Parallelism: 1, Downstreams: []string{"a"}, Samples: window(6, 1, blocked)},
		{Name: "a", Scalable: true, Parallelism: 1, Upstreams: []string{"src"}, Downstreams: []string{"op"}, Samples: window(6, 1, busyOp)},
		{Name: "op", Scalable: true, Parallelism: 8, Upstreams: []string{"a"}, Samples: window(6, 8, idle)},
	}}
	syms, below, why = Detect(q2, c)
	dec, _ = Choose(q2, Diagnose(q2, syms, below, why, c), c, allowAll)
	if dec == nil || dec.Action != ActScaleUp || dec.Diagnosis.Fragment != "a" {
		t.Fatalf("decision %+v, want scale_up of a and nothing else", dec)
	}
}

// TestChooseSkipsBlacklisted: a slow instance is moved; with move
// blacklisted for that diagnosis, the next resolver (scale up) is chosen
// and the skip says why. A diagnosis left with no resolver is an alert.
func TestChooseSkipsBlacklisted(t *testing.T) {
	c := DefaultConfig()
	q := pipeline(6, 3, blocked, func(k, p int) Instance {
		if p == 2 {
			return Instance{InRate: 330, OutRate: 330, Busy: 1, Queue: 3000}
		}
		return Instance{InRate: 340, OutRate: 340, Busy: 0.6, Queue: 100}
	}, calmSink)
	syms, below, why := Detect(q, c)
	ds := Diagnose(q, syms, below, why, c)
	dec, _ := Choose(q, ds, c, allowAll)
	if dec == nil || dec.Action != ActMove || dec.Diagnosis.Partition != 2 {
		t.Fatalf("decision %+v, want move of partition 2", dec)
	}
	noMove := func(_, d, a string) (bool, string) {
		if d == DiagSlowInstance && a == ActMove {
			return false, "blacklisted"
		}
		return true, ""
	}
	dec, _ = Choose(q, ds, c, noMove)
	if dec == nil || dec.Action != ActScaleUp || len(dec.Skipped) != 1 || !strings.Contains(dec.Skipped[0], "blacklisted") {
		t.Fatalf("decision %+v, want scale_up with move skipped as blacklisted", dec)
	}
	none := func(string, string, string) (bool, string) { return false, "blacklisted" }
	dec, alerts := Choose(q, ds, c, none)
	if dec != nil || len(alerts) != 1 || alerts[0].Diagnosis.Name != DiagSlowInstance {
		t.Fatalf("decision %+v alerts %+v, want no action and one alert", dec, alerts)
	}
}

// TestNoiseCausesNoAction: a provisioned query whose load varies +-20%
// around its mean, sample by sample, for an hour of one-second samples
// read through a sliding window: no detector fires, nothing is chosen.
func TestNoiseCausesNoAction(t *testing.T) {
	c := DefaultConfig()
	rng := rand.New(rand.NewSource(7))
	const n = 3600
	noise := make([]float64, n)
	for i := range noise {
		noise[i] = 1 + 0.4*(rng.Float64()-0.5)
	}
	full := pipeline(n, 2, func(k, p int) Instance { return Instance{InRate: 1000 * noise[k], OutRate: 1000 * noise[k], Busy: 0.1} },
		func(k, p int) Instance {
			return Instance{InRate: 500 * noise[k], OutRate: 500 * noise[k], Busy: 0.55 * noise[k], Queue: 40 * noise[k]}
		},
		func(k, p int) Instance { return Instance{InRate: 1000 * noise[k]} })
	full.SLO = 750
	actions := 0
	for end := 8; end <= n; end++ {
		q := &Query{Name: "q", SLO: full.SLO}
		for _, f := range full.Fragments {
			f.Samples = f.Samples[end-8 : end]
			q.Fragments = append(q.Fragments, f)
		}
		syms, below, why := Detect(q, c)
		if dec, _ := Choose(q, Diagnose(q, syms, below, why, c), c, allowAll); dec != nil {
			actions++
		}
	}
	if actions != 0 {
		t.Fatalf("%d actions over an hour of noisy stationary load, want 0", actions)
	}
}

func TestEvaluate(t *testing.T) {
	c := DefaultConfig()
	bad := Metrics{Throughput: 1000, UpBlockedMs: 800, Queue: 3000}
	for _, tc := range []struct {
		name          string
		action, diag  string
		before, after Metrics
		slo           float64
		want          bool
	}{
		{"pressure gone", ActScaleUp, DiagUnderProvisioned, bad, Metrics{Throughput: 1000, UpBlockedMs: 5, Queue: 50}, 0, true},
		{"throughput up a fifth", ActMove, DiagSlowInstance, bad, Metrics{Throughput: 1200, UpBlockedMs: 700, Queue: 2000}, 0, true},
		{"no change", ActMove, DiagSlowInstance, bad, Metrics{Throughput: 1020, UpBlockedMs: 790, Queue: 2900}, 0, false},
		{"calm but SLO still missed", ActScaleUp, DiagSLOViolated, Metrics{Throughput: 1000}, Metrics{Throughput: 1050}, 2000, false},
		{"SLO met", ActScaleUp, DiagSLOViolated, Metrics{Throughput: 1000}, Metrics{Throughput: 1990}, 2000, true},
		{"scale down kept things calm", ActScaleDown, DiagOverProvisioned, Metrics{Throughput: 1000}, Metrics{Throughput: 990, Queue: 20}, 0, true},
		{"scale down brought backpressure", ActScaleDown, DiagOverProvisioned, Metrics{Throughput: 1000}, Metrics{Throughput: 800, UpBlockedMs: 500}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, why := Evaluate(tc.action, tc.diag, tc.before, tc.after, tc.slo, c); got != tc.want {
				t.Errorf("improved %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}

func TestBlacklist(t *testing.T) {
	p := Pair{Query: "q", Diagnosis: DiagSlowInstance, Action: ActMove}
	other := Pair{Query: "q", Diagnosis: DiagUnderProvisioned, Action: ActScaleUp}
	log := []Logged{
		{p, OutcomeNotImproved},
		{p, OutcomePending},
		{other, OutcomeImproved},
		{other, OutcomeNotImproved},
		{other, OutcomeImproved},
	}
	bl := Blacklist(log, 0.5, 1)
	if r := bl.For(p); !r.Blacklisted || r.Evaluated != 1 || r.Failed != 1 {
		t.Errorf("failing pair %+v, want blacklisted after 1 of 1 failed", r)
	}
	if r := bl.For(other); r.Blacklisted || r.Evaluated != 3 || r.Failed != 1 {
		t.Errorf("mostly working pair %+v", r)
	}
	if r := Blacklist(log, 0.5, 2).For(p); r.Blacklisted {
		t.Errorf("blacklisted with fewer evaluated actions than required: %+v", r)
	}
}

// TestBlacklistPerFragment: a pair is scoped to the operator its action
// addressed (a failing scale-up of the splitter leaves scaling the
// counter allowed), and a logged action without a fragment (older log
// entries) still counts against every operator of its query.
func TestBlacklistPerFragment(t *testing.T) {
	at := func(frag string) Pair {
		return Pair{Query: "wc", Fragment: frag, Diagnosis: DiagUnderProvisioned, Action: ActScaleUp}
	}
	type want struct {
		evaluated, failed int
		blacklisted       bool
	}
	cases := []struct {
		name string
		log  []Logged
		ask  Pair
		want want
	}{
		{"failed elsewhere", []Logged{{at("splitter"), OutcomeFailed}}, at("counter"), want{0, 0, false}},
		{"failed here", []Logged{{at("splitter"), OutcomeFailed}}, at("splitter"), want{1, 1, true}},
		{"other query", []Logged{{Pair{Query: "other", Fragment: "counter", Diagnosis: DiagUnderProvisioned, Action: ActScaleUp}, OutcomeFailed}}, at("counter"), want{0, 0, false}},
		{"improved elsewhere, failed here", []Logged{{at("counter"), OutcomeImproved}, {at("splitter"), OutcomeNotImproved}}, at("splitter"), want{1, 1, true}},
		{"old entry without fragment", []Logged{{at(""), OutcomeNotImproved}}, at("counter"), want{1, 1, true}},
		{"old entry and own record", []Logged{{at(""), OutcomeNotImproved}, {at("counter"), OutcomeImproved}, {at("counter"), OutcomeImproved}}, at("counter"), want{3, 1, false}},
		{"pending does not count", []Logged{{at("counter"), OutcomePending}}, at("counter"), want{0, 0, false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Blacklist(tc.log, 0.5, 1).For(tc.ask)
			if got := (want{r.Evaluated, r.Failed, r.Blacklisted}); got != tc.want {
				t.Errorf("%+v: got %+v, want %+v", tc.ask, got, tc.want)
			}
		})
	}
}

// TestChooseSkipsBlacklistOnItsFragmentOnly: with scale-ups of one
// operator blacklisted, an under-provisioned other operator is still
// scaled up.
func TestChooseSkipsBlacklistOnItsFragmentOnly(t *testing.T) {
	bl := Blacklist([]Logged{{Pair{Query: "q", Fragment: "other", Diagnosis: DiagUnderProvisioned, Action: ActScaleUp}, OutcomeFailed}}, 0.5, 1)
	allowed := func(frag, diag, act string) (bool, string) {
		if bl.For(Pair{Query: "q", Fragment: frag, Diagnosis: diag, Action: act}).Blacklisted {
			return false, "blacklisted"
		}
		return true, ""
	}
	q, c := underProvisionedQuery()
	syms, below, why := Detect(q, c)
	ds := Diagnose(q, syms, below, why, c)
	dec, _ := Choose(q, ds, c, allowed)
	if dec == nil || dec.Action != ActScaleUp {
		t.Fatalf("decision %+v (diagnoses %+v), want a scale-up", dec, ds)
	}
	bl = Blacklist([]Logged{{Pair{Query: "q", Fragment: dec.Diagnosis.Fragment, Diagnosis: DiagUnderProvisioned, Action: ActScaleUp}, OutcomeFailed}}, 0.5, 1)
	if dec, _ := Choose(q, ds, c, allowed); dec != nil && dec.Action == ActScaleUp {
		t.Fatalf("scale-up chosen on %s though blacklisted there: %+v", dec.Diagnosis.Fragment, dec)
	}
}

// underProvisionedQuery is a source throttled by one operator instance
// that takes 1000 tuples/s while the source wants 10000/s.
func underProvisionedQuery() (*Query, Config) {
	src := steady(Instance{OutRate: 1000, Busy: 0.1, BlockedMs: 900})
	op := steady(Instance{InRate: 1000, OutRate: 1000, Busy: 1, Queue: 200})
	q := pipeline(6, 1, src, op, steady(Instance{InRate: 1000}))
	q.Fragments[0].SourceRate = 10000
	return q, DefaultConfig()
}
