package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// MessageType is the first byte of every Raft log entry and selects the
// command that decodes the JSON body after it.
type MessageType uint8

// IgnoreUnknownTypeFlag marks a type that a node which does not know it may
// skip (used for commands added later that old nodes can safely ignore).
const IgnoreUnknownTypeFlag MessageType = 0x80

// Command types. Values are persisted in the Raft log: never renumber, only
// append.
const (
	RegisterWorkerType MessageType = iota + 1
	SetWorkerStatusType
	SubmitQueryType
	StopQueryType
	PlaceTasksType
	UpdateTaskStatesType
	// CreateTokenType was UpsertTokenType, which nothing ever proposed.
	CreateTokenType
	DeleteWorkerType
	UpsertOperatorVersionType
	UpsertContractType
	AppendLedgerEntryType
	RecordHealthActionType
	RevokeTokenType
)

// Command types of the plan applier (issue 9). They start at 40 so that
// types other work appends after RevokeTokenType never collide with them.
const (
	// ApplyPlanType carries an ApplyPlanRequest: the only command a
	// coordinator proposes to change where tasks run or which partition
	// owns a key slot.
	ApplyPlanType MessageType = 40
)

// Command types of live reconfiguration (issue 13), from 60 so that no
// other work's additions collide with them.
const (
	// ReconfigureQueryType carries a ReconfigureQueryRequest: one
	// reconfiguration plan (new operator versions) for a running query.
	ReconfigureQueryType MessageType = 60
)

// Command types of cross-org migration (issue 11 item 6), in their own
// block so that types other work appends never collide with them.
const (
	// UpsertHostedTaskType carries an UpsertHostedTaskRequest.
	UpsertHostedTaskType MessageType = 70
	// DeleteHostedTaskType carries a DeleteHostedTaskRequest.
	DeleteHostedTaskType MessageType = 71
	// AbortMoveType carries an AbortMoveRequest.
	AbortMoveType MessageType = 72
)

// Command types of the health manager (issue 14).
const (
	// HealthLogType carries a HealthLogRequest: an entry of the health
	// manager's action log, or its evaluated outcome.
	HealthLogType MessageType = 46
)

var messageTypeNames = map[MessageType]string{
	UpsertHostedTaskType:      "UpsertHostedTask",
	DeleteHostedTaskType:      "DeleteHostedTask",
	AbortMoveType:             "AbortMove",
	RegisterWorkerType:        "RegisterWorker",
	SetWorkerStatusType:       "SetWorkerStatus",
	SubmitQueryType:           "SubmitQuery",
	StopQueryType:             "StopQuery",
	PlaceTasksType:            "PlaceTasks",
	UpdateTaskStatesType:      "UpdateTaskStates",
	CreateTokenType:           "CreateToken",
	DeleteWorkerType:          "DeleteWorker",
	UpsertOperatorVersionType: "UpsertOperatorVersion",
	UpsertContractType:        "UpsertContract",
	AppendLedgerEntryType:     "AppendLedgerEntry",
	RecordHealthActionType:    "RecordHealthAction",
	RevokeTokenType:           "RevokeToken",
	ApplyPlanType:             "ApplyPlan",
	ReconfigureQueryType:      "ReconfigureQuery",
	HealthLogType:             "HealthLog",
	UpdateTaskStatesBatchType: "UpdateTaskStatesBatch",
}

// String names the type, e.g. "SubmitQuery" or "Unknown(0x85)".
func (t MessageType) String() string {
	if name, ok := messageTypeNames[t]; ok {
		return name
	}
	return fmt.Sprintf("Unknown(%#x)", uint8(t))
}

// Encode builds a log entry: the type byte followed by the JSON of body.
func Encode(t MessageType, body any) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte(byte(t))
	if err := json.NewEncoder(&buf).Encode(body); err != nil {
		return nil, fmt.Errorf("encode %s command: %w", t, err)
	}
	return buf.Bytes(), nil
}

