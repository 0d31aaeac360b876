// Package loadmgr is the bounded-price load manager an org leader runs:
// every load period it measures the org's load against its capacity,
// offers movable tasks to contract partners when its marginal cost
// exceeds a contract's price plus the migration cost, answers partners'
// quotes and offers with its own marginal cost, brings moved tasks home
// when its marginal cost falls below the contract's lowest price (after
// the contract's notice period), settles what it owes, and accepts
// proposals its auto-accept policy covers. The decisions are those of
// federation/mpa; every move, return and settlement is co-signed with the
// partner (federation.Org.CoSign) and so lands in both orgs' Raft-backed
// ledgers.
//
// The manager moves nothing itself: a Mover does (the coordinator's
// cross-org live task move). Load only ever goes to an org holding an
// active contract with this one, in a direction it allows.
package loadmgr

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/federation/mpa"
)

// ErrConfig is returned for unusable load manager settings.
var ErrConfig = errors.New("invalid load manager setting")

// ErrNotMeasured: the org has not measured its load yet (no load period
// has run on this leader, or it has no workers), so it cannot quote.
var ErrNotMeasured = errors.New("load not measured yet")

// Mover moves tasks between orgs. The coordinator's Server implements it
// (the cross-org live task move); tests use a fake.
type Mover interface {
	// MigrateTaskOut moves a task of this org to partnerOrg under
	// contractID; it returns once the partner runs it, or an error after
	// rolling the move back (the task then still runs at home).
	MigrateTaskOut(ctx context.Context, taskID, partnerOrg, contractID string) error
	// ReturnTaskHome brings a task back from the partner running it.
	ReturnTaskHome(ctx context.Context, taskID string) error
	// TasksAtPartners maps each of this org's tasks running at a partner
	// to that partner.
	TasksAtPartners() map[string]string
}

// TaskLoad is one task running on the org's workers with its measured
// load (CPU seconds per second).
type TaskLoad struct {
	ID    string
	Class string
	Load  float64
}

// Sample is one measurement of the org: every task running on its
// workers (partners' tasks it hosts included) and its workers' cores.
type Sample struct {
	Tasks []TaskLoad
	Cores float64
}

// Sampler measures the org.
type Sampler func() Sample

// AutoAccept is the policy under which the manager accepts partners'
// contract proposals without an operator. A proposal is accepted when it
// comes from a listed org and its terms stay within every bound set.
type AutoAccept struct {
	// From lists the orgs whose proposals may be accepted; empty accepts
	// none.
	From []string
	// PriceMinAtLeast: where this org may host the proposer's tasks, the
	// contract's p_min must be at least this.
	PriceMinAtLeast float64
	// PriceMaxAtMost: where this org's tasks may run at the proposer, the
	// contract's p_max must be at most this (0: any).
	PriceMaxAtMost float64
	// MaxLoadAtMost bounds the contract's max load (0: any).
	MaxLoadAtMost float64
	// MaxValidity bounds how long the contract runs from now (0: any).
	MaxValidity time.Duration
}

// Covers reports whether the policy accepts terms proposed to org at now,
// and if not, why.
func (a AutoAccept) Covers(org string, t federation.Terms, now time.Time) (bool, string) {
	if !slices.Contains(a.From, t.Proposer) {
		return false, fmt.Sprintf("%s is not listed in the auto-accept policy", t.Proposer)
	}
	m := t.MPA()
	if m.Allows(t.Proposer, org) && t.PriceMin < a.PriceMinAtLeast {
		return false, fmt.Sprintf("p_min %g is below the policy's %g", t.PriceMin, a.PriceMinAtLeast)
	}
	if m.Allows(org, t.Proposer) && a.PriceMaxAtMost > 0 && t.PriceMax > a.PriceMaxAtMost {
		return false, fmt.Sprintf("p_max %g is above the policy's %g", t.PriceMax, a.PriceMaxAtMost)
	}
	if a.MaxLoadAtMost > 0 && t.MaxLoad > a.MaxLoadAtMost {
		return false, fmt.Sprintf("max load %g is above the policy's %g", t.MaxLoad, a.MaxLoadAtMost)
	}
	if a.MaxValidity > 0 && t.NotAfter.Sub(now) > a.MaxValidity {
		return false, fmt.Sprintf("validity until %s is longer than the policy's %s", t.NotAfter.Format(time.RFC3339), a.MaxValidity)
	}
	return true, ""
}

