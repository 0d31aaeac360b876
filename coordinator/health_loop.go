package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/coordinator/health"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// The health manager's policy loop (issue 14). It runs on the org leader
// as one of its duties: every Interval it reads the workers' latest
// per-task figures (LiveTaskStats), keeps a window of samples per
// fragment of each watched query, and runs the policy of package health
// over it. The one action chosen is written to the action log in Raft
// (pending) and carried out through the live rescale or the live move,
// both of which change placements only through the plan applier. The
// query then settles for Settle: no other action on it, and the window
// starts again; after it the action is evaluated against the figures it
// was taken on, and the evaluation goes to the log. The blacklist is
// computed from the log, so it survives a change of leader as the log
// does; a new leader adopts the pending actions it finds and evaluates
// them after a settling time of its own.

// HealthConfig configures the health manager's loop.
type HealthConfig struct {
	// Off turns the loop off on this coordinator.
	Off bool
	// All watches every running query. Otherwise (the default) only the
	// queries whose definition asks: autoscale: true, or an slo section.
	All bool
	// Interval is the time between two steps of the loop (default 1s);
	// Settle the time after an action before it is evaluated and before
	// another action on the same query (default 30s).
	Interval, Settle time.Duration
	// Warmup is how long at least the loop watches a query, from the
	// first sample of all its tasks, before it may act on it (0: one
	// settling time; negative: no warm-up). A query just started is not
	// at its load: its tasks start at different moments and first work
	// through what the sources sent meanwhile, the backlog held in front
	// of partitions that connected last, saturated, at rates that say
	// nothing of the query's load. It is the settling time after an
	// action, for the query's submission. After Warmup the warm-up goes
	// on while the query is still catching up (health.CatchingUp over
	// the samples of the last half warm-up: a backlog that shrinks, no
	// source falling behind its schedule), and ends for good the first
	// step it is not, or at WarmupMax. A new leader's loop watches each
	// query for a warm-up too: its figures before the leader change are
	// not kept.
	Warmup time.Duration
	// WarmupMax bounds the warm-up of a query whose backlog keeps
	// shrinking without ever being worked off (0: ten warm-ups). A query
	// that cannot catch up at all is not held that long: its backlog
	// does not shrink, or its sources fall behind, and that ends the
	// warm-up.
	WarmupMax time.Duration
	// Window is the number of samples kept per fragment (default 10, at
	// least the policy's MinSamples).
	Window int
	// FailureRatio and MinEvaluated: a diagnosis/action pair of a query
	// with at least MinEvaluated evaluated actions, of which at least
	// FailureRatio failed, is blacklisted (defaults 0.5 and 1).
	FailureRatio float64
	MinEvaluated int
	// Policy holds the detectors' and resolvers' thresholds (nil:
	// health.DefaultConfig()).
	Policy *health.Config
	// Offload is the last resolver of an under-provisioned fragment or a
	// missed SLO when the org lacks capacity: hand tasks of the fragment
	// to a contract partner through the bounded-price mechanism. nil: the
	// federation's load manager when the coordinator is in a federation
	// (loadOffloader), else offloading is not available and the resolver
	// is skipped.
	Offload Offloader
}

// Offloader hands work of a query to contract partners.
type Offloader interface {
	// Available reports whether an offload could happen at all now (a
	// contract in force lets this org's tasks run at a partner), and
	// why not.
	Available(now time.Time) (bool, string)
	// Offload offers the tasks of fragment of query running at home to
	// contract partners; it returns what moved, or an error when nothing
	// did (no contract, not profitable, refused).
	Offload(ctx context.Context, query, fragment string) (detail string, err error)
}

func (h *HealthConfig) fill() {
	if h.Interval <= 0 {
		h.Interval = time.Second
	}
	if h.Settle <= 0 {
		h.Settle = 30 * time.Second
	}
	if h.Warmup == 0 {
		h.Warmup = h.Settle
	}
	if h.WarmupMax <= 0 {
		h.WarmupMax = 10 * max(h.Warmup, 0)
	}
	h.WarmupMax = max(h.WarmupMax, h.Warmup)
	if h.Policy == nil {
		p := health.DefaultConfig()
		h.Policy = &p
	}
	if h.Window <= 0 {
		h.Window = 10
	}
	h.Window = max(h.Window, h.Policy.MinSamples)
	if h.FailureRatio <= 0 {
		h.FailureRatio = 0.5
	}
	if h.MinEvaluated <= 0 {
		h.MinEvaluated = 1
	}
}

