package runtime

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Live reconfiguration in a task (issue 13; fsm.QueryReconfig has the
// protocol).
//
// Every stateless operator of the task's fragment runs as an
// operator.Versioned: the versions of every configuration still in use,
// side by side, chosen per tuple by its tag (the epoch of its
// configuration). Nothing stops, drains or pauses: a plan's versions are
// built when the task learns the plan, installed between two releases
// (or two source records), and acknowledged.
//
// Markers: every BOUNDARY a task sends carries its level (tuple.Version),
// the newest epoch whose markers it has from all its inputs; a source's
// level is the epoch it produces under, which switches at each plan's
// cut. A task's level rises at a release step once every input's marker
// of that epoch was released (merger.levelAt): no tuple of an older epoch
// can arrive any more, so the versions only older epochs used are
// removed. An upstream that is disconnected sends no marker, which holds
// the level (and the removal) until it is back. Levels and cuts depend on
// the streams only, so replicas decide alike.
//
// A stateful operator no plan changed (an aggregate or join) is not
// versioned: one state serves every version of the query, and what it
// emits is tagged with the task's level (the configuration downstream of
// it). An aggregate a plan changes runs, from then on, as an
// operator.VersionedAggregate: its versions share its state, a tuple
// updates it through the version of its tag, and a window's rows come
// from one version and carry its tag (wrapStateful). With dynamic
// tracking a task clears the tag (0) of what it sends while no operator
// downstream of it has more than one active version; a receiver reads 0
// as its own level.
type reconfigState struct {
	// pending is the newest reconfiguration the task was given (Apply);
	// the producer installs it.
	pending  atomic.Pointer[fsm.QueryReconfig]
	expected atomic.Int64

	// Producer-owned.
	on      bool
	loaded  bool // members and vers set up (loadVersions)
	cur     *fsm.QueryReconfig
	members []operator.Operator
	names   []string
	vers    []versionSet // by member; nil for a stateful member no plan changed
	plans   map[uint64]*queryspec.Plan
	level   uint64
	cuts    []epochCut // switched plans, by epoch
	aligned map[uint64]alignedCut
	dynamic bool
	depends bool
	levels  []uint64
	// quiescentLoading: a quiescent plan is loading (a generator source
	// holds, holdSourceLoading).
	quiescentLoading bool
	// cutFloor (sources): by plan the source acknowledged while it was
	// loading, the lowest cut that plan can get (planCutFloor);
	// holdBelow is the lowest of them (math.MaxInt64: none). The source
	// emits nothing at or above holdBelow (holdForCut) until it learns
	// the plan's cut, so that it never passes a cut it does not know.
	cutFloor  map[uint64]int64
	holdBelow int64
	// switchAt (sources): by epoch, the stream time from which the
	// source produces under it: an earlier copy's switch point the
	// leader kept (TaskSpec.ReconfigKept), or this copy's own. It
	// replaces the plan's cut in cutEpoch, so a copy that replays the
	// stream tags it as the copy that first produced it did. switchedTo
	// is the newest epoch whose switch point is recorded (or that the
	// copy started at).
	switchAt   map[uint64]int64
	switchedTo uint64
	// replay (a kafka source placed again, which reads its partition
	// from the start): the early markers of the copies before it that it
	// has not sent again yet (see replay.go).
	replay *replayMarks

	// pre holds the versions built off the producer (prebuild).
	pre prebuilt

	// ended: the task's stream ended (its final boundary sent), so no
	// tuple of any epoch passes through it any more. From then on every
	// plan is installed as it arrives, off the producer (which stopped),
	// and the task is at the level of the newest: a plan committed after
	// a finite query's sources ended completes instead of waiting for
	// acknowledgements and markers that would never come. endMu
	// serialises those installs with one setReconfig makes under the
	// processing token.
	ended atomic.Bool
	endMu sync.Mutex
	// later: a goroutine waits for the processing token to install the
	// pending plan (installLater).
	later atomic.Bool

	// Reported (read by State on any goroutine).
	reported atomic.Bool
	acked    atomic.Uint64
	lvl      atomic.Uint64
	frontier atomic.Int64
	// passed (a pass-through sink, which has no merger): the highest
	// stream time it passed on (the final boundary aside), once
	// passedAny. See receivedFrontier and notePassedBatch.
	passed    atomic.Int64
	passedAny atomic.Bool
	loading   atomic.Bool
	markers   atomic.Pointer[[reportedMarkers]fsm.ReconfigMarkers]
	switches  atomic.Pointer[[reportedMarkers]fsm.ReconfigSwitch]
}

// versionSet is a member operator run as versions side by side:
// operator.Versioned (stateless) or operator.VersionedAggregate (one
// shared state).
type versionSet interface {
	operator.Operator
	Latest() uint64
	AddEpoch(version int, build func() (operator.Operator, error)) error
	SetFloor(floor uint64)
	Versions() []int
}

// reportedMarkers is how many epochs above its level a task reports
// marker counts for.
const reportedMarkers = 4

type epochCut struct {
	epoch uint64
	cut   int64
}

// setReconfig hands the task the query's reconfiguration state (Apply).
// An operator or sink task idle between releases installs it at once; a
// busy one at its next release (a DCAA machine's run goroutine at its
// next event, which this provides); a generator source waiting for its next
// record's due time at once (rcWake), a running one before its next
// record.
func (t *task) setReconfig(rc *fsm.QueryReconfig, expected int) {
	if rc == nil {
		return
	}
	t.rc.expected.Store(int64(expected))
	if old := t.rc.pending.Load(); old != nil && old.Latest() == rc.Latest() && samePhases(old, rc) {
		return
	}
	t.prebuild(rc)
	t.rc.pending.Store(rc)
	if t.rc.ended.Load() {
		// Stored before the check: a task that ends meanwhile finds it
		// (endReconfig), so one of the two installs it.
		t.installEnded()
		return
	}
	if t.genCtl == nil && t.rcWake != nil {
		// A kafka or ingest source holding for a cut (holdForCut)
		// installs it now.
		select {
		case t.rcWake <- struct{}{}:
		default:
		}
	}
	if t.genCtl != nil {
		// A generator installs it before its next record; one that is
		// held (a rescale, the quiescent baseline) takes it now.
		c := genCmd{f: func() {
			if err := t.pollReconfig(); err != nil && t.emitErr == nil {
				t.emitErr = err
			}
		}, done: make(chan struct{})}
		select {
		case t.genCtl <- c:
			<-c.done
		default:
			// A paced generator waiting for its next record's due time
			// installs it now rather than when it wakes: the plan
			// switches only once every task acknowledged it, and the
			// last of a worker's sources to wake held the worker's
			// report (up to a pacing wait, over a millisecond).
			if t.rcWake != nil && !t.r.rcWakeOff.Load() {
				select {
				case t.rcWake <- struct{}{}:
				default:
				}
			}
		}
	}
	if t.proc == nil {
		return
	}
	select {
	case t.proc <- struct{}{}:
		t.rc.endMu.Lock()
		err := t.pollReconfig()
		t.rc.endMu.Unlock()
		if err != nil {
			t.fail(err)
		}
		<-t.proc
	default:
		// Busy: in machine mode the run goroutine installs it at its
		// next event (woken here in case it is waiting for one).
		if t.dm != nil {
			t.dm.poke()
			return
		}
		t.installLater()
	}
}

// installLater installs the pending plan once the processing token is
// free, on a goroutine of its own that the task's context stops (at most
// one waits: it installs the newest plan pending when it gets the
// token). The holder may be anything that takes the token (a pass-through
// sink appending a batch, a snapshot, a correction): none of them looks
// for a pending plan when it lets go, and the next one that does
// (processOne, passLevel) may never come: a pass-through sink of a
// replicated query busy when the plan came, then reading only tentative
// results (no boundary) until its upstream's replica ended, never
// acknowledged the plan, so it never switched
// (TestReconfigUpgradeDuringDCAAFailure).
func (t *task) installLater() {
	if !t.rc.later.CompareAndSwap(false, true) {
		return
	}
	go func() {
		if err := t.lockProc(t.ctx); err != nil {
			t.rc.later.Store(false)
			return
		}
		// Cleared before the plan is read: a plan stored from now on
		// finds the token busy and starts another wait, or is read here.
		t.rc.later.Store(false)
		var err error
		if t.ctx.Err() == nil {
			t.rc.endMu.Lock()
			err = t.pollReconfig()
			t.rc.endMu.Unlock()
		}
		t.unlockProc()
		if err != nil {
			t.fail(err)
		}
	}()
}

// endReconfig records that the task's stream ended: its final boundary
// is sent (a source's, once flushed; an operator's or sink's, once
// processed). The producer calls it last, touching no reconfiguration
// state after it.
func (t *task) endReconfig() {
	t.rc.ended.Store(true)
	t.installEnded()
}

// installEnded installs the newest plan in a task whose stream ended and
// raises its level to that plan's epoch: nothing older (nothing at all)
// can reach it any more, so it acknowledges, counts as having every
// marker, and holds back neither switching nor removal.
func (t *task) installEnded() {
	r := &t.rc
	r.endMu.Lock()
	defer r.endMu.Unlock()
	if err := t.pollReconfig(); err != nil {
		t.fail(err)
		return
	}
	if r.on {
		t.raiseLevel(r.cur.Latest())
		t.noteMarkers(nil)
	}
}

func samePhases(a, b *fsm.QueryReconfig) bool {
	if len(a.Plans) != len(b.Plans) || a.Tracking != b.Tracking {
		return false
	}
	for i := range a.Plans {
		if a.Plans[i].Phase != b.Plans[i].Phase || a.Plans[i].Cut != b.Plans[i].Cut {
			return false
		}
	}
	return true
}

// pollReconfig installs a pending reconfiguration (producer only).
func (t *task) pollReconfig() error {
	p := t.rc.pending.Load()
	if p == nil || p == t.rc.cur {
		return nil
	}
	return t.installReconfig(p)
}

// installReconfig loads the versions of every epoch the task does not
// run yet, beside the ones it runs, and takes the plans' cuts and phases.
func (t *task) installReconfig(rc *fsm.QueryReconfig) error {
	r := &t.rc
	source := t.node.Kind == queryspec.KindSource
	if err := t.loadVersions(rc); err != nil {
		return err
	}
	if source && t.maxSTime != math.MinInt64 {
		// Reported with the acknowledgement: the cut goes above it. A
		// source's frontier never goes down (boundaryLevel), so the
		// lowest cut a plan acknowledged now can get is known now
		// (planCutFloor).
		r.frontier.Store(max(r.frontier.Load(), t.maxSTime))
	}
	known := len(r.cuts)
	r.cuts = r.cuts[:0]
	loading := false
	floors := map[uint64]int64{}
	for _, p := range rc.Plans {
		if p.Phase == fsm.ReconfigLoading {
			loading = true
			if source {
				// Quiescent plans too: their margin is a nanosecond,
				// and a boundary a source emitted just after it
				// acknowledged one (before its hold at the next
				// record) could reach the cut unknowingly.
				floors[p.Epoch] = r.planCutFloor(p)
			}
			continue
		}
		r.cuts = append(r.cuts, epochCut{p.Epoch, r.alignedCut(rc, p)})
		if source && len(r.cuts) > known && p.Phase == fsm.ReconfigSwitched && t.maxSTime >= p.Cut {
			// Not a plan this copy acknowledged while it loaded (those
			// hold at their cut's floor): one switched before the
			// copy started. Every tuple is still
			// processed by one configuration, but this source switches
			// later than its replicas may have.
			t.log.Warn("reconfiguration cut learned after passing it: switching at the next boundary",
				"epoch", p.Epoch, "cut", p.Cut, "frontier", t.maxSTime)
		}
	}
	if source {
		r.cutFloor, r.holdBelow = floors, math.MaxInt64
		for _, f := range floors {
			r.holdBelow = min(r.holdBelow, f)
		}
	}
	r.dynamic = rc.Tracking == fsm.TrackingDynamic
	r.depends = t.downstreamDepends(rc)
	r.cur, r.on = rc, true
	if done := rc.Completed(); done > r.level {
		// Completed everywhere: no older tuple exists (a copy started
		// from a snapshot, or after a move, starts here).
		t.raiseLevel(done)
	}
	r.switchedTo = max(r.switchedTo, r.level)
	if !source && t.maxSTime != math.MinInt64 {
		// Reported with the acknowledgement: the cut goes above it.
		r.frontier.Store(t.maxSTime)
	}
	r.quiescentLoading = false
	for _, p := range rc.Plans {
		r.quiescentLoading = r.quiescentLoading || (p.Strategy == fsm.StrategyQuiescent && p.Phase == fsm.ReconfigLoading)
	}
	r.loading.Store(loading)
	if rc.Latest() > r.acked.Load() {
		t.r.rcApplies.installed(t.spec.Query, rc.Latest(), time.Now())
	}
	r.acked.Store(rc.Latest())
	r.reported.Store(true)
	t.r.noteProgress()
	return nil
}

// loadVersions builds the versions of every epoch of rc the task does not
// run yet, beside the ones it runs (producer only, or before the task
// starts: a task started from a snapshot loads them before restoring it,
// since the snapshot holds the state of the versions its original ran).
func (t *task) loadVersions(rc *fsm.QueryReconfig) error {
	r := &t.rc
	source := t.node.Kind == queryspec.KindSource
	if !r.loaded {
		base, names := t.op, t.node.Members
		switch t.node.Kind {
		case queryspec.KindSource:
			base, names = t.srcChain, t.node.Members[1:]
		case queryspec.KindSink:
			base, names = nil, nil
		}
		r.members = operator.ChainMembers(base)
		if len(r.members) != len(names) {
			return fmt.Errorf("task %s: %d operators for members %v", t.spec.TaskID, len(r.members), names)
		}
		r.names, r.loaded = names, true
		r.vers = make([]versionSet, len(r.members))
		r.plans = map[uint64]*queryspec.Plan{0: t.plan}
		for i, op := range r.members {
			if def := t.memberDef(t.plan, i); def != nil && operator.Stateless(def.Type) {
				r.vers[i] = operator.NewVersioned(names[i], op, 1, 0)
				r.members[i] = r.vers[i]
			}
		}
	}
	for i := range r.vers {
		if r.vers[i] != nil {
			continue
		}
		v, err := t.wrapStateful(rc, r.members[i], r.names[i], i)
		if err != nil {
			return err
		}
		if v != nil {
			v.SetFloor(r.level)
			r.vers[i], r.members[i] = v, v
		}
	}
	for i, v := range r.vers {
		if v == nil {
			continue
		}
		for e := v.Latest() + 1; e <= rc.Latest(); e++ {
			if err := v.AddEpoch(rc.VersionOf(r.names[i], e), func() (operator.Operator, error) { return t.buildMember(rc, e, i) }); err != nil {
				return fmt.Errorf("task %s: %w", t.spec.TaskID, err)
			}
		}
	}
	if len(r.members) > 0 {
		if source {
			t.srcChain = operator.Chain(r.members...)
		} else {
			t.op = operator.Chain(r.members...)
		}
	}
	return nil
}

// wrapStateful returns the task's i-th operator op, a stateful one, run
// as versions over its state when a plan of rc changes it (an aggregate,
// staged when a version reshapes it; a join, whose versions share its
// buffers), or nil.
// Until a plan changes it, it is not versioned at all: what works without
// such a change is untouched. The state is kept in place; the epochs up
// to rc's latest are added.
func (t *task) wrapStateful(rc *fsm.QueryReconfig, op operator.Operator, name string, i int) (versionSet, error) {
	def := t.memberDef(t.plan, i)
	if def == nil || !changedBy(rc, name) {
		return nil, nil
	}
	if def.Type == "join" {
		vj, err := operator.NewVersionedJoin(name, op, 1, 0)
		if err != nil {
			return nil, fmt.Errorf("task %s: %w", t.spec.TaskID, err)
		}
		for e := vj.Latest() + 1; e <= rc.Latest(); e++ {
			if err := vj.AddEpoch(rc.VersionOf(name, e), func() (operator.Operator, error) { return t.buildMember(rc, e, i) }); err != nil {
				return nil, fmt.Errorf("task %s: %w", t.spec.TaskID, err)
			}
		}
		return vj, nil
	}
	if def.Type != "aggregate" {
		return nil, nil
	}
	base, err := operator.NewVersionedAggregate(name, op, 1, 0)
	if err != nil {
		return nil, fmt.Errorf("task %s: %w", t.spec.TaskID, err)
	}
	va := operator.NewStagedAggregate(base)
	for e := va.Latest() + 1; e <= rc.Latest(); e++ {
		if err := va.AddEpoch(rc.VersionOf(name, e), func() (operator.Operator, error) { return t.buildMember(rc, e, i) }); err != nil {
			return nil, fmt.Errorf("task %s: %w", t.spec.TaskID, err)
		}
	}
	return va, nil
}

// alignedCut is where sources switch to plan p: its cut, rounded up to a
// window boundary of every aggregate the plan reshapes (another window
// or group_by), so that no window of the old shape or the new one
// straddles the switch (operator.StagedAggregate). Every task computes
// it from the plans alone, so all agree.
func (r *reconfigState) alignedCut(rc *fsm.QueryReconfig, p fsm.ReconfigPlan) int64 {
	if c, ok := r.aligned[p.Epoch]; ok && c.cut == p.Cut {
		return c.aligned
	}
	var slides []int64
	prev, err1 := r.planOf(rc, p.Epoch-1)
	next, err2 := r.planOf(rc, p.Epoch)
	if err1 == nil && err2 == nil {
		for _, c := range p.Changes {
			a, b := prev.Query.OperatorByName(c.Operator), next.Query.OperatorByName(c.Operator)
			if a == nil || b == nil || a.Type != "aggregate" || sameShape(a, b) {
				continue
			}
			slides = append(slides, windowSlide(a), windowSlide(b))
		}
	}
	cut := operator.AlignCut(p.Cut, slides)
	if r.aligned == nil {
		r.aligned = map[uint64]alignedCut{}
	}
	r.aligned[p.Epoch] = alignedCut{p.Cut, cut}
	return cut
}

type alignedCut struct{ cut, aligned int64 }

// sameShape reports whether two definitions of an aggregate have the same
// window and group_by (their versions then share one state).
func sameShape(a, b *queryspec.Operator) bool {
	return reflect.DeepEqual(a.Window, b.Window) && slices.Equal(a.GroupBy, b.GroupBy)
}

// windowSlide is an aggregate's window slide (its size when tumbling), 0
// if it does not parse (validated definitions always do).
func windowSlide(def *queryspec.Operator) int64 {
	if def.Window == nil {
		return 0
	}
	s := def.Window.Slide
	if s == "" {
		s = def.Window.Size
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0
	}
	return int64(d)
}

// changedBy reports whether a plan of rc changes operator op.
func changedBy(rc *fsm.QueryReconfig, op string) bool {
	for _, p := range rc.Plans {
		for _, c := range p.Changes {
			if c.Operator == op {
				return true
			}
		}
	}
	return false
}

// memberDef is the definition of the task's i-th operator in plan.
func (t *task) memberDef(plan *queryspec.Plan, i int) *queryspec.Operator {
	n := plan.Node(t.spec.Fragment)
	if n == nil {
		return nil
	}
	if n.Kind == queryspec.KindOperator {
		if i == 0 {
			return n.Op
		}
		i--
	}
	if i < len(n.Chain) {
		return n.Chain[i]
	}
	return nil
}

// buildMember builds the task's i-th operator as configuration e defines
// it, with the input schemas of that configuration.
func (t *task) buildMember(rc *fsm.QueryReconfig, e uint64, i int) (operator.Operator, error) {
	if op := t.rc.pre.take(e, i); op != nil {
		return op, nil
	}
	t.rc.pre.producerBuilds.Add(1)
	plan, err := t.rc.planOf(rc, e)
	if err != nil {
		return nil, err
	}
	return t.buildMemberOf(plan, e, i)
}

// buildMemberOf builds the task's i-th operator as plan (configuration
// e) defines it (any goroutine: it reads only what the task's spec
// fixed).
func (t *task) buildMemberOf(plan *queryspec.Plan, e uint64, i int) (operator.Operator, error) {
	n := plan.Node(t.spec.Fragment)
	def := t.memberDef(plan, i)
	if n == nil || def == nil {
		return nil, fmt.Errorf("epoch %d has no operator %d in fragment %q", e, i, t.spec.Fragment)
	}
	var schemas []*tuple.Schema
	if n.Kind == queryspec.KindOperator && i == 0 {
		for _, in := range n.Inputs {
			schemas = append(schemas, plan.Node(in).Schema)
		}
	} else {
		j := i
		if n.Kind == queryspec.KindOperator {
			j--
		}
		schemas = []*tuple.Schema{n.ChainInputs[j]}
	}
	op, err := operator.New(def, schemas)
	if err != nil {
		return nil, err
	}
	if t.ctx != nil {
		operator.StopOn(op, t.ctx.Done())
	}
	return op, nil
}

func (r *reconfigState) planOf(rc *fsm.QueryReconfig, e uint64) (*queryspec.Plan, error) {
	if p := r.plans[e]; p != nil {
		return p, nil
	}
	if p := r.pre.plan(e); p != nil {
		r.plans[e] = p
		return p, nil
	}
	if e == 0 || e > uint64(len(rc.Plans)) {
		return nil, fmt.Errorf("no configuration of epoch %d", e)
	}
	q, err := queryspec.FromJSON(rc.Plans[e-1].SpecJSON)
	if err != nil {
		return nil, fmt.Errorf("configuration of epoch %d: %w", e, err)
	}
	p, err := q.FusedPlan()
	if err != nil {
		return nil, fmt.Errorf("configuration of epoch %d: %w", e, err)
	}
	r.plans[e] = p
	return p, nil
}

// downstreamDepends reports whether an operator of a fragment downstream
// of this task's has more than one active version (dynamic tracking then
// keeps the tags of what this task sends).
func (t *task) downstreamDepends(rc *fsm.QueryReconfig) bool {
	seen := map[string]bool{}
	queue := append([]string(nil), t.node.Outputs...)
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		if seen[f] {
			continue
		}
		seen[f] = true
		n := t.plan.Node(f)
		if n == nil {
			continue
		}
		for _, m := range n.Members {
			if len(rc.ActiveVersions(m)) > 1 {
				return true
			}
		}
		queue = append(queue, n.Outputs...)
	}
	return false
}

