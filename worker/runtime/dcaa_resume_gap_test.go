package runtime

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// s15 diagnosis (relayed_downstream under load: "subscriber resumes after
// discarded tuples; it misses some" for a DCAA operator input, and that
// chain's sink then had fewer results than the other, naming nothing).
// A DCAA operator task's input that resumes by stable id on a replica of
// the same lineage that no longer holds the ids after it (discarded:
// acknowledged by others, or past its buffer bound) skips them. Outside
// DCAA such a gap is named (gaploss.go, noteInputGap); a DCAA input
// names nothing.
func TestDCAAInputResumedOverAGapNamesIt(t *testing.T) {
	q, fake, c, w, up0, up1 := countsOverFakeLines(t, "rgap")
	all := append(stableLines(30, true), fakeTuple{"end", 0})
	// Replica 0 has produced the first 15 only (ids 1 to 15).
	fake.stream(t, up0, all[:15]...)
	// Replica 1 has it all, but discarded ids 1 to 20 (acknowledged by
	// another consumer).
	b1 := fake.put(t, up1, dataplane.BufferOptions{}, 0, fakeTuples(all...)...)
	b1.Register("other")
	b1.Ack("other", 20)
	c.apply()
	agg := failOverAfter(t, q, fake, w, up0, 15)
	got := viewOf(c.tail(t, queryspec.TaskID(q.Name, "out", 0, 0)))
	named := w.rt.task(agg).unc.list()
	t.Logf("aggregate named %v; sink: %d stable, %d records", named, len(got.stable), len(got.uncorrectable))
	if len(got.uncorrectable) == 0 {
		t.Errorf("the aggregate skipped ids 16 to 20 of its input (a resumption over discarded tuples) and its sink names nothing")
	}
}

// s17 diagnosis (TestRescaleKeyedAggregate/replicas=2 red in CI: one sink
// replica had an UNCORRECTABLE record the other had not, while every
// result was right). A DCAA operator input whose subscription is
// cancelled (its upstream replica moved, or the machine chose another)
// while the machine has its batch queued gives up waiting; the machine
// then takes the batch all the same, and its next Subscribe resumes
// after the batch's ids. The input's stable id (input.stableTaken) was
// moved by the delivery only, so it stayed behind: the resumption looked
// like a skip over ids the replica no longer held, and the input named
// the results between as lost though nothing was missing. A batch
// holding the final boundary left the input not ended (input.endTaken,
// which a rescale waits for). Here the machine is held (proc) while the
// batch is handed to it, and the subscription is cancelled right after:
// deterministic.
func TestDCAAInputCancelledWhileTheMachineTakesItsBatchNamesNothing(t *testing.T) {
	all := append(stableLines(30, true), fakeTuple{"end", 0}) // stable ids 1 to 34
	for _, tc := range []struct {
		name string
		upTo int // the batch cancelled: ids 12 to upTo
	}{
		{"a batch", 22},
		{"the last batch, with the final boundary", len(all)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, fake, c, w, up0, up1 := countsOverFakeLines(t, "took")
			b0 := fake.stream(t, up0, all[:11]...)
			fake.stream(t, up1, all...)
			var armed atomic.Bool
			cancelled := make(chan struct{})
			w.rt.dcaaPosted = func(in *input) {
				if !armed.CompareAndSwap(true, false) {
					return
				}
				// As placementsChanged does when the upstream replica
				// moves.
				in.mu.Lock()
				if in.cancelCur != nil {
					in.cancelCur()
					in.cancelCur = nil
				}
				in.mu.Unlock()
				close(cancelled)
			}
			c.apply()
			agg := queryspec.TaskID(q.Name, "counts", 0, 0)
			var tk *task
			waitUntil(t, "the aggregate taking replica 0's first 11 ids", func() bool {
				tk = w.rt.task(agg)
				return tk != nil && tk.inputs[0].stableTaken.Load() == 11
			})
			in := tk.inputs[0]
			if err := tk.lockProc(t.Context()); err != nil {
				t.Fatal(err)
			}
			armed.Store(true)
			n := appendAs(t, b0, 11, fakeTuples(all[11:tc.upTo]...)...)
			select {
			case <-cancelled:
			case <-time.After(30 * time.Second):
				tk.unlockProc()
				t.Fatal("the input never handed its batch to its machine")
			}
			waitUntil(t, "the delivery giving up", func() bool { return !in.health.busy.Load() })
			taken := in.stableTaken.Load()
			tk.unlockProc()
			// The machine takes the batch now; the input reads either
			// replica again after it, both hold the rest.
			appendAs(t, b0, n, fakeTuples(all[tc.upTo:]...)...)
			got := viewOf(c.tail(t, queryspec.TaskID(q.Name, "out", 0, 0)))
			t.Logf("stable id %d when the delivery gave up; sink: %d stable, %d records; aggregate named %v", taken, len(got.stable), len(got.uncorrectable), tk.unc.list())
			if len(got.uncorrectable) != 0 || len(tk.unc.list()) != 0 {
				t.Errorf("nothing was lost, but the sink has %d UNCORRECTABLE records and the aggregate named %v", len(got.uncorrectable), tk.unc.list())
			}
			counted := int64(0) // the windows' counts (n, the first field)
			for _, tp := range got.stable {
				if tp.Type == tuple.Stable {
					counted += tp.Values[0].I
				}
			}
			if counted != 30 || got.tentative+got.undos != 0 {
				t.Errorf("the sink counted %d lines (want 30), %d tentative, %d UNDO", counted, got.tentative, got.undos)
			}
			// The sink's end came after the machine took the input's.
			if !in.endTaken.Load() {
				t.Errorf("the aggregate ended, but its input is not noted ended (a rescale would wait for it)")
			}
		})
	}
}
