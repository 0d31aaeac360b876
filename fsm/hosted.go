package fsm

import (
	"fmt"

	"github.com/hashicorp/go-memdb"
)

// Hosted tasks (cross-org migration, issue 11 item 6): see HostedTask.

func (r *UpsertHostedTaskRequest) apply(tx *writeTx) (any, error) {
	h := r.Task
	switch {
	case h.Owner == "" || h.Host == "" || h.Owner == h.Host:
		return nil, invalid("hosted task: owner %q and host %q must be two different orgs", h.Owner, h.Host)
	case h.TaskID == "" || h.Query == "" || h.Contract == "":
		return nil, invalid("hosted task: task %q, query %q and contract %q are required", h.TaskID, h.Query, h.Contract)
	case h.ID != HostedTaskID(h.Owner, h.TaskID):
		return nil, invalid("hosted task: id %q is not %q", h.ID, HostedTaskID(h.Owner, h.TaskID))
	case h.Generation < 1:
		return nil, invalid("hosted task %s: generation %d", h.ID, h.Generation)
	case h.Phase != HostedMoving && h.Phase != HostedRunning && h.Phase != HostedReturning:
		return nil, invalid("hosted task %s: unknown phase %q", h.ID, h.Phase)
	}
	existing, err := txFirst[HostedTask](tx, TableHostedTasks, h.ID)
	if err != nil {
		return nil, err
	}
	if r.IfGeneration > 0 && (existing == nil || existing.Generation != r.IfGeneration) {
		return nil, fmt.Errorf("%w: %s is not at generation %d", ErrHostedStale, h.ID, r.IfGeneration)
	}
	affected := stringSet{}
	if h.WorkerID != "" {
		if w, err := txFirst[Worker](tx, TableWorkers, h.WorkerID); err != nil {
			return nil, err
		} else if w == nil {
			return nil, fmt.Errorf("%w: hosted task %s on %q", ErrWorkerNotFound, h.ID, h.WorkerID)
		}
		affected.add(h.WorkerID)
	}
	h.CreateIndex = tx.index
	if existing != nil {
		h.CreateIndex = existing.CreateIndex
		if existing.WorkerID != "" {
			affected.add(existing.WorkerID)
		}
	}
	h.ModifyIndex = tx.index
	if len(h.SpecJSON) == 0 {
		h.SpecJSON = nil
	}
	if err := tx.insert(TableHostedTasks, &h); err != nil {
		return nil, err
	}
	return nil, tx.bumpAssignIndex(affected)
}

func (r *DeleteHostedTaskRequest) apply(tx *writeTx) (any, error) {
	existing, err := txFirst[HostedTask](tx, TableHostedTasks, r.ID)
	if err != nil || existing == nil {
		return nil, err
	}
	if r.IfGeneration > 0 && existing.Generation != r.IfGeneration {
		return nil, fmt.Errorf("%w: %s is at generation %d, not %d", ErrHostedStale, r.ID, existing.Generation, r.IfGeneration)
	}
	if err := tx.delete(TableHostedTasks, existing); err != nil {
		return nil, err
	}
	affected := stringSet{}
	if existing.WorkerID != "" {
		affected.add(existing.WorkerID)
	}
	return nil, tx.bumpAssignIndex(affected)
}

// HostedTasks returns every hosted-task record (tasks of this org at
// partners, and partners' tasks here), sorted by id.
func (s *StateStore) HostedTasks(ws memdb.WatchSet) ([]*HostedTask, error) {
	return list[HostedTask](s.readTxn(ws), ws, TableHostedTasks, indexID)
}

// HostedTask returns one hosted-task record, nil if there is none.
func (s *StateStore) HostedTask(ws memdb.WatchSet, owner, taskID string) (*HostedTask, error) {
	return first[HostedTask](s.readTxn(ws), ws, TableHostedTasks, HostedTaskID(owner, taskID))
}

func (r *AbortMoveRequest) apply(tx *writeTx) (any, error) {
	t, err := txFirst[Task](tx, TableTasks, r.TaskID)
	if err != nil {
		return nil, err
	}
	if t == nil || t.MovingFrom == "" || t.MovingFrom == t.WorkerID || t.Gen() != r.Generation {
		return nil, fmt.Errorf("%w: %s generation %d", ErrNotMoving, r.TaskID, r.Generation)
	}
	affected := stringSet{}
	affected.add(t.WorkerID)
	affected.add(t.MovingFrom)
	updated := *t
	updated.WorkerID, updated.Generation = t.MovingFrom, max(t.MovingFromGeneration, 1)
	updated.endMove()
	updated.State, updated.Message = TaskStatePending, "move aborted: "+r.Reason
	updated.ModifyIndex = tx.index
	if err := tx.insert(TableTasks, &updated); err != nil {
		return nil, err
	}
	return nil, tx.bumpAssignIndex(affected)
}