// healthQuery is the loop's state for one watched query.
type healthQuery struct {
	// window: fragment -> samples, oldest first.
	window map[string][]health.Sample
	// seen: task id -> the newest sensor window already sampled (Unix
	// ms of its end).
	seen map[string]int64
	// quietUntil: no action before (settling after the last one).
	quietUntil time.Time
	// warmUntil: no action before (the warm-up after the query's first
	// complete sample); zero until that sample. warmCap: the warm-up
	// ends then whatever the query's figures (WarmupMax). warmed: the
	// warm-up is over for good.
	warmUntil, warmCap time.Time
	warmed             bool
	// history: fragment -> the samples of the last half warm-up, oldest
	// first, while the warm-up lasts (what CatchingUp reads).
	history map[string][]health.Sample
	pending *pendingHealth
	// alerted: fragment/diagnosis -> when last logged as an alert.
	alerted map[string]time.Time
	// defIndex is the definition the state belongs to.
	defIndex uint64
}

// pendingHealth is an action waiting for its evaluation.
type pendingHealth struct {
	id, fragment, diagnosis, action string
	before                          health.Metrics
	due                             time.Time
	// done says what the action did when that is known only once it is
	// carried out (the tasks an offload moved): it heads the evaluation.
	done string
}

// healthLoop is the leader's policy loop; one per leadership.
type healthLoop struct {
	s       *Server
	cfg     HealthConfig
	queries map[string]*healthQuery
	seq     int
	// underWay, when set, replaces the slot-map check of rescaleUnderWay
	// (tests).
	underWay func(query, fragment string) bool
}

// isRescale reports whether action is carried out by the live rescale.
func isRescale(action string) bool {
	return action == health.ActScaleUp || action == health.ActScaleDown || action == health.ActRebalanceSlots || action == health.ActScaleSources
}

// rescaleUnderWay reports whether a rescale of fragment of query is
// prepared or past its go and not finished. A rescale past its go only
// goes forward (finishRescale, or the next leader's resumeRescales): an
// action whose rescale is still under way has not completed, so it is
// neither failed nor ready to be judged.
func (l *healthLoop) rescaleUnderWay(query, fragment string) bool {
	if l.underWay != nil {
		return l.underWay(query, fragment)
	}
	m, err := l.s.State().SlotMap(nil, query, fragment)
	return err == nil && m != nil && m.Next != nil
}

// runHealth runs the policy loop until ctx ends (leadership lost).
func (s *Server) runHealth(ctx context.Context) {
	if s.cfg.Health.Off {
		return
	}
	l := s.newHealthLoop(s.cfg.Health)
	cfg := l.cfg
	l.adoptPending(time.Now())
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.step(ctx, now)
		}
	}
}

// newHealthLoop returns a loop with cfg's defaults filled in and, in a
// federation, the load manager as its offloader.
func (s *Server) newHealthLoop(cfg HealthConfig) *healthLoop {
	cfg.fill()
	if cfg.Offload == nil && s.load != nil {
		cfg.Offload = loadOffloader{s}
	}
	return &healthLoop{s: s, cfg: cfg, queries: map[string]*healthQuery{}}
}

// adoptPending takes over the actions a previous leader logged and did
// not evaluate: they are evaluated after a settling time from now, against
// the figures logged with them.
func (l *healthLoop) adoptPending(now time.Time) {
	acts, err := l.s.State().HealthActions(nil, "")
	if err != nil {
		return
	}
	for _, a := range acts {
		if a.Outcome != fsm.HealthPending {
			continue
		}
		var before health.Metrics
		_ = json.Unmarshal([]byte(a.Metrics), &before) // zero figures: judged on what follows alone
		hq := l.query(a.Query)
		hq.pending = &pendingHealth{id: a.ID, fragment: a.Fragment, diagnosis: a.Diagnosis, action: a.Action, before: before, due: now.Add(l.cfg.Settle)}
		hq.quietUntil = hq.pending.due
		l.s.logger.Info("health: adopted a pending action", "id", a.ID, "query", a.Query, "action", a.Action)
	}
}

func (l *healthLoop) query(name string) *healthQuery {
	hq := l.queries[name]
	if hq == nil {
		hq = &healthQuery{window: map[string][]health.Sample{}, alerted: map[string]time.Time{}}
		l.queries[name] = hq
	}
	return hq
}

// watched reports whether the loop looks after the query.
func (l *healthLoop) watched(spec *queryspec.Query) bool {
	return l.cfg.All || spec.Autoscale || spec.SLO != nil
}

