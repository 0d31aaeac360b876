package coordinator

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator/health"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// win is a one-second sensor window of task ending at second s.
func win(task string, s int64, in float64) *pb.TaskStats {
	return &pb.TaskStats{Task: task, InTps: in, ReportedAtMs: s * 1000, WindowMs: 1000}
}

// TestLiveStatsKeepsEveryWindow: a heartbeat carrying several windows of
// a task adds each new one to its history once (a window sent again is
// not added twice), the newest stands for the task, and a task missing
// from a report is gone with its history.
func TestLiveStatsKeepsEveryWindow(t *testing.T) {
	t.Parallel()
	l := newLiveStats()
	now := time.Now()
	l.put("w1", []*pb.TaskStats{win("a", 1, 10), win("b", 1, 20), win("a", 2, 11), win("b", 2, 21)}, now)
	l.put("w1", []*pb.TaskStats{win("a", 2, 11), win("b", 2, 21)}, now) // nothing new: sent again
	l.put("w1", []*pb.TaskStats{win("a", 3, 12), win("b", 3, 22)}, now)
	got := l.windows("a", "w1", 0)
	if len(got) != 3 || got[0].InTps != 10 || got[1].InTps != 11 || got[2].InTps != 12 {
		t.Fatalf("windows of a: %v, want the three windows once each, oldest first", got)
	}
	if after := l.windows("a", "w1", 2000); len(after) != 1 || after[0].ReportedAtMs != 3000 {
		t.Fatalf("windows of a after 2 s: %v", after)
	}
	if latest := l.of(map[string]bool{"a": true}, now.Add(-time.Minute))["a"]; len(latest) != 1 || latest[0].InTps != 12 || latest[0].Worker != "w1" {
		t.Fatalf("latest of a: %v", latest)
	}
	l.put("w1", []*pb.TaskStats{win("b", 4, 23)}, now)
	if got := l.windows("a", "w1", 0); len(got) != 0 {
		t.Fatalf("a task no longer reported keeps windows: %v", got)
	}
	for s := int64(5); s < 5+2*statsHistory; s++ {
		l.put("w1", []*pb.TaskStats{win("b", s, float64(s))}, now)
	}
	if got := l.windows("b", "w1", 0); len(got) != statsHistory || got[len(got)-1].ReportedAtMs != (4+2*statsHistory)*1000 {
		t.Fatalf("history of b: %d windows, want the newest %d", len(got), statsHistory)
	}
}

