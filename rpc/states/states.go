// Package states names the worker, task and query states that the
// coordinator stores, workers report and clients show. They travel as
// strings on the wire (rpc/fedstream.proto) and in the Raft log, so their
// spelling is part of the protocol: they are defined here, once, in a leaf
// package that the fsm, the coordinator, the worker runtime and the CLI all
// import, instead of as literals in each of them.
package states

// Worker statuses, as stored in the coordinator's workers table.
const (
	// WorkerReady: the worker's heartbeats reach the leader.
	WorkerReady = "ready"
	// WorkerDown: the worker missed its heartbeat TTL; its tasks are
	// placed elsewhere.
	WorkerDown = "down"
	// WorkerUnknown: a newly elected leader has not heard from the worker
	// yet, so it neither claims it is ready nor moves its tasks.
	WorkerUnknown = "unknown"
	// WorkerUnreachable: only shown (never stored), by the leader, for a
	// ready worker that has missed its heartbeats (silent for more than
	// half its heartbeat TTL) but is not declared down yet: it may have
	// been killed, paused or cut off.
	WorkerUnreachable = "unreachable"
)

// Task states. Pending is set by the coordinator; starting, running,
// stalled, failed and stopped are reported by the worker running the
// task; unknown, unreachable and lost are only shown (never stored) by the
// coordinator for a task whose worker's state is unknown, silent or down.
const (
	// TaskPending: not reported yet on its current worker (or unplaced).
	TaskPending = "pending"
	// TaskStarting: the worker is starting the task.
	TaskStarting = "starting"
	// TaskRunning: the task processes its input.
	TaskRunning = "running"
	// TaskStalled: running, but it has not moved for a while although it
	// has something to do; the message says why.
	TaskStalled = "stalled"
	// TaskFailed: the task stopped on an error; the message says which.
	TaskFailed = "failed"
	// TaskStopped: the task was stopped.
	TaskStopped = "stopped"
	// TaskUnknown: shown while the worker is not heard from since the
	// current leader took office.
	TaskUnknown = "unknown"
	// TaskLost: shown while the task's worker is down.
	TaskLost = "lost"
	// TaskUnreachable: shown while the task's worker has missed its
	// heartbeats (silent for more than half its heartbeat TTL, two of
	// its heartbeat intervals) but is not declared down yet: the
	// worker's last report (running, ...) may no longer hold.
	TaskUnreachable = "unreachable"
)

// Query statuses.
const (
	QueryRunning = "running"
	QueryStopped = "stopped"
)