// step runs one round of the loop over every watched query.
func (l *healthLoop) step(ctx context.Context, now time.Time) {
	qs, err := l.s.State().Queries(nil)
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, q := range qs {
		if q.Status != fsm.QueryStatusRunning || ctx.Err() != nil {
			continue
		}
		plan := l.s.plans.plan(q)
		if plan == nil || !l.watched(plan.Query) {
			continue
		}
		seen[q.Name] = true
		hq := l.query(q.Name)
		if hq.defIndex != q.CreateIndex {
			// A new definition: nothing of the old one's figures applies.
			*hq = healthQuery{window: map[string][]health.Sample{}, alerted: map[string]time.Time{}, defIndex: q.CreateIndex, pending: hq.pending, quietUntil: hq.quietUntil}
		}
		view := l.sample(q, plan, hq)
		if view == nil {
			continue // sample logged which task has no figures yet
		}
		if hq.warmUntil.IsZero() {
			hq.warmUntil = now.Add(max(l.cfg.Warmup, 0))
			hq.warmCap = now.Add(l.cfg.WarmupMax)
		}
		if hq.pending != nil && !now.Before(hq.pending.due) {
			l.evaluate(ctx, q.Name, hq, view, now)
		}
		if now.Before(hq.quietUntil) || hq.pending != nil || l.warming(q.Name, hq, view, now) {
			l.s.logger.Debug("health: no decision this step", "query", q.Name, "quiet_until", hq.quietUntil, "pending", hq.pending != nil,
				"warm_until", hq.warmUntil, "warmed", hq.warmed, "at", now)
			continue
		}
		l.decide(ctx, q.Name, hq, view, now)
	}
	for name, hq := range l.queries {
		if seen[name] || ctx.Err() != nil {
			continue
		}
		// A query stopped (or no longer watched) before its action could
		// be judged: say so rather than leave the action pending.
		if p := hq.pending; p != nil {
			l.evaluated(ctx, p.id, fsm.HealthNotImproved, "the query stopped or is no longer watched before the action could be evaluated", now)
		}
		delete(l.queries, name)
	}
}

// warming reports whether the query is still in its warm-up: before
// warmUntil, then as long as it catches up (health.CatchingUp over the
// warm-up history), until warmCap. The first step it does not, the
// warm-up is over for good: a backlog that comes later (a burst, a load
// change) is the detectors' to judge, and they leave one that drains
// alone.
func (l *healthLoop) warming(name string, hq *healthQuery, view *health.Query, now time.Time) bool {
	switch {
	case hq.warmed:
		return false
	case l.cfg.Warmup < 0:
		hq.warmed = true
		return false
	case now.Before(hq.warmUntil):
		return true
	case !now.Before(hq.warmCap):
		hq.warmed, hq.history = true, nil
		l.s.logger.Info("health: warm-up over: its longest", "query", name, "warmup_max", l.cfg.WarmupMax)
		return false
	}
	hv := *view
	hv.Fragments = slices.Clone(view.Fragments)
	for i := range hv.Fragments {
		hv.Fragments[i].Samples = hq.history[hv.Fragments[i].Name]
	}
	catching, why := health.CatchingUp(&hv, *l.cfg.Policy)
	if catching {
		l.s.logger.Debug("health: still warming up", "query", name, "why", why)
		return true
	}
	hq.warmed, hq.history = true, nil
	l.s.logger.Info("health: warm-up over", "query", name, "why", why)
	return false
}

// warmupHistory is the span of samples the warm-up judges a query on:
// half a warm-up, long enough for a draining backlog to show above the
// noise of single samples.
func (l *healthLoop) warmupHistory() time.Duration {
	return max(l.cfg.Warmup/2, time.Duration(l.cfg.Window)*l.cfg.Interval)
}

// maxHistory bounds the samples kept per fragment for the warm-up.
const maxHistory = 1000

