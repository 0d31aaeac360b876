// Package fsm is the replicated state of one org's coordinator cluster: the
// hashicorp/raft finite state machine (FSM), the commands it applies and the
// indexed in-memory state store (hashicorp/go-memdb) that the coordinator's
// gRPC services and leader loops read from.
//
// Invariants:
//
//   - Every Raft log entry is one MessageType byte followed by a JSON body
//     (see Encode). Apply is deterministic: it depends only on the current
//     state and the entry (never on clocks, randomness or map order), so every
//     coordinator that applies the same log reaches the same state.
//   - Bodies decode with unknown fields ignored (forward compatible: an
//     entry or snapshot record written by a newer build applies here as it
//     did there). An unknown type with IgnoreUnknownTypeFlag set is skipped
//     and logged. An entry that cannot be applied (unknown type without the
//     flag, empty, truncated or corrupt body) is never skipped: the FSM
//     halts (Apply and Snapshot refuse from then on, Halted is closed) and
//     the coordinator stops the node, because a node that cannot apply an
//     entry must stop rather than silently diverge from its peers. A
//     command that decodes but is rejected (validation, not found, exists)
//     changes nothing and returns *ApplyResult with Err set.
//   - Apply always returns *ApplyResult, never a bare error.
//   - Records are copy-on-write: the store never mutates a stored record; a
//     change inserts a modified copy. Records returned by the StateStore are
//     shared with the store and with snapshots, so callers must not mutate
//     them (copy first).
//   - Every write transaction sets the modify index of each table it touched
//     to the log index, and LatestIndex to the highest log index applied, so
//     readers can block until an index moves past a value (BlockingQuery).
//   - A worker's AssignIndex is the log index at which its assignment view
//     (see StateStore.WorkerAssignments) last changed; whenever it changes the
//     worker record is rewritten, which fires watchers of that worker.
//   - Idempotency keys: a command carrying a key that was already applied is
//     not re-applied; the original result is returned. At most
//     MaxIdempotencyKeys keys are kept, the oldest (by log index) pruned first.
//     Only successful commands record their key. A command that also
//     carries a request hash (UpsertContractRequest) is refused with
//     ErrIdempotencyMismatch when its key was applied for another hash.
//   - Snapshots contain every table (including idempotency keys and table
//     indexes) and end with a record count and SHA-256; Restore builds a fresh
//     store and swaps it in only when the whole stream is valid, so a corrupt
//     or truncated snapshot leaves the previous state in place. A swap closes
//     the previous store generation's abandon channel so blocked readers wake
//     and re-read.
package fsm