// raiseLevel records that no tuple of an epoch below level can arrive:
// versions only older epochs used are removed.
func (t *task) raiseLevel(level uint64) {
	r := &t.rc
	if level <= r.level {
		return
	}
	r.level = level
	for _, v := range r.vers {
		if v != nil {
			v.SetFloor(level)
		}
	}
	r.lvl.Store(level)
	t.r.noteProgress()
}

// reconfigStep runs at every release step of an operator or sink task,
// once the tuples below it are processed: the task's level as its inputs'
// released markers allow, and the marker counts it reports.
func (t *task) reconfigStep(step int64) {
	r := &t.rc
	if !r.on {
		return
	}
	lv, levels := t.merge.levelAt(step, r.levels)
	r.levels = levels
	if lv == endedLevel {
		// Every input ended (the final step): the boundary it sends
		// next is the task's last.
		lv = r.cur.Latest()
	}
	t.raiseLevel(lv)
	t.noteMarkers(levels)
}

// noteMarkers keeps, for the epochs above the task's level, how many
// inputs (upstream instances) have passed their markers.
func (t *task) noteMarkers(levels []uint64) {
	r := &t.rc
	m := r.markerCounts(levels, r.level, r.cur.Latest())
	if old := r.markers.Load(); old == nil || *old != m {
		r.markers.Store(&m)
	}
}