// ApplyResult is what FSM.Apply returns for every entry, so callers can use
// future.Response().(*fsm.ApplyResult).
type ApplyResult struct {
	// Index is the log index at which the command took effect. For a
	// deduplicated retry it is the index of the original application.
	Index uint64
	// Value is the command's result (see each request type), nil if none.
	Value any
	// Err is non-nil when the command was rejected; then nothing changed.
	Err error
	// Deduplicated is true when the idempotency key had already been applied
	// and Value is the original result.
	Deduplicated bool
}

// RegisterWorkerRequest registers or re-registers a worker. The caller
// generates Worker.ID. Value: the worker id (string). Index fields in Worker
// are ignored; Status defaults to ready.
//
// With ReplaceSameAddr, any other worker registered at the same Addr is
// removed as DeleteWorker would (its tasks become unplaced, so the
// scheduler places them again): a worker process that restarts gets a new
// id, and two processes cannot serve one address, so the old record is
// dead. At stamps Worker.StatusSince.
type RegisterWorkerRequest struct {
	Worker          Worker `json:"worker"`
	IdempotencyKey  string `json:"idempotency_key,omitempty"`
	ReplaceSameAddr bool   `json:"replace_same_addr,omitempty"`
	At              int64  `json:"at,omitempty"`
}

// SetWorkerStatusRequest sets the status of a worker, or of each worker in
// WorkerIDs (then unknown ids are skipped, and WorkerID may be empty). At
// (Unix nanoseconds, from the leader's clock) stamps StatusSince when the
// status changes, or when it was never stamped. Value: nil.
type SetWorkerStatusRequest struct {
	WorkerID  string   `json:"worker_id"`
	WorkerIDs []string `json:"worker_ids,omitempty"`
	Status    string   `json:"status"`
	At        int64    `json:"at,omitempty"`
}

