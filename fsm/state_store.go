package fsm

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-memdb"
)

// DefaultMaxWait is the wait bound BlockingQuery uses when maxWait <= 0.
const DefaultMaxWait = 5 * time.Minute

// StateStore is the indexed in-memory state. Reads may run concurrently with
// each other and with the FSM's writes; each read method sees one consistent
// version of the state. Returned records are shared with the store and must
// not be mutated by callers.
//
// The StateStore value stays the same across FSM.Restore: Restore swaps in a
// new generation (a fresh memdb) and closes the old generation's abandon
// channel, so callers may keep a *StateStore for the life of the FSM.
type StateStore struct {
	gen atomic.Pointer[generation]
}

// generation is one memdb with the channel closed when it is replaced.
type generation struct {
	db        *memdb.MemDB
	abandonCh chan struct{}
	// idempotencyKeys counts rows of TableIdempotency. Only the FSM goroutine
	// (Apply, Restore) reads or writes it.
	idempotencyKeys int
}

func newGeneration() (*generation, error) {
	db, err := memdb.NewMemDB(stateSchema())
	if err != nil {
		return nil, fmt.Errorf("create state schema: %w", err)
	}
	return &generation{db: db, abandonCh: make(chan struct{})}, nil
}

// NewStateStore returns an empty store.
func NewStateStore() (*StateStore, error) {
	g, err := newGeneration()
	if err != nil {
		return nil, err
	}
	s := &StateStore{}
	s.gen.Store(g)
	return s, nil
}

// swap installs g and wakes every watcher of the previous generation.
func (s *StateStore) swap(g *generation) {
	old := s.gen.Swap(g)
	close(old.abandonCh)
}

// AbandonCh is closed when the current state is replaced by a Restore.
func (s *StateStore) AbandonCh() <-chan struct{} {
	return s.gen.Load().abandonCh
}

// readTxn opens a read transaction on the current generation and, when ws is
// given, makes ws fire if that generation is abandoned.
func (s *StateStore) readTxn(ws memdb.WatchSet) *memdb.Txn {
	g := s.gen.Load()
	if ws != nil {
		ws.Add(g.abandonCh)
	}
	return g.db.Txn(false)
}

func first[T any](txn *memdb.Txn, ws memdb.WatchSet, table string, args ...any) (*T, error) {
	ch, obj, err := txn.FirstWatch(table, indexID, args...)
	if err != nil {
		return nil, fmt.Errorf("read %s %v: %w", table, args, err)
	}
	if ws != nil {
		ws.Add(ch)
	}
	if obj == nil {
		return nil, nil
	}
	return obj.(*T), nil
}

func list[T any](txn *memdb.Txn, ws memdb.WatchSet, table, index string, args ...any) ([]*T, error) {
	it, err := txn.Get(table, index, args...)
	if err != nil {
		return nil, fmt.Errorf("list %s by %s: %w", table, index, err)
	}
	if ws != nil {
		ws.Add(it.WatchCh())
	}
	var out []*T
	for obj := it.Next(); obj != nil; obj = it.Next() {
		out = append(out, obj.(*T))
	}
	return out, nil
}

// Worker returns a worker, or nil, nil if absent.
func (s *StateStore) Worker(ws memdb.WatchSet, id string) (*Worker, error) {
	return first[Worker](s.readTxn(ws), ws, TableWorkers, id)
}

// Workers returns all workers sorted by id.
func (s *StateStore) Workers(ws memdb.WatchSet) ([]*Worker, error) {
	return list[Worker](s.readTxn(ws), ws, TableWorkers, indexID)
}

// Query returns a query (running or stopped), or nil, nil if absent.
func (s *StateStore) Query(ws memdb.WatchSet, name string) (*Query, error) {
	return first[Query](s.readTxn(ws), ws, TableQueries, name)
}

// Queries returns all queries sorted by name.
func (s *StateStore) Queries(ws memdb.WatchSet) ([]*Query, error) {
	return list[Query](s.readTxn(ws), ws, TableQueries, indexID)
}

// Task returns a task, or nil, nil if absent.
func (s *StateStore) Task(ws memdb.WatchSet, id string) (*Task, error) {
	return first[Task](s.readTxn(ws), ws, TableTasks, id)
}

// Tasks returns all tasks sorted by id.
func (s *StateStore) Tasks(ws memdb.WatchSet) ([]*Task, error) {
	return list[Task](s.readTxn(ws), ws, TableTasks, indexID)
}

// TasksByQuery returns a query's tasks sorted by id.
func (s *StateStore) TasksByQuery(ws memdb.WatchSet, query string) ([]*Task, error) {
	return list[Task](s.readTxn(ws), ws, TableTasks, indexQuery, query)
}

// TasksByWorker returns the tasks placed on a worker sorted by id. With
// workerID "" it returns the unplaced tasks.
func (s *StateStore) TasksByWorker(ws memdb.WatchSet, workerID string) ([]*Task, error) {
	txn := s.readTxn(ws)
	if workerID == "" {
		return list[Task](txn, ws, TableTasks, indexPlaced, false)
	}
	return list[Task](txn, ws, TableTasks, indexWorker, workerID)
}