// sample adds the latest reports of q's tasks to its window when they are
// new, and returns the policy's view of the query (nil when there is not
// yet a full sample).
func (l *healthLoop) sample(q *fsm.Query, plan *queryspec.Plan, hq *healthQuery) *health.Query {
	tasks, err := l.s.State().TasksByQuery(nil, q.Name)
	if err != nil {
		return nil
	}
	rows := map[string]*pb.TaskStats{}
	for _, ts := range l.s.LiveTaskStats(q.Name) {
		rows[ts.Task+"\x00"+ts.Worker] = ts
		if rows[ts.Task] == nil || ts.ReportedAtMs > rows[ts.Task].ReportedAtMs {
			rows[ts.Task] = ts
		}
	}
	// Replica 0 of each partition stands for its partition: replicas
	// process the same input.
	parallelism := map[string]int{}
	var picked []reportedTask
	complete := true
	for _, t := range tasks {
		if t.Replica != 0 {
			continue
		}
		parallelism[t.Fragment]++
		ts := rows[t.ID+"\x00"+t.WorkerID]
		if ts == nil {
			ts = rows[t.ID]
		}
		if ts == nil || ts.ReportedAtMs == 0 {
			if complete {
				l.s.logger.Debug("health: no full sample yet", "query", q.Name, "task", t.ID, "worker", t.WorkerID)
			}
			complete = false
			continue
		}
		picked = append(picked, reportedTask{task: t, worker: ts.Worker})
	}
	if complete {
		l.addWindows(hq, picked)
	}
	if !complete {
		return nil
	}
	hqv := &health.Query{Name: q.Name}
	if plan.Query.SLO != nil {
		hqv.SLO = plan.Query.SLO.Throughput
	}
	for _, n := range plan.Nodes {
		f := health.Fragment{Name: n.Name, Parallelism: parallelism[n.Name], Upstreams: n.Inputs, Downstreams: n.Outputs,
			Samples: hq.window[n.Name]}
		switch n.Kind {
		case queryspec.KindSource:
			f.Source = true
			if n.Source != nil && n.Source.Gen != nil && n.Source.Gen.Rate > 0 {
				// The partitions running now: a live rescale of the
				// source changes them.
				f.SourceRate = float64(n.Source.Gen.Rate * max(parallelism[n.Name], 1))
				f.SourceScalable = true
				if why := sourceScaleRefusal(plan, n, max(parallelism[n.Name], 1)); why != "" {
					f.SourceScalable, f.SourceWhyNot = false, why
				}
			}
		case queryspec.KindSink:
			f.Sink = true
		case queryspec.KindOperator:
			f.Scalable = n.KeyFields != nil
			if m, err := l.s.State().SlotMap(nil, q.Name, n.Name); f.Scalable && err == nil && m != nil && m.Next == nil && m.QueryIndex == q.CreateIndex {
				f.Owners = m.Owners()
			}
		}
		hqv.Fragments = append(hqv.Fragments, f)
	}
	return hqv
}

// allowed is the resolver filter: blacklisted pairs and actions this
// coordinator cannot carry out are skipped.
func (l *healthLoop) allowed(query string, now time.Time) health.Allowed {
	bl := l.blacklist(query)
	scalings := l.scalings(query)
	away := l.awayTask(query)
	var sources []string
	if q, err := l.s.State().Query(nil, query); err == nil && q != nil {
		if plan := l.s.plans.plan(q); plan != nil {
			for _, n := range plan.Nodes {
				if isGeneratorSource(n) {
					sources = append(sources, n.Name)
				}
			}
		}
	}
	return func(frag, diag, act string) (bool, string) {
		if r := bl.For(health.Pair{Query: query, Fragment: frag, Diagnosis: diag, Action: act}); r.Blacklisted {
			return false, fmt.Sprintf("blacklisted on %s (%d of %d evaluated actions failed)", frag, r.Failed, r.Evaluated)
		}
		if act == health.ActScaleSources {
			// Logged on the source it scaled (Decision.Target).
			for _, src := range sources {
				if r := bl.For(health.Pair{Query: query, Fragment: src, Diagnosis: diag, Action: act}); r.Blacklisted {
					return false, fmt.Sprintf("blacklisted on %s (%d of %d evaluated actions failed)", src, r.Failed, r.Evaluated)
				}
			}
		}
		if diag == health.DiagOverProvisioned {
			// No scale-down (of an operator, or of a source's
			// partitions) soon after a scale-up of the same fragment.
			gap := upDownGap * l.cfg.Settle
			if at, ok := health.RecentScaleUp(scalings, frag, now, gap); ok {
				return false, fmt.Sprintf("%s was scaled up at %s, less than %s ago: no scale-down so soon after a scale-up", frag, at.UTC().Format(time.TimeOnly), gap)
			}
		}
		switch act {
		case health.ActScaleUp, health.ActScaleDown, health.ActRebalanceSlots:
			if away != "" {
				// The rescale's holds and cut do not reach a task at a
				// partner, which runs with the slot maps it moved with.
				return false, fmt.Sprintf("task %s of the query runs at a partner: no rescale until it is home", away)
			}
			return true, ""
		case health.ActMove:
			return true, ""
		case health.ActScaleSources:
			if away != "" {
				return false, fmt.Sprintf("task %s of the query runs at a partner: no rescale until it is home", away)
			}
			if len(sources) == 0 {
				return false, errNoLiveSourceScaling
			}
			return true, ""
		case health.ActOffload:
			if l.cfg.Offload == nil {
				return false, "no partner offload: the coordinator is not in a federation"
			}
			return l.cfg.Offload.Available(now)
		}
		return false, "not carried out by this build"
	}
}

