package coordinator

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// acksReceived is the leader's record of the reconfiguration
// acknowledgements it has received, ahead of Raft. A live update is done
// ("every task acknowledged": every task runs the plan's versions beside
// the old ones) when the leader holds the acknowledgement of every task
// of the query, each from the copy the leader's state places it on: that
// is when ReconfigAcksReceived records it, and the time `bench reconfig`
// takes. The durable record follows: the Raft write of the reports (the
// last one switches the plan, which then sets its cut). The record never
// advances a plan: the phases still advance only in Raft, and `query
// versions` shows only what Raft holds. A report's RPC returns only once
// it is written, so an acknowledgement this leader held but never wrote
// (it lost the leadership) is an error to its worker, which reports again
// to the next leader: nothing is lost, and the next leader decides from
// what it receives itself (seen is cleared when leadership ends).
type acksReceived struct {
	mu sync.Mutex
	// seen is the newest epoch each task's reports acknowledged, with
	// the copy that reported it, until Raft holds it (then the state
	// says as much).
	seen map[string]ackSeen
	// at is when every task's acknowledgement of (query, epoch) was
	// received.
	at map[acksKey]time.Time
	// began is when the first Raft write to begin after at did (the one
	// carrying the last acknowledgement, or one queued before it).
	began map[acksKey]time.Time
	// parked are the reports held until the report that completes a
	// plan's acknowledgements arrives (writeReport).
	parked []*parkedReport
	// holdFor replaces reconfigAckHold when set (tests).
	holdFor time.Duration
	// applied is when this coordinator's state machine applied each
	// plan (the commit as this coordinator sees it, ReconfigCommitted).
	applied map[acksKey]time.Time
	// served is when each worker's assignment watch first answered
	// with each plan (ReconfigServed).
	served map[servedKey]servedAt
}

// servedKey is one worker's watch answering with one plan.
type servedKey struct {
	acksKey
	worker string
}

// servedAt is when a watch woke (its last read began) and had built its
// response.
type servedAt struct{ woke, built time.Time }

// parkedReport is a worker's report waiting to be written with others.
type parkedReport struct {
	upd fsm.UpdateTaskStatesRequest
	// done receives the report's outcome once written (capacity one:
	// the writer never waits for the reader).
	done chan error
}

// reconfigAckHold bounds how long the leader holds a report that
// acknowledges a plan some other task has not acknowledged yet: about
// the spread between the workers' reports at low load (they learn the
// plan within a few milliseconds of each other, and each holds its own
// report until all its tasks installed the plan, reconfigSettleMax in
// the worker). A report held longer is written on its own, as before.
const reconfigAckHold = 20 * time.Millisecond

// ackSeen is an acknowledgement received from one copy of a task.
type ackSeen struct {
	epoch  uint64
	worker string
	// gen is the copy's generation (0: the report did not say).
	gen int
}

// of is the epoch the acknowledgement stands for in task t as the state
// has it now: none (0) when t is no longer the copy that sent it (moved
// or restarted since: its new copy has not installed anything yet).
func (a ackSeen) of(t *fsm.Task) uint64 {
	if a.worker != t.WorkerID || (a.gen != 0 && a.gen != t.Gen()) {
		return 0
	}
	return a.epoch
}

type acksKey struct {
	query string
	epoch uint64
}

// acksReceivedKeep bounds the plans remembered (the oldest go first in
// no particular order: a benchmark reads a plan's time soon after).
const acksReceivedKeep = 256

