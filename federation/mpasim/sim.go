// Package mpasim simulates the bounded-price mechanism of federation/mpa at
// scale, without network: many orgs with random capacities and loads, a
// random graph of contracts, and the same decision functions the load
// manager uses, run period by period. It compares four strategies (no
// sharing, fixed-price contracts, bounded-price contracts, and the best a
// central planner could do over the same contract graph) so that the gaps
// between them are visible.
package mpasim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/fedstream/fedstream/federation/mpa"
)

// ErrBadConfig is returned for simulation parameters outside their range.
var ErrBadConfig = errors.New("invalid simulation parameters")

// Strategy names, the keys of Result.Strategies.
const (
	StrategyNone    = "none"
	StrategyFixed   = "fixed"
	StrategyBounded = "bounded"
	StrategyOptimal = "optimal"
)

// Strategies lists the strategy names in the order they are printed.
var Strategies = []string{StrategyNone, StrategyFixed, StrategyBounded, StrategyOptimal}

// Config are the simulation's parameters.
type Config struct {
	Orgs      int     `json:"orgs"`
	Contracts int     `json:"contracts"` // contracts per org (the degree of the contract graph)
	Load      float64 `json:"load"`      // F: total load / total capacity
	Runs      int     `json:"runs"`
	Seed      uint64  `json:"seed"`
	// Spread: each org's share of capacity is drawn uniformly from
	// Load x [1-Spread, 1+Spread], then all loads are scaled so that the
	// total is exactly Load x total capacity.
	Spread float64 `json:"spread"`
	// MaxRounds bounds the load periods run to converge; Within is the
	// number of rounds an acceptable allocation must be reached in.
	MaxRounds int `json:"max_rounds"`
	Within    int `json:"within"`
	// NoisePeriods are run after convergence with every org's own load
	// scaled each period by a factor drawn uniformly from 1 +- Noise.
	NoisePeriods int     `json:"noise_periods"`
	Noise        float64 `json:"noise"`
	// Prices and the policy, as shares of capacity under the M/M/1 cost
	// (see mpa.SuggestedPrices): the bounded contracts' p_min and p_max
	// are the marginal costs at SharePriceMin and SharePriceMax of
	// capacity, fixed contracts are priced at p_min, and the migration
	// cost makes an org offer above ShareOffer at p_min.
	SharePriceMin float64 `json:"share_price_min"`
	SharePriceMax float64 `json:"share_price_max"`
	ShareOffer    float64 `json:"share_offer"`
	ShareReturn   float64 `json:"share_return"`
	// ShareFixed prices the fixed contracts (their migration cost is the
	// same as the bounded ones').
	ShareFixed float64 `json:"share_fixed"`
	// Smoothing is the EWMA weight of a new load sample.
	Smoothing float64 `json:"smoothing"`
	// NoCeiling turns off the partners' accept ceiling (mpa.AcceptCeiling),
	// to measure what it does.
	NoCeiling bool `json:"no_ceiling"`
	// MaxLoadShare sizes each contract's max load: this share of the
	// smaller partner's capacity.
	MaxLoadShare float64 `json:"max_load_share"`
	// OverloadFactor sizes the step of every org's marginal cost at its
	// capacity (mpa.Overload) in migration costs; 0 leaves the plain
	// M/M/1 cost.
	OverloadFactor float64 `json:"overload_factor"`
}

// DefaultConfig is the configuration `fedstream sim mpa` starts from.
func DefaultConfig() Config {
	return Config{Orgs: 200, Contracts: 4, Load: 0.8, Runs: 20, Seed: 1, Spread: 0.5,
		MaxRounds: 30, Within: 10, NoisePeriods: 40, Noise: 0.1,
		SharePriceMin: mpa.SharePriceMin, SharePriceMax: mpa.SharePriceMax, ShareOffer: mpa.ShareOffer, ShareReturn: mpa.ShareReturn, ShareFixed: mpa.SharePriceMin,
		Smoothing: mpa.SuggestedPolicy(mpa.DefaultUtilisation).Smoothing, MaxLoadShare: 0.5, OverloadFactor: mpa.OverloadFactor}
}

