package dcaa

// Wiring into the task runtime (done for operator tasks: see
// worker/runtime/dcaa_run.go and docs/DATAPLANE.md; sinks run no machine
// and keep a consumer's view of their input instead, see
// worker/runtime/dcaa_sink.go).
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
//     after AfterID, tagging what the new subscription delivers (Deliver,
//     SubscriptionFailed) with its Attempt, so that a batch the replaced
//     one still hands over is ignored.
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
// The open point of ids was settled for positions: output buffers keep
// numbering stream positions (transport and acknowledgement), UNDO
// carries the position of the stream's last stable tuple (in its STime on
// the wire), and corrections take new positions. Output's own stable
// numbering is therefore not used by the runtime. Each batch carries the
// producer's position offset (positions outside the stable view so far),
// from which a consuming operator task renumbers its input by stable id:
// the Machine sees stable ids (Deliver, Subscribe.AfterID, Capture), the
// same on every upstream replica (worker/runtime stableIDs). Heartbeats are sent by
// the data plane (an empty batch with the state after every boundary
// interval without data). The machine still keeps the stable input since
// its checkpoint up to Config.KeepLimit (see Machine.bound).
//
// Rescaling: the runtime holds and cuts the machine (Machine.SetCut)
// instead of the stable merger; see worker/runtime/rescale.go.