// TokenByHash returns the token whose SecretHash is hash, or nil, nil.
func (s *StateStore) TokenByHash(hash string) (*Token, error) {
	obj, err := s.readTxn(nil).First(TableTokens, indexSecret, hash)
	if err != nil || obj == nil {
		return nil, err
	}
	return obj.(*Token), nil
}

// Token returns the token with accessor id, or nil, nil.
func (s *StateStore) Token(id string) (*Token, error) {
	return first[Token](s.readTxn(nil), nil, TableTokens, id)
}

// Tokens returns all tokens sorted by id.
func (s *StateStore) Tokens(ws memdb.WatchSet) ([]*Token, error) {
	return list[Token](s.readTxn(ws), ws, TableTokens, indexID)
}

// OperatorVersions returns the versions of an operator sorted by version;
// with operator "" it returns all versions.
func (s *StateStore) OperatorVersions(ws memdb.WatchSet, operator string) ([]*OperatorVersion, error) {
	txn := s.readTxn(ws)
	if operator == "" {
		return list[OperatorVersion](txn, ws, TableOperatorVersions, indexID)
	}
	return list[OperatorVersion](txn, ws, TableOperatorVersions, indexOp, operator)
}

// Contracts returns all contracts sorted by id.
func (s *StateStore) Contracts(ws memdb.WatchSet) ([]*Contract, error) {
	return list[Contract](s.readTxn(ws), ws, TableContracts, indexID)
}

// ContractsByPartner returns the contracts with one partner sorted by id.
func (s *StateStore) ContractsByPartner(ws memdb.WatchSet, partner string) ([]*Contract, error) {
	return list[Contract](s.readTxn(ws), ws, TableContracts, indexPartner, partner)
}

// LedgerEntries returns the ledger entries with Seq >= fromSeq in order.
func (s *StateStore) LedgerEntries(ws memdb.WatchSet, fromSeq uint64) ([]*LedgerEntry, error) {
	txn := s.readTxn(ws)
	if ws != nil {
		// LowerBound iterators cannot be watched; watch the whole table.
		all, err := txn.Get(TableLedger, indexID)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", TableLedger, err)
		}
		ws.Add(all.WatchCh())
	}
	it, err := txn.LowerBound(TableLedger, indexID, fromSeq)
	if err != nil {
		return nil, fmt.Errorf("list %s from seq %d: %w", TableLedger, fromSeq, err)
	}
	var out []*LedgerEntry
	for obj := it.Next(); obj != nil; obj = it.Next() {
		out = append(out, obj.(*LedgerEntry))
	}
	return out, nil
}

// HealthActions returns the health actions of a query sorted by id; with
// query "" it returns all of them.
func (s *StateStore) HealthActions(ws memdb.WatchSet, query string) ([]*HealthAction, error) {
	txn := s.readTxn(ws)
	if query == "" {
		return list[HealthAction](txn, ws, TableHealthActions, indexID)
	}
	return list[HealthAction](txn, ws, TableHealthActions, indexQuery, query)
}

// SlotMaps returns the slot maps of a query's keyed fragments sorted by
// fragment; with query "" it returns all of them.
func (s *StateStore) SlotMaps(ws memdb.WatchSet, query string) ([]*SlotMap, error) {
	txn := s.readTxn(ws)
	if query == "" {
		return list[SlotMap](txn, ws, TableSlotMaps, indexID)
	}
	return list[SlotMap](txn, ws, TableSlotMaps, indexQuery, query)
}

// SlotMap returns the slot map of one fragment, or nil, nil.
func (s *StateStore) SlotMap(ws memdb.WatchSet, query, fragment string) (*SlotMap, error) {
	return first[SlotMap](s.readTxn(ws), ws, TableSlotMaps, query, fragment)
}

// TableIndex returns the log index of the last write to a table, 0 if none.
func (s *StateStore) TableIndex(table string) uint64 {
	return tableIndexIn(s.readTxn(nil), table)
}

// LatestIndex returns the highest log index the FSM has applied, including
// entries that were rejected or skipped.
func (s *StateStore) LatestIndex() uint64 {
	return tableIndexIn(s.readTxn(nil), appliedIndexKey)
}

func tableIndexIn(txn *memdb.Txn, key string) uint64 {
	obj, err := txn.First(tableIndexes, indexID, key)
	if err != nil || obj == nil {
		return 0
	}
	return obj.(*tableIndexEntry).Index
}

// QueryView is one query as a worker sees it: its definition, all its tasks
// and the address of every worker hosting one of them.
type QueryView struct {
	Query       *Query
	Tasks       []*Task           // all tasks of the query, sorted by id
	WorkerAddrs map[string]string // worker id -> addr, for placed tasks
	// SlotMaps are the slot maps of the query's keyed fragments, sorted
	// by fragment.
	SlotMaps []*SlotMap
}

