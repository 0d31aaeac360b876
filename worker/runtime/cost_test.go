package runtime

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/tuple"
)

// TestCostClockAddsUpExactly: cost waits that wake up late are paid back
// by the next ones, so n waits of d cost n*d plus at most one late
// wake-up, however late each is (each wait here sleeps 0.4 ms too long;
// waiting d each time, as before, made 100 waits of 1 ms cost 140 ms).
func TestCostClockAddsUpExactly(t *testing.T) {
	var c costClock
	var total time.Duration
	late := func(_ context.Context, d time.Duration) (time.Duration, error) {
		total += d + 400*time.Microsecond
		return d + 400*time.Microsecond, nil
	}
	for range 100 {
		if err := c.spend(context.Background(), time.Millisecond, late); err != nil {
			t.Fatal(err)
		}
	}
	if total < 100*time.Millisecond || total > 100*time.Millisecond+400*time.Microsecond {
		t.Fatalf("100 waits of 1 ms slept %s, want 100 ms plus at most one late wake-up", total)
	}
	// A zero cost owes nothing.
	before := total
	_ = c.spend(context.Background(), 0, late)
	if total != before {
		t.Fatal("a zero cost slept")
	}
}

// TestCostCountsAsBusy: an operator's calibrated cost is a wait, and the
// busy-time sensor counts it: the keyed aggregate's busy time is at least
// its tuples times the cost, so its true processing rate (tuples per busy
// second, what the health manager sizes by) is at most the calibrated
// 1/cost.
func TestCostCountsAsBusy(t *testing.T) {
	q := fmt.Sprintf(costAggQuery, 400)
	c := newCluster(t, 1, q, func(string, int, int) int { return 0 })
	defer c.close(t)
	c.apply()
	_ = c.tail(t, "wc/out/p0/r0")
	var st TaskStats
	waitUntil(t, "the aggregate took every line", func() bool {
		for _, s := range c.workers[0].rt.Stats() {
			if s.TaskID == "wc/counts/p0/r0" {
				st = s
			}
		}
		return st.InTuples == 400
	})
	if st.BusyNanos < int64(st.InTuples)*int64(time.Millisecond) {
		t.Fatalf("aggregate busy %s for %d tuples at 1 ms each", time.Duration(st.BusyNanos), st.InTuples)
	}
	t.Logf("true rate %.0f tuples per busy second (calibrated 1000)", float64(st.InTuples)/(float64(st.BusyNanos)/1e9))
}

// TestCostTaskReleasesStepByStep: the merge of a task with a calibrated
// cost releases one step at a time, however far its input is ahead, and
// a release forced up to a rescale's cut goes step by step as well: a
// backlog is worked through in releases of one boundary interval, each
// followed by its cost and a flush, instead of one release sleeping for
// all of it (which stalled a splitter ten times too small for 30 s and
// more in bench scaling's real-org run).
func TestCostTaskReleasesStepByStep(t *testing.T) {
	m := newMerger(1 << 20)
	m.oneStep = true
	m.addInput(0, 0)
	var batch []tuple.Tuple
	id := uint64(0)
	for st := int64(1); st < 40; st++ {
		id++
		batch = append(batch, tuple.Tuple{Type: tuple.Stable, ID: id, STime: st})
		if st%10 == 0 {
			id++
			batch = append(batch, tuple.Tuple{Type: tuple.Boundary, ID: id, STime: st})
		}
	}
	id++
	batch = append(batch, tuple.Tuple{Type: tuple.Boundary, ID: id, STime: 40})
	if err := m.add(context.Background(), 0, batch, nil, 0); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.cut, m.cutStep = 25, true
	m.mu.Unlock()
	var got [][]int64
	var sizes []int
	for {
		rel, ok := m.take()
		if !ok {
			break
		}
		n := 0
		for _, r := range rel.runs {
			n += len(r.tuples)
		}
		got = append(got, slices.Clone(rel.steps))
		sizes = append(sizes, n)
	}
	want := [][]int64{{10}, {20}, {25}}
	if !slices.EqualFunc(got, want, slices.Equal[[]int64]) || !slices.Equal(sizes, []int{9, 10, 5}) {
		t.Fatalf("releases %v of %v tuples, want %v of [9 10 5]", got, sizes, want)
	}
}

