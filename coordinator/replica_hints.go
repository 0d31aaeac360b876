package coordinator

import (
	"sync"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// Replica state hints (issue 10 item 2): a DCAA task's input hears in
// band only the upstream replicas it reads, so when it re-subscribes it
// could not prefer a STABLE replica over one in UP_FAILURE or
// STABILIZATION that it does not read. The leader knows every replica's
// state from the workers' reports and passes those of the tasks a
// worker's tasks read to it in each heartbeat answer
// (HeartbeatResponse.replica_states), with their age on the leader's own
// clock; the worker takes them as hints, a state heard in band since
// winning (dcaa.UpstreamStates.At). Heartbeats rather than the
// assignment watch: state reports do not move a worker's assignment
// index (the watch wakes only on placement changes), and heartbeats come
// every quarter of the TTL anyway.

// stateNews notes when the leader learned each task copy's replica state
// from a report (ReportTasks). Volatile: a new leader knows no report's
// time, and counts the states it did not see reported as old as its
// notes (since). One note per task id reported; notes of tasks no
// longer in the state are dropped once the notes doubled since the last
// sweep (prune), so a leader that serves for months while queries come
// and go keeps about as many notes as there are tasks.
type stateNews struct {
	mu      sync.Mutex
	since   time.Time
	m       map[string]stateNote // task id -> its last state reported
	sweepAt int                  // prune sweeps when m reaches it
}

// minSweep is the fewest notes a sweep waits for: below it the notes cost
// less than sweeping them against the state.
const minSweep = 1024

type stateNote struct {
	gen   int
	state pb.ReplicaState
	at    time.Time
}

func newStateNews(now time.Time) *stateNews {
	return &stateNews{since: now, m: map[string]stateNote{}, sweepAt: minSweep}
}

// prune drops the notes of tasks exists says are gone, once the notes
// reached twice their number after the last sweep.
func (n *stateNews) prune(exists func(taskID string) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.m) < n.sweepAt {
		return
	}
	for id := range n.m {
		if !exists(id) {
			delete(n.m, id)
		}
	}
	n.sweepAt = max(minSweep, 2*len(n.m))
}

// note records a reported state (the time only when it changed).
func (n *stateNews) note(taskID string, gen int, st pb.ReplicaState, now time.Time) {
	if st == pb.ReplicaState_REPLICA_STATE_UNSPECIFIED {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	gen = max(gen, 1) // 0: not said, the first copy
	if old, ok := n.m[taskID]; ok && old.gen == gen && old.state == st {
		return
	}
	n.m[taskID] = stateNote{gen: gen, state: st, at: now}
}

// age is how long the leader has known task copy (taskID, gen) in state
// st: since its report; one it did not see reported (a report to an
// earlier leader, or one not applied yet) at least unnotedAge, so that a
// state a task heard in band wins over it (a new leader's first answers
// would otherwise pass old states as news).
func (n *stateNews) age(taskID string, gen int, st pb.ReplicaState, now time.Time) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.m[taskID]; ok && old.gen == gen && old.state == st {
		return now.Sub(old.at)
	}
	return max(now.Sub(n.since), unnotedAge)
}

// unnotedAge is the least age of a state the leader did not see
// reported: older than any state an input heard in band from a replica
// it reads (every boundary interval), so such a hint counts only for
// replicas the input has not heard for that long.
const unnotedAge = time.Minute

// replicaStateHints are the DCAA states of the tasks worker's tasks read
// (the upstream fragments of its fragments, as its assignment view has
// them), with their ages. Empty when none of its queries reports one.
func (s *Server) replicaStateHints(worker string, now time.Time) ([]*pb.ReplicaStateHint, error) {
	_, tasks, queries, err := s.State().WorkerAssignments(nil, worker)
	if err != nil {
		return nil, err
	}
	own := map[string]map[string]bool{} // query -> fragments the worker runs
	for _, t := range tasks {
		if own[t.Query] == nil {
			own[t.Query] = map[string]bool{}
		}
		own[t.Query][t.Fragment] = true
	}
	var out []*pb.ReplicaStateHint
	for _, q := range queries {
		needed := s.plans.neededFragments(q.Query, own[q.Query.Name])
		for _, t := range q.Tasks {
			if t.ReplicaState == "" || needed != nil && !needed[t.Fragment] {
				continue
			}
			st := pb.ReplicaState(pb.ReplicaState_value[t.ReplicaState])
			_, gen := consumerPlacement(t)
			out = append(out, &pb.ReplicaStateHint{TaskId: t.ID, Generation: int32(gen), State: st,
				AgeMs: s.stateNews.age(t.ID, gen, st, now).Milliseconds()})
		}
	}
	return out, nil
}