// errNoLiveSourceScaling is why a missed SLO whose sources are the
// bottleneck ends as an alert when the query has no generator source.
const errNoLiveSourceScaling = "no generator source: an ingest or kafka source's partitions are its producers' streams, " +
	"which a live rescale cannot add; give them more producers or partitions, or resubmit the query"

// awayTask names a task of query that runs at (or is moving to) a
// partner, "" when none does.
func (l *healthLoop) awayTask(query string) string {
	hs, err := l.s.State().HostedTasks(nil)
	if err != nil {
		return ""
	}
	for _, h := range hs {
		if h.Owner == l.s.cfg.Org && h.Query == query {
			return h.TaskID
		}
	}
	return ""
}

// fits reports whether the org's workers can take more instances (each
// with the query's replicas) of a fragment of query, and if not why.
func (l *healthLoop) fits(query, fragment string, from, to int) (bool, string) {
	st := l.s.State()
	workers, err := st.Workers(nil)
	if err != nil {
		return true, ""
	}
	tasks, err := st.Tasks(nil)
	if err != nil {
		return true, ""
	}
	q, err := st.Query(nil, query)
	if err != nil || q == nil {
		return true, ""
	}
	placer := newPlacer(workers, tasks)
	placer.reserve(l.s.hostedLoad())
	for p := from; p < to; p++ {
		for r := range max(q.Replicas, 1) {
			t := &fsm.Task{ID: fsm.TaskID(query, fragment, p, r), Query: query, Fragment: fragment, Partition: p, Replica: r}
			if w, why := placer.pick(t); w == "" {
				return false, fmt.Sprintf("the org lacks capacity: no worker can take partition %d of %d more: %s", p, to-from, why)
			}
		}
	}
	return true, ""
}

// upDownGap is how many settling times must pass after a scale-up of a
// fragment before the loop scales it down.
const upDownGap = 10

// scalings returns the logged actions of query's current definition in
// the form the scale-down guard reads.
func (l *healthLoop) scalings(query string) []health.Scaling {
	st := l.s.State()
	acts, _ := st.HealthActions(nil, query)
	var from uint64
	if q, err := st.Query(nil, query); err == nil && q != nil {
		from = q.CreateIndex
	}
	var out []health.Scaling
	for _, a := range acts {
		if a.CreateIndex < from {
			continue
		}
		out = append(out, health.Scaling{Fragment: a.Fragment, At: time.UnixMilli(a.AtMs), From: a.FromParallelism, To: a.ToParallelism, Outcome: a.Outcome})
	}
	return out
}

// blacklist evaluates the query's pairs from the action log.
func (l *healthLoop) blacklist(query string) health.Records {
	acts, _ := l.s.State().HealthActions(nil, query)
	return blacklistOf(l.s.State(), acts, l.cfg.FailureRatio, l.cfg.MinEvaluated)
}

// blacklistOf counts the pairs of the logged actions. Only the actions of
// a query's current definition count: resubmitting a query starts its
// record afresh.
func blacklistOf(st *fsm.StateStore, acts []*fsm.HealthAction, ratio float64, minEvaluated int) health.Records {
	since := map[string]uint64{}
	logged := make([]health.Logged, 0, len(acts))
	for _, a := range acts {
		from, ok := since[a.Query]
		if !ok {
			if q, err := st.Query(nil, a.Query); err == nil && q != nil {
				from = q.CreateIndex
			}
			since[a.Query] = from
		}
		if a.CreateIndex < from {
			continue
		}
		logged = append(logged, health.Logged{Pair: health.Pair{Query: a.Query, Fragment: a.Fragment, Diagnosis: a.Diagnosis, Action: a.Action}, Outcome: a.Outcome})
	}
	return health.Blacklist(logged, ratio, minEvaluated)
}

