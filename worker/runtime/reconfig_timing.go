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
	// inst is when the last task installed each epoch (installed).
	inst map[queryEpoch]time.Time
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

// installed records that a task of query installed epoch e at `at`: the
// runtime keeps the latest such time per epoch (ReconfigInstalled).
func (a *reconfigApplies) installed(query string, e uint64, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := queryEpoch{query, e}
	if a.inst == nil {
		a.inst = map[queryEpoch]time.Time{}
	}
	if _, ok := a.inst[k]; !ok && len(a.inst) >= maxReconfigApplies {
		clear(a.inst) // a benchmark reads an epoch's time soon after
	}
	if at.After(a.inst[k]) {
		a.inst[k] = at
	}
}

type queryEpoch struct {
	query string
	epoch uint64
}

// ReconfigInstalled is when the last task of query on this runtime that
// installed epoch e (loaded its versions, ready for its tuples) did so;
// zero if none did. With the Apply times (ReconfigApplies) it splits a
// live update into the plan's delivery, its installation in every task
// and the acknowledgement (a report and a Raft write).
func (r *Runtime) ReconfigInstalled(query string, e uint64) time.Time {
	r.rcApplies.mu.Lock()
	defer r.rcApplies.mu.Unlock()
	return r.rcApplies.inst[queryEpoch{query, e}]
}

// SetReconfigWake turns on (the default) or off the waking of a paced
// generator source to install a plan it is handed while waiting for its
// next record's due time; off, it installs the plan when it wakes, as
// before. It exists so that `bench reconfig --wake-ab` can measure what
// the wake saves within one run.
func (r *Runtime) SetReconfigWake(on bool) { r.rcWakeOff.Store(!on) }

// ReconfigHold is a generator source's pause for a quiescent plan (the
// comparison baseline): when it held while the plan loaded (Loading),
// held again at its marker (Marker) and resumed under the new versions
// once the plan completed (Resumed). A zero time: that step did not
// happen (a source may reach the plan's cut without holding while it
// loaded, when it learned the plan between two records of a burst).
type ReconfigHold struct {
	Task, Query              string
	Epoch                    uint64
	Loading, Marker, Resumed time.Time
}

type holdStep int

const (
	holdLoading holdStep = iota
	holdMarker
	holdResumed
)

// reconfigHolds keeps the latest ReconfigHold records of a runtime.
type reconfigHolds struct {
	mu   sync.Mutex
	list []ReconfigHold
}

// maxReconfigHolds bounds the records kept (the oldest dropped).
const maxReconfigHolds = 256

// note records step of task's hold for epoch e at `at` (the first time
// only: a source may hold several times while a plan loads).
func (h *reconfigHolds) note(task, query string, e uint64, step holdStep, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := slices.IndexFunc(h.list, func(x ReconfigHold) bool { return x.Task == task && x.Epoch == e && x.Query == query })
	if i < 0 {
		if len(h.list) >= maxReconfigHolds {
			h.list = slices.Delete(h.list, 0, 1)
		}
		h.list = append(h.list, ReconfigHold{Task: task, Query: query, Epoch: e})
		i = len(h.list) - 1
	}
	x := &h.list[i]
	for _, f := range []struct {
		s holdStep
		t *time.Time
	}{{holdLoading, &x.Loading}, {holdMarker, &x.Marker}, {holdResumed, &x.Resumed}} {
		if f.s == step && f.t.IsZero() {
			*f.t = at
		}
	}
}

// ReconfigHolds reports, oldest first, the quiescent pauses of this
// runtime's generator sources.
func (r *Runtime) ReconfigHolds() []ReconfigHold {
	r.rcHolds.mu.Lock()
	defer r.rcHolds.mu.Unlock()
	return slices.Clone(r.rcHolds.list)
}