// noteAcksReceived takes the acknowledgements of a report received by the leader and
// records the plans whose every task has now acknowledged them. hold
// reports whether the report acknowledges a plan that is still loading
// and that only tasks placed on other workers than worker (the
// reporting one) have not acknowledged yet (writeReport holds such a
// report for the one that completes the plan).
func (s *Server) noteAcksReceived(worker string, reports []*pb.TaskState) (hold bool) {
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
			a.seen = map[string]ackSeen{}
		}
		if a.at == nil {
			a.at = map[acksKey]time.Time{}
		}
		got := ackSeen{epoch: t.Reconfig.Acked, worker: worker, gen: int(t.Generation)}
		if prev, ok := a.seen[t.TaskId]; ok && prev.worker == got.worker && prev.gen == got.gen {
			got.epoch = max(got.epoch, prev.epoch)
		}
		a.seen[t.TaskId] = got
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
				all = all && t.WorkerID != "" && max(t.ReconfigAcked, a.seen[t.ID].of(t)) >= p.Epoch
			}
			if !all {
				// Hold only for acknowledgements that can come soon
				// from other workers: this worker's own missing ones
				// come in its next report, which waits for this one,
				// and an unplaced task acknowledges nothing.
				news, others := false, true
				for _, t := range tasks {
					news = news || (t.ReconfigAcked < p.Epoch && acksIn(reports, t.ID) >= p.Epoch)
					if max(t.ReconfigAcked, a.seen[t.ID].of(t)) < p.Epoch && (t.WorkerID == "" || t.WorkerID == worker) {
						others = false
					}
				}
				hold = hold || (news && others)
			}
			if all {
				if len(a.at) >= acksReceivedKeep {
					clear(a.at)
					clear(a.began)
				}
				a.at[k] = now
			}
		}
		for _, t := range tasks {
			if a.seen[t.ID].of(t) <= t.ReconfigAcked {
				delete(a.seen, t.ID) // Raft has it, or it is stale
			}
		}
	}
	return hold
}

// acksIn is the epoch the reports acknowledge for task id (0: none).
func acksIn(reports []*pb.TaskState, id string) uint64 {
	for _, t := range reports {
		if t.TaskId == id && t.Reconfig != nil {
			return t.Reconfig.Acked
		}
	}
	return 0
}

// writeReport commits a worker's report (UpdateTaskStates). A plan
// switches once every task's acknowledgement is applied in Raft, and each
// write is a log append with its fsync: written as they came, the first
// worker's report went alone and the last one's waited for that write
// before its own, two writes on the path of every plan. So a report that
// acknowledges a plan still waiting for other tasks (hold) is held, for
// reconfigAckHold at most, and the next report that needs no holding
// (normally the one completing the plan's acknowledgements) is written
// in one entry with every report held (UpdateTaskStatesBatch, once every
// coordinator speaks protocol 10). Holding delays no decision: the plan
// cannot switch before the last acknowledgement anyway.
func (s *Server) writeReport(ctx context.Context, upd fsm.UpdateTaskStatesRequest, wait bool) error {
	a := &s.acks
	batching := s.canPropose(fsm.UpdateTaskStatesBatchType) == nil
	if !batching {
		return s.writeReports(ctx, []*parkedReport{{upd: upd, done: make(chan error, 1)}})
	}
	own := &parkedReport{upd: upd, done: make(chan error, 1)}
	if !wait {
		a.mu.Lock()
		batch := append(a.parked, own)
		a.parked = nil
		a.mu.Unlock()
		if err := s.writeReports(ctx, batch); err != nil {
			return err
		}
		return <-own.done
	}
	a.mu.Lock()
	a.parked = append(a.parked, own)
	hold := cmp.Or(a.holdFor, reconfigAckHold)
	a.mu.Unlock()
	limit := time.NewTimer(hold)
	defer limit.Stop()
	select {
	case err := <-own.done:
		return err
	case <-limit.C:
	case <-ctx.Done():
	}
	// Held long enough (or the caller gave up): write what is held,
	// unless a writer took this report meanwhile.
	a.mu.Lock()
	batch := a.parked
	taken := !slices.Contains(batch, own)
	if !taken {
		a.parked = nil
	}
	a.mu.Unlock()
	if !taken {
		if err := s.writeReports(ctx, batch); err != nil {
			return err
		}
	}
	return <-own.done
}

// writeReports commits the reports in one entry (one report: the plain
// UpdateTaskStates) and tells each its outcome on its done channel. Its
// error is the write's own (nothing was delivered then: every report
// gets it too). The write does not end with any one caller's context:
// it carries the other reports.
func (s *Server) writeReports(ctx context.Context, batch []*parkedReport) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	s.noteAcksWriteBegan()
	deliver := func(err error) error {
		for _, p := range batch {
			p.done <- err
		}
		return err
	}
	if len(batch) == 1 {
		res, err := s.apply(wctx, fsm.UpdateTaskStatesType, batch[0].upd)
		if err == nil && res.Err != nil {
			err = status.Errorf(codes.FailedPrecondition, "report tasks: %v", res.Err)
		}
		deliver(err)
		return nil
	}
	req := fsm.UpdateTaskStatesBatchRequest{}
	for _, p := range batch {
		req.Reports = append(req.Reports, p.upd)
	}
	res, err := s.apply(wctx, fsm.UpdateTaskStatesBatchType, req)
	if err != nil {
		return deliver(err)
	}
	if res.Err != nil {
		return deliver(status.Errorf(codes.FailedPrecondition, "report tasks: %v", res.Err))
	}
	out, _ := res.Value.(*fsm.UpdateTaskStatesBatchResult)
	for i, p := range batch {
		var err error
		if out != nil && i < len(out.Errs) && out.Errs[i] != "" {
			err = status.Errorf(codes.FailedPrecondition, "report tasks: %s", out.Errs[i])
		}
		p.done <- err
	}
	return nil
}

