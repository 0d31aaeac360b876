package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// TestDCAARefusedByEveryReplicaBacksOff: when every replica of an
// upstream refuses the subscription at once (here its links reset),
// the input moves to the other replica at once after the first refusal,
// but after a second in a row it waits the retry backoff before the
// next. Before, each refusal retargeted the input at once and it
// subscribed about 1800 times a second (a copy whose upstreams were not
// ready for it, at load 20), in a process already short of CPU. With
// the backoff (20 ms doubling to 1 s) a second holds a handful of
// attempts; the bound is far above that, and a loaded machine only
// makes fewer.
func TestDCAARefusedByEveryReplicaBacksOff(t *testing.T) {
	g := newAggRig(t, "5s", 32000)
	tk := g.c.workers[2].rt.task(queryspec.TaskID(g.q.Name, "counts", 0, 0))
	if tk == nil || tk.dm == nil {
		t.Fatal("the replicated aggregate does not run the DCAA machine")
	}
	var in *input
	waitUntil(t, "aggregate replica 0 reading partition 0", func() bool {
		_, in = readsReplica(tk, "lines", 0)
		return in != nil
	})
	for _, w := range g.c.workers[:2] {
		g.faults.CutOutgoing(w.addr, dataplane.Reset)
	}
	defer g.faults.HealAll()
	first := in.machineAttempt.Load()
	waitUntil(t, "a few subscriptions refused", func() bool { return in.machineAttempt.Load() >= first+3 })
	from, start := in.machineAttempt.Load(), time.Now()
	waitUntil(t, "a second of refusals", func() bool { return time.Since(start) >= time.Second })
	if n := in.machineAttempt.Load() - from; n > 50 {
		t.Fatalf("%d subscriptions in a second while every replica refused: no backoff", n)
	}
}
