package dcaa

import (
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Proto is the state as carried on data-plane batches
// (Batch.replica_state) and in task reports (TaskState.replica_state).
func (s State) Proto() fedstreampb.ReplicaState {
	switch s {
	case Stable:
		return fedstreampb.ReplicaState_REPLICA_STABLE
	case UpFailure:
		return fedstreampb.ReplicaState_REPLICA_UP_FAILURE
	case Stabilization:
		return fedstreampb.ReplicaState_REPLICA_STABILIZATION
	}
	return fedstreampb.ReplicaState_REPLICA_STATE_UNSPECIFIED
}

// StateFromProto reads a carried state; values this build does not know
// read as Unknown.
func StateFromProto(p fedstreampb.ReplicaState) State {
	switch p {
	case fedstreampb.ReplicaState_REPLICA_STABLE:
		return Stable
	case fedstreampb.ReplicaState_REPLICA_UP_FAILURE:
		return UpFailure
	case fedstreampb.ReplicaState_REPLICA_STABILIZATION:
		return Stabilization
	}
	return Unknown
}

// StreamState is the in-band state of a task's output streams, as set on
// every batch they send: the replica's state and the output's tentative
// progress (Output.TentWatermark).
func (m *Machine) StreamState(out *Output) (fedstreampb.ReplicaState, int64) {
	return m.State().Proto(), out.TentWatermark()
}

// DeliverFromBatch builds the Deliver event of a received batch's tuples
// and its in-band state.
func DeliverFromBatch(input int, b *fedstreampb.Batch, tuples []tuple.Tuple) Deliver {
	return Deliver{Input: input, Tuples: tuples, Upstream: StateFromProto(b.ReplicaState), TentWatermark: b.TentativeWatermark}
}