// Config tunes the manager. Zero values take the defaults.
type Config struct {
	// Utilisation is the target utilisation U: capacity T is the workers'
	// cores times U (default mpa.DefaultUtilisation).
	Utilisation float64
	// Cores, when positive, replaces the ready workers' cores in the
	// capacity: an org that lends fedstream only part of its machines
	// (and `fedstream dev`, which makes one org small so that its demo
	// load exceeds its capacity).
	Cores float64
	// Cost names the cost function of load; "mm1" (the default) is the
	// only one (mpa.MM1).
	Cost string
	// Period is the load period (default 5s).
	Period time.Duration
	// SettleEvery is how often the org settles what it owes for its tasks
	// at partners (default 1m).
	SettleEvery time.Duration
	// Policy holds the migration cost, the return margin and the
	// smoothing weight (default mpa.SuggestedPolicy(Utilisation)).
	Policy *mpa.Policy
	// Reserve is how long a partner keeps room for tasks it accepted
	// before their move is recorded (default 3 periods).
	Reserve time.Duration
	// MoveTimeout bounds one task move or return (default 1m).
	MoveTimeout time.Duration
	AutoAccept  AutoAccept
}

// Defaults fills the zero values and checks the rest.
func (c Config) Defaults() (Config, error) {
	if c.Utilisation == 0 {
		c.Utilisation = mpa.DefaultUtilisation
	}
	if !(c.Utilisation > 0 && c.Utilisation < 1) {
		return c, fmt.Errorf("%w: target utilisation %v must be in (0, 1)", ErrConfig, c.Utilisation)
	}
	if c.Cost == "" {
		c.Cost = "mm1"
	}
	if c.Cost != "mm1" {
		return c, fmt.Errorf("%w: cost function %q: the one available is mm1", ErrConfig, c.Cost)
	}
	if c.Period == 0 {
		c.Period = 5 * time.Second
	}
	if c.SettleEvery == 0 {
		c.SettleEvery = time.Minute
	}
	if c.Cores < 0 || math.IsInf(c.Cores, 0) || math.IsNaN(c.Cores) {
		return c, fmt.Errorf("%w: cores %v must be a non-negative number", ErrConfig, c.Cores)
	}
	if c.Period < 0 || c.SettleEvery < 0 || c.Reserve < 0 || c.MoveTimeout < 0 {
		return c, fmt.Errorf("%w: durations must be positive (period %s, settle every %s)", ErrConfig, c.Period, c.SettleEvery)
	}
	if c.Reserve == 0 {
		c.Reserve = 3 * c.Period
	}
	if c.MoveTimeout == 0 {
		c.MoveTimeout = time.Minute
	}
	if c.Policy == nil {
		p := mpa.SuggestedPolicy(c.Utilisation)
		c.Policy = &p
	}
	if p := c.Policy; p.MigrationCost < 0 || p.ReturnMargin < 0 || p.Smoothing < 0 || p.Smoothing > 1 {
		return c, fmt.Errorf("%w: migration cost %v and return margin %v must be non-negative, smoothing %v in [0, 1]", ErrConfig, p.MigrationCost, p.ReturnMargin, p.Smoothing)
	}
	return c, nil
}

// Status is what the manager last measured and decided; `fedstream load`
// shows it.
type Status struct {
	Org string `json:"org"`
	// Measured is the last sample's load, Load the smoothed load the
	// decisions use (both in CPU seconds per second, partners' tasks
	// hosted here included, this org's tasks at partners excluded).
	Measured    float64 `json:"measured"`
	Load        float64 `json:"load"`
	Cores       float64 `json:"cores"`
	Utilisation float64 `json:"utilisation"`
	// Capacity is T = cores x utilisation.
	Capacity     float64 `json:"capacity"`
	MarginalCost float64 `json:"marginal_cost"`
	// Tasks counts the tasks measured on the org's workers.
	Tasks int         `json:"tasks"`
	Out   []Placement `json:"out"`
	In    []Placement `json:"in"`
	// Reserved is load accepted from partners whose move is not recorded
	// yet.
	Reserved float64   `json:"reserved"`
	At       time.Time `json:"at"`
	// Last lists what the last period decided, one line each.
	Last []string `json:"last,omitempty"`
	// Moves, Returns and Settlements count what this leader recorded.
	Moves       int `json:"moves"`
	Returns     int `json:"returns"`
	Settlements int `json:"settlements"`
}

