package fsm

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
)

// Live reconfiguration (issue 13).
//
// A reconfiguration plan gives new definitions (versions) to some operators
// of a running query. Plans are numbered by epoch, 1, 2, 3, ...: the
// configuration of epoch e is the query as submitted with plans 1..e
// applied, and a tuple tagged e is processed by exactly the versions of
// configuration e. A plan goes through three phases, each a deterministic
// effect of task reports (UpdateTaskStates), never a second command that
// could race:
//
//   - loading: every task loads the plan's versions beside the ones it
//     runs and acknowledges (Task.ReconfigAcked). Nothing switches yet.
//   - switched: once every task of the query acknowledged (and the plan
//     before it switched), Cut is set above every stream time any task has
//     reported (plus the plan's margin). Sources tag what they produce at
//     or above Cut with the epoch and mark each output stream; every task
//     forwards the marker once it has it from every upstream instance.
//   - complete: once every task has the markers from all its upstream
//     instances (Task.ReconfigLevel), no tuple of an older epoch exists
//     any more: older versions are removed everywhere. A task that is
//     disconnected (unplaced, or its worker not ready) reports nothing, so
//     it holds the plan open until it is back.
//
// Several plans may be under way at once (v1, v2 and v3 coexisting); they
// switch in epoch order, each at a later cut.

// Reconfiguration phases.
const (
	ReconfigLoading  = "loading"
	ReconfigSwitched = "switched"
	ReconfigComplete = "complete"
)

// Reconfiguration strategies (ReconfigPlan.Strategy).
const (
	// StrategyLive: versions side by side, nothing stops.
	StrategyLive = "live"
	// StrategyQuiescent is the comparison baseline: generator sources hold
	// at the plan's cut (after emitting their marker) until the plan is
	// complete, so the stream drains before the versions swap, then
	// resume. Nothing else differs: the phases advance by the same rules.
	StrategyQuiescent = "quiescent"
)

// Version tracking modes of a query (QueryReconfig.Tracking).
const (
	// TrackingStatic: a tuple keeps the epoch of the configuration its
	// source produced it under all the way to the sink.
	TrackingStatic = "static"
	// TrackingDynamic: a task clears the tag (0) of what it sends when no
	// operator downstream of it has more than one active version, so only
	// versions a downstream still depends on are tracked.
	TrackingDynamic = "dynamic"
)

// DefaultSwitchMargin is how far (stream time, ns) above the highest
// reported frontier the sources switch. A source that acknowledged a
// plan with frontier F holds before F plus the margin until it learns
// the cut (worker/runtime holdForCut), so that no source replica passes
// a cut it does not know; a plan that switches within the margin holds
// nothing.
const DefaultSwitchMargin = int64(2e9)

// QueryReconfig is the reconfiguration state of a query, kept in its
// record (Query.Reconfig) so snapshots and assignment views carry it.
type QueryReconfig struct {
	Tracking string         `json:"tracking,omitempty"`
	Plans    []ReconfigPlan `json:"plans,omitempty"`
}

// ReconfigPlan is one reconfiguration plan: the epoch it starts.
type ReconfigPlan struct {
	Epoch uint64 `json:"epoch"`
	// Strategy is StrategyLive or StrategyQuiescent.
	Strategy string           `json:"strategy,omitempty"`
	Changes  []OperatorChange `json:"changes"`
	// SpecJSON is the canonical query spec of this epoch's configuration.
	SpecJSON     []byte `json:"spec_json,omitempty"`
	Phase        string `json:"phase"`
	SwitchMargin int64  `json:"switch_margin,omitempty"`
	// Cut is the stream time from which sources produce under this
	// epoch (set on switching).
	Cut         int64 `json:"cut,omitempty"`
	CommittedAt int64 `json:"committed_at,omitempty"`
	// SwitchIndex and CompleteIndex are the log indexes of the reports
	// that switched and completed the plan.
	SwitchIndex   uint64 `json:"switch_index,omitempty"`
	CompleteIndex uint64 `json:"complete_index,omitempty"`
}

