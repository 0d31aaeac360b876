package fsm

// ProtocolVersion is the replication protocol this build speaks: which
// command types it can apply. Each coordinator advertises it (a serf tag),
// and the leader proposes a command type only once every coordinator of
// the org advertises at least the version that introduced it (see
// ProtocolOf), so a rolling upgrade never hands an older node an entry it
// would have to halt on.
//
// Versions:
//
//	1: every type up to RevokeTokenType; builds before the tag existed
//	   (they advertise nothing and count as 1).
//	2: forward compatible decoding (unknown fields ignored, an entry that
//	   cannot be applied halts the node) and the protocol tag itself.
//	3: ApplyPlanType (the plan applier's placements and slot maps), the
//	   slot-map table and task generations.
//	4: fields of ApplyPlanRequest an older build would ignore (and so
//	   apply differently): live placements (PlannedPlacement.Live), live
//	   rescales (SlotMapUpdate.Phase and Cut, NewTasks, RemoveTasks) and
//	   the rescale progress of task reports. No new command type: the
//	   leader checks ApplyPlanRequest.Protocol before proposing a plan.
//	5: live moves that switch consumers only once the new copy has caught
//	   up (PlannedPlacement.CatchUp, Task.MoveCatchUp, the move positions
//	   of task reports, TaskStateUpdate.SwitchMove). No new command type:
//	   the leader plans a catch-up move only when every coordinator speaks
//	   5, so an older build never holds a task with MoveCatchUp.
//	6: ReconfigureQueryType (live reconfiguration plans) and the
//	   reconfiguration progress of task reports, which only matters once
//	   a query has a plan (so an older build never meets it).
//	7: hosted tasks of cross-org migration (UpsertHostedTaskType,
//	   DeleteHostedTaskType) and AbortMoveType.
//	8: HealthLogType (the health manager's action log with evaluated
//	   outcomes).
//	9: live rescales of generator sources: the stream start of each
//	   partition a rescale added (SlotMapUpdate.Starts, SlotMap.Starts).
//	   No new command type: the leader checks ApplyPlanRequest.Protocol.
//	10: UpdateTaskStatesBatchType (several workers' task reports in one
//	   entry: the acknowledgements of a reconfiguration plan written
//	   together).
//	11: UpdateTaskStatesRequest.KeepReconfig: a task's reconfiguration
//	   frontier and its sources' switch points kept across its copies
//	   (Task.ReconfigKept), which the cut of a plan goes above. No new
//	   command type: the leader sets the field only once every
//	   coordinator speaks 11.
//	12: stop-and-copy live moves (PlannedPlacement.Halt, Task.MoveHalt):
//	   an older build would apply one as a live move whose old copy runs
//	   on. No new command type: the leader checks
//	   ApplyPlanRequest.Protocol before proposing a plan.
//
// A build that adds command types raises ProtocolVersion and lists them in
// commandProtocol with the new value.
const ProtocolVersion = 12

// HaltMoveProtocol is the version whose builds apply stop-and-copy live
// moves (PlannedPlacement.Halt).
const HaltMoveProtocol = 12

// KeepReconfigProtocol is the version whose builds apply
// UpdateTaskStatesRequest.KeepReconfig.
const KeepReconfigProtocol = 11

// BaseProtocol is the version every coordinator is assumed to speak,
// including one that advertises no version at all.
const BaseProtocol = 1

// commandProtocol maps every command type to the protocol version that
// introduced it. TestEveryCommandHasAProtocol keeps it complete.
var commandProtocol = map[MessageType]int{
	RegisterWorkerType:        1,
	SetWorkerStatusType:       1,
	SubmitQueryType:           1,
	StopQueryType:             1,
	PlaceTasksType:            1,
	UpdateTaskStatesType:      1,
	CreateTokenType:           1,
	DeleteWorkerType:          1,
	UpsertOperatorVersionType: 1,
	UpsertContractType:        1,
	AppendLedgerEntryType:     1,
	RecordHealthActionType:    1,
	RevokeTokenType:           1,
	ApplyPlanType:             3,
	ReconfigureQueryType:      6,
	UpsertHostedTaskType:      7,
	DeleteHostedTaskType:      7,
	AbortMoveType:             7,
	HealthLogType:             8,
	UpdateTaskStatesBatchType: 10,
}

// ProtocolOf returns the protocol version that introduced t; ok is false
// for a type this build does not know.
func ProtocolOf(t MessageType) (version int, ok bool) {
	v, ok := commandProtocol[t]
	return v, ok
}