// Validate checks the ranges.
func (c Config) Validate() error {
	switch {
	case c.Orgs < 2 || c.Orgs > 100000:
		return fmt.Errorf("%w: --orgs %d: want 2 to 100000", ErrBadConfig, c.Orgs)
	case c.Contracts < 1 || c.Contracts >= c.Orgs:
		return fmt.Errorf("%w: --contracts %d: want 1 to orgs-1 (%d)", ErrBadConfig, c.Contracts, c.Orgs-1)
	case !(c.Load > 0) || c.Load > 10:
		return fmt.Errorf("%w: --load %v: want a total load / total capacity in (0, 10]", ErrBadConfig, c.Load)
	case c.Runs < 1:
		return fmt.Errorf("%w: --runs %d: want at least 1", ErrBadConfig, c.Runs)
	case !(c.Spread >= 0 && c.Spread < 1):
		return fmt.Errorf("%w: spread %v: want [0, 1)", ErrBadConfig, c.Spread)
	case c.MaxRounds < 1 || c.Within < 0:
		return fmt.Errorf("%w: max rounds %d, within %d", ErrBadConfig, c.MaxRounds, c.Within)
	case !(c.ShareFixed > 0 && c.ShareFixed < 1.18):
		return fmt.Errorf("%w: fixed price share %v: want (0, 1.18)", ErrBadConfig, c.ShareFixed)
	case !(c.Smoothing > 0 && c.Smoothing <= 1):
		return fmt.Errorf("%w: smoothing %v: want (0, 1]", ErrBadConfig, c.Smoothing)
	case c.NoisePeriods < 0 || !(c.Noise >= 0 && c.Noise < 1):
		return fmt.Errorf("%w: noise periods %d, noise %v", ErrBadConfig, c.NoisePeriods, c.Noise)
	case !(c.MaxLoadShare > 0 && c.MaxLoadShare <= 10):
		return fmt.Errorf("%w: --max-load-share %v: want (0, 10]", ErrBadConfig, c.MaxLoadShare)
	case !(c.OverloadFactor >= 0 && c.OverloadFactor <= 1000):
		return fmt.Errorf("%w: --overload-factor %v: want [0, 1000]", ErrBadConfig, c.OverloadFactor)
	case !(c.ShareReturn > 0 && c.ShareReturn < c.SharePriceMin && c.SharePriceMin < c.ShareOffer && c.SharePriceMin <= c.SharePriceMax && c.SharePriceMax < 1.18):
		return fmt.Errorf("%w: price shares: want 0 < return (%v) < p_min (%v) < offer (%v), p_min <= p_max (%v) < 1.18", ErrBadConfig, c.ShareReturn, c.SharePriceMin, c.ShareOffer, c.SharePriceMax)
	}
	return nil
}

// Stats are one strategy's figures over all runs.
type Stats struct {
	// AcceptableShare is the share of runs that reach an acceptable
	// allocation (every org at or under capacity, or every org at or over
	// it when the total load is over the total capacity) within Within
	// rounds and keep it to the end of convergence.
	AcceptableShare float64 `json:"acceptable_share"`
	// RoundsP50 and RoundsMax: load periods until no org moves anything
	// any more (capped at MaxRounds), over all runs.
	RoundsP50 int `json:"rounds_p50"`
	RoundsMax int `json:"rounds_max"`
	// AcceptableRoundsP50: rounds until the allocation became acceptable
	// for good, over the runs that got there.
	AcceptableRoundsP50 int `json:"acceptable_rounds_p50"`
	// Moves is the mean number of task moves (returns included) per run
	// until convergence.
	Moves float64 `json:"moves"`
	// NoiseMovesPerOrgPeriod: task moves per org per load period after
	// convergence, under the load noise.
	NoiseMovesPerOrgPeriod float64 `json:"noise_moves_per_org_period"`
	// OverCapacityShare is the mean share of orgs above their capacity at
	// the end of convergence.
	OverCapacityShare float64 `json:"over_capacity_share"`
}