// markerCounts counts, for the epochs above level up to latest, the
// inputs whose marker level reached them.
func (r *reconfigState) markerCounts(levels []uint64, level, latest uint64) [reportedMarkers]fsm.ReconfigMarkers {
	var m [reportedMarkers]fsm.ReconfigMarkers
	expected := int(r.expected.Load())
	if expected == 0 {
		expected = len(levels)
	}
	for k := range m {
		e := level + 1 + uint64(k)
		if e > latest {
			break
		}
		seen := 0
		for _, l := range levels {
			if l >= e {
				seen++
			}
		}
		m[k] = fsm.ReconfigMarkers{Epoch: e, Seen: seen, Expected: expected}
	}
	return m
}

// sourceEpoch is the epoch a source produces a tuple of stream time stime
// under: that of the latest switched plan whose cut it has reached, and
// never below the source's level (an idle source that switched before
// its time reached the cut, see idleSwitch, tags everything after its
// marker with the new epoch whatever its stime).
func (r *reconfigState) sourceEpoch(stime int64) uint64 {
	return max(r.cutEpoch(stime), r.level)
}

// cutEpoch is the epoch of the latest switched plan whose cut stime
// reached (or the newest complete plan's), or whose switch point it
// reached where the source (or an earlier copy of it) switched elsewhere
// than at the cut. A switch point below the cut is an idle source's
// early marker (idleSwitch): a boundary at the newest stream time the
// source had sent, after its records at that time, so a record at
// exactly that time belongs before it (it is not of the epoch); one at
// or above the cut is a first record or boundary of the epoch (the cut,
// or a cut learned late), which is.
func (r *reconfigState) cutEpoch(stime int64) uint64 {
	e := r.cur.Completed()
	for _, c := range r.cuts {
		at := c.cut
		if sw, ok := r.switchAt[c.epoch]; ok {
			at = sw
			if sw < c.cut {
				at = sw + 1 // sw < c.cut <= math.MaxInt64
			}
		}
		if stime >= at {
			e = max(e, c.epoch)
		}
	}
	return e
}

