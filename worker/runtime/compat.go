package runtime

import (
	"fmt"
	"slices"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// snapshotForLevel returns snap as a worker of data-plane level level may
// receive it (rolling upgrades, docs/ARCHITECTURE.md). A copy started from
// a snapshot serves the output tuples it retains to its consumers again,
// so a worker of an older build must not get a tuple type it does not
// know among them: below rpc.DataPlaneLevelUncorrectable each
// UNCORRECTABLE record becomes a REC_DONE (see dataplane.DowngradeIndexed;
// positions and stable ids stay). Pending input holds data tuples only.
// snap itself is never changed (a halted snapshot is served again), only
// a copy of what differs.
func snapshotForLevel(snap *TaskSnapshot, level int32) (*TaskSnapshot, error) {
	if snap == nil || rpc.EffectiveDataPlaneLevel(level) >= rpc.DataPlaneLevelUncorrectable {
		return snap, nil
	}
	out := snap
	for i := range snap.Outputs {
		o := &snap.Outputs[i]
		tail, offs, n, err := dataplane.DowngradeIndexed(o.Tail, o.TailOffs, level)
		if err != nil {
			return nil, fmt.Errorf("snapshot for a worker of data-plane %s: output to %q partition %d: %w",
				rpc.DataPlaneLevelText(level), o.Consumer, o.Partition, err)
		}
		if n == 0 {
			continue
		}
		if out == snap {
			cp := *snap
			cp.Outputs = slices.Clone(snap.Outputs)
			out = &cp
		}
		out.Outputs[i].Tail, out.Outputs[i].TailOffs = tail, offs
	}
	return out, nil
}
