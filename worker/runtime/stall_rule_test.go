package runtime

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// TestWaitingForInputStallRule drives checkStall's "waiting for input"
// rule with chosen clock readings: a merge with one input ahead (it
// brought a boundary beyond the last release) and one behind that sends
// nothing, the output standing still. An idle upstream sends only a
// boundary per boundary interval, so the input behind is stalled only
// after two intervals of silence, or StallAfter when that is longer (a
// report after StallAfter alone, 100 ms against a 1 s interval, was a
// false stall of TestIdleTasksAreNotStalled under load).
func TestWaitingForInputStallRule(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		after, interval, silent time.Duration
		stalled                 bool
	}{
		{after: 100 * ms, interval: time.Second, silent: 150 * ms, stalled: false},
		{after: 100 * ms, interval: time.Second, silent: 1500 * ms, stalled: false},
		{after: 100 * ms, interval: time.Second, silent: 2 * time.Second, stalled: true},
		{after: 100 * ms, interval: 10 * ms, silent: 99 * ms, stalled: false},
		{after: 100 * ms, interval: 10 * ms, silent: 100 * ms, stalled: true},
		{after: 30 * time.Second, interval: 50 * ms, silent: 10 * time.Second, stalled: false},
		{after: 30 * time.Second, interval: 50 * ms, silent: 30 * time.Second, stalled: true},
	} {
		t.Run(fmt.Sprintf("after=%v/interval=%v/silent=%v", tc.after, tc.interval, tc.silent), func(t *testing.T) {
			tk := waitingRig(tc.interval)
			start := time.Unix(1000, 0)
			tk.checkStall(start, tc.after) // the output's position, seen at start
			tk.checkStall(start.Add(tc.silent), tc.after)
			st := tk.State()
			if got := st.State == StateStalled; got != tc.stalled {
				t.Fatalf("stalled %v, want %v (%s)", got, tc.stalled, st.Message)
			}
		})
	}
}

// waitingRig is a running task, no runtime around it, whose merge waits
// for its second input: the first brought a boundary beyond the last
// release, the second nothing.
func waitingRig(interval time.Duration) *task {
	m := newMerger(8)
	m.addInput(0, 0)
	m.addInput(0, 1)
	m.inputs[0].boundary = 5
	tk := &task{
		r:     &Runtime{opts: Options{BoundaryInterval: interval}},
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		state: StateRunning,
		merge: m,
	}
	for p := range 2 {
		sub := dataplane.NewSubscriber(&fedstreampb.StreamRef{Query: "q", TaskId: fmt.Sprintf("q/up/p%d/r0", p)}, "", false, 0)
		tk.inputs = append(tk.inputs, &input{t: tk, upstream: "up", upPartition: p, sub: sub})
	}
	return tk
}

// TestRestoredDCAATaskIsNotWaitingForInput: a DCAA operator task's
// machine merges its inputs; task.merge is not fed. A copy restored from
// a peer's snapshot had that snapshot's input positions installed in
// task.merge all the same (one input with a boundary beyond the release,
// one not), where they stayed: once its input ended and its output stood
// still for StallAfter, the copy was reported stalled, "waiting for input
// from lines partition 0, which sent nothing since", while its consumers
// had its final boundary (TestLossyReplicaRebootstrapsFromStablePeer
// under load 20-34, both re-placed aggregate copies, session 18).
func TestRestoredDCAATaskIsNotWaitingForInput(t *testing.T) {
	tk := waitingRig(10 * time.Millisecond)
	tk.dm = &dcaaRun{t: tk}        // the machine merges; tk.merge holds what a restore installed
	tk.merge.inputs[0].pending = 3 // the snapshot's tuples waiting for release
	start := time.Unix(1000, 0)
	tk.checkStall(start, 30*time.Second)
	tk.checkStall(start.Add(time.Minute), 30*time.Second)
	if st := tk.State(); st.State == StateStalled {
		t.Fatalf("stalled: %s", st.Message)
	}
	if q, _ := tk.queueTuples(); q != 0 {
		t.Fatalf("queue %d: the tuples of a merge the task does not use", q)
	}
}