// noteSwitch records that a source produced its first tuple or boundary
// of epoch e at stime: the switch point of every epoch up to e not
// recorded yet, reported to the leader, which keeps it for the task's
// next copies (fsm ReconfigKept). Producer only.
func (r *reconfigState) noteSwitch(e uint64, stime int64) {
	if e <= r.switchedTo {
		return
	}
	if r.switchAt == nil {
		r.switchAt = map[uint64]int64{}
	}
	for x := r.switchedTo + 1; x <= e; x++ {
		if _, ok := r.switchAt[x]; !ok {
			r.switchAt[x] = stime
		}
	}
	r.switchedTo = e
	var rep [reportedMarkers]fsm.ReconfigSwitch
	for i := range rep {
		x := e - uint64(i)
		at, ok := r.switchAt[x]
		if x == 0 || !ok {
			break
		}
		rep[i] = fsm.ReconfigSwitch{Epoch: x, At: at}
	}
	r.switches.Store(&rep)
}

// restoreKept gives a new copy of a source what the leader kept of its
// earlier copies (fsm ReconfigKept), before it installs a plan: it
// acknowledges with at least the highest frontier any of them
// acknowledged a plan with, so it holds at that floor as they did and
// the cut goes above everything they emitted, and it tags what it
// replays by their switch points (cutEpoch).
func (t *task) restoreKept(k *fsm.ReconfigKept) {
	if k == nil || t.node.Kind != queryspec.KindSource {
		return
	}
	r := &t.rc
	r.frontier.Store(max(r.frontier.Load(), k.Frontier))
	for _, sw := range k.Switches {
		if r.switchAt == nil {
			r.switchAt = map[uint64]int64{}
		}
		r.switchAt[sw.Epoch] = sw.At
	}
	if t.kafka != nil && t.genRestore == nil && t.spec.FromSnapshot == nil {
		// It reads its partition from the start again (a copy from a
		// snapshot goes on from the snapshot's offset instead).
		r.replay = newReplayMarks(k.Switches)
	}
}

