package coordinator

import (
	"strings"
	"sync"
	"time"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// acksReceived notes, on the leader, when the acknowledgements of every
// task of a reconfiguration plan have been received, before the Raft
// write that records the last of them (and switches the plan) is
// applied. It only observes: the plan's phases still advance in Raft.
// `bench reconfig` reports it beside the applied time, which adds that
// write (a log append with its fsync) to the update.
type acksReceived struct {
	mu sync.Mutex
	// seen is the newest epoch each task's reports acknowledged, until
	// Raft holds it (then the state says as much).
	seen map[string]uint64
	// at is when every task's acknowledgement of (query, epoch) was
	// received.
	at map[acksKey]time.Time
}

type acksKey struct {
	query string
	epoch uint64
}

// acksReceivedKeep bounds the plans remembered (the oldest go first in
// no particular order: a benchmark reads a plan's time soon after).
const acksReceivedKeep = 256

// noteAcksReceived takes the acknowledgements of a report received by the leader and
// records the plans whose every task has now acknowledged them.
func (s *Server) noteAcksReceived(reports []*pb.TaskState) {
	a := &s.acks
	now := time.Now()
	queries := map[string]bool{}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range reports {
		if t.Reconfig == nil || t.Reconfig.Acked == 0 {
			continue
		}
		if a.seen == nil {
			a.seen, a.at = map[string]uint64{}, map[acksKey]time.Time{}
		}
		a.seen[t.TaskId] = max(a.seen[t.TaskId], t.Reconfig.Acked)
		if q, _, ok := strings.Cut(t.TaskId, "/"); ok {
			queries[q] = true
		}
	}
	for name := range queries {
		q, err := s.State().Query(nil, name)
		if err != nil || q == nil || q.Reconfig == nil {
			continue
		}
		tasks, err := s.State().TasksByQuery(nil, name)
		if err != nil || len(tasks) == 0 {
			continue
		}
		for _, p := range q.Reconfig.Plans {
			k := acksKey{name, p.Epoch}
			if _, done := a.at[k]; done || p.Phase != fsm.ReconfigLoading {
				continue
			}
			all := true
			for _, t := range tasks {
				all = all && t.WorkerID != "" && max(t.ReconfigAcked, a.seen[t.ID]) >= p.Epoch
			}
			if all {
				if len(a.at) >= acksReceivedKeep {
					clear(a.at)
				}
				a.at[k] = now
			}
		}
		for _, t := range tasks {
			if a.seen[t.ID] <= t.ReconfigAcked {
				delete(a.seen, t.ID) // Raft has it
			}
		}
	}
}

// ReconfigAcksReceived is when this coordinator, as the leader, had
// received every task's acknowledgement of query's plan epoch (zero if it
// did not see that happen).
func (s *Server) ReconfigAcksReceived(query string, epoch uint64) time.Time {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return s.acks.at[acksKey{query, epoch}]
}