// TestEveryTaskReleasesStepByStep: an operator task without a calibrated
// cost releases a backlog step by step too (merger.oneStep; the output is
// the same either way). Releasing a whole backlog at once made one
// merged run per tuple of it when the inputs' stimes interleave, in a
// slice that grew into fresh memory (about 9 % of an unreplicated copy's
// CPU in BenchmarkDCAAOverhead).
func TestEveryTaskReleasesStepByStep(t *testing.T) {
	q, err := queryspec.Parse("q.yaml", []byte(fmt.Sprintf(strings.Replace(costAggQuery, "    cost: 1ms\n", "", 1), 100)))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := q.FusedPlan()
	if err != nil {
		t.Fatal(err)
	}
	if plan.Node("counts").Op.CostDuration() != 0 {
		t.Fatal("the aggregate still has a cost")
	}
	c := newClusterOpts(t, 1, q, func(string, int, int) int { return 0 }, Options{})
	defer c.close(t)
	c.apply()
	tk := c.workers[0].rt.task("wc/counts/p0/r0")
	if tk == nil {
		t.Fatal("no aggregate task")
	}
	if !tk.merge.oneStep {
		t.Fatal("the aggregate's merger releases a backlog at once")
	}
}

// TestBusyCountsWhileReleasing: a task's busy time counts the release it
// is processing as it goes, not only once the release ends: an aggregate
// whose first release costs seconds (1 ms a tuple, scaled 2000 times)
// shows a second of busy time and more before it has taken a tuple. Before, it read 0 until the release ended, so a
// sensor window shorter than a release saw the task idle and then at
// most one window of busy time (the share is capped at 1), which made a
// saturated task's true rate look several times its real one.
func TestBusyCountsWhileReleasing(t *testing.T) {
	q := fmt.Sprintf(costAggQuery, 50)
	spec, err := queryspec.Parse("q.yaml", []byte(q))
	if err != nil {
		t.Fatal(err)
	}
	c := newClusterOpts(t, 1, spec, func(string, int, int) int { return 0 }, Options{CostScale: 2000})
	defer c.close(t)
	c.apply()
	read := func() TaskStats {
		for _, s := range c.workers[0].rt.Stats() {
			if s.TaskID == "wc/counts/p0/r0" {
				return s
			}
		}
		return TaskStats{}
	}
	var first TaskStats
	waitUntil(t, "busy time during the first release", func() bool {
		first = read()
		return first.BusyNanos > 0 && first.InTuples == 0
	})
	waitUntil(t, "busy time growing during the first release", func() bool {
		st := read()
		if st.BusyNanos < first.BusyNanos {
			t.Fatalf("busy time went back from %d to %d ns", first.BusyNanos, st.BusyNanos)
		}
		// A second of it: more than any release without a data tuple
		// (which costs nothing) adds.
		return st.BusyNanos-first.BusyNanos >= int64(time.Second) && st.InTuples == 0
	})
}

// TestBusyNanosNeverGoesBack: the busy time stats reports adds the
// release going on to what ended, and never decreases, even when a
// reading comes between the end of a release and its accounting.
func TestBusyNanosNeverGoesBack(t *testing.T) {
	var c taskCounters
	now := time.Unix(100, 0)
	since := now.Add(-300 * time.Millisecond).UnixNano()
	// 300 ms into a release, 100 ms of it blocked on an output.
	if got, open := c.busyNanos(since, 50, 50+int64(100*time.Millisecond), now); got != int64(200*time.Millisecond) || open != got {
		t.Fatalf("during a release: %v (open %v), want 200ms, all open", time.Duration(got), time.Duration(open))
	}
	// The release ended (busySince cleared) before its time was added:
	// the reading holds at what was shown.
	if got, open := c.busyNanos(0, 0, 0, now); got != int64(200*time.Millisecond) || open != 0 {
		t.Fatalf("between the end and its accounting: %v (open %v), want 200ms, none open", time.Duration(got), time.Duration(open))
	}
	c.busy.Add(int64(250 * time.Millisecond))
	if got, _ := c.busyNanos(0, 0, 0, now); got != int64(250*time.Millisecond) {
		t.Fatalf("after the accounting: %v, want 250ms", time.Duration(got))
	}
}

// costAggQuery is a keyed aggregate with a calibrated cost of 1 ms a
// tuple over a words generator of %d lines, read by one sink.
const costAggQuery = `
name: wc
sources:
  - name: lines
    generator: {kind: words, seed: 42, limit: %d}
operators:
  - name: counts
    type: aggregate
    input: lines
    window: {size: 2ms}
    group_by: [line]
    aggregates: {cnt: "count()"}
    cost: 1ms
sinks:
  - {name: out, input: counts}
`