// tagSource tags a record a source produced (producer only). It installs
// nothing: a source installs a pending plan where it holds for the cut,
// just before it emits (holdForCut); a plan installed after that, here,
// could have a cut at or below the record's stime that the source's
// replicas already know.
func (t *task) tagSource(tp *tuple.Tuple) {
	if t.rc.on {
		tp.Version = t.rc.sourceEpoch(tp.STime)
		t.rc.noteSwitch(tp.Version, tp.STime)
	}
}

// boundaryLevel is the marker level a boundary at stime carries, raising
// a source's level as it passes a cut.
func (t *task) boundaryLevel(stime int64) uint64 {
	r := &t.rc
	if t.node.Kind == queryspec.KindSource {
		// No install here: a source installs a plan only where it
		// holds for the cut before emitting (holdForCut).
		if !r.on {
			return 0
		}
		if stime != math.MaxInt64 {
			// Never below what the source emitted (a boundary can lie
			// below records already sent): the cut goes above every
			// one of them, and what the frontier reported with an
			// acknowledgement was is a floor of every later report.
			r.frontier.Store(max(stime, t.maxSTime, r.frontier.Load()))
		}
		t.raiseLevel(r.sourceEpoch(stime))
		if stime != math.MaxInt64 {
			r.noteSwitch(r.level, stime)
		}
		return r.level
	}
	if r.on && stime != math.MaxInt64 {
		r.frontier.Store(stime)
	}
	return r.level
}

// tagOut sets the tag of a tuple the task sends: never below its level
// (what a stateful operator emits carries none), and 0 under dynamic
// tracking when nothing downstream depends on it.
func (t *task) tagOut(tp *tuple.Tuple) {
	r := &t.rc
	if tp.Version < r.level {
		tp.Version = r.level
	}
	if r.dynamic && !r.depends {
		tp.Version = 0
	}
}

// passLevel follows the marker level of a sink that passes its single
// input through: the level of the last boundary of each batch.
func (t *task) passLevel(last *tuple.Tuple) {
	if err := t.pollReconfig(); err != nil {
		t.fail(err)
	}
	if !t.rc.on || last.Type != tuple.Boundary {
		return
	}
	t.raiseLevel(last.Version)
	lv := []uint64{last.Version}
	t.noteMarkers(lv)
}

// reconfigProgress fills the reconfiguration fields of a task's state.
func (t *task) reconfigProgress(st *TaskState) {
	r := &t.rc
	if !r.reported.Load() {
		return
	}
	st.Reconfig = true
	st.ReconfigAcked, st.ReconfigLevel = r.acked.Load(), r.lvl.Load()
	if r.loading.Load() {
		// Only while a plan waits to switch: the cut goes above it.
		st.ReconfigFrontier = r.frontier.Load()
		if t.node.Kind != queryspec.KindSource {
			st.ReconfigFrontier = max(st.ReconfigFrontier, t.receivedFrontier())
		}
	}
	if sw := r.switches.Load(); sw != nil {
		st.ReconfigSwitches = *sw
	}
	switch {
	case t.merge != nil && !t.passThrough:
		// Markers count as they arrive; the level (and the removal)
		// waits until what came before them is processed.
		st.ReconfigMarkers = r.markerCounts(t.merge.receivedLevels(), st.ReconfigLevel, st.ReconfigAcked)
	case r.markers.Load() != nil:
		st.ReconfigMarkers = *r.markers.Load()
	}
}

// receivedFrontier is the highest stream time the task received from
// its upstreams, processed or not (math.MinInt64: none). A task other
// than a source acknowledges a plan with it as well as with the highest
// stream time it produced, so that the cut goes above everything any
// copy of an upstream source gave it. That is the only record of how far
// a source's copy got when the copy is gone (its worker lost) and had
// acknowledged no plan (a source reports its frontier only while a plan
// loads, and the leader keeps only those, fsm ReconfigKept): its next
// copy starts its stream again below what its consumers took, and
// acknowledges from there, and a consumer whose own output waits for a
// slower input has produced nothing that far. With the cut below what
// the lost copy emitted, the new copy would tag by the cut what the
// consumers took from the lost copy under the old epoch
// (TestReconfigPlanCommittedWhileAPlacedAgainSourceReplays). Otherwise
// the cut does not move: every stream time a task receives starts at a
// source (an aggregate's result carries its window's end, at most the
// watermark that closed it), and each running source reports the
// highest it sent.
func (t *task) receivedFrontier() int64 {
	f := int64(math.MinInt64)
	if t.merge != nil {
		f = t.merge.receivedFrontier()
	}
	if t.rc.passedAny.Load() {
		f = max(f, t.rc.passed.Load())
	}
	return f
}

// notePassed records the stream time of the last tuple of a batch a
// pass-through sink passed on (its receivedFrontier). Only the last
// tuple's header is decoded on that path: a batch of a stream in stream
// time order ends with its highest; one out of order (an ingest source's
// allowed lateness) within a batch may have had a higher one before it.
// Called with the processing token held (the only writer).
func (t *task) notePassed(last *tuple.Tuple) {
	r := &t.rc
	if last.STime == finalBoundary || r.passedAny.Load() && last.STime <= r.passed.Load() {
		return
	}
	r.passed.Store(last.STime)
	r.passedAny.Store(true)
}