// WorkerAssignments returns a worker's assignment view: the tasks placed on it
// and a QueryView (sorted by name) for every query that has a task on it.
// index is the worker's AssignIndex; the view is read from one consistent
// version of the state. ws fires when the worker's record changes, which
// includes every change of AssignIndex. ErrWorkerNotFound if unknown.
// Task state reports (UpdateTaskStates) do not move AssignIndex, so the
// State/Message of tasks in a view may be newer than the index suggests.
func (s *StateStore) WorkerAssignments(ws memdb.WatchSet, workerID string) (uint64, []*Task, []*QueryView, error) {
	txn := s.readTxn(ws)
	w, err := first[Worker](txn, ws, TableWorkers, workerID)
	if err != nil {
		return 0, nil, nil, err
	}
	if w == nil {
		return 0, nil, nil, fmt.Errorf("%w: %q", ErrWorkerNotFound, workerID)
	}
	tasks, err := list[Task](txn, nil, TableTasks, indexWorker, workerID)
	if err != nil {
		return 0, nil, nil, err
	}
	// The old copies of live moves out of this worker still run here.
	moving, err := list[Task](txn, nil, TableTasks, indexMovingFrom, workerID)
	if err != nil {
		return 0, nil, nil, err
	}
	for _, t := range moving {
		tasks = append(tasks, MovingOutCopy(t))
	}
	names := map[string]struct{}{}
	for _, t := range tasks {
		names[t.Query] = struct{}{}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)

	addrs := map[string]string{} // cache across queries
	views := make([]*QueryView, 0, len(sorted))
	for _, name := range sorted {
		q, err := first[Query](txn, nil, TableQueries, name)
		if err != nil {
			return 0, nil, nil, err
		}
		if q == nil {
			return 0, nil, nil, fmt.Errorf("state invariant broken: task of worker %q belongs to missing query %q", workerID, name)
		}
		qtasks, err := list[Task](txn, nil, TableTasks, indexQuery, name)
		if err != nil {
			return 0, nil, nil, err
		}
		maps, err := list[SlotMap](txn, nil, TableSlotMaps, indexQuery, name)
		if err != nil {
			return 0, nil, nil, err
		}
		view := &QueryView{Query: q, Tasks: qtasks, WorkerAddrs: map[string]string{}, SlotMaps: maps}
		for _, t := range qtasks {
			// A live move's new copy fetches its snapshot from MovingFrom.
			for _, id := range []string{t.WorkerID, t.MovingFrom} {
				if id == "" {
					continue
				}
				addr, ok := addrs[id]
				if !ok {
					host, err := first[Worker](txn, nil, TableWorkers, id)
					if err != nil {
						return 0, nil, nil, err
					}
					if host != nil {
						addr = host.Addr
					}
					addrs[id] = addr
				}
				view.WorkerAddrs[id] = addr
			}
		}
		views = append(views, view)
	}
	return w.AssignIndex, tasks, views, nil
}

// MovingOutCopy is the old copy of a task in a live move, as its worker
// (t.MovingFrom) runs it: placed there at generation MovingFromGeneration,
// with MovingFrom equal to WorkerID, which marks a moving-out copy.
func MovingOutCopy(t *Task) *Task {
	c := *t
	c.WorkerID, c.Generation = t.MovingFrom, t.MovingFromGeneration
	return &c
}

// endMove clears the fields of a live move.
func (t *Task) endMove() {
	t.MovingFrom, t.MovingFromGeneration = "", 0
	t.MoveCatchUp, t.MovePosition, t.MovingFromPosition, t.MoveBlocked, t.MoveHalt = false, nil, nil, false, false
}

// IsMovingOut reports whether t is a moving-out copy (MovingOutCopy).
func (t *Task) IsMovingOut() bool { return t.MovingFrom != "" && t.MovingFrom == t.WorkerID }

// BlockingQuery runs fn. If minIndex is 0 or the index fn returns is greater
// than minIndex it returns at once. Otherwise it waits until the watch set fn
// filled fires, then reruns fn, until the index moves past minIndex, maxWait
// elapses (DefaultMaxWait if maxWait <= 0) or ctx ends. It returns the index of
// the last run of fn; on ctx end the error is ctx.Err(), on maxWait it is nil.
// The read methods add the store's abandon channel to ws, so a Restore wakes
// the wait and fn re-reads the new state.
func (s *StateStore) BlockingQuery(ctx context.Context, minIndex uint64, maxWait time.Duration, fn func(ws memdb.WatchSet) (uint64, error)) (uint64, error) {
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	waitCtx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	for {
		ws := memdb.NewWatchSet()
		index, err := fn(ws)
		if err != nil || minIndex == 0 || index > minIndex {
			return index, err
		}
		if err := ws.WatchCtx(waitCtx); err != nil {
			// waitCtx ended: either the caller's ctx or maxWait.
			return index, ctx.Err()
		}
	}
}