// SubmitQueryRequest creates a running query with its tasks. It fails with
// ErrQueryExists if a running query has that name; a stopped one is replaced.
// Tasks may already be placed (WorkerID set, the worker must exist). Task.ID
// must equal TaskID(Query.Name, Fragment, Partition, Replica); Task.Query may
// be left empty. Value: the query name (string).
type SubmitQueryRequest struct {
	Query          Query  `json:"query"`
	Tasks          []Task `json:"tasks"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// StopQueryRequest marks a query stopped and deletes its tasks. Stopping a
// stopped query is a no-op. ErrQueryNotFound if absent. Value: the name.
type StopQueryRequest struct {
	Name           string `json:"name"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// Placement puts one task on a worker; WorkerID "" unplaces it. Message
// becomes the task's Message (for an unplaced task: why it could not be
// placed).
type Placement struct {
	TaskID   string `json:"task_id"`
	WorkerID string `json:"worker_id"`
	Message  string `json:"message,omitempty"`
}

// PlaceTasksRequest is the placement command of older builds, kept so that
// their log entries still replay. No coordinator proposes it any more:
// every placement goes through the leader's plan applier as an
// ApplyPlanRequest, which re-checks it (see ApplyPlanRequest).
//
// It applies placements in order. Placements naming an unknown
// task or an unknown worker are skipped. A task that moves gets State pending
// and the placement's Message; an unplaced task that stays unplaced gets
// the placement's Message if it differs (a new reason to wait), without
// changing any worker's view. Value: *PlaceTasksResult.
type PlaceTasksRequest struct {
	Placements []Placement `json:"placements"`
}

// PlaceTasksResult reports what PlaceTasks did.
type PlaceTasksResult struct {
	Moved   int      `json:"moved"`   // placements that changed a task's worker
	Skipped []string `json:"skipped"` // task ids skipped (unknown task or worker)
}

// TaskStateUpdate is one task's reported state.
type TaskStateUpdate struct {
	TaskID  string `json:"task_id"`
	State   string `json:"state"`
	Message string `json:"message"`
	// Generation is the copy that reports; a report of another generation
	// than the task's current one is skipped. 0: not said (older workers).
	Generation int `json:"generation,omitempty"`
	// ReplicaState is the task replica's DCAA state ("REPLICA_STABLE",
	// "REPLICA_UP_FAILURE", "REPLICA_STABILIZATION"; "" when its query
	// has no replicas) and Tentative whether its output is tentative now.
	ReplicaState string `json:"replica_state,omitempty"`
	Tentative    bool   `json:"tentative,omitempty"`
	// Lossy: a DCAA correction could not make the copy's results exact
	// (see Task.Lossy).
	Lossy bool `json:"lossy,omitempty"`
	// Rescale progress (see Task.Prepared, Frontier, CutDone); zero when
	// no rescale is under way.
	Prepared uint64 `json:"prepared,omitempty"`
	Frontier int64  `json:"frontier,omitempty"`
	CutDone  uint64 `json:"cut_done,omitempty"`
	// MovePosition is the copy's output position while it takes part in a
	// live move (see Task.MoveCatchUp); nil otherwise. A report of the
	// moving-out copy (the worker and generation of Task.MovingFrom) is
	// recorded for it too.
	MovePosition *uint64 `json:"move_position,omitempty"`
	// MoveBlocked: the copy's output is full and blocked (no consumer
	// reads it yet): it can go no further until consumers switch to it.
	MoveBlocked bool `json:"move_blocked,omitempty"`
	// SwitchMove ends the live move of the task now, caught up or not:
	// the leader's bound on a new copy's catch-up (the other fields are
	// then ignored). Protocol 5.
	SwitchMove bool `json:"switch_move,omitempty"`
	// Live reconfiguration progress (see Task.ReconfigAcked); a report
	// with Reconfig false leaves the task's progress as it is (workers of
	// older builds). Protocol 6.
	Reconfig         bool              `json:"reconfig,omitempty"`
	ReconfigAcked    uint64            `json:"reconfig_acked,omitempty"`
	ReconfigLevel    uint64            `json:"reconfig_level,omitempty"`
	ReconfigFrontier int64             `json:"reconfig_frontier,omitempty"`
	ReconfigMarkers  []ReconfigMarkers `json:"reconfig_markers,omitempty"`
	// ReconfigSwitches: for a source, where its stream switched to each
	// of the newest epochs it produces under (see ReconfigSwitch).
	// Protocol 11, kept only from a request with KeepReconfig.
	ReconfigSwitches []ReconfigSwitch `json:"reconfig_switches,omitempty"`
}

// UpdateTaskStatesRequest records task states reported by a worker. Only
// tasks currently placed on that worker are updated; others are skipped
// (the report is stale). ErrWorkerNotFound if the worker is unknown. State
// changes do not change AssignIndex. Value: *UpdateTaskStatesResult.
type UpdateTaskStatesRequest struct {
	WorkerID string            `json:"worker_id"`
	States   []TaskStateUpdate `json:"states"`
	// KeepReconfig: keep every copy's reconfiguration frontier and switch
	// points in Task.ReconfigKept, the moving-out copy's of a live move
	// included, and set a plan's cut above the kept frontiers too. The
	// leader sets it only when every coordinator speaks protocol 11: an
	// older build ignores the field and would compute another cut from
	// the same entry. Without it the entry applies as before protocol 11.
	KeepReconfig bool `json:"keep_reconfig,omitempty"`
}

// UpdateTaskStatesResult reports what UpdateTaskStates did.
type UpdateTaskStatesResult struct {
	Updated int      `json:"updated"`
	Skipped []string `json:"skipped"` // task ids not placed on the worker
}

// CreateTokenRequest stores a new token. Token.ID must be non-empty,
// Token.SecretHash a HashSecret value (64 lowercase hex digits), Token.Role
// one of authz.TokenRoles, ExpiresUnixMs 0 or after CreatedUnixMs.
// ErrTokenExists if a token has that id or that secret. Value: the id.
type CreateTokenRequest struct {
	Token          Token  `json:"token"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// RevokeTokenRequest deletes a token: from the next read on, it no longer
// authenticates anyone. ErrTokenNotFound if absent. Value: the id.
type RevokeTokenRequest struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// DeleteWorkerRequest removes a worker; its tasks become unplaced (pending).
// ErrWorkerNotFound if absent. Value: nil.
type DeleteWorkerRequest struct {
	WorkerID string `json:"worker_id"`
	// reason, when set, becomes the Message of the unplaced tasks.
	reason string
}

// UpsertOperatorVersionRequest creates or replaces an operator version.
// Value: nil.
type UpsertOperatorVersionRequest struct {
	Version OperatorVersion `json:"version"`
}

// UpsertContractRequest creates or replaces a contract. Value: the
// contract's id (string). With IdempotencyKey set (a new proposal that a
// client may retry) a key already applied changes nothing and the value is
// the id of the contract the first request stored, or
// ErrIdempotencyMismatch when RequestHash differs from the first's.
// Both fields are optional: an older build ignores them (see the
// protocol notes at IdempotencyKey in package federation).
type UpsertContractRequest struct {
	Contract       Contract `json:"contract"`
	IdempotencyKey string   `json:"idempotency_key,omitempty"`
	// RequestHash fingerprints the client's request the key belongs to
	// (not the stored record, which a retry builds anew: its time and
	// signature differ).
	RequestHash string `json:"request_hash,omitempty"`
}

// AppendLedgerEntryRequest appends one ledger entry; it must extend the chain
// (ErrLedgerChain). The FSM checks linkage only; hashing and signatures are
// the caller's. Value: the entry's Seq (uint64).
type AppendLedgerEntryRequest struct {
	Entry LedgerEntry `json:"entry"`
}

// HealthLogRequest records an action of the health manager in the action
// log, or the evaluation of one recorded before. A new entry needs ID,
// Query, Fragment, Diagnosis, Action, AtMs and an Outcome (pending for an
// action to evaluate; alert, or failed when it could not be carried out,
// are final at once). An entry already in the log may only go from
// pending to a final outcome, with EvaluatedAtMs, and keeps everything
// else: an action is evaluated once and the log is never rewritten.
// ErrInvalidRequest otherwise. Value: nil. Protocol 6.
type HealthLogRequest struct {
	Action HealthAction `json:"action"`
}

// RecordHealthActionRequest creates or replaces a health action. Value: nil.
type RecordHealthActionRequest struct {
	Action HealthAction `json:"action"`
}

// UpsertHostedTaskRequest creates or replaces a hosted-task record. With
// IfGeneration > 0 it applies only while the stored record's generation
// is IfGeneration (ErrHostedStale otherwise), so a late report of an
// older copy cannot overwrite a newer move. Value: nil.
type UpsertHostedTaskRequest struct {
	Task         HostedTask `json:"task"`
	IfGeneration int        `json:"if_generation,omitempty"`
}

// DeleteHostedTaskRequest removes a hosted-task record; with
// IfGeneration > 0 only while its generation is that. Deleting a record
// that does not exist does nothing. Value: nil.
type DeleteHostedTaskRequest struct {
	ID           string `json:"id"`
	IfGeneration int    `json:"if_generation,omitempty"`
}

// AbortMoveRequest undoes a live move that has not ended: the task goes
// back to the worker and generation of its old copy (MovingFrom), which
// never stopped and which its consumers still read, and the new copy is
// no longer placed. It applies only while the task is still moving with
// its new copy at Generation (ErrNotMoving otherwise), so it cannot race
// the end of the move: whichever commits first wins. Cross-org migration
// uses it to roll back a move its partner did not complete. Value: nil.
type AbortMoveRequest struct {
	TaskID     string `json:"task_id"`
	Generation int    `json:"generation"`
	Reason     string `json:"reason,omitempty"`
}
