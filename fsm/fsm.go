package fsm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-memdb"
	"github.com/hashicorp/raft"
)

// MaxIdempotencyKeys is how many idempotency keys the FSM remembers; when a
// new key would exceed it, the keys applied at the lowest log index go first.
const MaxIdempotencyKeys = 10000

// FSM is the raft.FSM of a coordinator cluster. Raft calls Apply, Snapshot
// and Restore from one goroutine; readers use State() concurrently.
type FSM struct {
	logger             *slog.Logger
	state              *StateStore
	maxIdempotencyKeys int

	// haltErr is set (once) when a committed entry cannot be applied; see
	// halt. haltCh is closed at the same time.
	haltErr  atomic.Pointer[error]
	haltCh   chan struct{}
	haltOnce sync.Once
}

var _ raft.FSM = (*FSM)(nil)

// New returns an FSM with an empty state. A nil logger discards logs.
func New(logger *slog.Logger) (*FSM, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	state, err := NewStateStore()
	if err != nil {
		return nil, err
	}
	return &FSM{logger: logger.With("component", "fsm"), state: state, maxIdempotencyKeys: MaxIdempotencyKeys, haltCh: make(chan struct{})}, nil
}

// State returns the state store. It is the same value for the life of the
// FSM, including across Restore.
func (f *FSM) State() *StateStore { return f.state }

// command is a decoded request body that can apply itself.
type command interface {
	apply(tx *writeTx) (any, error)
}

// idempotentCommand is a command that may carry an idempotency key.
type idempotentCommand interface {
	command
	idempotencyKey() string
	// decodeResult turns a stored IdempotencyRecord.Result back into the
	// Value the command returned.
	decodeResult(raw []byte) (any, error)
}

// hashedCommand is an idempotent command that also fingerprints the
// client request its key belongs to: a key presented again with another
// fingerprint is refused (ErrIdempotencyMismatch) instead of answered
// with the first request's result.
type hashedCommand interface {
	requestHash() string
}

// commandDecoders maps each known type to a constructor of its request.
var commandDecoders = map[MessageType]func() command{
	RegisterWorkerType:        func() command { return &RegisterWorkerRequest{} },
	SetWorkerStatusType:       func() command { return &SetWorkerStatusRequest{} },
	SubmitQueryType:           func() command { return &SubmitQueryRequest{} },
	StopQueryType:             func() command { return &StopQueryRequest{} },
	PlaceTasksType:            func() command { return &PlaceTasksRequest{} },
	UpdateTaskStatesType:      func() command { return &UpdateTaskStatesRequest{} },
	CreateTokenType:           func() command { return &CreateTokenRequest{} },
	DeleteWorkerType:          func() command { return &DeleteWorkerRequest{} },
	UpsertOperatorVersionType: func() command { return &UpsertOperatorVersionRequest{} },
	UpsertContractType:        func() command { return &UpsertContractRequest{} },
	AppendLedgerEntryType:     func() command { return &AppendLedgerEntryRequest{} },
	RecordHealthActionType:    func() command { return &RecordHealthActionRequest{} },
	RevokeTokenType:           func() command { return &RevokeTokenRequest{} },
	ApplyPlanType:             func() command { return &ApplyPlanRequest{} },
	ReconfigureQueryType:      func() command { return &ReconfigureQueryRequest{} },
	UpsertHostedTaskType:      func() command { return &UpsertHostedTaskRequest{} },
	DeleteHostedTaskType:      func() command { return &DeleteHostedTaskRequest{} },
	AbortMoveType:             func() command { return &AbortMoveRequest{} },
	HealthLogType:             func() command { return &HealthLogRequest{} },
	UpdateTaskStatesBatchType: func() command { return &UpdateTaskStatesBatchRequest{} },
}

// decodeBody decodes one JSON value and rejects trailing data. Unknown
// fields are ignored: a newer build may add a field to a command or a
// record (forward compatible encoding), and an older node must still apply
// that entry exactly as the leader did rather than refuse it. A newer build
// that needs an older node to understand a field must gate it behind a new
// command type (see ProtocolOf), which the leader proposes only once every
// coordinator advertises a build that knows it.
func decodeBody(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after JSON value")
	}
	return nil
}

// Halted is closed when the FSM met a committed entry it cannot apply (see
// halt); HaltErr then says which. The coordinator watches it and shuts the
// node down.
func (f *FSM) Halted() <-chan struct{} { return f.haltCh }

// HaltErr is nil while the FSM applies entries, and the reason (wrapping
// ErrHalted) once it halted.
func (f *FSM) HaltErr() error {
	if p := f.haltErr.Load(); p != nil {
		return *p
	}
	return nil
}