// notePassedBatch is notePassed for a batch a pass-through sink passed
// on (tuple i is data[offs[i]:], last the last one's header). When the
// query has a source whose stream may be out of stream-time order
// (passUnordered), every tuple's header is read: the last one may be
// below an earlier one (an ingest source's allowed lateness; its
// boundary after a request is newest - allowed_lateness), and the
// sink's frontier must be the highest it received, or a plan's cut may
// fall below a record it passed on under the old epoch when that
// record's source copy is lost (see receivedFrontier). In order, the
// last is the highest, and the other headers are not decoded.
func (t *task) notePassedBatch(last *tuple.Tuple, offs []int, data []byte) {
	t.notePassed(last)
	if !t.passUnordered || len(offs) < 2 {
		return
	}
	var h tuple.Tuple
	for _, o := range offs[:len(offs)-1] {
		if _, err := tuple.DecodeHeader(data[o:], &h); err != nil {
			return // the batch was decoded whole before: not reached
		}
		t.notePassed(&h)
	}
}

// mayBeUnordered reports whether a source of plan's query may produce
// its stream out of stream-time order: an ingest source with an
// allowed_lateness, or a kafka source (its records' times are the
// topic's, judged as ingest lines are).
func mayBeUnordered(plan *queryspec.Plan) bool {
	for _, n := range plan.Nodes {
		if n.Kind != queryspec.KindSource || n.Source == nil {
			continue
		}
		if n.Source.Kafka != nil || n.Source.Lateness() > 0 {
			return true
		}
	}
	return false
}

// PauseSources holds every generator source task of query on this runtime
// between two records, for the quiescent reconfiguration strategy (pause,
// drain, swap, resume), which exists only as the baseline the live one is
// measured against, and for tests. A held source has flushed what it
// produced, so downstream receives all of it. It returns the lowest and
// the highest stream time the held sources produced (everything
// downstream drains up to the lowest) and a function that resumes them
// (call it once).
func (r *Runtime) PauseSources(ctx context.Context, query string) (low, high int64, resume func()) {
	low, high = math.MaxInt64, math.MinInt64
	hold := make(chan struct{})
	for _, t := range r.tasksByID() {
		if t.spec.Query != query || t.gen == nil || t.genCtl == nil {
			continue
		}
		var f int64
		held := func() {
			// What the generator staged goes out before it holds: a
			// source behind its schedule flushes only full batches, and
			// downstream could not drain up to the lowest stream time.
			// An error (the task stopping) comes back to the generator
			// at its next flush.
			_ = t.flush(ctx)
			f = t.maxSTime
		}
		if t.onGenerator(ctx, held, hold) {
			low, high = min(low, f), max(high, f)
		}
	}
	return low, high, func() { close(hold) }
}

// earlyLevel is the level a source's snapshot carries
// (TaskSnapshot.SourceLevel): its level if it switched before its last
// boundary reached the plan's cut (idleSwitch), which the copy could not
// tell from that boundary; 0 otherwise.
func (r *reconfigState) earlyLevel(boundary int64) uint64 {
	if !r.on {
		return 0
	}
	if r.cutEpoch(boundary) >= r.level {
		return 0
	}
	return r.level
}

// switchedAbove is the newest switched plan's epoch when it is above the
// task's level (0 otherwise): the epoch an idle source switches to.
func (r *reconfigState) switchedAbove() uint64 {
	var e uint64
	for _, c := range r.cuts {
		e = max(e, c.epoch)
	}
	if e <= r.level {
		return 0
	}
	return e
}

// idleSwitch switches an idle push source (ingest, kafka) to the newest
// switched plan without waiting for its stream time to reach the cut,
// which a source that produces nothing never does (it would hold the
// plan's markers, and the removal of the old versions downstream, for as
// long as it is idle). Producer only (an ingest source's mutex held, a
// kafka source's goroutine).
//
// The marker is a boundary at `at`, which must be at least the stime of
// every tuple the source sent (a marker raises a downstream input's level
// at the first release step above it, once everything sent before it is
// processed) and a promise the source keeps (nothing later below it).
// From the marker on, every tuple is tagged with the new epoch whatever
// its stime (sourceEpoch never goes below the level). It returns whether
// it switched.
func (t *task) idleSwitch(ctx context.Context, at int64) (bool, error) {
	r := &t.rc
	if !r.on {
		return false, nil
	}
	e := r.switchedAbove()
	if e == 0 {
		return false, nil
	}
	t.raiseLevel(e)
	if err := t.emitBoundary(ctx, at); err != nil {
		return false, err
	}
	return true, t.flush(ctx)
}

// idleTicks drives an ingest source between requests (its own goroutine,
// stopped with the task): every boundary interval it installs a pending
// reconfiguration (an idle source would otherwise never acknowledge a
// plan, holding it in loading for the whole query), and when no request
// came for a whole interval while a switched plan waits above its level,
// it switches (idleSwitch) with its marker at the newest stime it
// accepted: its floor rises there, so from then on a record behind the
// newest is late even within allowed_lateness.
func (t *task) idleTicks(ctx context.Context) {
	if t.awaitAligned(ctx) != nil {
		return // stopped
	}
	st := t.ingest
	tick := time.NewTicker(t.r.opts.BoundaryInterval)
	defer tick.Stop()
	var seen uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if t.rc.pending.Load() == nil {
			continue // the query was never reconfigured
		}
		st.mu.Lock()
		idle := st.requests == seen
		seen = st.requests
		if st.movedOut == nil && !st.closed {
			if err := t.pollReconfig(); err != nil {
				st.mu.Unlock()
				t.fail(err)
				return
			}
			if idle {
				at := max(st.boundary, st.newest, math.MinInt64+1)
				switched, err := t.idleSwitch(ctx, at)
				if err != nil {
					t.discardStaged()
				} else if switched {
					st.boundary = at
				}
			}
		}
		st.mu.Unlock()
	}
}

