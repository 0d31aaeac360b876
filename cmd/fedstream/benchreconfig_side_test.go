package main

import (
	"errors"
	"testing"
)

// A window in which a process fell behind is merged with the next until
// every process is back at the paced count; the windows' overheads
// compare CPU per result.
func TestPairWindows(t *testing.T) {
	modes := []string{"off", "static", "dynamic"}
	w := func(cpu, n int) sideWindow { return sideWindow{CPUNanos: int64(cpu), Results: n, AllocBytes: int64(n)} }
	per := [][]sideWindow{
		{w(1000, 100), w(1000, 100), w(1000, 100), w(1000, 100)},
		// static falls behind in the second window, catches up in the third
		{w(1100, 100), w(600, 50), w(1600, 150), w(1100, 100)},
		{w(1000, 100), w(1000, 100), w(1000, 100), w(1000, 97)},
	}
	ws, warmup, err := pairWindows(modes, per, 100)
	if err != nil || warmup != 0 {
		t.Fatal(warmup, err)
	}
	if len(ws) != 3 || ws[0].Windows != 1 || ws[1].Windows != 2 || ws[2].Windows != 1 {
		t.Fatalf("windows %+v: want 1, 2 (merged), 1", ws)
	}
	if ws[1].Results["static"] != 200 || ws[1].MicrosPerResult["static"] != 0.011 || ws[1].AllocPerResult["static"] != 1 {
		t.Fatalf("merged window %+v", ws[1])
	}
	if got := ws[0].Static; got < 0.0908 || got > 0.0910 { // 1 - 10/11
		t.Fatalf("first window's static overhead %v, want 1-10/11", got)
	}
	if ws[0].Dynamic != 0 {
		t.Fatalf("first window's dynamic overhead %v, want 0", ws[0].Dynamic)
	}
	// A remainder that never caught up joins the last window.
	per[2][3] = w(1000, 10)
	if ws, _, err = pairWindows(modes, per, 100); err != nil || len(ws) != 2 || ws[1].Windows != 3 {
		t.Fatalf("remainder: %+v, %v: want 2 windows, the last of 3", ws, err)
	}
	// Leading windows until every process kept pace in one (here the
	// first delivering its start's backlog, then static's lag) are left
	// out.
	per[2][3] = w(1000, 100)
	per[0][0] = w(1000, 180)
	if ws, warmup, err = pairWindows(modes, per, 100); err != nil || warmup != 3 || len(ws) != 1 || ws[0].Windows != 1 {
		t.Fatalf("warm-up: %+v, %d, %v: want 3 left out, then one window", ws, warmup, err)
	}
	// Never at pace: every window, merged into one.
	late := [][]sideWindow{{w(1, 200), w(1, 200)}, {w(1, 100), w(1, 100)}, {w(1, 100), w(1, 100)}}
	if ws, warmup, err = pairWindows(modes, late, 100); err != nil || warmup != 0 || len(ws) != 1 || ws[0].Windows != 2 {
		t.Fatalf("never at pace: %+v, %d, %v", ws, warmup, err)
	}
	// A process that delivered nothing at all is an error.
	zero := [][]sideWindow{{w(1, 0)}, {w(1, 100)}, {w(1, 100)}}
	if _, _, err := pairWindows(modes, zero, 100); !errors.Is(err, errSideChild) {
		t.Fatalf("no results: err %v", err)
	}
	if _, _, err := pairWindows(modes, [][]sideWindow{{w(1, 1)}, {}, {w(1, 1)}}, 100); !errors.Is(err, errSideChild) {
		t.Fatalf("uneven windows: err %v", err)
	}
}
