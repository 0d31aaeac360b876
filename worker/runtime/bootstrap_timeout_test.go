package runtime

import (
	"context"
	"testing"
	"time"
)

// A new copy whose bootstrap takes longer than the worker's own
// BootstrapTimeout, but not than the timeout its source gives it
// (SnapshotSource.Timeout: a copy at a partner org is given its owner's
// bound on the move), starts from the fetched snapshot. Before, the
// worker's fixed timeout (a minute by default) ended the fetch and the
// copy started without a snapshot, replaying from its upstreams'
// buffers. The bootstrap is held here past the worker's timeout as a
// fetch relayed across two orgs' coordinators on a busy machine is
// (16 s for 1 MB in session 21's soak).
func TestBootstrapTakesTheTimeItsSourceGives(t *testing.T) {
	const moving = "wc/counts/p0/r0"
	const own = 100 * time.Millisecond
	c := newMoveRun(t, moving, func(o *Options) { o.BootstrapTimeout = own })
	defer c.close(t)
	from, to := c.from, c.to
	to.rt.beforePin = func(spec TaskSpec) {
		if spec.TaskID == moving {
			// Stands for a slow fetch: the bootstrap's clock runs on.
			time.Sleep(3 * own)
		}
	}
	var moved TaskSpec
	for _, s := range c.specs[from] {
		if s.TaskID == moving {
			moved = s
		}
	}
	if moved.TaskID == "" {
		t.Fatalf("task %s is not on the worker it moves from", moving)
	}
	old := max(moved.Generation, 1)
	moved.Generation = old + 1
	moved.Bootstrap = &SnapshotSource{WorkerAddr: from.addr, TaskID: moving, Generation: old, Timeout: time.Minute}
	c.specs[to] = append(c.specs[to], moved)
	to.rt.Apply(context.Background(), c.specs[to])
	if tk := to.rt.task(moving); tk == nil || !tk.restored {
		t.Fatalf("the new copy of %s, whose bootstrap took %s against the worker's %s and the source's %s, did not start from the snapshot (states %v)",
			moving, 3*own, own, time.Minute, c.states())
	}
}