// OperatorChange is a new version of one operator.
type OperatorChange struct {
	Operator string `json:"operator"`
	Version  int    `json:"version"`
	// SpecJSON is the operator's new definition (queryspec.Operator JSON).
	SpecJSON []byte `json:"spec_json"`
}

// ReconfigMarkers is a task's marker count for one epoch whose markers it
// has not all received yet.
type ReconfigMarkers struct {
	Epoch    uint64 `json:"epoch"`
	Seen     int    `json:"seen"`
	Expected int    `json:"expected"`
}

// VersionOf returns the version operator op has in the configuration of
// epoch e (1 for an operator no plan up to e changed).
func (rc *QueryReconfig) VersionOf(op string, e uint64) int {
	v := 1
	if rc == nil {
		return v
	}
	for _, p := range rc.Plans {
		if p.Epoch > e {
			break
		}
		for _, c := range p.Changes {
			if c.Operator == op {
				v = c.Version
			}
		}
	}
	return v
}

// Latest is the newest epoch (0 with no plan).
func (rc *QueryReconfig) Latest() uint64 {
	if rc == nil || len(rc.Plans) == 0 {
		return 0
	}
	return rc.Plans[len(rc.Plans)-1].Epoch
}

// Completed is the newest epoch whose plan is complete (0 if none): no
// tuple of an older epoch exists any more.
func (rc *QueryReconfig) Completed() uint64 {
	var done uint64
	if rc == nil {
		return 0
	}
	for _, p := range rc.Plans {
		if p.Phase != ReconfigComplete {
			break
		}
		done = p.Epoch
	}
	return done
}