// Result is the outcome of Run.
type Result struct {
	Config     Config           `json:"config"`
	Strategies map[string]Stats `json:"strategies"`
	// Prices and policy the fixed and bounded contracts used.
	PriceMin      float64 `json:"price_min"`
	PriceMax      float64 `json:"price_max"`
	PriceFixed    float64 `json:"price_fixed"`
	MigrationCost float64 `json:"migration_cost"`
	// OverloadPenalty is the step of the orgs' marginal cost at capacity.
	OverloadPenalty float64 `json:"overload_penalty"`
	Seconds         float64 `json:"seconds"`
}

// Simulation constants, documented in docs/FEDERATION.md.
const (
	capMin, capMax   = 10.0, 100.0 // an org's capacity T, load units
	taskMin, taskMax = 0.2, 2.0    // a task's load
	period           = 10 * time.Second
	notice           = 3 * period
)

// Run simulates cfg.Runs random federations under every strategy.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	u := mpa.DefaultUtilisation
	pmin, pmax := mpa.MarginalAtShare(cfg.SharePriceMin, u), mpa.MarginalAtShare(cfg.SharePriceMax, u)
	pol := mpa.SuggestedPolicy(u)
	pol.MigrationCost = mpa.MarginalAtShare(cfg.ShareOffer, u) - pmin
	pol.ReturnMargin = pmin - mpa.MarginalAtShare(cfg.ShareReturn, u)
	pol.Smoothing = cfg.Smoothing
	pol.OverloadPenalty = cfg.OverloadFactor * pol.MigrationCost
	res := Result{Config: cfg, PriceMin: pmin, PriceMax: pmax, PriceFixed: mpa.MarginalAtShare(cfg.ShareFixed, u), MigrationCost: pol.MigrationCost, OverloadPenalty: pol.OverloadPenalty, Strategies: map[string]Stats{}}
	per := map[string][]runStats{}
	for r := 0; r < cfg.Runs; r++ {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		w := newWorld(cfg, uint64(r))
		per[StrategyNone] = append(per[StrategyNone], w.none())
		per[StrategyOptimal] = append(per[StrategyOptimal], w.optimal())
		pf := mpa.MarginalAtShare(cfg.ShareFixed, u)
		per[StrategyFixed] = append(per[StrategyFixed], w.market(cfg, pf, pf, pol, uint64(r)))
		per[StrategyBounded] = append(per[StrategyBounded], w.market(cfg, pmin, pmax, pol, uint64(r)))
	}
	for name, runs := range per {
		res.Strategies[name] = aggregate(runs)
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

type runStats struct {
	acceptable  bool
	rounds      int
	accRounds   int // -1 when never acceptable for good
	moves       int
	noiseMoves  float64 // per org per period
	overCapShar float64
}

func aggregate(runs []runStats) Stats {
	var s Stats
	var rounds, acc []int
	for _, r := range runs {
		if r.acceptable {
			s.AcceptableShare++
		}
		if r.accRounds >= 0 {
			acc = append(acc, r.accRounds)
		}
		rounds = append(rounds, r.rounds)
		s.Moves += float64(r.moves)
		s.NoiseMovesPerOrgPeriod += r.noiseMoves
		s.OverCapacityShare += r.overCapShar
	}
	n := float64(len(runs))
	s.AcceptableShare /= n
	s.Moves /= n
	s.NoiseMovesPerOrgPeriod /= n
	s.OverCapacityShare /= n
	s.RoundsP50, s.RoundsMax = median(rounds), slices.Max(rounds)
	s.AcceptableRoundsP50 = -1
	if len(acc) > 0 {
		s.AcceptableRoundsP50 = median(acc)
	}
	return s
}

func median(xs []int) int {
	ys := slices.Clone(xs)
	slices.Sort(ys)
	return ys[(len(ys)-1)/2]
}

// world is one random federation: orgs, their tasks, the contract graph.
type world struct {
	n         int
	overall   bool // total load above total capacity
	name      []string
	cost      []mpa.MM1 // per org: the base cost (a market adds its policy's overload step)
	capa      []float64 // per org: capacity T
	taskOwner []int32
	taskLoad  []float64
	taskID    []string
	own       [][]int32 // tasks by owner, largest first
	contracts []contract
	adj       [][]int32 // contract indices by org
}

type contract struct {
	a, b    int32
	maxLoad float64
	id      string
}

func newWorld(cfg Config, run uint64) *world {
	rng := rand.New(rand.NewPCG(cfg.Seed, run))
	n := cfg.Orgs
	w := &world{n: n, overall: cfg.Load > 1, name: make([]string, n), cost: make([]mpa.MM1, n), capa: make([]float64, n), own: make([][]int32, n), adj: make([][]int32, n)}
	loads := make([]float64, n)
	var totalT, totalL float64
	for i := range n {
		w.name[i] = "org" + strconv.Itoa(i)
		t := capMin + rng.Float64()*(capMax-capMin)
		w.capa[i] = t
		w.cost[i] = mpa.MM1{T: t, U: mpa.DefaultUtilisation}
		loads[i] = t * cfg.Load * (1 - cfg.Spread + 2*cfg.Spread*rng.Float64())
		totalT += t
		totalL += loads[i]
	}
	scale := cfg.Load * totalT / totalL
	for i := range n {
		left := loads[i] * scale
		for left > 1e-9 {
			l := taskMin + rng.Float64()*(taskMax-taskMin)
			if l > left || left-l < taskMin {
				l = left
			}
			left -= l
			id := int32(len(w.taskLoad))
			w.taskOwner = append(w.taskOwner, int32(i))
			w.taskLoad = append(w.taskLoad, l)
			w.taskID = append(w.taskID, strconv.Itoa(int(id)))
			w.own[i] = append(w.own[i], id)
		}
		sort.SliceStable(w.own[i], func(a, b int) bool { return w.taskLoad[w.own[i][a]] > w.taskLoad[w.own[i][b]] })
	}
	// Contract graph: each org's Contracts stubs, shuffled and paired;
	// self-pairs and duplicates are dropped, so a few orgs end with one
	// or two contracts fewer.
	stubs := make([]int32, 0, n*cfg.Contracts)
	for i := range n {
		for range cfg.Contracts {
			stubs = append(stubs, int32(i))
		}
	}
	rng.Shuffle(len(stubs), func(i, j int) { stubs[i], stubs[j] = stubs[j], stubs[i] })
	seen := map[[2]int32]bool{}
	for k := 0; k+1 < len(stubs); k += 2 {
		a, b := stubs[k], stubs[k+1]
		if a > b {
			a, b = b, a
		}
		if a == b || seen[[2]int32{a, b}] {
			continue
		}
		seen[[2]int32{a, b}] = true
		ci := int32(len(w.contracts))
		ml := cfg.MaxLoadShare * math.Min(w.capa[a], w.capa[b])
		w.contracts = append(w.contracts, contract{a: a, b: b, maxLoad: ml, id: "c" + strconv.Itoa(int(ci))})
		w.adj[a] = append(w.adj[a], ci)
		w.adj[b] = append(w.adj[b], ci)
	}
	return w
}

func (w *world) ownLoad(i int) float64 {
	s := 0.0
	for _, t := range w.own[i] {
		s += w.taskLoad[t]
	}
	return s
}

func (w *world) acceptable(load []float64) (bool, float64) {
	ok, over := true, 0
	for i := range w.n {
		t := w.capa[i]
		if load[i] > t+1e-9 {
			over++
			if !w.overall {
				ok = false
			}
		} else if w.overall && load[i] < t-1e-9 {
			ok = false
		}
	}
	return ok, float64(over) / float64(w.n)
}

func (w *world) none() runStats {
	load := make([]float64, w.n)
	for i := range w.n {
		load[i] = w.ownLoad(i)
	}
	ok, over := w.acceptable(load)
	acc := -1
	if ok {
		acc = 0
	}
	return runStats{acceptable: ok, accRounds: acc, overCapShar: over}
}

// optimal is the central planner's bound. Load is treated as divisible
// and moved in one round along contract edges, each direction carrying at
// most the contract's max load; an org may pass on load it received by
// sending its own. Whether every org can end at or under capacity is then
// a max-flow question: a source feeds each overloaded org its excess, each
// underloaded org drains its headroom to a sink, and contract edges carry
// the moves; an acceptable allocation exists exactly when the flow
// saturates every excess. Whole tasks and the limit that an org cannot
// send more than its own load only make the real problem harder, so the
// share of runs this finds acceptable is an upper bound for any mechanism
// on the same graph. When the total load is over capacity the question is
// the mirror one (every deficit filled from excess).
func (w *world) optimal() runStats {
	s, t := w.n, w.n+1
	g := newFlowNet(w.n + 2)
	var need float64
	for i := range w.n {
		d := w.ownLoad(i) - w.capa[i]
		if d > 0 {
			g.addEdge(s, i, d)
			if !w.overall {
				need += d
			}
		} else if d < 0 {
			g.addEdge(i, t, -d)
			if w.overall {
				need -= d
			}
		}
	}
	type arc struct{ from, idx int }
	var arcs []arc
	for _, c := range w.contracts {
		arcs = append(arcs, arc{int(c.a), g.addEdge(int(c.a), int(c.b), c.maxLoad)}, arc{int(c.b), g.addEdge(int(c.b), int(c.a), c.maxLoad)})
	}
	got := g.maxFlow(s, t)
	ok := got >= need-1e-6
	// Moves: each org's net outflow realised with its largest tasks
	// first, an estimate of the fewest task moves the plan needs.
	out := make([]float64, w.n)
	final := make([]float64, w.n)
	for i := range w.n {
		final[i] = w.ownLoad(i)
	}
	for k, a := range arcs {
		f := g.flow(a.idx)
		out[a.from] += f
		c := w.contracts[k/2]
		to := c.b
		if int(c.b) == a.from {
			to = c.a
		}
		final[a.from] -= f
		final[to] += f
	}
	moves := 0
	for i := range w.n {
		left := out[i]
		for _, task := range w.own[i] {
			if left <= 1e-9 {
				break
			}
			left -= w.taskLoad[task]
			moves++
		}
	}
	rs := runStats{acceptable: ok, accRounds: -1, moves: moves}
	if ok {
		rs.rounds = 1
		rs.accRounds = 1
		if need <= 1e-9 {
			rs.rounds, rs.accRounds = 0, 0
		}
	}
	_, rs.overCapShar = w.acceptable(final)
	return rs
}

// market runs the decision rules of federation/mpa with contracts priced
// [pmin, pmax] (equal bounds: fixed price).
func (w *world) market(cfg Config, pmin, pmax float64, pol mpa.Policy, run uint64) runStats {
	m := newMarket(w, pmin, pmax, pol, rand.New(rand.NewPCG(cfg.Seed^0x9e3779b97f4a7c15, run)))
	m.noCeiling = cfg.NoCeiling
	rs := runStats{accRounds: -1}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if ok, _ := w.acceptable(m.load); ok {
		rs.accRounds = 0
	}
	for r := 1; r <= cfg.MaxRounds; r++ {
		now = now.Add(period)
		moved := m.round(now)
		rs.moves += moved
		ok, _ := w.acceptable(m.load)
		switch {
		case ok && rs.accRounds < 0:
			rs.accRounds = r
		case !ok:
			rs.accRounds = -1
		}
		if moved == 0 {
			break
		}
		rs.rounds = r
	}
	ok, over := w.acceptable(m.load)
	rs.acceptable = ok && rs.accRounds >= 0 && rs.accRounds <= cfg.Within
	rs.overCapShar = over
	if cfg.NoisePeriods > 0 {
		noisy := 0
		for range cfg.NoisePeriods {
			now = now.Add(period)
			for o := range w.n {
				m.factor[o] = 1 + cfg.Noise*(2*m.rng.Float64()-1)
				m.smooth[o].Add(m.factor[o])
			}
			m.recompute()
			noisy += m.round(now)
		}
		rs.noiseMoves = float64(noisy) / float64(w.n*cfg.NoisePeriods)
	}
	return rs
}

// market is the state of one strategy's run.
type market struct {
	w         *world
	cost      []mpa.Cost // per org: the base cost with the policy's overload step
	terms     []mpa.Terms
	pol       mpa.Policy
	rng       *rand.Rand
	host      []int32   // per task: the org running it
	via       []int32   // per task away from home: its contract, else -1
	movedAt   []float64 // per task away: the load accounted to the contract
	notice    []mpa.Homecoming
	hosted    [][2]float64 // per contract: a's load at b, b's load at a
	factor    []float64    // per owner: true load factor this period
	smooth    []mpa.Smoother
	load      []float64 // per org: true load
	meas      []float64 // per org: smoothed measured load
	minOffer  float64   // the lowest MC at which any contract can pay a move
	noCeiling bool
	scratch   []mpa.Task
}

func newMarket(w *world, pmin, pmax float64, pol mpa.Policy, rng *rand.Rand) *market {
	nt := len(w.taskLoad)
	m := &market{w: w, pol: pol, rng: rng, host: make([]int32, nt), via: make([]int32, nt), movedAt: make([]float64, nt),
		notice: make([]mpa.Homecoming, nt), hosted: make([][2]float64, len(w.contracts)),
		factor: make([]float64, w.n), smooth: make([]mpa.Smoother, w.n), load: make([]float64, w.n), meas: make([]float64, w.n),
		minOffer: pmin + pol.MigrationCost}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range w.contracts {
		m.terms = append(m.terms, mpa.Terms{ID: c.id, Proposer: w.name[c.a], Partner: w.name[c.b], PriceMin: pmin, PriceMax: pmax,
			MaxLoad: c.maxLoad, Direction: mpa.DirBoth, NotBefore: start, NotAfter: start.Add(365 * 24 * time.Hour), Notice: notice})
	}
	for t := range nt {
		m.host[t] = w.taskOwner[t]
		m.via[t] = -1
	}
	m.cost = make([]mpa.Cost, w.n)
	for o := range w.n {
		m.cost[o] = pol.Cost(w.cost[o])
		m.factor[o] = 1
		m.smooth[o] = mpa.Smoother{Alpha: pol.Smoothing}
		m.smooth[o].Add(1)
	}
	m.recompute()
	return m
}

func (m *market) trueLoad(t int32) float64 { return m.w.taskLoad[t] * m.factor[m.w.taskOwner[t]] }
func (m *market) measLoad(t int32) float64 {
	return m.w.taskLoad[t] * m.smooth[m.w.taskOwner[t]].Value()
}

func (m *market) recompute() {
	clear(m.load)
	clear(m.meas)
	for t := range m.host {
		h := m.host[t]
		m.load[h] += m.trueLoad(int32(t))
		m.meas[h] += m.measLoad(int32(t))
	}
}

// move puts task t at org to (home when to is its owner).
func (m *market) move(t int32, to int32, via int32, accounted float64) {
	from := m.host[t]
	m.load[from] -= m.trueLoad(t)
	m.meas[from] -= m.measLoad(t)
	m.load[to] += m.trueLoad(t)
	m.meas[to] += m.measLoad(t)
	m.host[t] = to
	m.via[t] = via
	m.movedAt[t] = accounted
	m.notice[t] = mpa.Homecoming{}
}

// side is the index into hosted for owner's load under contract c.
func (m *market) side(c int32, owner int32) int {
	if m.w.contracts[c].a == owner {
		return 0
	}
	return 1
}

// round is one load period: every org, in random order, first takes home
// what it may, then offers to its partners, cheapest first.
func (m *market) round(now time.Time) int {
	moves := 0
	for _, i := range m.rng.Perm(m.w.n) {
		moves += m.returns(int32(i), now)
		moves += m.offers(int32(i), now)
	}
	return moves
}

func (m *market) returns(i int32, now time.Time) int {
	moves := 0
	for _, t := range m.w.own[i] {
		if m.host[t] == i {
			continue
		}
		c := m.via[t]
		task := mpa.Task{ID: m.w.taskID[t], Load: m.measLoad(t)}
		wants := mpa.WantsBack(m.cost[i], m.meas[i], task, m.terms[c], m.pol.ReturnMargin)
		if m.notice[t].Step(wants, now, m.terms[c].Notice) {
			m.hosted[c][m.side(c, i)] -= m.movedAt[t]
			m.move(t, i, -1, 0)
			moves++
		}
	}
	return moves
}

func (m *market) offers(i int32, now time.Time) int {
	cost := m.cost[i]
	if cost.Marginal(m.meas[i]) <= m.minOffer {
		return 0
	}
	cs := slices.Clone(m.w.adj[i])
	partner := func(c int32) int32 {
		if m.w.contracts[c].a == i {
			return m.w.contracts[c].b
		}
		return m.w.contracts[c].a
	}
	mc := func(j int32) float64 { return m.cost[j].Marginal(m.meas[j]) }
	sort.Slice(cs, func(a, b int) bool { return mc(partner(cs[a])) < mc(partner(cs[b])) })
	moves := 0
	for _, c := range cs {
		if cost.Marginal(m.meas[i]) <= m.minOffer {
			break
		}
		j := partner(c)
		m.scratch = m.scratch[:0]
		for _, t := range m.w.own[i] {
			if m.host[t] == i {
				m.scratch = append(m.scratch, mpa.Task{ID: m.w.taskID[t], Load: m.measLoad(t)})
			}
		}
		side := m.side(c, i)
		// The quote: the partner's marginal cost, and how much it would
		// take at the price that settles from it.
		hostMC := mc(j)
		price, ok := mpa.SettlePrice(cost.Marginal(m.meas[i]), hostMC, m.pol.MigrationCost, m.terms[c].PriceMin, m.terms[c].PriceMax)
		if !ok {
			continue
		}
		room := mpa.Room(m.cost[j], m.meas[j], price)
		off, err := mpa.PlanOffer(mpa.OfferInput{Owner: m.w.name[i], Host: m.w.name[j], Terms: m.terms[c], Cost: cost, Load: m.meas[i],
			HostMarginal: hostMC, HostRoom: room, Hosted: m.hosted[c][side], Tasks: m.scratch, MigrationCost: m.pol.MigrationCost, Now: now})
		if err != nil {
			continue
		}
		took, err := mpa.Accept(mpa.AcceptInput{Host: m.w.name[j], Terms: m.terms[c], Cost: m.cost[j], Load: m.meas[j],
			Hosted: m.hosted[c][side], Offer: off, Now: now, Ceiling: m.ceiling(j, c)})
		if err != nil {
			continue
		}
		for _, task := range took {
			id, _ := strconv.Atoi(task.ID)
			m.hosted[c][side] += task.Load
			m.move(int32(id), j, c, task.Load)
			moves++
		}
	}
	return moves
}

// ceiling is org j's accept ceiling for an offer under contract c: its
// capacity plus its own tasks at home, as far as its other contracts have
// room for them (mpa.AcceptCeiling). Off when Config.NoCeiling.
func (m *market) ceiling(j, c int32) float64 {
	if m.noCeiling {
		return 0
	}
	own := 0.0
	for _, t := range m.w.own[j] {
		if m.host[t] == j {
			own += m.measLoad(t)
		}
	}
	room := 0.0
	for _, k := range m.w.adj[j] {
		if k != c {
			room += math.Max(0, m.w.contracts[k].maxLoad-m.hosted[k][m.side(k, j)])
		}
	}
	return mpa.AcceptCeiling(m.w.capa[j], own, room)
}
