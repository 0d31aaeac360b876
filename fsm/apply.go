package fsm

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/fedstream/fedstream/rpc/authz"
	"github.com/fedstream/fedstream/rpc/states"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

type stringSet map[string]struct{}

func (s stringSet) add(v string) { s[v] = struct{}{} }

func (s stringSet) sorted() []string {
	out := make([]string, 0, len(s))
	for v := range s {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// Assignment views. A worker's view depends on: the tasks placed on it, and
// for every query with a task on it, the query record, all its tasks'
// placements and the addresses of the workers hosting them. A command that
// changes any of these for a set of queries calls addHosts for those queries
// before and after its change and then bumpAssignIndex on the union, which
// covers workers that gained, lost or kept tasks of those queries.

// addHosts adds to into every worker hosting a task of one of the queries.
func (tx *writeTx) addHosts(queries stringSet, into stringSet) error {
	for q := range queries {
		tasks, err := txList[Task](tx, TableTasks, indexQuery, q)
		if err != nil {
			return err
		}
		for _, t := range tasks {
			if t.WorkerID != "" {
				into.add(t.WorkerID)
			}
			if t.MovingFrom != "" {
				into.add(t.MovingFrom)
			}
		}
	}
	return nil
}

// queriesOnWorker returns the queries with a task placed on the worker.
func (tx *writeTx) queriesOnWorker(workerID string) (stringSet, error) {
	tasks, err := txList[Task](tx, TableTasks, indexWorker, workerID)
	if err != nil {
		return nil, err
	}
	out := stringSet{}
	for _, t := range tasks {
		out.add(t.Query)
	}
	return out, nil
}

// bumpAssignIndex sets AssignIndex and ModifyIndex of the (still existing)
// workers to the transaction's index.
func (tx *writeTx) bumpAssignIndex(workers stringSet) error {
	for _, id := range workers.sorted() {
		w, err := txFirst[Worker](tx, TableWorkers, id)
		if err != nil {
			return err
		}
		if w == nil || w.AssignIndex == tx.index && w.ModifyIndex == tx.index {
			continue
		}
		updated := *w
		updated.AssignIndex = tx.index
		updated.ModifyIndex = tx.index
		if err := tx.insert(TableWorkers, &updated); err != nil {
			return err
		}
	}
	return nil
}

// deleteTasksOf deletes every task of a query.
func (tx *writeTx) deleteTasksOf(query string) error {
	n, err := tx.txn.DeleteAll(TableTasks, indexQuery, query)
	if err != nil {
		return fmt.Errorf("delete tasks of %q: %w", query, err)
	}
	if n > 0 {
		tx.touched[TableTasks] = struct{}{}
	}
	return nil
}

func validWorkerStatus(s string) bool {
	return s == WorkerStatusReady || s == WorkerStatusDown || s == WorkerStatusUnknown
}

func (r *RegisterWorkerRequest) idempotencyKey() string { return r.IdempotencyKey }

func (r *RegisterWorkerRequest) decodeResult(raw []byte) (any, error) {
	var id string
	err := json.Unmarshal(raw, &id)
	return id, err
}

func (r *RegisterWorkerRequest) apply(tx *writeTx) (any, error) {
	w := r.Worker
	if w.ID == "" {
		return nil, invalid("register worker: empty worker id")
	}
	if w.Status == "" {
		w.Status = WorkerStatusReady
	}
	if !validWorkerStatus(w.Status) {
		return nil, invalid("register worker %q: status %q is not %q, %q or %q", w.ID, w.Status, WorkerStatusReady, WorkerStatusDown, WorkerStatusUnknown)
	}
	if w.Cores < 0 {
		return nil, invalid("register worker %q: negative cores %d", w.ID, w.Cores)
	}
	if len(w.Labels) == 0 {
		w.Labels = nil // nil and empty are one value; keeps snapshots exact
	}
	existing, err := txFirst[Worker](tx, TableWorkers, w.ID)
	if err != nil {
		return nil, err
	}
	if r.ReplaceSameAddr && w.Addr != "" {
		if err := tx.removeOthersAt(w.ID, w.Addr); err != nil {
			return nil, err
		}
	}
	w.ModifyIndex = tx.index
	if r.At != 0 && (existing == nil || existing.Status != w.Status || existing.StatusSince == 0) {
		w.StatusSince = r.At
	} else if existing != nil {
		w.StatusSince = existing.StatusSince
	}
	if existing == nil {
		// A new worker has an empty view as of now.
		w.CreateIndex, w.AssignIndex = tx.index, tx.index
		return w.ID, tx.insert(TableWorkers, &w)
	}
	w.CreateIndex, w.AssignIndex = existing.CreateIndex, existing.AssignIndex
	if existing.Addr == w.Addr {
		return w.ID, tx.insert(TableWorkers, &w)
	}
	// The address is part of the view of every worker sharing a query.
	queries, err := tx.queriesOnWorker(w.ID)
	if err != nil {
		return nil, err
	}
	affected := stringSet{}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	if err := tx.insert(TableWorkers, &w); err != nil {
		return nil, err
	}
	return w.ID, tx.bumpAssignIndex(affected)
}

func (r *SetWorkerStatusRequest) apply(tx *writeTx) (any, error) {
	if !validWorkerStatus(r.Status) {
		return nil, invalid("set status of worker %q: status %q is not %q, %q or %q", r.WorkerID, r.Status, WorkerStatusReady, WorkerStatusDown, WorkerStatusUnknown)
	}
	if len(r.WorkerIDs) > 0 {
		for _, id := range r.WorkerIDs {
			if _, err := r.set(tx, id); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	found, err := r.set(tx, r.WorkerID)
	if err == nil && !found {
		err = fmt.Errorf("%w: %q", ErrWorkerNotFound, r.WorkerID)
	}
	return nil, err
}

// set applies the status to one worker; found is false if it is unknown.
func (r *SetWorkerStatusRequest) set(tx *writeTx, id string) (found bool, err error) {
	w, err := txFirst[Worker](tx, TableWorkers, id)
	if err != nil || w == nil {
		return false, err
	}
	if w.Status == r.Status && (w.StatusSince != 0 || r.At == 0) {
		return true, nil // no write: watchers are not woken for nothing
	}
	updated := *w
	updated.Status = r.Status
	if r.At != 0 {
		updated.StatusSince = r.At
	}
	updated.ModifyIndex = tx.index
	return true, tx.insert(TableWorkers, &updated)
}

// removeOthersAt deletes every worker other than keep registered at addr,
// unplacing its tasks (see DeleteWorkerRequest).
func (tx *writeTx) removeOthersAt(keep, addr string) error {
	workers, err := txList[Worker](tx, TableWorkers, indexID)
	if err != nil {
		return err
	}
	for _, old := range workers {
		if old.ID == keep || old.Addr != addr {
			continue
		}
		if _, err := (&DeleteWorkerRequest{WorkerID: old.ID, reason: fmt.Sprintf("worker %s replaced by %s at %s", old.ID, keep, addr)}).apply(tx); err != nil {
			return err
		}
	}
	return nil
}

func (r *DeleteWorkerRequest) apply(tx *writeTx) (any, error) {
	w, err := txFirst[Worker](tx, TableWorkers, r.WorkerID)
	if err != nil {
		return nil, err
	}
	if w == nil {
		return nil, fmt.Errorf("%w: %q", ErrWorkerNotFound, r.WorkerID)
	}
	tasks, err := txList[Task](tx, TableTasks, indexWorker, r.WorkerID)
	if err != nil {
		return nil, err
	}
	queries := stringSet{}
	for _, t := range tasks {
		queries.add(t.Query)
	}
	affected := stringSet{}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	for _, t := range tasks {
		updated := *t
		updated.WorkerID = ""
		// The copy on the deleted worker is gone: the next is a new one.
		updated.Generation = t.Gen() + 1
		updated.resetReconfig()
		updated.Lossy = false
		updated.State = TaskStatePending
		updated.Message = fmt.Sprintf("worker %s deleted", r.WorkerID)
		if r.reason != "" {
			updated.Message = r.reason
		}
		updated.ModifyIndex = tx.index
		if err := tx.insert(TableTasks, &updated); err != nil {
			return nil, err
		}
	}
	if err := tx.delete(TableWorkers, w); err != nil {
		return nil, err
	}
	return nil, tx.bumpAssignIndex(affected) // skips the deleted worker
}

func (r *SubmitQueryRequest) idempotencyKey() string { return r.IdempotencyKey }

func (r *SubmitQueryRequest) decodeResult(raw []byte) (any, error) {
	var name string
	err := json.Unmarshal(raw, &name)
	return name, err
}

func (r *SubmitQueryRequest) apply(tx *writeTx) (any, error) {
	q := r.Query
	if q.Name == "" {
		return nil, invalid("submit query: empty name")
	}
	if q.Replicas < 0 {
		return nil, invalid("submit query %q: negative replicas %d", q.Name, q.Replicas)
	}
	existing, err := txFirst[Query](tx, TableQueries, q.Name)
	if err != nil {
		return nil, err
	}
	if existing != nil && existing.Status == QueryStatusRunning {
		return nil, fmt.Errorf("%w: %q", ErrQueryExists, q.Name)
	}
	tasks := make([]Task, len(r.Tasks))
	seen := stringSet{}
	for i, t := range r.Tasks {
		if t.Query == "" {
			t.Query = q.Name
		}
		if t.Query != q.Name {
			return nil, invalid("submit query %q: task %q belongs to query %q", q.Name, t.ID, t.Query)
		}
		if t.Fragment == "" || t.Partition < 0 || t.Replica < 0 {
			return nil, invalid("submit query %q: task %q needs a fragment and non-negative partition and replica", q.Name, t.ID)
		}
		if want := TaskID(t.Query, t.Fragment, t.Partition, t.Replica); t.ID != want {
			return nil, invalid("submit query %q: task id %q should be %q", q.Name, t.ID, want)
		}
		if _, dup := seen[t.ID]; dup {
			return nil, invalid("submit query %q: duplicate task %q", q.Name, t.ID)
		}
		seen.add(t.ID)
		if t.WorkerID != "" {
			w, err := txFirst[Worker](tx, TableWorkers, t.WorkerID)
			if err != nil {
				return nil, err
			}
			if w == nil {
				return nil, fmt.Errorf("%w: %q (task %q of query %q)", ErrWorkerNotFound, t.WorkerID, t.ID, q.Name)
			}
		}
		if t.State == "" {
			t.State = TaskStatePending
		}
		if t.Generation < 1 {
			t.Generation = 1
		}
		t.CreateIndex, t.ModifyIndex = tx.index, tx.index
		tasks[i] = t
	}

	queries := stringSet{q.Name: {}}
	affected := stringSet{}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	// A stopped query has no tasks (StopQuery deletes them); delete any left
	// anyway so the replacement starts clean.
	if err := tx.deleteTasksOf(q.Name); err != nil {
		return nil, err
	}
	if err := tx.deleteSlotMapsOf(q.Name); err != nil {
		return nil, err
	}
	for i := range tasks {
		other, err := txFirst[Task](tx, TableTasks, tasks[i].ID)
		if err != nil {
			return nil, err
		}
		if other != nil {
			return nil, invalid("submit query %q: task id %q is taken by query %q", q.Name, tasks[i].ID, other.Query)
		}
		if err := tx.insert(TableTasks, &tasks[i]); err != nil {
			return nil, err
		}
	}
	q.Status = QueryStatusRunning
	if len(q.SpecJSON) == 0 {
		q.SpecJSON = nil
	}
	q.CreateIndex, q.ModifyIndex = tx.index, tx.index
	if err := tx.insert(TableQueries, &q); err != nil {
		return nil, err
	}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	return q.Name, tx.bumpAssignIndex(affected)
}

func (r *StopQueryRequest) idempotencyKey() string { return r.IdempotencyKey }

func (r *StopQueryRequest) decodeResult(raw []byte) (any, error) {
	var name string
	err := json.Unmarshal(raw, &name)
	return name, err
}

func (r *StopQueryRequest) apply(tx *writeTx) (any, error) {
	q, err := txFirst[Query](tx, TableQueries, r.Name)
	if err != nil {
		return nil, err
	}
	if q == nil {
		return nil, fmt.Errorf("%w: %q", ErrQueryNotFound, r.Name)
	}
	if q.Status == QueryStatusStopped {
		return r.Name, nil
	}
	affected := stringSet{}
	if err := tx.addHosts(stringSet{r.Name: {}}, affected); err != nil {
		return nil, err
	}
	if err := tx.deleteTasksOf(r.Name); err != nil {
		return nil, err
	}
	if err := tx.deleteSlotMapsOf(r.Name); err != nil {
		return nil, err
	}
	updated := *q
	updated.Status = QueryStatusStopped
	updated.ModifyIndex = tx.index
	if err := tx.insert(TableQueries, &updated); err != nil {
		return nil, err
	}
	return r.Name, tx.bumpAssignIndex(affected)
}

func (r *PlaceTasksRequest) apply(tx *writeTx) (any, error) {
	result := &PlaceTasksResult{}
	type move struct{ taskID, workerID, message string }
	var moves []move
	queries := stringSet{}
	workerExists := map[string]bool{"": true}
	for _, p := range r.Placements {
		t, err := txFirst[Task](tx, TableTasks, p.TaskID)
		if err != nil {
			return nil, err
		}
		exists, known := workerExists[p.WorkerID]
		if !known {
			w, err := txFirst[Worker](tx, TableWorkers, p.WorkerID)
			if err != nil {
				return nil, err
			}
			exists = w != nil
			workerExists[p.WorkerID] = exists
		}
		if t == nil || !exists {
			result.Skipped = append(result.Skipped, p.TaskID)
			continue
		}
		queries.add(t.Query)
		moves = append(moves, move{p.TaskID, p.WorkerID, p.Message})
	}
	affected := stringSet{}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	// Apply in order, re-reading each task: a task may appear twice and the
	// last placement wins.
	for _, m := range moves {
		t, err := txFirst[Task](tx, TableTasks, m.taskID)
		if err != nil {
			return nil, err
		}
		if t.WorkerID == m.workerID {
			if m.workerID == "" && t.Message != m.message {
				// Still waiting, for a new reason: no view changes.
				updated := *t
				updated.Message = m.message
				updated.ModifyIndex = tx.index
				if err := tx.insert(TableTasks, &updated); err != nil {
					return nil, err
				}
			}
			continue
		}
		updated := *t
		updated.WorkerID = m.workerID
		updated.resetReconfig() // another copy now
		updated.State = TaskStatePending
		updated.Message = m.message
		updated.ModifyIndex = tx.index
		if err := tx.insert(TableTasks, &updated); err != nil {
			return nil, err
		}
		result.Moved++
	}
	if result.Moved == 0 {
		return result, nil
	}
	if err := tx.addHosts(queries, affected); err != nil {
		return nil, err
	}
	return result, tx.bumpAssignIndex(affected)
}

func (r *UpdateTaskStatesRequest) apply(tx *writeTx) (any, error) {
	w, err := txFirst[Worker](tx, TableWorkers, r.WorkerID)
	if err != nil {
		return nil, err
	}
	if w == nil {
		return nil, fmt.Errorf("%w: %q", ErrWorkerNotFound, r.WorkerID)
	}
	for _, u := range r.States {
		if u.State == "" {
			return nil, invalid("update task states from worker %q: empty state for task %q", r.WorkerID, u.TaskID)
		}
	}
	result := &UpdateTaskStatesResult{}
	reconfigured := stringSet{}
	for _, u := range r.States {
		t, err := txFirst[Task](tx, TableTasks, u.TaskID)
		if err != nil {
			return nil, err
		}
		if t != nil && t.MovingFrom != "" && t.MovingFrom != t.WorkerID && t.MovingFrom == r.WorkerID && u.Generation == t.MovingFromGeneration {
			// The moving-out copy of a live move: only its position counts
			// (the new copy's catch-up is measured against it), and what
			// it reports of its stream against the plans is kept (it
			// may learn a plan the snapshot its new copy started from
			// had not seen, acknowledge it, hold at its floor, switch).
			updated := *t
			kept := r.KeepReconfig && u.Reconfig && updated.keepReconfig(u.ReconfigFrontier, u.ReconfigSwitches)
			if !kept && (u.MovePosition == nil || (t.MovingFromPosition != nil && *t.MovingFromPosition == *u.MovePosition)) {
				continue
			}
			if kept {
				reconfigured.add(t.Query)
			}
			updated.ModifyIndex = tx.index
			if u.MovePosition != nil {
				pos := *u.MovePosition
				updated.MovingFromPosition = &pos
				if err := tx.maybeEndMove(&updated, false); err != nil {
					return nil, err
				}
			}
			if err := tx.insert(TableTasks, &updated); err != nil {
				return nil, err
			}
			result.Updated++
			continue
		}
		if t == nil || t.WorkerID != r.WorkerID || (u.Generation != 0 && u.Generation != t.Gen()) {
			// Not (or no longer) this copy: an older generation's report.
			result.Skipped = append(result.Skipped, u.TaskID)
			continue
		}
		if u.SwitchMove {
			// The leader's bound on a catch-up: end the move as it is.
			if t.MovingFrom == "" || t.State != states.TaskRunning {
				continue
			}
			updated := *t
			updated.ModifyIndex = tx.index
			if err := tx.maybeEndMove(&updated, true); err != nil {
				return nil, err
			}
			if err := tx.insert(TableTasks, &updated); err != nil {
				return nil, err
			}
			result.Updated++
			continue
		}
		// A position matters only during a move (a copy may still report
		// one until its assignment shows the move ended).
		samePos := t.MovingFrom == "" || u.MovePosition == nil || (t.MovePosition != nil && *t.MovePosition == *u.MovePosition && t.MoveBlocked == u.MoveBlocked)
		sameReconfig := !u.Reconfig || (t.ReconfigAcked == u.ReconfigAcked && t.ReconfigLevel == u.ReconfigLevel &&
			t.ReconfigFrontier == u.ReconfigFrontier && slices.Equal(t.ReconfigMarkers, u.ReconfigMarkers))
		updated := *t
		if r.KeepReconfig && u.Reconfig && updated.keepReconfig(u.ReconfigFrontier, u.ReconfigSwitches) {
			sameReconfig = false
		}
		if t.State == u.State && t.Message == u.Message && t.ReplicaState == u.ReplicaState && t.Tentative == u.Tentative && t.Lossy == u.Lossy &&
			t.Prepared == u.Prepared && t.Frontier == u.Frontier && t.CutDone == u.CutDone && samePos && sameReconfig {
			continue
		}
		if u.Reconfig {
			updated.ReconfigAcked, updated.ReconfigLevel, updated.ReconfigFrontier = u.ReconfigAcked, u.ReconfigLevel, u.ReconfigFrontier
			updated.ReconfigMarkers = slices.Clone(u.ReconfigMarkers)
			if !sameReconfig {
				reconfigured.add(t.Query)
			}
		}
		updated.State = u.State
		updated.Message = u.Message
		updated.ReplicaState, updated.Tentative, updated.Lossy = u.ReplicaState, u.Tentative, u.Lossy
		updated.Prepared, updated.Frontier, updated.CutDone = u.Prepared, u.Frontier, u.CutDone
		if t.MovingFrom != "" && u.MovePosition != nil {
			pos := *u.MovePosition
			updated.MovePosition, updated.MoveBlocked = &pos, u.MoveBlocked
		} else if t.MovingFrom != "" && u.State == states.TaskRunning {
			// A running new copy without a position (a worker of an
			// older build, or a copy started without the old one's
			// snapshot) cannot be compared: the move ends on running.
			updated.MoveCatchUp = false
		}
		updated.ModifyIndex = tx.index
		if err := tx.maybeEndMove(&updated, false); err != nil {
			return nil, err
		}
		if err := tx.insert(TableTasks, &updated); err != nil {
			return nil, err
		}
		result.Updated++
	}
	for _, q := range reconfigured.sorted() {
		if _, err := tx.advanceReconfig(q); err != nil {
			return nil, err
		}
	}
	return result, nil
}

// maybeEndMove ends the live move of t (not yet inserted) if its new copy
// runs and, for a catch-up move, its output position has reached the old
// copy's, or it can go no further (its output is blocked, or it stalls),
// or force: consumers switch to the new copy (every host of the query
// sees the placement change) and the old copy's worker stops it.
func (tx *writeTx) maybeEndMove(t *Task, force bool) error {
	if t.MovingFrom == "" || t.MovingFrom == t.WorkerID {
		return nil
	}
	switch {
	case t.State == states.TaskStalled && t.MoveCatchUp:
		// Most likely blocked on an output no consumer reads yet.
	case t.State != states.TaskRunning:
		return nil
	case t.MoveCatchUp && !force && !t.MoveBlocked && (t.MovePosition == nil || t.MovingFromPosition == nil || *t.MovePosition < *t.MovingFromPosition):
		return nil
	}
	hosts := stringSet{t.MovingFrom: {}}
	if err := tx.addHosts(stringSet{t.Query: {}}, hosts); err != nil {
		return err
	}
	// The positions stay: they show where the switch happened.
	t.MovingFrom, t.MovingFromGeneration, t.MoveCatchUp, t.MoveHalt = "", 0, false, false
	return tx.bumpAssignIndex(hosts)
}

func isSecretHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func (r *CreateTokenRequest) idempotencyKey() string { return r.IdempotencyKey }

func (r *CreateTokenRequest) decodeResult(raw []byte) (any, error) {
	var id string
	err := json.Unmarshal(raw, &id)
	return id, err
}

func (r *CreateTokenRequest) apply(tx *writeTx) (any, error) {
	tok := r.Token
	if tok.ID == "" {
		return nil, invalid("create token: empty id")
	}
	if !isSecretHash(tok.SecretHash) {
		return nil, invalid("create token %q: secret_hash must be 64 lowercase hex digits (HashSecret of the secret)", tok.ID)
	}
	if _, err := authz.ParseRole(tok.Role); err != nil {
		return nil, invalid("create token %q: %v", tok.ID, err)
	}
	if tok.CreatedUnixMs <= 0 || tok.ExpiresUnixMs < 0 || (tok.ExpiresUnixMs > 0 && tok.ExpiresUnixMs <= tok.CreatedUnixMs) {
		return nil, invalid("create token %q: created %d and expires %d (Unix ms): want created > 0 and expires 0 (never) or after created", tok.ID, tok.CreatedUnixMs, tok.ExpiresUnixMs)
	}
	if existing, err := txFirst[Token](tx, TableTokens, tok.ID); err != nil {
		return nil, err
	} else if existing != nil {
		return nil, fmt.Errorf("%w: id %q", ErrTokenExists, tok.ID)
	}
	if obj, err := tx.txn.First(TableTokens, indexSecret, tok.SecretHash); err != nil {
		return nil, fmt.Errorf("read tokens by secret: %w", err)
	} else if obj != nil {
		// Says nothing about the other token: the caller proved nothing.
		return nil, fmt.Errorf("%w: another token has this secret", ErrTokenExists)
	}
	tok.CreateIndex, tok.ModifyIndex = tx.index, tx.index
	return tok.ID, tx.insert(TableTokens, &tok)
}

func (r *RevokeTokenRequest) idempotencyKey() string { return r.IdempotencyKey }

func (r *RevokeTokenRequest) decodeResult(raw []byte) (any, error) {
	var id string
	err := json.Unmarshal(raw, &id)
	return id, err
}

func (r *RevokeTokenRequest) apply(tx *writeTx) (any, error) {
	tok, err := txFirst[Token](tx, TableTokens, r.ID)
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, fmt.Errorf("%w: %q", ErrTokenNotFound, r.ID)
	}
	return r.ID, tx.delete(TableTokens, tok)
}

func (r *UpsertOperatorVersionRequest) apply(tx *writeTx) (any, error) {
	v := r.Version
	if v.Operator == "" || v.Version == "" {
		return nil, invalid("upsert operator version: operator %q and version %q must be non-empty", v.Operator, v.Version)
	}
	if len(v.SpecJSON) == 0 {
		v.SpecJSON = nil
	}
	existing, err := txFirst[OperatorVersion](tx, TableOperatorVersions, v.Operator, v.Version)
	if err != nil {
		return nil, err
	}
	v.CreateIndex = tx.index
	if existing != nil {
		v.CreateIndex = existing.CreateIndex
	}
	v.ModifyIndex = tx.index
	return nil, tx.insert(TableOperatorVersions, &v)
}

func (r *UpsertContractRequest) idempotencyKey() string { return r.IdempotencyKey }

func (r *UpsertContractRequest) requestHash() string { return r.RequestHash }

func (r *UpsertContractRequest) decodeResult(raw []byte) (any, error) {
	var id string
	err := json.Unmarshal(raw, &id)
	return id, err
}

func (r *UpsertContractRequest) apply(tx *writeTx) (any, error) {
	c := r.Contract
	if c.ID == "" || c.Partner == "" {
		return nil, invalid("upsert contract: id %q and partner %q must be non-empty", c.ID, c.Partner)
	}
	if len(c.Body) == 0 {
		c.Body = nil
	}
	existing, err := txFirst[Contract](tx, TableContracts, c.ID)
	if err != nil {
		return nil, err
	}
	c.CreateIndex = tx.index
	if existing != nil {
		c.CreateIndex = existing.CreateIndex
	}
	c.ModifyIndex = tx.index
	return c.ID, tx.insert(TableContracts, &c)
}

func (r *AppendLedgerEntryRequest) apply(tx *writeTx) (any, error) {
	e := r.Entry
	if e.Hash == "" || e.Kind == "" {
		return nil, invalid("append ledger entry %d: hash and kind must be non-empty", e.Seq)
	}
	it, err := tx.txn.ReverseLowerBound(TableLedger, indexID, uint64(1<<64-1))
	if err != nil {
		return nil, fmt.Errorf("read last ledger entry: %w", err)
	}
	wantSeq, wantPrev := uint64(1), ""
	if obj := it.Next(); obj != nil {
		last := obj.(*LedgerEntry)
		wantSeq, wantPrev = last.Seq+1, last.Hash
	}
	if e.Seq != wantSeq || e.PrevHash != wantPrev {
		return nil, fmt.Errorf("%w: got seq %d prev_hash %q, want seq %d prev_hash %q", ErrLedgerChain, e.Seq, e.PrevHash, wantSeq, wantPrev)
	}
	if len(e.Body) == 0 {
		e.Body = nil
	}
	e.CreateIndex = tx.index
	return e.Seq, tx.insert(TableLedger, &e)
}

func (r *RecordHealthActionRequest) apply(tx *writeTx) (any, error) {
	a := r.Action
	if a.ID == "" || a.Action == "" {
		return nil, invalid("record health action: id %q and action %q must be non-empty", a.ID, a.Action)
	}
	existing, err := txFirst[HealthAction](tx, TableHealthActions, a.ID)
	if err != nil {
		return nil, err
	}
	a.CreateIndex = tx.index
	if existing != nil {
		a.CreateIndex = existing.CreateIndex
	}
	a.ModifyIndex = tx.index
	return nil, tx.insert(TableHealthActions, &a)
}

func (r *HealthLogRequest) apply(tx *writeTx) (any, error) {
	a := r.Action
	existing, err := txFirst[HealthAction](tx, TableHealthActions, a.ID)
	if err != nil {
		return nil, err
	}
	if existing != nil {
		if existing.Outcome != HealthPending {
			return nil, invalid("health log: action %s is already %s: an action is evaluated once", a.ID, existing.Outcome)
		}
		if !healthFinal(a.Outcome) || a.Outcome == HealthAlert || a.EvaluatedAtMs <= 0 {
			return nil, invalid("health log: evaluation of %s needs a final outcome (improved, not_improved, failed) and evaluated_at_ms, got %q at %d",
				a.ID, a.Outcome, a.EvaluatedAtMs)
		}
		updated := *existing
		updated.Outcome, updated.OutcomeDetail, updated.EvaluatedAtMs = a.Outcome, a.OutcomeDetail, a.EvaluatedAtMs
		updated.ModifyIndex = tx.index
		return nil, tx.insert(TableHealthActions, &updated)
	}
	if a.ID == "" || a.Query == "" || a.Fragment == "" || a.Diagnosis == "" || a.Action == "" || a.AtMs <= 0 {
		return nil, invalid("health log: id %q, query %q, fragment %q, diagnosis %q, action %q and at_ms %d must all be set",
			a.ID, a.Query, a.Fragment, a.Diagnosis, a.Action, a.AtMs)
	}
	if a.Outcome != HealthPending && a.Outcome != HealthAlert && a.Outcome != HealthFailed {
		return nil, invalid("health log: a new action's outcome must be pending, alert or failed, got %q", a.Outcome)
	}
	a.CreateIndex, a.ModifyIndex = tx.index, tx.index
	return nil, tx.insert(TableHealthActions, &a)
}