type reservation struct {
	owner, contract string
	load            float64
	until           time.Time
}

// Manager is one org's load manager. It runs on the org's leader.
type Manager struct {
	cfg    Config
	org    *federation.Org
	sample Sampler
	mover  Mover
	log    *slog.Logger

	// step serialises periods; it is never held by the handler.
	step sync.Mutex

	// mu guards what the handler reads and writes. It is never held
	// across a call to a partner or to the Mover: two orgs quoting each
	// other at once must not wait on each other.
	mu         sync.Mutex
	smooth     mpa.Smoother
	measured   bool
	cost       mpa.MM1
	status     Status
	reserved   map[string]reservation // task -> room kept for it
	notices    map[string]*notice
	lastSettle time.Time
	// unrecorded: tasks moved or returned whose ledger record failed;
	// retried every period.
	unrecorded map[string]pendingRecord
}

// notice is the return notice given for one task at a partner.
type notice struct {
	h     mpa.Homecoming
	since time.Time
}

type pendingRecord struct {
	// id is the record's, the same on each retry: a retry whose first
	// attempt the partner recorded records it once (CoSignID).
	id, kind, contract string
	fields             map[string]string
}

// New returns the manager of org. sample measures the org; mover moves
// tasks across orgs.
// The coordinator passes its Server as mover (the cross-org live task
// move).
func New(cfg Config, org *federation.Org, sample Sampler, mover Mover, log *slog.Logger) (*Manager, error) {
	cfg, err := cfg.Defaults()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{cfg: cfg, org: org, sample: sample, mover: mover, log: log.With("component", "loadmgr"),
		smooth: mpa.Smoother{Alpha: cfg.Policy.Smoothing}, reserved: map[string]reservation{},
		notices: map[string]*notice{}, unrecorded: map[string]pendingRecord{}}
	m.status.Org = org.Name()
	m.status.Utilisation = cfg.Utilisation
	return m, nil
}

// Config is the manager's configuration with its defaults.
func (m *Manager) Config() Config { return m.cfg }

// Run steps every load period until ctx ends. Its caller (the leader's
// loop) owns it.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.Step(ctx)
	}
}

// Status returns what the manager last measured and decided.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.status
	s.Out = slices.Clone(s.Out)
	s.In = slices.Clone(s.In)
	s.Last = slices.Clone(s.Last)
	return s
}

// Step runs one load period: measure, accept proposals the policy covers,
// bring tasks home, offer tasks, settle.
func (m *Manager) Step(ctx context.Context) {
	m.step.Lock()
	defer m.step.Unlock()
	now := m.org.Now()
	var last []string
	note := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		last = append(last, line)
		m.log.Debug(line)
	}
	m.autoAccept(ctx, now, note)
	m.retryRecords(ctx, note)
	es, err := m.org.Entries()
	if err != nil {
		m.log.Warn("reading the ledger", "err", err)
		return
	}
	view := readLedger(m.org.Name(), es)
	x, ok := m.measure(view, now)
	if ok {
		x = m.returns(ctx, view, x, now, note)
		m.offers(ctx, view, x, now, note, nil)
	} else {
		note("no workers: capacity 0, nothing offered or quoted")
	}
	if now.Sub(m.lastSettle) >= m.cfg.SettleEvery {
		if view, err = m.view(); err == nil {
			m.settle(ctx, view, now, note)
		}
		m.lastSettle = now
	}
	if view, err := m.view(); err == nil {
		m.mu.Lock()
		m.status.Out, m.status.In = m.placements(view.out), m.placements(view.in)
		m.mu.Unlock()
	}
	m.mu.Lock()
	m.status.Last = last
	m.mu.Unlock()
}

func (m *Manager) view() (ledgerView, error) {
	es, err := m.org.Entries()
	if err != nil {
		return ledgerView{}, err
	}
	return readLedger(m.org.Name(), es), nil
}

// placements lists ps by task, with the end of any notice given; m.mu
// is held.
func (m *Manager) placements(ps map[string]Placement) []Placement {
	out := make([]Placement, 0, len(ps))
	for _, p := range ps {
		if n := m.notices[p.Task]; n != nil && n.h.Pending() {
			p.ReturningAt = n.since
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Placement) int { return cmp.Compare(a.Task, b.Task) })
	return out
}