// halt stops the FSM at a committed entry it cannot apply: an entry that
// does not decode (truncated, corrupt) or an unknown type without
// IgnoreUnknownTypeFlag. Skipping such an entry would silently diverge
// from the nodes that applied it, so from here on the FSM changes nothing:
// Apply refuses every entry, Snapshot fails (a snapshot would persist the
// state without the entry and let raft compact it away), and Halted is
// closed so the coordinator shuts the node down with a clear log line.
// After a restart raft replays the log from the last snapshot and halts at
// the same entry again, deterministically, until a build that can apply it
// runs.
//
// Why not panic in Apply: a panic would also stop the node, but it kills
// every component sharing the process (the single-process dev federation
// runs coordinators and workers together, and so do in-process tests)
// without an orderly shutdown of Raft's stores.
func (f *FSM) halt(index uint64, t MessageType, cause error) *ApplyResult {
	err := fmt.Errorf("%w: log index %d, type %s: %w", ErrHalted, index, t, cause)
	f.haltOnce.Do(func() {
		f.haltErr.Store(&err)
		f.logger.Error("FSM HALTED: a committed log entry cannot be applied; this node stops instead of diverging from its peers (run a build that understands the entry)",
			"index", index, "type", t.String(), "err", cause)
		close(f.haltCh)
	})
	return &ApplyResult{Index: index, Err: err}
}

// Apply applies one committed log entry and returns *ApplyResult. An entry
// this node cannot apply halts the FSM (see halt); after that every entry
// returns an error wrapping ErrHalted and changes nothing.
func (f *FSM) Apply(l *raft.Log) any {
	if err := f.HaltErr(); err != nil {
		return &ApplyResult{Index: l.Index, Err: err}
	}
	if l.Type != raft.LogCommand {
		f.markApplied(l.Index)
		return &ApplyResult{Index: l.Index}
	}
	return f.applyCommand(l.Index, l.Data)
}

func (f *FSM) applyCommand(index uint64, data []byte) *ApplyResult {
	if len(data) == 0 {
		return f.halt(index, 0, fmt.Errorf("%w: empty log entry", ErrMalformedCommand))
	}
	t := MessageType(data[0])
	newCommand, ok := commandDecoders[t]
	if !ok {
		if t&IgnoreUnknownTypeFlag != 0 {
			f.logger.Warn("skipping unknown ignorable command", "type", t.String(), "index", index)
			f.markApplied(index)
			return &ApplyResult{Index: index}
		}
		return f.halt(index, t, fmt.Errorf("%w: non-ignorable type %d (%#x)", ErrUnknownCommand, uint8(t), uint8(t)))
	}
	cmd := newCommand()
	if err := decodeBody(data[1:], cmd); err != nil {
		return f.halt(index, t, fmt.Errorf("%w: decode %s body: %v", ErrMalformedCommand, t, err))
	}

	g := f.state.gen.Load()
	tx := newWriteTx(g, index)
	key := ""
	if ic, ok := cmd.(idempotentCommand); ok {
		key = ic.idempotencyKey()
		if key != "" {
			if res := f.replay(tx, t, key, ic); res != nil {
				tx.abort()
				if res.Err != nil {
					return f.reject(index, t, res.Err, slog.LevelWarn)
				}
				f.markApplied(index)
				return res
			}
		}
	}
	value, err := cmd.apply(tx)
	if err != nil {
		tx.abort()
		return f.reject(index, t, err, slog.LevelInfo)
	}
	if key != "" {
		if err := f.recordIdempotency(tx, t, key, requestHashOf(cmd), value); err != nil {
			tx.abort()
			return f.reject(index, t, err, slog.LevelError)
		}
	}
	if err := tx.commit(); err != nil {
		return f.reject(index, t, err, slog.LevelError)
	}
	return &ApplyResult{Index: index, Value: value}
}

// reject logs a failed entry, records its index as applied and returns the
// error result. Malformed entries log at error level; ordinary rejections
// (validation, not found, exists) at info.
func (f *FSM) reject(index uint64, t MessageType, err error, level slog.Level) *ApplyResult {
	f.logger.Log(context.Background(), level, "command rejected", "type", t.String(), "index", index, "err", err)
	f.markApplied(index)
	return &ApplyResult{Index: index, Err: err}
}

// markApplied advances LatestIndex for an entry that changed nothing else.
func (f *FSM) markApplied(index uint64) {
	tx := newWriteTx(f.state.gen.Load(), index)
	if err := tx.commit(); err != nil {
		f.logger.Error("record applied index", "index", index, "err", err)
	}
}

