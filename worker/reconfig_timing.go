package worker

import (
	"strings"
	"sync"
	"time"

	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// rcTimes records, per reconfiguration plan, when this worker's
// assignment watch returned the response that first carried it and when
// the last report carrying a task's acknowledgement of it left (normally
// the one report for every task here, see awaitReconfigSettled): the two ends
// of a live update's path that only the agent sees (the runtime records
// what lies between: the Apply that handed the tasks the plan, and their
// installs). Benchmarks read them (ReconfigTimes); nothing depends on
// them.
type rcTimes struct {
	mu   sync.Mutex
	seen map[rcKey]*rcStamp
}

type rcKey struct {
	query string
	epoch uint64
}

type rcStamp struct{ received, reported time.Time }

// rcTimesKeep bounds the plans remembered (all forgotten past it).
const rcTimesKeep = 256

// stamp returns the record of (query, epoch), creating it; under mu.
func (r *rcTimes) stamp(query string, epoch uint64) *rcStamp {
	k := rcKey{query, epoch}
	if s := r.seen[k]; s != nil {
		return s
	}
	if r.seen == nil || len(r.seen) >= rcTimesKeep {
		r.seen = map[rcKey]*rcStamp{}
	}
	s := &rcStamp{}
	r.seen[k] = s
	return s
}

// received notes that a watch response that came at `at` carried the
// newest plan of each query in specs.
func (r *rcTimes) received(specs []wrt.TaskSpec, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range specs {
		if e := s.Reconfig.Latest(); e > 0 {
			if st := r.stamp(s.Query, e); st.received.IsZero() {
				st.received = at
			}
		}
	}
}

// reported notes that a report carrying task id's acknowledgement of
// epoch acked (new: not in a report sent before) leaves at `at`.
func (r *rcTimes) reported(id string, acked uint64, at time.Time) {
	q, _, _ := strings.Cut(id, "/")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stamp(q, acked).reported = at
}

// ReconfigTimes is when this worker's assignment watch returned the
// response that first carried plan epoch of query, and when its last
// report carrying a task's acknowledgement of that plan was sent (zero:
// not seen).
func (w *Worker) ReconfigTimes(query string, epoch uint64) (received, reported time.Time) {
	w.rcTimes.mu.Lock()
	defer w.rcTimes.mu.Unlock()
	if s := w.rcTimes.seen[rcKey{query, epoch}]; s != nil {
		return s.received, s.reported
	}
	return time.Time{}, time.Time{}
}