// The quiescent strategy (the comparison baseline: pause the sources,
// drain, swap, resume) in a generator source: it holds from when it
// learns the plan while the plan loads (holdSourceLoading); once every
// task acknowledged, the plan's cut is just above what the sources
// produced (the plan's margin), and each source produces up to it,
// emits its marker and holds again until the plan is complete
// (holdQuiescent): by then everything produced before the pause has been
// processed (drained) and the older versions are removed (swapped); then
// it resumes under the new versions. Cuts and phases come from Raft, so
// every replica holds at the same boundary and produces the same stream.
//
// quiescentEpoch is the epoch of a quiescent plan that a generator source
// must hold for after emitting a boundary at stime: a switched plan whose
// cut the boundary reached and that is not complete yet (0: none); the
// boundary is the source's marker of that epoch (producer only).
func (t *task) quiescentEpoch(stime int64) uint64 {
	r := &t.rc
	if !r.on || r.cur == nil || stime == finalBoundary {
		return 0
	}
	for _, p := range r.cur.Plans {
		if p.Strategy == fsm.StrategyQuiescent && p.Phase == fsm.ReconfigSwitched && stime >= p.Cut {
			return p.Epoch
		}
	}
	return 0
}

// quiescentCatchUp reports whether a generator source must produce the
// record at stime without waiting for its due time: a quiescent plan is
// switched and its cut is above stime. The cut is the highest stream time
// any source had produced when they paused, so a source that started
// later than the others (its stream time behind theirs) would otherwise
// keep producing at its pace, the stream not paused, until its stream
// time reached the cut (tens of milliseconds of start skew in an org).
// Its records below the cut belong before the pause; producing them at
// once changes no record or boundary, only when they come, as the pauses
// themselves (producer only).
func (t *task) quiescentCatchUp(stime int64) bool {
	r := &t.rc
	if !r.on || r.cur == nil {
		return false
	}
	for _, p := range r.cur.Plans {
		if p.Strategy == fsm.StrategyQuiescent && p.Phase == fsm.ReconfigSwitched && stime < p.Cut {
			return true
		}
	}
	return false
}

// holdQuiescent runs after the source emitted its marker of the
// quiescent plan of epoch e, a boundary at marker: it emits boundaries at
// marker+1, marker+2, ... one per fragment of the query, flushes and holds
// the generator until the plan is complete or the task stops, installing
// the reconfigurations it is handed meanwhile and running other generator
// commands (snapshots, rescales). It returns the last boundary emitted,
// below which no record may follow (records are clamped up to it).
//
// A task's level rises at a release step above its inputs' markers, so
// with nothing above the marker the first task downstream would wait for
// ever; each boundary one nanosecond higher lets one more stage pass it.
// Their number depends on the plan only, so replicas emit the same.
func (t *task) holdQuiescent(ctx context.Context, e uint64, marker int64) (int64, error) {
	last := marker
	for range len(t.plan.Nodes) {
		last++
		if err := t.emitBoundary(ctx, last); err != nil {
			return last, err
		}
	}
	if err := t.flush(ctx); err != nil {
		return last, err
	}
	t.log.Debug("source held for a quiescent reconfiguration", "epoch", e, "marker", marker)
	t.r.rcHolds.note(t.spec.TaskID, t.spec.Query, e, holdMarker, time.Now())
	if err := t.holdUntil(ctx, last, func() bool { return t.rc.cur.Completed() >= e }); err != nil {
		return last, err
	}
	t.r.rcHolds.note(t.spec.TaskID, t.spec.Query, e, holdResumed, time.Now())
	return last, nil
}

// planCutFloor is the lowest cut plan p (loading) can get, as a
// source that acknowledges it now sees it: once every task acknowledged,
// the coordinator sets the cut at the highest frontier any task reported
// plus the plan's margin (fsm advanceReconfig), and this task's report
// with its acknowledgement, like every later one, carries at least the
// frontier it has now (a source's never goes down). The floor the task
// computed when it first learned the plan is kept: later reports only
// raise the cut.
func (r *reconfigState) planCutFloor(p fsm.ReconfigPlan) int64 {
	if f, ok := r.cutFloor[p.Epoch]; ok {
		return f
	}
	margin := p.SwitchMargin
	if margin <= 0 {
		margin = fsm.DefaultSwitchMargin // as the plan's commit sets it
	}
	f := r.frontier.Load()
	if f >= math.MaxInt64-margin {
		return math.MaxInt64
	}
	return f + margin
}

// snapshotCut puts in a source's snapshot the floors of the plans it
// acknowledged that still load, and the frontier it reported them with
// (TaskSnapshot.CutFloors): everything it emitted is at or below that
// frontier, and it emitted nothing at or above a floor (producer only).
func (t *task) snapshotCut(s *TaskSnapshot) {
	r := &t.rc
	if len(r.cutFloor) == 0 {
		return
	}
	s.CutFrontier = max(r.frontier.Load(), t.maxSTime)
	for e, f := range r.cutFloor {
		s.CutFloors = append(s.CutFloors, EpochFloor{Epoch: e, Floor: f})
	}
	slices.SortFunc(s.CutFloors, func(a, b EpochFloor) int { return cmp.Compare(a.Epoch, b.Epoch) })
}

// restoreCut gives a source copy started from snapshot s (a move, a
// re-placement) its original's cut floors and frontier before it
// installs a plan: it acknowledges the plans its original acknowledged
// with at least the frontier the original reported (the coordinator
// forgot that report with the placement, and the copy has emitted
// nothing yet), so the cut goes above everything the original emitted,
// and it holds at the same floors until it learns the cut. A plan the
// original did not acknowledge gets its floor from that frontier too
// (planCutFloor).
func (t *task) restoreCut(s *TaskSnapshot) {
	if len(s.CutFloors) == 0 {
		return
	}
	r := &t.rc
	r.frontier.Store(max(r.frontier.Load(), s.CutFrontier))
	r.cutFloor, r.holdBelow = make(map[uint64]int64, len(s.CutFloors)), math.MaxInt64
	for _, f := range s.CutFloors {
		r.cutFloor[f.Epoch] = f.Floor
		r.holdBelow = min(r.holdBelow, f.Floor)
	}
}