// decide runs the policy on a query and carries out its choice.
func (l *healthLoop) decide(ctx context.Context, name string, hq *healthQuery, q *health.Query, now time.Time) {
	pc := *l.cfg.Policy
	syms, below, why := health.Detect(q, pc)
	ds := health.Diagnose(q, syms, below, why, pc)
	if l.s.logger.Enabled(ctx, slog.LevelDebug) {
		for _, f := range q.Fragments {
			if n := len(f.Samples); n > 0 {
				l.s.logger.Debug("health: window", "query", name, "fragment", f.Name, "samples", n, "last", fmt.Sprintf("%+v", f.Samples[n-1].Instances))
			}
		}
		l.s.logger.Debug("health: step", "query", name, "symptoms", fmt.Sprintf("%+v", syms), "diagnoses", fmt.Sprintf("%+v", ds))
	}
	if len(ds) == 0 {
		return
	}
	allowed := l.allowed(name, now)
	chosen, alerts := health.Choose(q, ds, pc, allowed)
	if chosen != nil && chosen.Action == health.ActScaleUp && l.cfg.Offload != nil {
		// With a partner to offload to, a scale-up the org cannot place
		// is not tried (and failed, and blacklisted): the next resolver
		// is chosen at once.
		if ok, why := l.fits(name, chosen.Diagnosis.Fragment, chosen.From, chosen.To); !ok {
			frag := chosen.Diagnosis.Fragment
			chosen, alerts = health.Choose(q, ds, pc, func(f, diag, act string) (bool, string) {
				if act == health.ActScaleUp && f == frag {
					return false, why
				}
				return allowed(f, diag, act)
			})
		}
	}
	for _, a := range alerts {
		key := a.Diagnosis.Fragment + "/" + a.Diagnosis.Name
		if last, ok := hq.alerted[key]; ok && now.Sub(last) < 10*l.cfg.Settle {
			continue
		}
		hq.alerted[key] = now
		l.s.logger.Warn("health: diagnosis without a resolver", "query", name, "fragment", a.Diagnosis.Fragment,
			"diagnosis", a.Diagnosis.Name, "why", a.Diagnosis.Why, "skipped", strings.Join(a.Skipped, "; "))
		l.record(ctx, name, q, a, fsm.HealthAlert, "no resolver could act", now)
	}
	if chosen == nil {
		return
	}
	if isRescale(chosen.Action) {
		// A rescale someone else started is no failure of this pair:
		// wait for it to end.
		if m, err := l.s.State().SlotMap(nil, name, target(*chosen)); err != nil || m != nil && m.Next != nil {
			l.s.logger.Debug("health: a rescale of the fragment is under way: no action", "query", name, "fragment", target(*chosen), "err", err)
			return
		}
	}
	id := l.record(ctx, name, q, *chosen, fsm.HealthPending, chosen.Why, now)
	if id == "" {
		return // not logged (no leader, older coordinators): no action either
	}
	before := health.Measure(q, target(*chosen), pc)
	l.s.logger.Info("health: acting", "query", name, "fragment", target(*chosen), "diagnosis", chosen.Diagnosis.Name,
		"partition", chosen.Diagnosis.Partition, "symptoms", strings.Join(chosen.Diagnosis.Symptoms, ","),
		"diagnosis_why", chosen.Diagnosis.Why, "action", chosen.Action, "from", chosen.From, "to", chosen.To, "why", chosen.Why)
	if l.s.logger.Enabled(ctx, slog.LevelDebug) {
		// The samples the diagnosis was made on, partition by partition:
		// what a false diagnosis is found from (and recorded into table
		// tests).
		if f := q.Fragment(chosen.Diagnosis.Fragment); f != nil {
			l.s.logger.Debug("health: window behind the action", "query", name, "fragment", f.Name, "samples", windowText(f.Samples))
			for _, u := range f.Upstreams {
				if uf := q.Fragment(u); uf != nil {
					l.s.logger.Debug("health: upstream window behind the action", "query", name, "fragment", u, "samples", upstreamText(uf.Samples))
				}
			}
		}
	}
	did, err := l.carryOut(ctx, name, q, *chosen)
	done := time.Now()
	if err != nil && isRescale(chosen.Action) && l.rescaleUnderWay(name, target(*chosen)) {
		// The rescale passed its go but its tasks had not all passed the
		// cut within the rescale's limit (a backlogged operator works
		// through its backlog at its old pace first): it is still under
		// way, not failed. It stays pending; evaluate waits for it to
		// finish and then for the settling time.
		l.s.logger.Info("health: rescale still under way, evaluated once it finishes", "query", name, "action", chosen.Action, "err", err)
		did, err = "the rescale outlasted its wait ("+err.Error()+")", nil
	}
	if err != nil {
		l.s.logger.Warn("health: action failed", "query", name, "action", chosen.Action, "err", err)
		l.evaluated(ctx, id, fsm.HealthFailed, err.Error(), done)
		hq.quietUntil = done.Add(l.cfg.Settle)
		return
	}
	hq.pending = &pendingHealth{id: id, fragment: target(*chosen), diagnosis: chosen.Diagnosis.Name, action: chosen.Action,
		before: before, due: done.Add(l.cfg.Settle), done: did}
	hq.quietUntil = hq.pending.due
	// The figures from before the action say nothing of after it.
	hq.window = map[string][]health.Sample{}
}

