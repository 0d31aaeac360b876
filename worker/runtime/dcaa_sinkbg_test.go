package runtime

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Background corrections at a sink (dcaa_sinkbg.go): every replica of
// counts loses source partition 0 (links held) for longer than X, and
// both go tentative, and so do both sinks; then counts replica 1's links
// heal while replica 0's stay held. Replica 1 reconciles and is stable
// again. Sink replica 0, which reads counts replica 0, still tentative,
// reads replica 1 in the background and moves to it once it is stable
// again: the sink is stable while counts replica 0 is still failed.
// Without background reads (Options.DCAANoBackground, the same scenario
// in the same test) it stays tentative until counts replica 0 heals and
// corrects itself; that run holds counts replica 0 four times as long as
// the first run's sink took (at least a second), so the ratio of the two
// times from counts replica 1's REC_DONE to sink replica 0 stable is
// below 1/2 whenever the background read works, on any load. After
// healing, both sinks' stable outputs equal a failure-free run's.
func TestDCAASinkBackgroundCorrections(t *testing.T) {
	const limit = 16000
	want := failureFree(t, "5s", limit)
	withBg, ok, _ := sinkBackgroundRun(t, want, false, 0)
	if !ok {
		t.Fatal("no time from counts replica 1's REC_DONE to sink replica 0 stable measured with background reads")
	}
	hold := max(time.Second, 4*withBg)
	without, ok, moved := sinkBackgroundRun(t, want, true, hold)
	t.Logf("counts replica 1's REC_DONE to sink replica 0 stable: %v with background reads, %v without (counts replica 0 held %v more; seen: %v; moves without: %v)", withBg, without, hold, ok, moved)
	switch {
	case len(moved) > 0:
		// A starved process took counts replica 0 for silent and the
		// sink moved: the run without did not wait for replica 0.
		t.Log("the run without background reads moved the sink's input: no ratio")
	case ok && 2*withBg >= without:
		t.Fatalf("sink replica 0 stable %v after the REC_DONE with background reads, %v without: want less than half", withBg, without)
	}
}

// sinkBackgroundRun runs the scenario of TestDCAASinkBackgroundCorrections
// and returns the time from counts replica 1 stable again to sink replica
// 0 stable. With background reads it waits for
// sink replica 0 stable before healing counts replica 0 (and fails when
// it is not: before, it stayed tentative); without, it heals counts
// replica 0 after hold, the sink still tentative then unless its input
// moved for silence. moved names the sink's input if it read another
// replica than counts replica 0 before the heal.
func sinkBackgroundRun(t *testing.T, want []tuple.Tuple, without bool, hold time.Duration) (d time.Duration, ok bool, moved []string) {
	t.Helper()
	opts := dcaaOpts
	opts.DCAANoBackground = without
	g := newFaultRig(t, propQuery(t, "agg", "300ms", 16000), 6, []int{2, 4, 5}, opts, propPlace(true))
	g.c.apply()
	g.readingStable(t)
	a0, a1 := g.task(propAgg0), g.task(propAgg1)
	sink := g.task(propSink0)
	g.cut(2, dataplane.Hold, 0, 1)
	g.cut(5, dataplane.Hold, 0, 1)
	waitUntil(t, "both counts replicas tentative", func() bool { return a0.dm.tentSteps.Load() >= 15 && a1.dm.tentSteps.Load() >= 15 })
	waitUntil(t, "sink replica 0 tentative", sink.tentative.Load)
	watch := newStableWatch(a1, []*task{sink})
	defer watch.stop()
	g.faults[5].HealAll()
	g.stableAgain(t, propAgg1)
	if without {
		time.Sleep(hold) // counts replica 0 stays failed a while
		moved = g.readOther(0, propSink0)
		if !sink.tentative.Load() && len(moved) == 0 {
			t.Fatal("without background reads, sink replica 0 stable while counts replica 0 was failed and read")
		}
	} else {
		// Before, it stayed tentative here until counts replica 0 healed.
		g.stableAgain(t, propSink0)
		if n := sink.inputs[0].bgMoves.Load(); n == 0 {
			t.Logf("sink replica 0 stable without a background move (its input moved: %v)", g.readOther(0, propSink0))
		}
	}
	g.faults[2].HealAll()
	g.stableAgain(t, propAgg0)
	g.stableAgain(t, propSink0)
	g.stableAgain(t, propSink1)
	// The watch polls on its own: wait for it to see what stableAgain saw.
	waitUntil(t, "the watch seeing sink replica 0 stable", func() bool { _, ok := watch.delay(); return ok })
	d, ok = watch.delay()
	g.restAtSpeed(t)
	for _, id := range []string{propSink0, propSink1} {
		v := viewOf(g.c.tail(t, id))
		sameStable(t, v.stable, want, 40)
	}
	return d, ok, moved
}
