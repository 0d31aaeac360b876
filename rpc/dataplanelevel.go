package rpc

import "fmt"

// Data-plane feature levels. Workers of different builds run side by side
// during a rolling upgrade; each states the level of its build when it
// registers (RegisterRequest.dataplane_level) and when it subscribes to a
// stream (SubscribeRequest.dataplane_level), and a worker serving a stream
// states its own in the response header (DataPlaneLevelHeader). A level
// includes every lower one. A peer that states no level (0) runs a build
// from before levels existed and counts as DataPlaneLevelBase, although
// some such builds know more: assuming less only withholds a feature
// from it, assuming more would break it.
//
// Two rules follow (docs/ARCHITECTURE.md, "Rolling upgrades"):
//   - a producer never sends a subscriber a tuple type above the
//     subscriber's level (see worker/dataplane's compatibility rewrite);
//   - the coordinator starts nothing a worker involved cannot run: it
//     refuses, naming the workers, instead of letting an older build
//     misbehave (a quiescent reconfiguration plan needs
//     DataPlaneLevelQuiescent on every worker of the query; a rescale
//     read by a replicated operator needs DataPlaneLevelRescaleReaders
//     on that operator's workers).
const (
	// DataPlaneLevelBase: tuple types STABLE to REC_DONE (1-5), live
	// reconfiguration plans of strategy live.
	DataPlaneLevelBase int32 = 1
	// DataPlaneLevelUncorrectable: also tuple type UNCORRECTABLE (6).
	DataPlaneLevelUncorrectable int32 = 2
	// DataPlaneLevelQuiescent: also reconfiguration plans of strategy
	// quiescent (an older build runs them as live ones).
	DataPlaneLevelQuiescent int32 = 3
	// DataPlaneLevelRescaleReaders: also a replicated (DCAA) operator
	// that follows a live rescale of the fragment it reads: it holds its
	// machine at the prepare and takes the added partitions' streams at
	// the cut (an older build refuses to hold, and the rescale would be
	// aborted after placing its new tasks).
	DataPlaneLevelRescaleReaders int32 = 4

	// DataPlaneLevel is this build's level.
	DataPlaneLevel = DataPlaneLevelRescaleReaders
)

// DataPlaneLevelHeader is the gRPC response header in which a worker
// serving a Subscribe call states its data-plane level.
const DataPlaneLevelHeader = "fedstream-dataplane-level"

// StreamRestartedHeader is the gRPC response header ("1") in which a
// worker serving a Subscribe call says that the stream's producer started
// again without the state of its previous copy (re-placed with no replica
// to bootstrap from): its ids start again and do not continue the ones a
// reader took from that copy. The worker sends it at once, before any
// tuple, so that a reader asking after an id the new copy has not reached
// learns it without waiting for that id.
const StreamRestartedHeader = "fedstream-stream-restarted"

// EffectiveDataPlaneLevel is the level a peer that stated l has: l, or
// DataPlaneLevelBase when it stated none (0, an older build).
func EffectiveDataPlaneLevel(l int32) int32 {
	if l < DataPlaneLevelBase {
		return DataPlaneLevelBase
	}
	return l
}

// DataPlaneLevelText describes level l for messages: "level 2", or
// "no level (an older build: level 1)".
func DataPlaneLevelText(l int32) string {
	if l < DataPlaneLevelBase {
		return fmt.Sprintf("no level (an older build: level %d)", DataPlaneLevelBase)
	}
	return fmt.Sprintf("level %d", l)
}
