package runtime

import (
	"slices"
	"sync"
	"time"
)

// ReconfigApply is when an Apply first handed the tasks of a query here a
// reconfiguration epoch, and when it was done: parsing the epoch's
// configuration, building the versions that changed and installing them
// in the tasks that were idle (a source installs them at its next record,
// a busy task at its next release). Benchmarks read it to split a live
// update's time into learning the plan, this work and the report.
type ReconfigApply struct {
	Query       string
	Epoch       uint64
	Began, Done time.Time
}

// reconfigApplies keeps the latest ReconfigApply records of a runtime.
type reconfigApplies struct {
	mu sync.Mutex
	// seen is the newest epoch handed per query; list the records, the
	// oldest dropped past maxReconfigApplies.
	seen map[string]uint64
	list []ReconfigApply
}

const maxReconfigApplies = 64

// note records that an Apply that began at began handed the tasks of
// query epoch e, done now, unless an earlier Apply handed it already.
func (a *reconfigApplies) note(query string, e uint64, began, done time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e <= a.seen[query] {
		return
	}
	if a.seen == nil {
		a.seen = map[string]uint64{}
	}
	a.seen[query] = e
	if len(a.list) >= maxReconfigApplies {
		a.list = slices.Delete(a.list, 0, 1)
	}
	a.list = append(a.list, ReconfigApply{Query: query, Epoch: e, Began: began, Done: done})
}

// ReconfigApplies reports, oldest first, the latest reconfiguration
// epochs this runtime's Apply handed its tasks and how long that took.
func (r *Runtime) ReconfigApplies() []ReconfigApply {
	r.rcApplies.mu.Lock()
	defer r.rcApplies.mu.Unlock()
	return slices.Clone(r.rcApplies.list)
}
