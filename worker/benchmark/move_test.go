package benchmark

import (
	"strings"
	"testing"
	"time"
)

// TestMoveInProcess runs bench move on a small state with in-process
// workers: both moves happen, state is transferred, and the moved run's
// results are the unmoved run's, row for row. (This is the check that
// found a live move losing and repeating windows at 64 MB.)
func TestMoveInProcess(t *testing.T) {
	var progress strings.Builder
	res, err := RunMove(t.Context(), MoveConfig{StateMB: 1, Duration: 10 * time.Second, Settle: time.Second,
		Launch: InProcessLauncher(testLogger()), Logger: testLogger(), Progress: &progress})
	if err != nil {
		t.Fatalf("%v\nprogress:\n%s", err, progress.String())
	}
	t.Logf("%+v", *res)
	if res.Lost != 0 || res.Duplicated != 0 || res.ResultRows == 0 {
		t.Fatalf("moved run vs reference: %d rows, %d lost, %d duplicated", res.ResultRows, res.Lost, res.Duplicated)
	}
	if res.StateMB <= 0 || res.LoopbackMBs <= 0 || res.LiveMoveMs <= 0 || res.StopCopyMoveMs <= 0 || res.StopCopyGapMs <= 0 || res.MoveRatio <= 0 {
		t.Fatalf("a figure is missing: %+v", *res)
	}
	if !strings.Contains(progress.String(), "live move done") {
		t.Fatalf("no progress reported:\n%s", progress.String())
	}
}

func TestCompareRows(t *testing.T) {
	lost, dup := compareRows([]string{"a", "b", "b", "c"}, []string{"a", "b", "c", "c", "d"})
	if lost != 1 || dup != 2 {
		t.Fatalf("lost %d, duplicated %d; want 1 and 2", lost, dup)
	}
}

func TestLongestGap(t *testing.T) {
	at := func(ms int64) int64 { return ms * 1e6 }
	times := []int64{at(0), at(50), at(100), at(400), at(450), at(1000)}
	from, to := time.Unix(0, at(120)), time.Unix(0, at(300))
	if got := longestGap(times, from, to); got != 300*time.Millisecond {
		t.Fatalf("gap %s, want 300ms (the interval 100..400 overlapping 120..300)", got)
	}
}
