package fsm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fedstream/fedstream/rpc/authz"
	"github.com/fedstream/fedstream/rpc/states"
)

// Worker statuses. A worker is ready while its heartbeats reach the
// leader, down once it missed them past its TTL (its tasks are placed
// elsewhere), and unknown from the moment a newly elected leader takes
// office until the worker's first heartbeat to it: the new leader cannot
// know whether the worker survived (after a full restart it may be long
// gone), so it neither claims it is ready nor moves its tasks yet.
//
// The spellings live in rpc/states, shared with workers and clients.
const (
	WorkerStatusReady   = states.WorkerReady
	WorkerStatusDown    = states.WorkerDown
	WorkerStatusUnknown = states.WorkerUnknown
)

// Query statuses (see rpc/states).
const (
	QueryStatusRunning = states.QueryRunning
	QueryStatusStopped = states.QueryStopped
)

// TaskStatePending is the state of a task that has not reported yet on its
// current worker. The FSM sets it when a task is created without a state and
// whenever a task is moved to another worker or unplaced.
const TaskStatePending = states.TaskPending

// Token roles (rpc/authz defines what each may do).
const (
	RoleAdmin   = string(authz.RoleAdmin)
	RoleWriter  = string(authz.RoleWriter)
	RoleReader  = string(authz.RoleReader)
	RoleAuditor = string(authz.RoleAuditor)
	RoleWorker  = string(authz.RoleWorker)
)

