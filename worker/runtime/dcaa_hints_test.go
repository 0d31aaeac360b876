package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dcaa"
)

// The coordinator's replica state hints (Runtime.NoteReplicaStates, as a
// heartbeat answer brings them) reach the tasks that read those replicas
// and change the choice: counts replica 0 reads source partition 0's
// replica 0; told that replica 0 is in UP_FAILURE now and replica 1 is
// STABLE, its machine moves that input to replica 1, which it has never
// read. (Before, nothing passed the states on: the input stayed.) A
// sink keeps the hints of its upstream's replicas for its background
// reads.
func TestDCAAReplicaStateHintsReachTheTasks(t *testing.T) {
	g := newPropRig(t, "300ms", 16000)
	g.readingStable(t)
	agg := g.task(propAgg0)
	var in *input
	for _, i := range agg.inputsNow() {
		if i.upstream == "lines" && i.upPartition == 0 {
			in = i
		}
	}
	if in == nil {
		t.Fatal("counts replica 0 has no input from lines partition 0")
	}
	subscribed := func() int {
		if err := agg.lockProc(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer agg.unlockProc()
		return agg.dm.m.Subscribed(in.idx)
	}
	if r := subscribed(); r != 0 {
		t.Fatalf("counts replica 0 reads lines partition 0's replica %d before any hint, want 0", r)
	}
	hints := []ReplicaStateHint{
		{TaskID: "agg/lines/p0/r0", Generation: 1, State: fedstreampb.ReplicaState_REPLICA_UP_FAILURE},
		{TaskID: "agg/lines/p0/r1", Generation: 1, State: fedstreampb.ReplicaState_REPLICA_STABLE},
		{TaskID: propAgg1, Generation: 1, State: fedstreampb.ReplicaState_REPLICA_STABILIZATION},
	}
	// Heartbeats repeat the hints; a machine busy at one may miss it.
	waitUntil(t, "counts replica 0 moved to lines partition 0's replica 1 by the hint", func() bool {
		for _, w := range g.c.workers {
			w.rt.NoteReplicaStates(hints, time.Now())
		}
		return subscribed() == 1
	})
	h, ok := g.task(propSink0).hints.get(hintKey{"counts", 0, 1})
	if !ok || h.state != dcaa.Stabilization {
		t.Fatalf("sink replica 0's hint of counts replica 1: %+v %v, want STABILIZATION", h, ok)
	}
}
