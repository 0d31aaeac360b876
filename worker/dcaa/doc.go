package dcaa

// Wiring into the task runtime (not done yet; notes for it).
//
// One Machine per task with inputs, one Output per task (its output
// streams share the state). The runtime calls Step with the wall clock
// (monotonic, in nanoseconds) for every delivered batch (Deliver, with
// the batch's in-band replica_state and tentative_watermark), every
// failed subscription, every coordinator report of the upstream
// replicas' states, every peer message, and at NextDeadline (Tick). It
// carries out the actions in order:
//
//   - Subscribe: cancel the input's attempt and subscribe to that replica
//     after AfterID (today input.run rotates replicas by itself; with DCAA
//     the machine chooses).
//   - Checkpoint: snapshot the operators (the snapshot mechanism of
//     moves) together with Output.LastStable.
//   - Release: for each step, Process its tuples (Entry.Input is the
//     merge input index: port and upstream partition), Advance, then
//     Output.Boundary; Output.SetTentative(Release.Tentative) first.
//   - Restore: restore that snapshot, then Output.Undo; RecDone:
//     Output.RecDone.
//   - AskPermission, ReplyPermission, NotifyDone: messages to the peer
//     replicas of the partition (a small data-plane RPC); their answers
//     come back as PermissionReply / PermissionRequest / PeerDone.
//   - StateChange: report in TaskState.replica_state and set on every
//     batch of the task's outputs (with Output.TentWatermark).
//
// Open points for that wiring: Output numbers the stable stream (UNDO
// resets the numbering, so corrected tuples reuse the ids of the tentative
// ones they replace) while output buffers number stream positions; the
// buffers need to keep positions for transport and acknowledgement and
// carry the stable id alongside, or start a new position range after each
// UNDO. A producer whose output is tentative and has nothing to send must
// still send heartbeat batches (its state and tentative watermark), or
// its consumers will take it for silent. The machine keeps the stable
// input since its checkpoint without bound.
