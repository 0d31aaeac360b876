package fsm

import "errors"

// ErrQueryExists is returned when a query is submitted under the name of a
// query that is still running.
var ErrQueryExists = errors.New("query already exists and is running")

// ErrQueryNotFound is returned when a command names a query that does not exist.
var ErrQueryNotFound = errors.New("query not found")

// ErrWorkerNotFound is returned when a command or read names a worker that is
// not registered.
var ErrWorkerNotFound = errors.New("worker not found")

// ErrUnknownCommand is the cause (within ErrHalted) of a halt on a log entry
// whose type this node does not know and that is not marked ignorable.
var ErrUnknownCommand = errors.New("unknown command type")

// ErrMalformedCommand is the cause (within ErrHalted) of a halt on a log
// entry that is empty or whose body cannot be decoded for its type
// (truncated, corrupt, a field of the wrong type).
var ErrMalformedCommand = errors.New("malformed command")

// ErrHalted is returned by Apply once the FSM met a committed entry it
// cannot apply: it then applies nothing more and the node must stop (see
// FSM.Halted). It wraps ErrUnknownCommand or ErrMalformedCommand.
var ErrHalted = errors.New("fsm halted at a committed log entry it cannot apply")

// ErrInvalidRequest is returned when a decoded command fails validation
// (missing id, bad status, inconsistent task id, ...). Nothing is changed.
var ErrInvalidRequest = errors.New("invalid request")

// ErrIdempotencyKeyReused is returned when an idempotency key that was used by
// a command of one type is presented with a command of another type.
var ErrIdempotencyKeyReused = errors.New("idempotency key reused by a different command type")

// ErrIdempotencyMismatch is returned when an idempotency key that was
// applied is presented again with a request of different content (its
// RequestHash differs): a retry must repeat the request it retries, so
// this is a client reusing a key for a new request, or a forged retry.
// Nothing is changed; the error names the key.
var ErrIdempotencyMismatch = errors.New("idempotency key reused for a request of different content")

// ErrLedgerChain is returned when a ledger entry does not extend the chain:
// its sequence number is not last+1 or its PrevHash is not the last hash.
var ErrLedgerChain = errors.New("ledger entry does not extend the chain")

// ErrCorruptSnapshot is returned by Restore when the snapshot stream is
// truncated, corrupt, of an unsupported version or holds an unknown record
// kind. The previous state is left in place.
var ErrCorruptSnapshot = errors.New("corrupt snapshot")

// ErrTokenExists is returned when a token is created with the id or the
// secret of an existing token.
var ErrTokenExists = errors.New("token already exists")

// ErrTokenNotFound is returned when a command names a token that does not
// exist (never created, or revoked).
var ErrTokenNotFound = errors.New("token not found")

// ErrHostedStale is returned when a hosted-task command names a
// generation the stored record no longer has (a newer move replaced it).
var ErrHostedStale = errors.New("hosted task record has another generation")

// ErrNotMoving is returned when an AbortMove names a task that is not in
// a live move with a new copy of that generation (the move ended, or
// another one replaced it).
var ErrNotMoving = errors.New("task is not moving with a new copy of that generation")