// Worker is a registered worker process.
type Worker struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	Org    string            `json:"org"`
	Addr   string            `json:"addr"`
	Cores  int32             `json:"cores"`
	Labels map[string]string `json:"labels,omitempty"`
	Status string            `json:"status"` // WorkerStatusReady | WorkerStatusDown | WorkerStatusUnknown
	// StatusSince is when Status last changed (Unix nanoseconds, as the
	// leader's clock stamped the command; 0 if not known).
	StatusSince int64 `json:"status_since,omitempty"`
	// AssignIndex is the Raft index at which this worker's assignment view
	// (StateStore.WorkerAssignments) last changed.
	AssignIndex uint64 `json:"assign_index"`
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// Query is a continuous query's definition.
type Query struct {
	Name        string `json:"name"`
	SpecJSON    []byte `json:"spec_json,omitempty"`
	Status      string `json:"status"` // QueryStatusRunning | QueryStatusStopped
	Replicas    int    `json:"replicas"`
	MaxDelay    string `json:"max_delay"`
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// Task is one copy of one fragment of a query: the unit of placement.
type Task struct {
	ID        string `json:"id"` // TaskID(Query, Fragment, Partition, Replica)
	Query     string `json:"query"`
	Fragment  string `json:"fragment"`
	Partition int    `json:"partition"`
	Replica   int    `json:"replica"`
	// WorkerID is the worker the task is placed on; "" = unplaced.
	WorkerID string `json:"worker_id"`
	// Generation numbers the copies of this task: 1 for the first, and
	// one more each time the task leaves a worker it was placed on (moved,
	// re-placed after its worker was lost, unplaced), so an old and a new
	// copy of one partition replica are told apart everywhere. 0 in
	// records of older builds means 1 (see Gen).
	Generation int `json:"generation,omitempty"`
	// MovingFrom is, during a live move (PlannedPlacement.Live), the
	// worker still running the previous copy (generation
	// MovingFromGeneration) "moving out": the new copy on WorkerID takes
	// its starting snapshot from it, and it keeps serving its output until
	// the new copy reports running (and, with MoveCatchUp, has caught up),
	// which clears both fields. "" otherwise.
	MovingFrom           string `json:"moving_from,omitempty"`
	MovingFromGeneration int    `json:"moving_from_generation,omitempty"`
	State                string `json:"state"`
	Message              string `json:"message"`
	// ReplicaState and Tentative are the DCAA state last reported (see
	// TaskStateUpdate).
	ReplicaState string `json:"replica_state,omitempty"`
	Tentative    bool   `json:"tentative,omitempty"`
	// ScaleEpoch is, for a task a rescale created (a partition added),
	// the slot-map epoch it was created for; its first copy has that
	// generation and starts empty, taking its slots at the rescale's cut
	// (it has no peer to bootstrap from). 0 for tasks created on submit.
	ScaleEpoch uint64 `json:"scale_epoch,omitempty"`
	// Rescale progress the copy reported (see SlotMapNext): Prepared is
	// the epoch of the rescale it holds for, Frontier the highest stream
	// time it has produced or released, CutDone the epoch whose cut it
	// has passed (slots handed over and installed).
	Prepared uint64 `json:"prepared,omitempty"`
	Frontier int64  `json:"frontier,omitempty"`
	CutDone  uint64 `json:"cut_done,omitempty"`
	// MoveCatchUp makes a live move (MovingFrom set) end only once the new
	// copy has caught up with the old one: it runs and its output position
	// (MovePosition) has reached the old copy's (MovingFromPosition), so
	// consumers switch without waiting for the new copy to replay what
	// the old one already produced. Without it (moves planned before
	// protocol 5) the move ends as soon as the new copy runs. The leader
	// bounds the wait (TaskStateUpdate.SwitchMove). The positions are the
	// latest each copy reported during the move (nil: none yet); once the
	// move has ended they stay as they were at the switch (for status and
	// checks) until the task is placed again.
	MoveCatchUp        bool    `json:"move_catch_up,omitempty"`
	MovePosition       *uint64 `json:"move_position,omitempty"`
	MovingFromPosition *uint64 `json:"moving_from_position,omitempty"`
	// MoveBlocked: the new copy reported its output blocked (full, no
	// consumer yet): it cannot catch up further, so the move ends.
	MoveBlocked bool   `json:"move_blocked,omitempty"`
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// Gen is the task's generation, at least 1.
func (t *Task) Gen() int { return max(t.Generation, 1) }

// TaskID builds the id of a task: <query>/<fragment>/p<partition>/r<replica>.
func TaskID(query, fragment string, partition, replica int) string {
	return fmt.Sprintf("%s/%s/p%d/r%d", query, fragment, partition, replica)
}

// Token is an access token. Only the SHA-256 hex hash of the secret is
// stored (HashSecret); the raw secret never enters the Raft log. ID is the
// accessor that names the token in lists and revocations: knowing it grants
// nothing.
type Token struct {
	ID          string `json:"id"`
	SecretHash  string `json:"secret_hash"`
	Role        string `json:"role"` // one of authz.TokenRoles
	Description string `json:"description"`
	// CreatedUnixMs and ExpiresUnixMs are wall-clock times chosen by the
	// coordinator that proposed the token, so every node stores the same
	// values; ExpiresUnixMs 0 means the token does not expire. Expiry is
	// checked when the token is used (Expired), never by the FSM.
	CreatedUnixMs int64  `json:"created_unix_ms"`
	ExpiresUnixMs int64  `json:"expires_unix_ms,omitempty"`
	CreateIndex   uint64 `json:"create_index"`
	ModifyIndex   uint64 `json:"modify_index"`
}

// NewToken builds a Token for a raw secret, storing only its hash.
func NewToken(id, secret, role, description string) Token {
	return Token{ID: id, SecretHash: HashSecret(secret), Role: role, Description: description}
}

// Expired reports whether the token has expired at now.
func (t *Token) Expired(now time.Time) bool {
	return t.ExpiresUnixMs > 0 && now.UnixMilli() >= t.ExpiresUnixMs
}

// HashSecret returns the lowercase hex SHA-256 of a token secret. Secrets
// are drawn at random with 256 bits, so a fast unsalted hash is enough.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// OperatorVersion is one definition of an operator (live reconfiguration).
type OperatorVersion struct {
	Operator    string `json:"operator"`
	Version     string `json:"version"`
	SpecJSON    []byte `json:"spec_json,omitempty"`
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// Contract is a signed agreement with a partner org.
type Contract struct {
	ID          string `json:"id"`
	Partner     string `json:"partner"`
	Status      string `json:"status"`
	Body        []byte `json:"body,omitempty"` // the signed contract document
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// LedgerEntry is one entry of the org's hash-chained ledger. Seq starts at 1
// and is contiguous; PrevHash is the previous entry's Hash ("" for Seq 1).
type LedgerEntry struct {
	Seq         uint64 `json:"seq"`
	PrevHash    string `json:"prev_hash"`
	Hash        string `json:"hash"`
	Kind        string `json:"kind"`
	Body        []byte `json:"body,omitempty"`
	CreateIndex uint64 `json:"create_index"`
}

// HealthAction is one diagnosis and repair of the health manager.
type HealthAction struct {
	ID          string `json:"id"`
	Query       string `json:"query"`
	Diagnosis   string `json:"diagnosis"`
	Action      string `json:"action"`
	Detail      string `json:"detail"`
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// IdempotencyRecord remembers the result of a command applied with an
// idempotency key.
type IdempotencyRecord struct {
	Key   string      `json:"key"`
	Type  MessageType `json:"type"`
	Index uint64      `json:"index"` // log index at which the command took effect
	// Result is the JSON of the command's ApplyResult.Value.
	Result json.RawMessage `json:"result"`
}

// tableIndexEntry is a row of the internal index table: the modify index of a
// table, or (under appliedIndexKey) the highest log index applied.
type tableIndexEntry struct {
	Table string `json:"table"`
	Index uint64 `json:"index"`
}
