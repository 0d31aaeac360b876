package coordinator

import (
	"bytes"
	"encoding/json"
	"slices"
	"sync"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// reconfigWire encodes a query's reconfiguration state for the assignment
// watch and keeps what it encoded. A commit that changes a plan's phase
// wakes the watch of every worker of the query at once, and each
// response carried the JSON of the whole state (every plan of the
// query's history, each with its full spec): encoded once per worker on
// the coordinator, then decoded in full by every worker, on the path of
// the plan's delivery (learned_ms of `bench reconfig`), growing with the
// number of plans. Now every plan is encoded once, while it does not
// change, and a worker that asks for it gets the plans one by one
// (QueryView.reconfig_plans_json) and decodes only those it has not seen.
type reconfigWire struct {
	mu      sync.Mutex
	byQuery map[string]*wireEntry
}

// wireEntry is the encoding of one query's reconfiguration state.
type wireEntry struct {
	createIndex uint64
	// rc is the state encoded: state store objects are never modified
	// in place, so the same pointer means the same state.
	rc    *fsm.QueryReconfig
	plans [][]byte
	// whole is rc's JSON as one document, for workers that read
	// QueryView.reconfig_json (nil until one asks).
	whole []byte
}

// reconfigWireKeep bounds the queries remembered (all forgotten past it:
// the next response encodes its query again).
const reconfigWireKeep = 256

// entry returns q's encoded reconfiguration state, encoding only the
// plans that differ from the previous state encoded for q.
func (w *reconfigWire) entry(q *fsm.Query) (*wireEntry, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rc := q.Reconfig
	prev := w.byQuery[q.Name]
	if prev != nil && prev.createIndex == q.CreateIndex && prev.rc == rc {
		return prev, nil
	}
	e := &wireEntry{createIndex: q.CreateIndex, rc: rc, plans: make([][]byte, len(rc.Plans))}
	for i := range rc.Plans {
		if prev != nil && prev.createIndex == q.CreateIndex && i < len(prev.rc.Plans) && samePlan(&prev.rc.Plans[i], &rc.Plans[i]) {
			e.plans[i] = prev.plans[i]
			continue
		}
		b, err := json.Marshal(&rc.Plans[i])
		if err != nil {
			return nil, err
		}
		e.plans[i] = b
	}
	if w.byQuery == nil || len(w.byQuery) >= reconfigWireKeep {
		w.byQuery = map[string]*wireEntry{}
	}
	w.byQuery[q.Name] = e
	return e, nil
}

// fill sets view's reconfiguration state for q: the plans one by one
// when split (the worker asked for them), else the whole JSON.
func (w *reconfigWire) fill(view *pb.QueryView, q *fsm.Query, split bool) error {
	if q.Reconfig == nil {
		return nil
	}
	e, err := w.entry(q)
	if err != nil {
		return err
	}
	if split {
		view.ReconfigState, view.ReconfigTracking, view.ReconfigPlansJson = true, q.Reconfig.Tracking, e.plans
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.whole == nil {
		if e.whole, err = json.Marshal(e.rc); err != nil {
			return err
		}
	}
	view.ReconfigJson = e.whole
	return nil
}

// samePlan reports whether a and b are equal in every field, so that
// they have the same JSON.
func samePlan(a, b *fsm.ReconfigPlan) bool {
	return a.Epoch == b.Epoch && a.Strategy == b.Strategy && a.Phase == b.Phase && a.SwitchMargin == b.SwitchMargin &&
		a.Cut == b.Cut && a.CommittedAt == b.CommittedAt && a.SwitchIndex == b.SwitchIndex && a.CompleteIndex == b.CompleteIndex &&
		bytes.Equal(a.SpecJSON, b.SpecJSON) &&
		slices.EqualFunc(a.Changes, b.Changes, func(x, y fsm.OperatorChange) bool {
			return x.Operator == y.Operator && x.Version == y.Version && bytes.Equal(x.SpecJSON, y.SpecJSON)
		})
}