// holdForCut runs in every source (generator, kafka, ingest) before it
// emits a record or a boundary at stime: it installs a pending
// reconfiguration and, if stime reached the lowest cut a plan the
// source acknowledged can get (holdBelow) while that plan still loads,
// holds the source until it learns the plan's cut (or ctx ends). So no
// source replica passes a cut before it knows it: the replicas of a
// partition switch at the same stime, and nothing a source emitted is
// at or above a cut it learns later. With a margin longer than the
// plan takes to switch, nothing holds. boundary is the last boundary
// the source emitted: a held generator or kafka source serves snapshots
// at it (producer only; an ingest source's mutex held).
func (t *task) holdForCut(ctx context.Context, boundary, stime int64) error {
	if err := t.pollReconfig(); err != nil {
		return err
	}
	r := &t.rc
	if len(r.cutFloor) == 0 || stime < r.holdBelow {
		return nil
	}
	// What the source staged goes out before it waits: downstream
	// tasks are not kept from releasing up to it meanwhile.
	if err := t.flush(ctx); err != nil {
		return err
	}
	t.counters.cutHolds.Add(1)
	start := time.Now()
	t.log.Debug("source held at the lowest cut of a reconfiguration plan until it learns the cut",
		"stime", stime, "floor", r.holdBelow, "plans", len(r.cutFloor))
	yield := func() bool { return t.ingest != nil && t.ingest.snapWaits.Load() }
	err := t.holdUntil(ctx, boundary, func() bool { return len(t.rc.cutFloor) == 0 || stime < t.rc.holdBelow || yield() })
	if err == nil && len(t.rc.cutFloor) > 0 && stime >= t.rc.holdBelow {
		// An ingest request gives way to a move's snapshot, which
		// waits for the ingest lock it holds: the plan may wait for the
		// moved copy's acknowledgement, and so the cut for the
		// snapshot. The lines before this one stay taken; the producer
		// resends the rest to the new copy, which holds them alike
		// (restoreCut).
		err = t.movedErr()
	}
	t.log.Debug("source resumed after learning the reconfiguration cut", "held", time.Since(start), "err", err)
	return err
}

// holdSourceLoading holds a generator source, before it tags and emits
// its next record, while a quiescent plan is loading: the stream stops
// as soon as the plan is learned, before its versions are loaded and
// acknowledged (the task acknowledged already, with the frontier the cut
// goes above). A pause changes no record or boundary, only when they
// come, so replicas still produce the same stream. boundary is the last
// boundary the source emitted (generator goroutine only).
func (t *task) holdSourceLoading(ctx context.Context, boundary int64) error {
	if err := t.pollReconfig(); err != nil || !t.rc.quiescentLoading {
		return err
	}
	if err := t.flush(ctx); err != nil {
		return err
	}
	for _, p := range t.rc.cur.Plans {
		if p.Strategy == fsm.StrategyQuiescent && p.Phase == fsm.ReconfigLoading {
			t.r.rcHolds.note(t.spec.TaskID, t.spec.Query, p.Epoch, holdLoading, time.Now())
		}
	}
	return t.holdUntil(ctx, boundary, func() bool { return !t.rc.quiescentLoading })
}

// holdUntil holds a source until done holds or ctx ends, installing the
// reconfigurations it is handed meanwhile and serving snapshot requests
// (at boundary, the last boundary it emitted) and other generator
// commands (rescales) (the source's producer only; an ingest source,
// which has neither, only installs).
func (t *task) holdUntil(ctx context.Context, boundary int64, done func() bool) error {
	t.counters.busyUntilNow(t)
	defer t.counters.resume(t)
	// setReconfig hands a held generator the new state through genCtl;
	// the ticker covers one stored while the generator was busy.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := t.pollReconfig(); err != nil {
			return err
		}
		if done() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case c := <-t.genCtl:
			t.runGenCmd(ctx, c)
		case req := <-t.genSnap:
			req <- t.cutSource(ctx, boundary)
		case <-t.rcWake:
		case <-tick.C:
		}
	}
}

// prebuilt holds versions of a task's stateless operators built by
// prebuild, on the goroutine that hands the task a reconfiguration,
// until the producer installs them (buildMember takes them). Parsing an
// epoch's configuration and compiling its expressions took 0.5-5 ms per
// task (20 ms once) on a loaded machine; on the producer that was a
// pause of the task's stream, and a source's pause holds up every task
// that merges it with others in stream-time order.
type prebuilt struct {
	mu    sync.Mutex
	upTo  uint64 // epochs up to upTo were prebuilt
	plans map[uint64]*queryspec.Plan
	ops   map[prebuiltKey]operator.Operator
	// producerBuilds counts the operators the producer had to build
	// itself (a task started with a reconfiguration builds them all).
	producerBuilds atomic.Int64
}

type prebuiltKey struct {
	epoch  uint64
	member int
}

func (p *prebuilt) take(e uint64, i int) operator.Operator {
	p.mu.Lock()
	defer p.mu.Unlock()
	op := p.ops[prebuiltKey{e, i}]
	delete(p.ops, prebuiltKey{e, i})
	return op
}

func (p *prebuilt) plan(e uint64) *queryspec.Plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.plans[e]
}

// prebuild parses the configurations of rc's epochs not prebuilt yet and
// builds the task's stateless operators in them (any goroutine but the
// producer's, which installs them later). What fails here is left to the
// producer, which builds it again and reports the error.
func (t *task) prebuild(rc *fsm.QueryReconfig) {
	p := &t.rc.pre
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.node == nil {
		return // a task that could not be built (failedTask) runs nothing
	}
	members := t.node.Members
	switch t.node.Kind {
	case queryspec.KindSource:
		members = members[1:]
	case queryspec.KindSink:
		members = nil
	}
	for e := p.upTo + 1; e <= rc.Latest(); e++ {
		p.upTo = e
		plan, err := t.r.epochPlans.get(rc.Plans[e-1].SpecJSON)
		if err != nil {
			continue
		}
		if p.plans == nil {
			p.plans, p.ops = map[uint64]*queryspec.Plan{}, map[prebuiltKey]operator.Operator{}
		}
		p.plans[e] = plan
		for i := range members {
			def := t.memberDef(plan, i)
			if def == nil || !operator.Stateless(def.Type) || rc.VersionOf(members[i], e) == rc.VersionOf(members[i], e-1) {
				continue // stateful, or unchanged: the version of e-1 serves
			}
			if op, err := t.buildMemberOf(plan, e, i); err == nil {
				p.ops[prebuiltKey{e, i}] = op
			}
		}
	}
}

// planCache holds the plans of reconfiguration epochs by their canonical
// spec, parsed once for all the tasks of a runtime: parsing one and
// fusing it took about 1 ms on a loaded machine, once per task that
// learned the plan, all at the same moment. Plans are read-only once
// built. The cache forgets everything past planCacheSize specs (a new
// plan is parsed again at worst).
type planCache struct {
	mu    sync.Mutex
	plans map[string]*queryspec.Plan
}

const planCacheSize = 64

func (c *planCache) get(spec []byte) (*queryspec.Plan, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.plans[string(spec)]; p != nil {
		return p, nil
	}
	q, err := queryspec.FromJSON(spec)
	if err != nil {
		return nil, err
	}
	p, err := q.FusedPlan()
	if err != nil {
		return nil, err
	}
	if c.plans == nil || len(c.plans) >= planCacheSize {
		c.plans = map[string]*queryspec.Plan{}
	}
	c.plans[string(spec)] = p
	return p, nil
}