// TestHealthLoopSamplesEveryWindow: whatever the loop's interval and the
// order in which workers' windows arrive, every sensor window makes one
// sample, with the windows of the same second of every instance; an
// instance far ahead of another (its worker's reports were held up)
// skips its oldest windows rather than pairing windows seconds apart.
func TestHealthLoopSamplesEveryWindow(t *testing.T) {
	t.Parallel()
	s := &Server{liveStats: newLiveStats()}
	l := &healthLoop{s: s, cfg: HealthConfig{Window: 100}, queries: map[string]*healthQuery{}}
	l.cfg.fill()
	hq := l.query("q")
	tasks := []reportedTask{
		{task: &fsm.Task{ID: "q/f/p0/r0", Fragment: "f", Partition: 0, WorkerID: "w1"}, worker: "w1"},
		{task: &fsm.Task{ID: "q/f/p1/r0", Fragment: "f", Partition: 1, WorkerID: "w2"}, worker: "w2"},
	}
	now := time.Now()
	// w1 has sent seconds 1..3, w2 only 1..2: two samples now.
	s.liveStats.put("w1", []*pb.TaskStats{win("q/f/p0/r0", 1, 1), win("q/f/p0/r0", 2, 2), win("q/f/p0/r0", 3, 3)}, now)
	s.liveStats.put("w2", []*pb.TaskStats{win("q/f/p1/r0", 1, 101), win("q/f/p1/r0", 2, 102)}, now)
	l.addWindows(hq, tasks)
	// Nothing new: no sample.
	l.addWindows(hq, tasks)
	// w2 catches up with seconds 3 and 4, w1 sends 4.
	s.liveStats.put("w1", []*pb.TaskStats{win("q/f/p0/r0", 4, 4)}, now)
	s.liveStats.put("w2", []*pb.TaskStats{win("q/f/p1/r0", 3, 103), win("q/f/p1/r0", 4, 104)}, now)
	l.addWindows(hq, tasks)
	check := func(want [][2]float64) {
		t.Helper()
		got := hq.window["f"]
		if len(got) != len(want) {
			t.Fatalf("%d samples, want %d: %+v", len(got), len(want), got)
		}
		for i, smp := range got {
			if len(smp.Instances) != 2 || smp.Instances[0].InRate != want[i][0] || smp.Instances[1].InRate != want[i][1] {
				t.Fatalf("sample %d: %+v, want in rates %v", i, smp.Instances, want[i])
			}
		}
	}
	check([][2]float64{{1, 101}, {2, 102}, {3, 103}, {4, 104}})
	// w2 falls silent while w1 goes on for seconds 5..9: no sample, then
	// w2 sends seconds 8 and 9 only (its windows before were dropped):
	// seconds 5..7 are skipped, 8 and 9 make samples.
	for sec := int64(5); sec <= 9; sec++ {
		s.liveStats.put("w1", []*pb.TaskStats{win("q/f/p0/r0", sec, float64(sec))}, now)
		s.liveStats.put("w2", []*pb.TaskStats{win("q/f/p1/r0", 4, 104)}, now)
		l.addWindows(hq, tasks)
	}
	s.liveStats.put("w2", []*pb.TaskStats{win("q/f/p1/r0", 8, 108), win("q/f/p1/r0", 9, 109)}, now)
	l.addWindows(hq, tasks)
	check([][2]float64{{1, 101}, {2, 102}, {3, 103}, {4, 104}, {8, 108}, {9, 109}})
	// Windows end a little after the second (a late tick): still paired
	// by their second.
	late := win("q/f/p1/r0", 10, 110)
	late.ReportedAtMs += 180
	s.liveStats.put("w1", []*pb.TaskStats{win("q/f/p0/r0", 10, 10)}, now)
	s.liveStats.put("w2", []*pb.TaskStats{late}, now)
	l.addWindows(hq, tasks)
	check([][2]float64{{1, 101}, {2, 102}, {3, 103}, {4, 104}, {8, 108}, {9, 109}, {10, 110}})
	// Reports of older workers (no window length) pair in order.
	old := &healthQuery{window: map[string][]health.Sample{}}
	oldTasks := []reportedTask{
		{task: &fsm.Task{ID: "q/g/p0/r0", Fragment: "g", Partition: 0, WorkerID: "w3"}, worker: "w3"},
		{task: &fsm.Task{ID: "q/g/p1/r0", Fragment: "g", Partition: 1, WorkerID: "w4"}, worker: "w4"},
	}
	s.liveStats.put("w3", []*pb.TaskStats{{Task: "q/g/p0/r0", InTps: 1, ReportedAtMs: 20_100}}, now)
	s.liveStats.put("w4", []*pb.TaskStats{{Task: "q/g/p1/r0", InTps: 2, ReportedAtMs: 21_700}}, now)
	l.addWindows(old, oldTasks)
	l.addWindows(old, oldTasks)
	if g := old.window["g"]; len(g) != 1 || g[0].Instances[0].InRate != 1 || g[0].Instances[1].InRate != 2 {
		t.Fatalf("reports without a window length: %+v", old.window)
	}
}

// TestHeldBacklogCountsAsQueue: what an upstream holds for one partition
// (a slow one, which takes only what it processes) is part of that
// partition's queue in the samples, so the queue skew that tells a slow
// instance shows although the backlog waits upstream.
func TestHeldBacklogCountsAsQueue(t *testing.T) {
	t.Parallel()
	s := &Server{liveStats: newLiveStats()}
	l := &healthLoop{s: s, cfg: HealthConfig{Window: 10}, queries: map[string]*healthQuery{}}
	l.cfg.fill()
	hq := l.query("q")
	tasks := []reportedTask{
		{task: &fsm.Task{ID: "q/src/p0/r0", Fragment: "src", WorkerID: "w1"}, worker: "w1"},
		{task: &fsm.Task{ID: "q/op/p0/r0", Fragment: "op", Partition: 0, WorkerID: "w1"}, worker: "w1"},
		{task: &fsm.Task{ID: "q/op/p1/r0", Fragment: "op", Partition: 1, WorkerID: "w1"}, worker: "w1"},
	}
	src := win("q/src/p0/r0", 1, 0)
	src.Held = []*pb.HealthHeldBacklog{{Fragment: "op", Partition: 1, Tuples: 1800}, {Fragment: "op", Partition: 0, Tuples: 20}}
	p0, p1 := win("q/op/p0/r0", 1, 400), win("q/op/p1/r0", 1, 400)
	p0.Queue, p1.Queue = 5, 30
	s.liveStats.put("w1", []*pb.TaskStats{src, p0, p1}, time.Now())
	l.addWindows(hq, tasks)
	op := hq.window["op"]
	if len(op) != 1 || op[0].Instances[0].Queue != 25 || op[0].Instances[1].Queue != 1830 {
		t.Fatalf("op samples %+v, want queues 5+20 and 30+1800", op)
	}
}