// measure takes a sample and folds it into the smoothed load. The sample
// is corrected by what the ledger says: this org's tasks recorded at
// partners do not count here even while a stale report still lists them,
// and partners' tasks recorded here count at their recorded load until
// the workers report them.
func (m *Manager) measure(view ledgerView, now time.Time) (float64, bool) {
	s := m.sample()
	if m.cfg.Cores > 0 {
		s.Cores = m.cfg.Cores
	}
	raw, seen := 0.0, map[string]bool{}
	for _, t := range s.Tasks {
		if _, away := view.out[t.ID]; away || seen[t.ID] {
			continue
		}
		seen[t.ID] = true
		raw += t.Load
	}
	unmeasured := 0.0
	for id, p := range view.in {
		if !seen[id] {
			unmeasured += p.Load
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.reserved {
		if _, landed := view.in[id]; landed || now.After(r.until) {
			delete(m.reserved, id)
		}
	}
	x := m.smooth.Add(raw + unmeasured)
	st := &m.status
	st.Measured, st.Load, st.Cores, st.Tasks, st.At = raw+unmeasured, x, s.Cores, len(seen), now
	if !(s.Cores > 0) {
		m.measured = false
		st.Capacity, st.MarginalCost = 0, 0
		return x, false
	}
	m.cost = mpa.MM1{T: s.Cores * m.cfg.Utilisation, U: m.cfg.Utilisation}
	m.measured = true
	st.Capacity, st.MarginalCost = m.cost.T, m.cost.Marginal(x)
	st.Reserved = m.reservedLocked("", "")
	return x, true
}

func (m *Manager) reservedLocked(owner, contract string) float64 {
	sum := 0.0
	for _, r := range m.reserved {
		if (owner == "" || r.owner == owner) && (contract == "" || r.contract == contract) {
			sum += r.load
		}
	}
	return sum
}

// contracts returns the active contracts, by id.
func (m *Manager) contracts() []federation.ContractDoc {
	cs, err := m.org.Contracts()
	if err != nil {
		m.log.Warn("reading contracts", "err", err)
		return nil
	}
	return cs
}

func partnerOf(org string, t federation.Terms) string {
	if t.Proposer == org {
		return t.Partner
	}
	return t.Proposer
}

// autoAccept accepts pending proposals the policy covers.
func (m *Manager) autoAccept(ctx context.Context, now time.Time, note func(string, ...any)) {
	if len(m.cfg.AutoAccept.From) == 0 {
		return
	}
	for _, c := range m.contracts() {
		if c.Status != federation.StatusPending {
			continue
		}
		ok, why := m.cfg.AutoAccept.Covers(m.org.Name(), c.Terms, now)
		if !ok {
			note("contract %s from %s left for an operator: %s", c.Terms.ID, c.Terms.Proposer, why)
			continue
		}
		if _, err := m.org.Accept(ctx, c.Terms.ID); err != nil {
			m.log.Warn("auto-accepting a contract failed", "contract", c.Terms.ID, "from", c.Terms.Proposer, "err", err)
			continue
		}
		m.log.Info("auto-accepted a contract", "contract", c.Terms.ID, "from", c.Terms.Proposer)
		note("auto-accepted contract %s from %s", c.Terms.ID, c.Terms.Proposer)
	}
}

// record co-signs a move or return; on failure it is kept and retried
// every period, so the ledger catches up with a move that happened.
func (m *Manager) record(ctx context.Context, task, kind, contract string, fields map[string]string) error {
	id, err := federation.NewRecordID(kind)
	if err == nil {
		_, err = m.org.CoSignID(ctx, kind, contract, id, fields)
	}
	if err != nil {
		m.unrecorded[kind+"/"+task] = pendingRecord{id: id, kind: kind, contract: contract, fields: fields}
		return err
	}
	return nil
}

func (m *Manager) retryRecords(ctx context.Context, note func(string, ...any)) {
	for k, r := range m.unrecorded {
		if _, err := m.org.CoSignID(ctx, r.kind, r.contract, r.id, r.fields); err != nil {
			note("recording %s still fails: %v", k, err)
			continue
		}
		delete(m.unrecorded, k)
	}
}

// returns brings this org's tasks home when the return rule has held for
// the contract's notice period, or at once when the contract is no longer
// in force. It also records the return of a task the Mover already brought
// home (a partner that died). It returns the load after the returns.
func (m *Manager) returns(ctx context.Context, view ledgerView, x float64, now time.Time, note func(string, ...any)) float64 {
	docs := map[string]federation.ContractDoc{}
	for _, c := range m.contracts() {
		docs[c.Terms.ID] = c
	}
	away := m.mover.TasksAtPartners()
	ps := make([]Placement, 0, len(view.out))
	for _, p := range view.out {
		ps = append(ps, p)
	}
	// The smallest first: with room for only some, small ones fit.
	slices.SortFunc(ps, func(a, b Placement) int { return cmp.Or(cmp.Compare(a.Load, b.Load), cmp.Compare(a.Task, b.Task)) })
	m.mu.Lock()
	cost := m.cost
	m.mu.Unlock()
	for _, p := range ps {
		if _, ok := m.unrecorded[ledger.KindReturn+"/"+p.Task]; ok {
			continue
		}
		doc, ok := docs[p.Contract]
		reason := ""
		switch {
		case away[p.Task] == "":
			reason = "rehomed" // the Mover already runs it at home
		case !ok || doc.Status != federation.StatusActive || !doc.Terms.MPA().InForce(now):
			reason = "contract ended"
		default:
			m.mu.Lock()
			n := m.notices[p.Task]
			if n == nil {
				n = &notice{}
				m.notices[p.Task] = n
			}
			wants := mpa.WantsBack(cost, x, mpa.Task{ID: p.Task, Class: p.Class, Load: p.Load}, doc.Terms.MPA(), m.cfg.Policy.ReturnMargin)
			had := n.h.Pending()
			back := n.h.Step(wants, now, doc.Terms.Notice)
			if wants && !had {
				n.since = now.Add(doc.Terms.Notice)
			}
			m.mu.Unlock()
			if !back {
				if wants && !had {
					note("notice given for %s at %s: back after %s", p.Task, p.Host, doc.Terms.Notice)
				}
				continue
			}
			reason = "marginal cost below the contract's prices"
		}
		if reason != "rehomed" {
			mctx, cancel := context.WithTimeout(ctx, m.cfg.MoveTimeout)
			err := m.mover.ReturnTaskHome(mctx, p.Task)
			cancel()
			if err != nil {
				note("bringing %s home from %s failed: %v", p.Task, p.Host, err)
				continue
			}
		}
		x += p.Load
		m.mu.Lock()
		delete(m.notices, p.Task)
		m.smooth.Shift(p.Load)
		m.status.Returns++
		m.mu.Unlock()
		fields := map[string]string{FieldTask: p.Task, FieldLoad: fmtF(p.Load), FieldReason: reason}
		if err := m.record(ctx, p.Task, ledger.KindReturn, p.Contract, fields); err != nil {
			note("%s came home from %s, recording it failed (retried): %v", p.Task, p.Host, err)
			continue
		}
		m.log.Info("task came home", "task", p.Task, "from", p.Host, "contract", p.Contract, "reason", reason)
		note("%s came home from %s (%s)", p.Task, p.Host, reason)
	}
	m.mu.Lock()
	for t := range m.notices {
		if _, ok := view.out[t]; !ok {
			delete(m.notices, t)
		}
	}
	m.mu.Unlock()
	return x
}

func fmtF(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

type quote struct {
	doc          federation.ContractDoc
	partner      string
	hostMC, room float64
}

// ErrNoOffload: an offload moved nothing (no contract in force allows
// it, the offer rule does not hold at any contract's price, or partners
// refused); the error says which.
var ErrNoOffload = errors.New("nothing offloaded")

// Offloaded is one task an offload moved to a partner.
type Offloaded struct {
	Task, Partner, Contract string
	Price, Load             float64
}

// CanOffload reports whether a contract in force lets this org's tasks
// run at a partner now, and why not.
func (m *Manager) CanOffload() (bool, string) {
	me, now := m.org.Name(), m.org.Now()
	for _, c := range m.contracts() {
		t := c.Terms
		if c.Status == federation.StatusActive && t.MPA().InForce(now) && t.MPA().Allows(me, partnerOf(me, t)) {
			return true, ""
		}
	}
	return false, "no contract in force lets " + me + "'s tasks run at a partner"
}

// Offload runs the offer rule now for the given tasks only (the health
// manager's offload: a fragment the org has no capacity to scale), with
// the same bounded-price decisions, co-signed ledger records and limits
// as a load period: a task moves only to a partner holding an active
// contract in force, when this org's marginal cost exceeds the settled
// price plus the migration cost, within the contract's load bound. Tasks
// with no measured load are not offered. It returns the tasks moved, or
// ErrNoOffload with the reasons.
func (m *Manager) Offload(ctx context.Context, tasks []string) ([]Offloaded, error) {
	m.step.Lock()
	defer m.step.Unlock()
	now := m.org.Now()
	var notes []string
	note := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		notes = append(notes, line)
		m.log.Debug(line)
	}
	view, err := m.view()
	if err != nil {
		return nil, err
	}
	x, ok := m.measure(view, now)
	if !ok {
		return nil, fmt.Errorf("%w: %w (no workers)", ErrNoOffload, ErrNotMeasured)
	}
	only := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		only[t] = true
	}
	moved := m.offers(ctx, view, x, now, note, only)
	if len(moved) == 0 {
		if len(notes) == 0 {
			notes = append(notes, "no contract in force lets "+m.org.Name()+"'s tasks run at a partner")
		}
		return nil, fmt.Errorf("%w: %s", ErrNoOffload, strings.Join(notes, "; "))
	}
	return moved, nil
}

// offers applies the offer rule to every partner, cheapest first, and
// moves what they accept, of the tasks in only when it is not nil.
func (m *Manager) offers(ctx context.Context, view ledgerView, x float64, now time.Time, note func(string, ...any), only map[string]bool) (moved []Offloaded) {
	me := m.org.Name()
	m.mu.Lock()
	cost := m.cost
	m.mu.Unlock()
	ownerMC := cost.Marginal(x)
	mig := m.cfg.Policy.MigrationCost
	// Cheap test first: above the lowest price any contract allows?
	var quotes []quote
	for _, c := range m.contracts() {
		t := c.Terms
		if c.Status != federation.StatusActive || !t.MPA().InForce(now) || !t.MPA().Allows(me, partnerOf(me, t)) {
			continue
		}
		if ownerMC <= t.PriceMin+mig {
			// The offer rule cannot hold at any price of this contract
			// (said only when asked to offload: a calm period says nothing).
			if only != nil {
				note("not offered under %s: marginal cost %.4g is not above the lowest price %.4g plus the migration cost %.4g", t.ID, ownerMC, t.PriceMin, mig)
			}
			continue
		}
		partner := partnerOf(me, t)
		ans, err := m.org.Call(ctx, partner, federation.Message{Kind: federation.MsgQuote,
			Load: &federation.LoadMessage{Contract: t.ID, OwnerMarginal: ownerMC, MigrationCost: mig}})
		if err != nil || ans.Load == nil {
			note("no quote from %s under %s: %v", partner, t.ID, err)
			continue
		}
		quotes = append(quotes, quote{doc: c, partner: partner, hostMC: ans.Load.HostMarginal, room: ans.Load.Room})
	}
	slices.SortFunc(quotes, func(a, b quote) int {
		return cmp.Or(cmp.Compare(a.hostMC, b.hostMC), cmp.Compare(a.doc.Terms.ID, b.doc.Terms.ID))
	})
	away := m.mover.TasksAtPartners()
	tasks := m.movable(view, away)
	if only != nil {
		tasks = slices.DeleteFunc(tasks, func(t mpa.Task) bool { return !only[t.ID] })
		if len(tasks) == 0 {
			note("none of the %d tasks to offload runs here with a measured load", len(only))
		}
	}
	for _, q := range quotes {
		if len(tasks) == 0 {
			break
		}
		t := q.doc.Terms
		off, err := mpa.PlanOffer(mpa.OfferInput{Owner: me, Host: q.partner, Terms: t.MPA(), Cost: cost, Load: x,
			HostMarginal: q.hostMC, HostRoom: q.room, Hosted: hosted(view.out, t.ID), Tasks: tasks, MigrationCost: mig, Now: now})
		if err != nil {
			note("nothing offered to %s under %s: %v", q.partner, t.ID, err)
			continue
		}
		ans, err := m.org.Call(ctx, q.partner, federation.Message{Kind: federation.MsgOffer,
			Load: &federation.LoadMessage{Contract: t.ID, Price: off.Price, Tasks: off.Tasks}})
		if err != nil || ans.Load == nil {
			note("%s refused %d tasks at %.4g under %s: %v", q.partner, len(off.Tasks), off.Price, t.ID, err)
			continue
		}
		for _, task := range ans.Load.Tasks {
			if !slices.ContainsFunc(off.Tasks, func(o mpa.Task) bool { return o.ID == task.ID }) {
				continue // only what was offered
			}
			mctx, cancel := context.WithTimeout(ctx, m.cfg.MoveTimeout)
			err := m.mover.MigrateTaskOut(mctx, task.ID, q.partner, t.ID)
			cancel()
			if err != nil {
				note("moving %s to %s failed (it runs at home): %v", task.ID, q.partner, err)
				continue
			}
			x -= task.Load
			tasks = slices.DeleteFunc(tasks, func(o mpa.Task) bool { return o.ID == task.ID })
			m.mu.Lock()
			m.smooth.Shift(-task.Load)
			m.status.Moves++
			m.mu.Unlock()
			moved = append(moved, Offloaded{Task: task.ID, Partner: q.partner, Contract: t.ID, Price: off.Price, Load: task.Load})
			fields := map[string]string{FieldTask: task.ID, FieldClass: task.Class, FieldLoad: fmtF(task.Load), FieldPrice: fmtF(off.Price)}
			if err := m.record(ctx, task.ID, ledger.KindMove, t.ID, fields); err != nil {
				note("%s moved to %s, recording it failed (retried): %v", task.ID, q.partner, err)
				continue
			}
			m.log.Info("task moved to a partner", "task", task.ID, "to", q.partner, "contract", t.ID, "price", off.Price, "load", task.Load)
			note("%s moved to %s at %.4g (load %.3g)", task.ID, q.partner, off.Price, task.Load)
		}
	}
	return moved
}

// movable lists this org's own tasks running at home, the largest first:
// not partners' tasks it hosts (an org relieves itself by moving its own),
// not tasks already away.
func (m *Manager) movable(view ledgerView, away map[string]string) []mpa.Task {
	s := m.sample()
	var out []mpa.Task
	seen := map[string]bool{}
	for _, t := range s.Tasks {
		_, guest := view.in[t.ID]
		_, out1 := view.out[t.ID]
		if guest || out1 || away[t.ID] != "" || seen[t.ID] || !(t.Load > 0) {
			continue
		}
		seen[t.ID] = true
		out = append(out, mpa.Task{ID: t.ID, Class: t.Class, Load: t.Load})
	}
	slices.SortFunc(out, func(a, b mpa.Task) int { return cmp.Or(cmp.Compare(b.Load, a.Load), cmp.Compare(a.ID, b.ID)) })
	return out
}

// ReceiveLoad answers a partner's quote or offer (federation.LoadHandler).
func (m *Manager) ReceiveLoad(_ context.Context, doc federation.ContractDoc, msg federation.Message) (federation.Message, error) {
	me := m.org.Name()
	refuse := func(err error) (federation.Message, error) {
		return federation.Message{Kind: federation.MsgRefused, From: me, Reason: err.Error()}, nil
	}
	t := doc.Terms
	owner := msg.From
	if err := t.MPA().Validate(); err != nil {
		return refuse(err)
	}
	if !t.MPA().Allows(owner, me) {
		return refuse(fmt.Errorf("%w: contract %s (%s, proposed by %s) does not let %s's tasks run at %s", mpa.ErrOutsideTerms, t.ID, t.Direction, t.Proposer, owner, me))
	}
	es, err := m.org.Entries()
	if err != nil {
		return federation.Message{}, err
	}
	view := readLedger(me, es)
	now := m.org.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.measured {
		return refuse(fmt.Errorf("%w at %s", ErrNotMeasured, me))
	}
	y := m.smooth.Value() + m.reservedLocked("", "")
	hostedHere := hosted(view.in, t.ID) + m.reservedLocked(owner, t.ID)
	switch msg.Kind {
	case federation.MsgQuote:
		hostMC := m.cost.Marginal(y)
		price, _ := mpa.SettlePrice(msg.Load.OwnerMarginal, hostMC, msg.Load.MigrationCost, t.PriceMin, t.PriceMax)
		room := math.Max(0, math.Min(mpa.Room(m.cost, y, price), t.MaxLoad-hostedHere))
		return federation.Message{Kind: federation.MsgOK, From: me, Load: &federation.LoadMessage{Contract: t.ID, HostMarginal: hostMC, Room: room, Price: price}}, nil
	case federation.MsgOffer:
		off := mpa.Offer{Contract: msg.Load.Contract, Owner: owner, Host: me, Price: msg.Load.Price, Tasks: msg.Load.Tasks}
		for _, task := range off.Tasks {
			off.Load += task.Load
		}
		took, err := mpa.Accept(mpa.AcceptInput{Host: me, Terms: t.MPA(), Cost: m.cost, Load: y, Hosted: hostedHere, Offer: off, Now: now})
		if err != nil {
			return refuse(err)
		}
		for _, task := range took {
			m.reserved[task.ID] = reservation{owner: owner, contract: t.ID, load: task.Load, until: now.Add(m.cfg.Reserve)}
		}
		m.status.Reserved = m.reservedLocked("", "")
		return federation.Message{Kind: federation.MsgOK, From: me, Load: &federation.LoadMessage{Contract: t.ID, Price: off.Price, Tasks: took}}, nil
	}
	return refuse(fmt.Errorf("unknown load message %q", msg.Kind))
}

// Expecting reports whether this org accepted task of owner under
// contract in an offer whose move has not been recorded yet: the host side
// of a cross-org move can check with it that the task it is asked to run
// is one its load manager took.
func (m *Manager) Expecting(owner, contract, task string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.reserved[task]
	return ok && r.owner == owner && r.contract == contract && m.org.Now().Before(r.until)
}

// settle co-signs, for every contract under which this org's tasks ran
// at the partner since the last settlement, what it owes: the recorded
// load of each task times the seconds it was away, times the price of its
// move.
func (m *Manager) settle(ctx context.Context, view ledgerView, now time.Time, note func(string, ...any)) {
	me := m.org.Name()
	contracts := map[string]time.Time{} // contract -> start of the period to settle
	for _, p := range view.history {
		if p.Owner != me {
			continue
		}
		from := view.settledTo[p.Contract]
		if from.IsZero() {
			from = p.Since
			if f, ok := contracts[p.Contract]; ok && f.Before(from) {
				from = f
			}
		}
		if !p.Until.IsZero() && !p.Until.After(from) {
			continue // settled already
		}
		contracts[p.Contract] = from
	}
	ids := make([]string, 0, len(contracts))
	for id := range contracts {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		from := contracts[id]
		if !now.After(from) {
			continue
		}
		// One record per contract and period, so a period is settled
		// whole or not at all: its price is the load-weighted average of
		// the moves' prices, which makes amount = load-seconds x price the
		// exact sum over the tasks.
		loadSeconds, amount := 0.0, 0.0
		for price, ls := range accrued(view.history, me, id, from, now) {
			loadSeconds += ls
			amount += ls * price
		}
		if !(loadSeconds > 0) {
			continue
		}
		price := amount / loadSeconds
		fields, err := federation.SettlementFields(loadSeconds, price, from, now)
		if err != nil {
			note("settlement under %s: %v", id, err)
			continue
		}
		// The record id names the period's start: a period retried after
		// a lost answer (the partner recorded it, this org did not, so it
		// settles from the same start again) is the same record, and the
		// partner's copy is recorded instead of a second, overlapping
		// settlement (CoSignID).
		rid := fmt.Sprintf("%s-%s-%s-%d", ledger.KindSettlement, id, m.org.Name(), from.UnixNano())
		if _, err := m.org.CoSignID(ctx, ledger.KindSettlement, id, rid, fields); err != nil {
			note("settlement under %s not co-signed (retried next time): %v", id, err)
			continue
		}
		m.mu.Lock()
		m.status.Settlements++
		m.mu.Unlock()
		m.log.Info("settled with a partner", "contract", id, "load_seconds", loadSeconds, "price", price, "amount", amount)
		note("settled %.4g load-seconds at %.4g under %s", loadSeconds, price, id)
	}
}
