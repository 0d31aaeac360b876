package coordinator

import (
	"encoding/json"
	"slices"
	"sync"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// reconfigStaging holds, on the leader, the reconfiguration plans it is
// committing: validated and proposed to Raft, not yet applied. The
// assignment watch sends them to the workers (WatchAssignmentsResponse
// staged) while the plan's Raft write runs, and a worker builds the new
// versions of its tasks then, with no effect on them. When the commit
// reaches it, a worker only installs what it built (a pointer swap per
// operator) instead of parsing the new configuration and compiling its
// operators on the plan's path. A worker decides nothing from a staged
// plan: a plan acts only once committed, and a build that does not match
// the committed plan of its epoch is discarded (worker/runtime, stage).
//
// Only the leader stages, and only for the workers watching it; a worker
// watching another coordinator learns the plan at its commit, as before.
type reconfigStaging struct {
	mu sync.Mutex
	// gen counts the changes of plans; changed is closed at the next.
	gen     uint64
	changed chan struct{}
	plans   []*pb.StagedPlan
}

// stage adds query's plan (proposed, not yet committed) and wakes the
// watches. It returns the function that withdraws it once the proposal
// returned (committed or not).
func (st *reconfigStaging) stage(q *fsm.Query, plan fsm.ReconfigPlan) (done func(committed bool)) {
	b, err := json.Marshal(&plan)
	if err != nil {
		return func(bool) {} // not staged: the workers build at the commit
	}
	sp := &pb.StagedPlan{Query: q.Name, QueryIndex: q.CreateIndex, PlanJson: b}
	st.mu.Lock()
	st.plans = append(slices.DeleteFunc(st.plans, func(p *pb.StagedPlan) bool { return p.Query == q.Name }), sp)
	st.bumpLocked()
	st.mu.Unlock()
	return func(committed bool) {
		st.mu.Lock()
		defer st.mu.Unlock()
		n := len(st.plans)
		st.plans = slices.DeleteFunc(st.plans, func(p *pb.StagedPlan) bool { return p == sp })
		if !committed && len(st.plans) != n {
			// Tell the workers: they discard what they built for it.
			// A committed plan reaches them through the state instead.
			st.bumpLocked()
		}
	}
}

func (st *reconfigStaging) bumpLocked() {
	st.gen++
	if st.changed != nil {
		close(st.changed)
	}
	st.changed = make(chan struct{})
}

// current returns the generation, the plans staged in it and the channel
// closed at the next change.
func (st *reconfigStaging) current() (uint64, []*pb.StagedPlan, <-chan struct{}) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.changed == nil {
		st.changed = make(chan struct{})
	}
	return st.gen, slices.Clone(st.plans), st.changed
}