// carryOut performs a decision through the live rescale (a rebalance
// too: the same partitions, other owners for the moved slots), the live
// move or the offloader. did says what it did when only carrying it out
// tells (the tasks an offload moved).
func (l *healthLoop) carryOut(ctx context.Context, name string, q *health.Query, d health.Decision) (did string, err error) {
	s := l.s
	switch d.Action {
	case health.ActScaleUp, health.ActScaleDown:
		s.scaleMu.Lock()
		defer s.scaleMu.Unlock()
		_, err := s.rescale(ctx, name, d.Diagnosis.Fragment, d.To)
		return "", err
	case health.ActRebalanceSlots:
		s.scaleMu.Lock()
		defer s.scaleMu.Unlock()
		return "", l.rebalance(ctx, name, d)
	case health.ActScaleSources:
		if d.Target == "" {
			return "", errors.New("no source to scale")
		}
		s.scaleMu.Lock()
		defer s.scaleMu.Unlock()
		_, err := s.rescale(ctx, name, d.Target, d.To)
		return "", err
	case health.ActMove:
		id := fsm.TaskID(name, d.Diagnosis.Fragment, d.Diagnosis.Partition, 0)
		to, err := l.moveTarget(id)
		if err != nil {
			return "", err
		}
		_, err = (&adminService{s: s}).MoveTask(ctx, &pb.MoveTaskRequest{TaskId: id, ToWorker: to})
		return "", err
	case health.ActOffload:
		if l.cfg.Offload == nil {
			return "", errors.New("no offloader")
		}
		return l.cfg.Offload.Offload(ctx, name, d.Diagnosis.Fragment)
	}
	return "", fmt.Errorf("action %s is not carried out by this build", d.Action)
}

// rebalance gives the decision's slots their new owners through the live
// rescale, the number of partitions unchanged. The moves were planned on
// the map the window saw: a slot owned by another partition now (the map
// changed since) refuses the whole rebalance as stale. scaleMu is held.
func (l *healthLoop) rebalance(ctx context.Context, name string, d health.Decision) error {
	frag := d.Diagnosis.Fragment
	cur, err := l.s.State().SlotMap(nil, name, frag)
	if err != nil || cur == nil {
		return fmt.Errorf("rebalance %s/%s: no slot map", name, frag)
	}
	if cur.Next != nil {
		return fmt.Errorf("rebalance %s/%s: a rescale to epoch %d is under way", name, frag, cur.Next.Epoch)
	}
	owners := cur.Owners()
	for _, m := range d.Slots {
		if m.Slot < 0 || m.Slot >= len(owners) || m.To < 0 || m.To >= cur.Partitions {
			return fmt.Errorf("rebalance %s/%s: slot %d to partition %d is out of range", name, frag, m.Slot, m.To)
		}
		if owners[m.Slot] != m.From {
			return fmt.Errorf("rebalance %s/%s: stale: slot %d belongs to partition %d now, planned from %d", name, frag, m.Slot, owners[m.Slot], m.From)
		}
		owners[m.Slot] = m.To
	}
	_, err = l.s.rescaleTo(ctx, name, frag, cur.Partitions, fsm.RangesOf(owners), cur.Epoch)
	return err
}

// moveTarget picks the ready worker with the fewest tasks other than the
// one the task runs on and those running another replica of its
// partition (the plan applier checks the placement again).
func (l *healthLoop) moveTarget(taskID string) (string, error) {
	st := l.s.State()
	t, err := st.Task(nil, taskID)
	if err != nil || t == nil {
		return "", fmt.Errorf("task %s not found", taskID)
	}
	workers, err := st.Workers(nil)
	if err != nil {
		return "", err
	}
	tasks, err := st.Tasks(nil)
	if err != nil {
		return "", err
	}
	load, sibling := map[string]int{}, map[string]bool{}
	for _, o := range tasks {
		load[o.WorkerID]++
		if o.Query == t.Query && o.Fragment == t.Fragment && o.Partition == t.Partition {
			sibling[o.WorkerID] = true
		}
	}
	best := ""
	for _, w := range workers {
		if w.Status != fsm.WorkerStatusReady || sibling[w.ID] {
			continue
		}
		if best == "" || load[w.ID] < load[best] || load[w.ID] == load[best] && w.ID < best {
			best = w.ID
		}
	}
	if best == "" {
		return "", fmt.Errorf("no other ready worker to move %s to", taskID)
	}
	return best, nil
}