// ActiveVersions are the versions of op some tuple may still need: those
// of the configurations from the newest complete epoch to the latest.
func (rc *QueryReconfig) ActiveVersions(op string) []int {
	var out []int
	for e := rc.Completed(); e <= rc.Latest(); e++ {
		if v := rc.VersionOf(op, e); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// ReconfigureQueryRequest commits a reconfiguration plan for a running
// query. Plan.Epoch must be one more than the query's latest epoch and
// each change's Version one more than the operator's version in that
// epoch (so a plan computed against a stale view is refused, and a retry
// under the same idempotency key applies once). ErrQueryNotFound if the
// query does not exist or is stopped. Value: the plan's epoch (uint64).
type ReconfigureQueryRequest struct {
	Query          string       `json:"query"`
	Plan           ReconfigPlan `json:"plan"`
	Tracking       string       `json:"tracking,omitempty"`
	IdempotencyKey string       `json:"idempotency_key,omitempty"`
	At             int64        `json:"at,omitempty"`
}

func (r *ReconfigureQueryRequest) idempotencyKey() string { return r.IdempotencyKey }

func (r *ReconfigureQueryRequest) decodeResult(raw []byte) (any, error) {
	var e uint64
	err := json.Unmarshal(raw, &e)
	return e, err
}

func (r *ReconfigureQueryRequest) apply(tx *writeTx) (any, error) {
	q, err := txFirst[Query](tx, TableQueries, r.Query)
	if err != nil {
		return nil, err
	}
	if q == nil || q.Status != QueryStatusRunning {
		return nil, fmt.Errorf("%w: %q (not running)", ErrQueryNotFound, r.Query)
	}
	switch r.Tracking {
	case "", TrackingStatic, TrackingDynamic:
	default:
		return nil, invalid("reconfigure %q: tracking %q is not %q or %q", r.Query, r.Tracking, TrackingStatic, TrackingDynamic)
	}
	p := r.Plan
	var rc QueryReconfig
	if q.Reconfig != nil {
		rc = *q.Reconfig
		rc.Plans = slices.Clone(rc.Plans)
	}
	if want := rc.Latest() + 1; p.Epoch != want {
		return nil, invalid("reconfigure %q: plan epoch %d, the next epoch is %d (another plan committed first?)", r.Query, p.Epoch, want)
	}
	if len(p.Changes) == 0 {
		return nil, invalid("reconfigure %q: the plan changes no operator", r.Query)
	}
	seen := map[string]bool{}
	for _, c := range p.Changes {
		if c.Operator == "" || seen[c.Operator] {
			return nil, invalid("reconfigure %q: operator %q is empty or changed twice", r.Query, c.Operator)
		}
		seen[c.Operator] = true
		if want := rc.VersionOf(c.Operator, p.Epoch-1) + 1; c.Version != want {
			return nil, invalid("reconfigure %q: operator %q version %d, want %d", r.Query, c.Operator, c.Version, want)
		}
	}
	if p.SwitchMargin <= 0 {
		p.SwitchMargin = DefaultSwitchMargin
	}
	if p.Strategy == "" {
		p.Strategy = StrategyLive
	}
	p.Phase, p.Cut, p.CommittedAt, p.SwitchIndex, p.CompleteIndex = ReconfigLoading, 0, r.At, 0, 0
	rc.Plans = append(rc.Plans, p)
	if r.Tracking != "" {
		rc.Tracking = r.Tracking
	}
	if rc.Tracking == "" {
		rc.Tracking = TrackingStatic
	}
	updated := *q
	updated.Reconfig = &rc
	updated.ModifyIndex = tx.index
	if err := tx.insert(TableQueries, &updated); err != nil {
		return nil, err
	}
	// Tasks already acknowledging (none yet) cannot switch it; a query
	// without tasks would never report: advance now.
	if _, err := tx.advanceReconfig(r.Query); err != nil {
		return nil, err
	}
	hosts := stringSet{}
	if err := tx.addHosts(stringSet{r.Query: {}}, hosts); err != nil {
		return nil, err
	}
	return p.Epoch, tx.bumpAssignIndex(hosts)
}

// ReconfigSwitch is where a source's stream switched to epoch Epoch:
// from stream time At on, it produces under Epoch's configuration (its
// first record or boundary of that epoch; a marker at At for an idle
// source, which switches before its stream time reaches the cut). A copy
// that replays the source's stream tags it by At rather than by the cut,
// so it produces what the earlier copy produced.
type ReconfigSwitch struct {
	Epoch uint64 `json:"epoch"`
	At    int64  `json:"at"`
}

// ReconfigKept is what the copies of a task reported of their stream
// against the plans, kept across copies (Task.ReconfigKept).
type ReconfigKept struct {
	// Frontier is the highest frontier any copy acknowledged a plan
	// with: the cut of a plan goes above it, so it goes above everything
	// a copy emitted under the old epoch even when that copy is gone (its
	// worker lost) or no longer counts (the old copy of a live move), and
	// a new copy holds at the floor it gives (a source copy holds below
	// the lowest cut a plan can get until it learns the cut).
	Frontier int64 `json:"frontier,omitempty"`
	// Switches are a source's switch points, the first reported for each
	// epoch, the newest maxKeptSwitches epochs.
	Switches []ReconfigSwitch `json:"switches,omitempty"`
}

// maxKeptSwitches bounds ReconfigKept.Switches: an epoch that old is
// complete, and a copy starts at the level of the newest complete plan.
const maxKeptSwitches = 8

// keepReconfig merges a copy's report into t.ReconfigKept (t is the
// updated copy of a task, not yet inserted); it reports whether anything
// changed.
func (t *Task) keepReconfig(frontier int64, switches []ReconfigSwitch) bool {
	k, changed := t.ReconfigKept.Merge(frontier, switches)
	t.ReconfigKept = k
	return changed
}

// Merge returns k (nil: nothing kept yet) with a copy's report merged
// in, and whether that changed anything (k itself is never modified:
// state records are shared). The frontier only rises; a switch point
// once kept stays (the copies that follow replay it).
func (k *ReconfigKept) Merge(frontier int64, switches []ReconfigSwitch) (*ReconfigKept, bool) {
	out := ReconfigKept{}
	if k != nil {
		out = ReconfigKept{Frontier: k.Frontier, Switches: slices.Clone(k.Switches)}
	}
	changed := false
	if frontier > out.Frontier {
		out.Frontier, changed = frontier, true
	}
	for _, sw := range switches {
		if sw.Epoch == 0 || slices.ContainsFunc(out.Switches, func(o ReconfigSwitch) bool { return o.Epoch == sw.Epoch }) {
			continue
		}
		out.Switches, changed = append(out.Switches, sw), true
	}
	if !changed {
		return k, false
	}
	slices.SortFunc(out.Switches, func(a, b ReconfigSwitch) int { return cmp.Compare(a.Epoch, b.Epoch) })
	if n := len(out.Switches); n > maxKeptSwitches {
		out.Switches = out.Switches[n-maxKeptSwitches:]
	}
	return &out, true
}

// resetReconfig forgets the reconfiguration progress a task's previous
// copy reported: a new copy (another generation) reports its own. Keeping
// the old copy's level could complete a plan (and remove old versions
// everywhere) while the new copy still replays tuples of an older epoch
// from its upstreams' buffers. ReconfigKept stays: it is about the
// task's stream, which the new copy goes on with.
func (t *Task) resetReconfig() {
	t.ReconfigAcked, t.ReconfigLevel, t.ReconfigFrontier, t.ReconfigMarkers = 0, 0, 0, nil
}

// advanceReconfig moves the query's plans to their next phase where every
// task's reports allow it, and tells the query's workers (assignment
// views) when something changed. changed reports whether it did.
func (tx *writeTx) advanceReconfig(query string) (changed bool, err error) {
	q, err := txFirst[Query](tx, TableQueries, query)
	if err != nil || q == nil || q.Reconfig == nil || q.Reconfig.Completed() == q.Reconfig.Latest() {
		return false, err
	}
	tasks, err := txList[Task](tx, TableTasks, indexQuery, query)
	if err != nil {
		return false, err
	}
	rc := *q.Reconfig
	rc.Plans = slices.Clone(rc.Plans)
	frontier := int64(math.MinInt64)
	for _, t := range tasks {
		frontier = max(frontier, t.ReconfigFrontier)
		if t.ReconfigKept != nil {
			frontier = max(frontier, t.ReconfigKept.Frontier)
		}
	}
	prevPhase, prevCut := ReconfigComplete, int64(math.MinInt64)
	for i := range rc.Plans {
		p := &rc.Plans[i]
		switch p.Phase {
		case ReconfigLoading:
			if prevPhase == ReconfigLoading || len(tasks) == 0 {
				break
			}
			all := true
			for _, t := range tasks {
				all = all && t.WorkerID != "" && t.ReconfigAcked >= p.Epoch
			}
			if !all {
				break
			}
			cut := frontier
			if cut < math.MaxInt64-p.SwitchMargin {
				cut += p.SwitchMargin
			}
			if prevCut != math.MinInt64 {
				cut = max(cut, prevCut+1)
			}
			p.Phase, p.Cut, p.SwitchIndex = ReconfigSwitched, cut, tx.index
			changed = true
		case ReconfigSwitched:
			all := true
			for _, t := range tasks {
				all = all && t.WorkerID != "" && t.ReconfigLevel >= p.Epoch
			}
			if all && prevPhase == ReconfigComplete {
				p.Phase, p.CompleteIndex = ReconfigComplete, tx.index
				changed = true
			}
		}
		prevPhase = p.Phase
		if p.Cut != 0 {
			prevCut = p.Cut
		}
	}
	if !changed {
		return false, nil
	}
	updated := *q
	updated.Reconfig = &rc
	updated.ModifyIndex = tx.index
	if err := tx.insert(TableQueries, &updated); err != nil {
		return false, err
	}
	hosts := stringSet{}
	if err := tx.addHosts(stringSet{query: {}}, hosts); err != nil {
		return false, err
	}
	return true, tx.bumpAssignIndex(hosts)
}