// noteAcksWriteBegan records, for every plan whose acknowledgements are
// all received, that a write of reports begins now, unless one did
// since.
func (s *Server) noteAcksWriteBegan() {
	a := &s.acks
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.at {
		if _, ok := a.began[k]; !ok {
			if a.began == nil {
				a.began = map[acksKey]time.Time{}
			}
			a.began[k] = now
		}
	}
}

// ReconfigAcksWriteBegan is when this coordinator, as the leader, began
// the first Raft write of reports after it had received every task's
// acknowledgement of query's plan epoch (zero if it did not see that).
// From there to the plan's switch is the write itself (log append with
// its fsync, the state machine); from ReconfigAcksReceived to here, the
// wait for it to begin.
func (s *Server) ReconfigAcksWriteBegan(query string, epoch uint64) time.Time {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return s.acks.began[acksKey{query, epoch}]
}

// ReconfigAcksReceived is when this coordinator, as the leader, had
// received every task's acknowledgement of query's plan epoch (zero if it
// did not see that happen).
func (s *Server) ReconfigAcksReceived(query string, epoch uint64) time.Time {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return s.acks.at[acksKey{query, epoch}]
}

// acksLeadershipEnded forgets the acknowledgements this coordinator held
// as the leader and fails every report still held for a batch: none of
// them was written, so each worker reports again, to the next leader,
// which decides from what it receives itself (acksReceived).
func (s *Server) acksLeadershipEnded() {
	a := &s.acks
	a.mu.Lock()
	parked := a.parked
	a.parked = nil
	clear(a.seen)
	a.mu.Unlock()
	for _, p := range parked {
		p.done <- status.Error(codes.Unavailable, "report tasks: leadership lost before the report was written; report again")
	}
}

// notePlanApplied records that the state machine applied the
// ReconfigureQuery command body with result res at `at` (a plan it
// refused or had applied before is not noted).
func (a *acksReceived) notePlanApplied(body []byte, res any, at time.Time) {
	r, ok := res.(*fsm.ApplyResult)
	if !ok || r.Err != nil || r.Deduplicated {
		return
	}
	epoch, ok := r.Value.(uint64)
	if !ok {
		return
	}
	var req struct {
		Query string `json:"query"`
	}
	if json.Unmarshal(body, &req) != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.applied == nil || len(a.applied) >= acksReceivedKeep {
		a.applied = map[acksKey]time.Time{}
	}
	a.applied[acksKey{req.Query, epoch}] = at
}

// ReconfigCommitted is when this coordinator's state machine applied
// query's plan epoch (zero if it did not, since it started): the plan's
// commit, the start of a live update, as this coordinator saw it, ahead of
// any reader woken by the change.
func (s *Server) ReconfigCommitted(query string, epoch uint64) time.Time {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return s.acks.applied[acksKey{query, epoch}]
}

// noteServed records that worker's assignment watch, woken at woke,
// built at built a response carrying plan epoch of query (the first such
// response only).
func (a *acksReceived) noteServed(worker, query string, epoch uint64, woke, built time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := servedKey{acksKey{query, epoch}, worker}
	if _, ok := a.served[k]; ok {
		return
	}
	if a.served == nil || len(a.served) >= 4*acksReceivedKeep {
		a.served = map[servedKey]servedAt{}
	}
	a.served[k] = servedAt{woke, built}
}

// ReconfigServed is when this coordinator's assignment watches, for the
// last of the workers they served with query's plan epoch, woke and had
// built the response that first carried it (zero: none did). From the
// commit (ReconfigCommitted) to woke is the wake of the watch; built to
// the worker's receipt of the response, its transfer.
func (s *Server) ReconfigServed(query string, epoch uint64) (woke, built time.Time) {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	for k, at := range s.acks.served {
		if k.acksKey == (acksKey{query, epoch}) {
			woke, built = later(woke, at.woke), later(built, at.built)
		}
	}
	return woke, built
}

// later is the later of a and b (the zero time counts as earliest).
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