// replay returns the stored result for an already applied key, nil if the key
// is new.
func (f *FSM) replay(tx *writeTx, t MessageType, key string, ic idempotentCommand) *ApplyResult {
	obj, err := tx.txn.First(TableIdempotency, indexID, key)
	if err != nil {
		return &ApplyResult{Index: tx.index, Err: fmt.Errorf("read idempotency key %q: %w", key, err)}
	}
	if obj == nil {
		return nil
	}
	rec := obj.(*IdempotencyRecord)
	if rec.Type != t {
		return &ApplyResult{Index: tx.index, Err: fmt.Errorf("%w: key %q was used by %s, now by %s", ErrIdempotencyKeyReused, key, rec.Type, t)}
	}
	// Records from before request hashes, and commands without one,
	// compare by type only.
	if h := requestHashOf(ic); h != "" && rec.RequestHash != "" && h != rec.RequestHash {
		return &ApplyResult{Index: tx.index, Err: fmt.Errorf("%w: key %q was applied at index %d for another %s request (request hash %s, this one %s)",
			ErrIdempotencyMismatch, key, rec.Index, t, rec.RequestHash, h)}
	}
	value, err := ic.decodeResult(rec.Result)
	if err != nil {
		return &ApplyResult{Index: tx.index, Err: fmt.Errorf("decode stored result of key %q: %w", key, err)}
	}
	return &ApplyResult{Index: rec.Index, Value: value, Deduplicated: true}
}

// recordIdempotency stores the key's result and prunes the oldest keys beyond
// the limit. Pruning depends only on the log, so every node prunes alike.
func (f *FSM) recordIdempotency(tx *writeTx, t MessageType, key, requestHash string, value any) error {
	raw, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("encode result for idempotency key %q: %w", key, err)
	}
	rec := &IdempotencyRecord{Key: key, Type: t, Index: tx.index, Result: raw, RequestHash: requestHash}
	if err := tx.insert(TableIdempotency, rec); err != nil {
		return err
	}
	tx.idempotencyDelta++
	excess := tx.gen.idempotencyKeys + tx.idempotencyDelta - f.maxIdempotencyKeys
	if excess <= 0 {
		return nil
	}
	it, err := tx.txn.Get(TableIdempotency, indexApplied)
	if err != nil {
		return fmt.Errorf("list idempotency keys: %w", err)
	}
	var oldest []any
	for obj := it.Next(); obj != nil && len(oldest) < excess; obj = it.Next() {
		oldest = append(oldest, obj)
	}
	for _, obj := range oldest { // delete after iterating: memdb iterators must not see writes
		if err := tx.delete(TableIdempotency, obj); err != nil {
			return err
		}
		tx.idempotencyDelta--
	}
	return nil
}

// requestHashOf is cmd's request fingerprint, "" if it has none.
func requestHashOf(cmd any) string {
	if hc, ok := cmd.(hashedCommand); ok {
		return hc.requestHash()
	}
	return ""
}

// writeTx is one write transaction at one log index. It records which tables
// changed so commit can set their modify indexes.
type writeTx struct {
	gen              *generation
	txn              *memdb.Txn
	index            uint64
	touched          map[string]struct{}
	idempotencyDelta int
}

func newWriteTx(g *generation, index uint64) *writeTx {
	return &writeTx{gen: g, txn: g.db.Txn(true), index: index, touched: map[string]struct{}{}}
}

func (tx *writeTx) insert(table string, obj any) error {
	if err := tx.txn.Insert(table, obj); err != nil {
		return fmt.Errorf("insert into %s: %w", table, err)
	}
	tx.touched[table] = struct{}{}
	return nil
}

func (tx *writeTx) delete(table string, obj any) error {
	if err := tx.txn.Delete(table, obj); err != nil {
		return fmt.Errorf("delete from %s: %w", table, err)
	}
	tx.touched[table] = struct{}{}
	return nil
}

func (tx *writeTx) abort() { tx.txn.Abort() }

// commit sets the touched tables' indexes and the applied index, then commits.
func (tx *writeTx) commit() error {
	for table := range tx.touched {
		if err := tx.txn.Insert(tableIndexes, &tableIndexEntry{Table: table, Index: tx.index}); err != nil {
			tx.txn.Abort()
			return fmt.Errorf("set index of %s: %w", table, err)
		}
	}
	if err := tx.txn.Insert(tableIndexes, &tableIndexEntry{Table: appliedIndexKey, Index: tx.index}); err != nil {
		tx.txn.Abort()
		return fmt.Errorf("set applied index: %w", err)
	}
	tx.txn.Commit()
	tx.gen.idempotencyKeys += tx.idempotencyDelta
	return nil
}

func txFirst[T any](tx *writeTx, table string, args ...any) (*T, error) {
	return first[T](tx.txn, nil, table, args...)
}

func txList[T any](tx *writeTx, table, index string, args ...any) ([]*T, error) {
	return list[T](tx.txn, nil, table, index, args...)
}