// record writes a decision to the action log and returns its id ("" when
// it could not be written).
func (l *healthLoop) record(ctx context.Context, name string, q *health.Query, d health.Decision, outcome, detail string, now time.Time) string {
	l.seq++
	id := fmt.Sprintf("%s-%d-%d", name, now.UnixMilli(), l.seq)
	m, _ := json.Marshal(health.Measure(q, target(d), *l.cfg.Policy))
	symptoms := strings.Join(d.Diagnosis.Symptoms, ",")
	if d.Diagnosis.Why != "" {
		symptoms += ": " + d.Diagnosis.Why
	}
	if len(d.Skipped) > 0 {
		detail += " (skipped: " + strings.Join(d.Skipped, "; ") + ")"
	}
	act := d.Action
	if act == "" {
		act = "none"
	}
	a := fsm.HealthAction{ID: id, Query: name, Fragment: target(d), Diagnosis: d.Diagnosis.Name, Action: act,
		Detail: detail, Symptoms: symptoms, AtMs: now.UnixMilli(), Metrics: string(m), FromParallelism: d.From, ToParallelism: d.To, Outcome: outcome}
	if d.Diagnosis.Partition >= 0 {
		a.Detail = fmt.Sprintf("partition %d: %s", d.Diagnosis.Partition, a.Detail)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := l.s.apply(cctx, fsm.HealthLogType, fsm.HealthLogRequest{Action: a})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		l.s.logger.Warn("health: action log not written", "query", name, "err", err)
		return ""
	}
	l.s.metrics.health.WithLabelValues(a.Diagnosis, a.Action, outcome).Inc()
	return id
}

// evaluated writes an action's outcome to the log.
func (l *healthLoop) evaluated(ctx context.Context, id, outcome, detail string, at time.Time) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := l.s.apply(cctx, fsm.HealthLogType, fsm.HealthLogRequest{Action: fsm.HealthAction{ID: id, Outcome: outcome, OutcomeDetail: detail, EvaluatedAtMs: at.UnixMilli()}})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		l.s.logger.Warn("health: evaluation not written", "id", id, "err", err)
	}
}

// evaluate judges the query's pending action once its window after the
// action is long enough (or, failing that, two settling times late).
func (l *healthLoop) evaluate(ctx context.Context, name string, hq *healthQuery, q *health.Query, now time.Time) {
	p := hq.pending
	pc := *l.cfg.Policy
	f := q.Fragment(p.fragment)
	if f == nil {
		hq.pending = nil
		l.evaluated(ctx, p.id, fsm.HealthNotImproved, "the fragment is gone", now)
		return
	}
	if isRescale(p.action) && l.rescaleUnderWay(name, p.fragment) {
		// Not completed yet (the rescale of an adopted action, or one
		// that outlasted the loop's wait): judge it a settling time after
		// it finishes, on figures from after it.
		p.due = now.Add(l.cfg.Settle)
		hq.quietUntil = p.due
		hq.window = map[string][]health.Sample{}
		return
	}
	if len(f.Samples) < pc.MinSamples && now.Before(p.due.Add(2*l.cfg.Settle)) {
		return
	}
	after := health.Measure(q, p.fragment, pc)
	ok, why := health.Evaluate(p.action, p.diagnosis, p.before, after, q.SLO, pc)
	if p.done != "" {
		why = p.done + "; " + why
	}
	outcome := fsm.HealthNotImproved
	if ok {
		outcome = fsm.HealthImproved
	}
	l.s.logger.Info("health: action evaluated", "query", name, "id", p.id, "action", p.action, "outcome", outcome, "why", why)
	l.evaluated(ctx, p.id, outcome, why, now)
	hq.pending = nil
}

// target is the fragment a decision changes: its Target (the source a
// scale_sources decision scales), else the diagnosed fragment.
func target(d health.Decision) string {
	if d.Target != "" {
		return d.Target
	}
	return d.Diagnosis.Fragment
}

// windowText writes a window of samples for the log, one sample per line
// and per partition {input rate, busy share, queue} (the form the table
// tests of package health record windows in), each sample with its
// time of day.
func windowText(ss []health.Sample) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "\n%s", s.At.UTC().Format("15:04:05.000"))
		for _, in := range s.Instances {
			fmt.Fprintf(&b, " p%d{%.0f, %.3f, %.0f}", in.Partition, in.InRate, in.Busy, in.Queue)
		}
	}
	return b.String()
}

// upstreamText writes an upstream's window for the log: per sample its
// total output rate and its instances' mean blocked time (ms/s) and mean
// backlog held for consumers.
func upstreamText(ss []health.Sample) string {
	var b strings.Builder
	for _, s := range ss {
		out, blocked, unacked := 0.0, 0.0, 0.0
		for _, in := range s.Instances {
			out += in.OutRate
			blocked += in.BlockedMs
			unacked += in.Unacked
		}
		n := float64(max(len(s.Instances), 1))
		fmt.Fprintf(&b, "\n%s out %.0f/s, blocked %.0f ms/s, unacked %.0f per instance", s.At.UTC().Format("15:04:05.000"), out, blocked/n, unacked/n)
	}
	return b.String()
}
