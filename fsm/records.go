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
	// DataPlaneLevel is the data-plane feature level the worker's build
	// stated when it registered (rpc.DataPlaneLevel); 0: it stated none
	// (a build from before levels). Optional: an older coordinator
	// ignores the field, so no protocol version gates it.
	DataPlaneLevel int32 `json:"dataplane_level,omitempty"`
	// AssignIndex is the Raft index at which this worker's assignment view
	// (StateStore.WorkerAssignments) last changed.
	AssignIndex uint64 `json:"assign_index"`
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// Query is a continuous query's definition.
type Query struct {
	Name     string `json:"name"`
	SpecJSON []byte `json:"spec_json,omitempty"`
	Status   string `json:"status"` // QueryStatusRunning | QueryStatusStopped
	Replicas int    `json:"replicas"`
	MaxDelay string `json:"max_delay"`
	// Reconfig is the query's live reconfiguration state (plans and the
	// versions they introduced); nil until the first plan (issue 13).
	Reconfig *QueryReconfig `json:"reconfig,omitempty"`
	// PaceOrigin is the wall-clock time (Unix nanoseconds) the query's
	// paced generators place their record 0 at, fixed by the leader when
	// it proposed the query: every partition and replica paces from it,
	// so their stream times keep step whenever each started (0: each
	// paces from its own start, as records of older builds do).
	PaceOrigin  int64  `json:"pace_origin,omitempty"`
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
	// Lossy is the current copy's last report that a DCAA correction
	// could not make its results exact, so its stable stream is no longer
	// its peer replicas'. The leader replaces such a copy by one
	// bootstrapped from a STABLE peer that is not lossy (coordinator
	// rebootstrapLossy); a re-placement clears it (the next copy starts
	// exact).
	Lossy bool `json:"lossy,omitempty"`
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
	MoveBlocked bool `json:"move_blocked,omitempty"`
	// MoveHalt makes a live move stop-and-copy (PlannedPlacement.Halt):
	// the new copy's snapshot halts the old copy, which processes and
	// acknowledges nothing after it, so the task never has two copies
	// taking input. The leader moves so a task whose producer is in a
	// move that does not end (coordinator inOrder). Protocol 12.
	MoveHalt bool `json:"move_halt,omitempty"`
	// Live reconfiguration progress the copy reported (see
	// QueryReconfig): the newest epoch whose versions it has loaded, the
	// newest epoch whose markers it has from every upstream instance, the
	// highest stream time it has produced (or, a task other than a source,
	// received), and its marker counts for the epochs above ReconfigLevel.
	ReconfigAcked    uint64            `json:"reconfig_acked,omitempty"`
	ReconfigLevel    uint64            `json:"reconfig_level,omitempty"`
	ReconfigFrontier int64             `json:"reconfig_frontier,omitempty"`
	ReconfigMarkers  []ReconfigMarkers `json:"reconfig_markers,omitempty"`
	// ReconfigKept is what the task's copies, every one of them (earlier
	// generations, the old copy of a live move), reported of where their
	// stream stands against the plans: placing the task again keeps it
	// (resetReconfig does not clear it), and a new copy is given it with
	// its assignment (see ReconfigKept). Recorded only from reports whose
	// request has KeepReconfig (protocol 11).
	ReconfigKept *ReconfigKept `json:"reconfig_kept,omitempty"`
	CreateIndex  uint64        `json:"create_index"`
	ModifyIndex  uint64        `json:"modify_index"`
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

// HealthAction is one diagnosis and repair of the health manager: its
// action log entry. The fields after Detail are written only by
// HealthLogRequest (protocol 6).
type HealthAction struct {
	ID        string `json:"id"`
	Query     string `json:"query"`
	Diagnosis string `json:"diagnosis"`
	Action    string `json:"action"`
	Detail    string `json:"detail"`
	// Fragment acted on, the symptoms seen (in words), when the action was
	// decided (Unix ms, the leader's clock) and the figures behind it
	// (JSON of coordinator/health.Metrics).
	Fragment string `json:"fragment,omitempty"`
	Symptoms string `json:"symptoms,omitempty"`
	AtMs     int64  `json:"at_ms,omitempty"`
	Metrics  string `json:"metrics,omitempty"`
	// FromParallelism and ToParallelism of a scaling action.
	FromParallelism int `json:"from_parallelism,omitempty"`
	ToParallelism   int `json:"to_parallelism,omitempty"`
	// Outcome is HealthPending until the action is evaluated after its
	// settling time, then one of the final outcomes (see
	// HealthLogRequest); OutcomeDetail says why, EvaluatedAtMs when.
	Outcome       string `json:"outcome,omitempty"`
	OutcomeDetail string `json:"outcome_detail,omitempty"`
	EvaluatedAtMs int64  `json:"evaluated_at_ms,omitempty"`
	CreateIndex   uint64 `json:"create_index"`
	ModifyIndex   uint64 `json:"modify_index"`
}

// Outcomes of a health action.
const (
	HealthPending     = "pending"
	HealthImproved    = "improved"
	HealthNotImproved = "not_improved"
	HealthFailed      = "failed"
	HealthAlert       = "alert"
)

// healthFinal reports whether an outcome is final (an evaluated action or
// an alert).
func healthFinal(o string) bool {
	return o == HealthImproved || o == HealthNotImproved || o == HealthFailed || o == HealthAlert
}

// IdempotencyRecord remembers the result of a command applied with an
// idempotency key.
type IdempotencyRecord struct {
	Key   string      `json:"key"`
	Type  MessageType `json:"type"`
	Index uint64      `json:"index"` // log index at which the command took effect
	// Result is the JSON of the command's ApplyResult.Value.
	Result json.RawMessage `json:"result"`
	// RequestHash is the fingerprint of the request that used the key
	// (commands that carry one: UpsertContractRequest), "" otherwise.
	RequestHash string `json:"request_hash,omitempty"`
}

// tableIndexEntry is a row of the internal index table: the modify index of a
// table, or (under appliedIndexKey) the highest log index applied.
type tableIndexEntry struct {
	Table string `json:"table"`
	Index uint64 `json:"index"`
}

// Phases of a hosted task (cross-org migration).
const (
	// HostedMoving: the host's copy is being started from the owner's
	// running copy; the owner's copy still serves every consumer.
	HostedMoving = "moving"
	// HostedRunning: the host's copy runs and the owner's consumers read
	// it; the owner's copy has stopped.
	HostedRunning = "running"
	// HostedReturning: the owner is starting a copy at home from the
	// host's copy; the host's copy still serves every consumer.
	HostedReturning = "returning"
)

// HostedTask is one task of an owner org running at a partner (host)
// org under a contract. Both orgs record it in their own Raft state: the
// owner to know where its task runs and to bring it home if the host
// dies; the host to run it on one of its workers (WorkerID) and to know
// whose streams its cross-org data-plane port may relay. It also holds
// what a ledger entry of the move needs: the contract, the task, when it
// started and the load it carries.
type HostedTask struct {
	// ID is HostedTaskID(Owner, TaskID).
	ID        string `json:"id"`
	Owner     string `json:"owner"`
	Host      string `json:"host"`
	Contract  string `json:"contract"`
	Query     string `json:"query"`
	TaskID    string `json:"task_id"`
	Fragment  string `json:"fragment"`
	Partition int    `json:"partition"`
	Replica   int    `json:"replica"`
	// Generation is the generation of the copy at the host (the owner's
	// copy it started from has Generation-1 or less).
	Generation int `json:"generation"`
	// WorkerID is, at the host, the worker running the copy; "" at the
	// owner and while unplaced.
	WorkerID string `json:"worker_id,omitempty"`
	// Phase is HostedMoving, HostedRunning or HostedReturning.
	Phase string `json:"phase"`
	// Since is when the move started (Unix nanoseconds, the owner's
	// leader's clock).
	Since int64 `json:"since"`
	// Load is the load (cores busy) the owner declared for the task when
	// it moved it, counted against the contract's max load.
	Load float64 `json:"load"`
	// SpecJSON is, at the host, the owner's query definition (the host
	// runs one task of a query it does not own).
	SpecJSON []byte `json:"spec_json,omitempty"`
	// At the host, what its worker needs to run a task of a query it does
	// not own: the generation of the owner's copy to take the starting
	// snapshot from (SourceGeneration), every task of the query (Peers,
	// to find upstreams and count downstream replicas) and the slot maps
	// of its keyed fragments as the owner had them when the task moved.
	SourceGeneration int          `json:"source_generation,omitempty"`
	Peers            []HostedPeer `json:"peers,omitempty"`
	SlotMaps         []SlotMap    `json:"slot_maps,omitempty"`
	// ReconfigJSON is, at the host, the owner's live reconfiguration
	// state of the query (QueryReconfig JSON; nil without one) and
	// MarkersExpected how many markers per epoch the task gets: the
	// owner sends both with the move and with every sync, so the copy runs
	// the query's versions like the owner's tasks.
	ReconfigJSON    []byte `json:"reconfig_json,omitempty"`
	MarkersExpected int    `json:"markers_expected,omitempty"`
	// BootstrapTimeoutMs is, at the host, how long the owner waits for
	// the move (its catch-up bound and two partner timeouts, in ms; 0
	// from an older owner): the host's worker may take that long to fetch
	// the starting snapshot across the orgs (SnapshotSource.timeout_ms).
	// A node of an older build drops it, and the worker then uses its
	// own bootstrap timeout, as before.
	BootstrapTimeoutMs int64 `json:"bootstrap_timeout_ms,omitempty"`
	// OwnerIndex is, at the host, the owner's Raft index once it had
	// recorded this generation's move (0 from an older owner): a sync
	// whose task list the owner read at an older index may not list the
	// task yet, and says nothing about it (syncRequest.StateIndex).
	OwnerIndex uint64 `json:"owner_index,omitempty"`
	// State and Message are what the host's worker last reported.
	State       string `json:"state,omitempty"`
	Message     string `json:"message,omitempty"`
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// HostedPeer is one task of a hosted task's query, as the host sees it.
type HostedPeer struct {
	TaskID    string `json:"task_id"`
	Fragment  string `json:"fragment"`
	Partition int    `json:"partition"`
	Replica   int    `json:"replica"`
}

// HostedTaskID is the id of the hosted-task record of owner's task.
func HostedTaskID(owner, taskID string) string { return owner + "|" + taskID }
