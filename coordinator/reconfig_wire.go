package coordinator

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
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
	// digests are the plans' digests (PlanDigest), by plan.
	digests []uint64
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
	e := &wireEntry{createIndex: q.CreateIndex, rc: rc, plans: make([][]byte, len(rc.Plans)), digests: make([]uint64, len(rc.Plans))}
	for i := range rc.Plans {
		if prev != nil && prev.createIndex == q.CreateIndex && i < len(prev.rc.Plans) && samePlan(&prev.rc.Plans[i], &rc.Plans[i]) {
			e.plans[i], e.digests[i] = prev.plans[i], prev.digests[i]
			continue
		}
		b, err := json.Marshal(&rc.Plans[i])
		if err != nil {
			return nil, err
		}
		e.plans[i], e.digests[i] = b, PlanDigest(b)
	}
	if w.byQuery == nil || len(w.byQuery) >= reconfigWireKeep {
		w.byQuery = map[string]*wireEntry{}
	}
	w.byQuery[q.Name] = e
	return e, nil
}

// fill sets view's reconfiguration state for q: the plans one by one
// when split (the worker asked for them), else the whole JSON. The JSON
// of a split plan whose digest is in have (the worker holds it) is left
// out.
func (w *reconfigWire) fill(view *pb.QueryView, q *fsm.Query, split bool, have map[uint64]bool) error {
	if q.Reconfig == nil {
		return nil
	}
	e, err := w.entry(q)
	if err != nil {
		return err
	}
	if split {
		view.ReconfigState, view.ReconfigTracking, view.ReconfigPlansJson = true, q.Reconfig.Tracking, e.plans
		view.ReconfigPlanDigests = e.digests
		if len(have) > 0 {
			// A copy: e.plans is shared by every response.
			view.ReconfigPlansJson = make([][]byte, len(e.plans))
			for i, b := range e.plans {
				if !have[e.digests[i]] {
					view.ReconfigPlansJson[i] = b
				}
			}
		}
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

// PlanDigest is the digest of a plan's JSON that a worker names the
// plans it holds by (QueryView.reconfig_plan_digests): the first 8 bytes
// of its SHA-256, big-endian.
func PlanDigest(planJSON []byte) uint64 {
	sum := sha256.Sum256(planJSON)
	return binary.BigEndian.Uint64(sum[:8])
}
