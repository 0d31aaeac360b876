package runtime

import (
	"slices"
	"time"

	"github.com/fedstream/fedstream/fsm"
)

// StagedPlan is a reconfiguration plan the leader is committing
// (validated and proposed, not yet committed): Query's plan of epoch
// Plan.Epoch, for the query's definition of create index QueryIndex.
type StagedPlan struct {
	Query      string
	QueryIndex uint64
	Plan       fsm.ReconfigPlan
}

// Stage builds, in every running task of the queries of staged, the
// versions that plan would add (its configuration parsed, its changed
// operators compiled), beside nothing: a task runs no version before it
// is handed the committed plan (Apply), and then installs what was built
// here instead of building it on the plan's path. A plan is built ahead
// only as the next epoch of the plans a task was handed. What was built
// for a staged plan is discarded when the committed plan of that epoch
// differs, or when a later call no longer stages it (it did not commit,
// or it did and the task is handed it as usual). Call it from the
// goroutine that calls Apply.
func (r *Runtime) Stage(staged []StagedPlan) {
	for _, t := range r.tasksByID() {
		i := slices.IndexFunc(staged, func(s StagedPlan) bool {
			return s.Query == t.spec.Query && s.QueryIndex == t.spec.QueryIndex
		})
		cur := t.rc.pending.Load()
		if i < 0 || staged[i].Plan.Epoch != cur.Latest()+1 {
			t.rc.pre.discardStaged(cur.Latest())
			continue
		}
		rc := &fsm.QueryReconfig{Plans: append(slices.Clip(plansOf(cur)), staged[i].Plan)}
		t.prebuildFrom(rc, true)
		r.rcApplies.stagedDone(t.spec.Query, staged[i].Plan.Epoch, time.Now())
	}
}

func plansOf(rc *fsm.QueryReconfig) []fsm.ReconfigPlan {
	if rc == nil {
		return nil
	}
	return rc.Plans
}

// discardStaged forgets what was built for staged plans above epoch
// latest.
func (p *prebuilt) discardStaged(latest uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for e := range p.staged {
		if e > latest {
			p.dropFrom(e)
		}
	}
}

// stagedDone records that a task of query finished building the staged
// plan of epoch e at `at` (the latest such time per epoch is kept).
func (a *reconfigApplies) stagedDone(query string, e uint64, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.staged == nil || len(a.staged) >= maxReconfigApplies {
		a.staged = map[queryEpoch]time.Time{}
	}
	k := queryEpoch{query, e}
	if at.After(a.staged[k]) {
		a.staged[k] = at
	}
}

// ReconfigStaged is when the last task of query on this runtime finished
// building the versions of epoch e from the staged plan (zero if none
// did): with the plan's commit time it shows how much of the build was
// done before the commit.
func (r *Runtime) ReconfigStaged(query string, e uint64) time.Time {
	r.rcApplies.mu.Lock()
	defer r.rcApplies.mu.Unlock()
	return r.rcApplies.staged[queryEpoch{query, e}]
}
