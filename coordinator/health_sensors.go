package coordinator

import (
	"slices"
	"sort"
	"time"

	"github.com/fedstream/fedstream/coordinator/health"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// The health loop's intake of the one-second sensors (issue 14).
//
// Workers report each task's figures per sensor window (one second by
// default), every window once, as it closes (worker/sensors.go), and the
// leader keeps the last windows of each task (liveStats.windows). The
// loop turns them into samples one window at a time, so the policy sees
// every window whatever the heartbeat interval and its own interval.
// Windows close on multiples of the window on the wall clock on every
// worker, so the windows of one second of all instances make one sample:
// windows are matched by their end rounded to the window. They reach the
// leader at different moments, so a step may find a second's window of
// some instances and not yet of others; that second waits for the next
// step. A second some instance never reports (its worker's reports were
// held up longer than it keeps windows) is skipped once a later second
// is complete. Windows of workers that do not say their window's length
// (older builds) are matched in order instead.

// reportedTask is a replica-0 task with the worker whose reports stand
// for it.
type reportedTask struct {
	task   *fsm.Task
	worker string
}

// addWindows appends to hq's window one sample per sensor window that
// every task has reported since the last step.
func (l *healthLoop) addWindows(hq *healthQuery, tasks []reportedTask) {
	if len(tasks) == 0 {
		return
	}
	if hq.seen == nil {
		hq.seen = map[string]int64{}
	}
	wins := make([][]*pb.TaskStats, len(tasks))
	for i, t := range tasks {
		wins[i] = l.s.liveStats.windows(t.task.ID, t.worker, hq.seen[t.task.ID])
	}
	rounds, upto := alignWindows(wins)
	for i, t := range tasks {
		if upto[i] > hq.seen[t.task.ID] {
			hq.seen[t.task.ID] = upto[i]
		}
	}
	for _, round := range rounds {
		// What the upstreams hold for each partition is queued for it
		// too: a partition takes only what it processes, so the backlog
		// in front of one slow partition waits in its upstreams' buffers.
		held := map[string]map[int]int64{}
		for _, ts := range round {
			for _, h := range ts.Held {
				if held[h.Fragment] == nil {
					held[h.Fragment] = map[int]int64{}
				}
				held[h.Fragment][int(h.Partition)] += h.Tuples
			}
		}
		// keys: downstream fragment -> slot -> sampled tuples routed to it
		// in this window; keysSampled: the tuples its upstreams sampled in
		// all (the rebalance sums them over the samples it reads).
		keys, keysSampled := map[string]map[int]float64{}, map[string]float64{}
		byFrag := map[string][]health.Instance{}
		var at int64
		for i, ts := range round {
			t := tasks[i].task
			at = max(at, ts.ReportedAtMs)
			to := map[string]bool{}
			for _, k := range ts.KeySample {
				m := keys[k.Fragment]
				if m == nil {
					m = map[int]float64{}
					keys[k.Fragment] = m
				}
				m[int(k.Slot)] += float64(k.Count)
				to[k.Fragment] = true
			}
			for f := range to {
				keysSampled[f] += float64(ts.KeysSampled)
			}
			byFrag[t.Fragment] = append(byFrag[t.Fragment], health.Instance{Task: t.ID, Partition: t.Partition, Worker: t.WorkerID,
				InRate: ts.InTps, OutRate: ts.OutTps, Busy: ts.Busy, Queue: float64(ts.Queue + held[t.Fragment][t.Partition]),
				BlockedMs: ts.BackpressureMsPerS, Unacked: float64(ts.UnackedTuples), LagS: ts.SourceLagS,
				WindowS: float64(ts.WindowMs) / 1e3, OpenBusyS: ts.OpenBusyS})
		}
		for frag, ins := range byFrag {
			sort.Slice(ins, func(i, j int) bool { return ins[i].Partition < ins[j].Partition })
			w := append(hq.window[frag], health.Sample{At: time.UnixMilli(at), Instances: ins, Keys: keys[frag], KeysSampled: keysSampled[frag]})
			if len(w) > l.cfg.Window {
				w = w[len(w)-l.cfg.Window:]
			}
			hq.window[frag] = w
			if !hq.warmed {
				if hq.history == nil {
					hq.history = map[string][]health.Sample{}
				}
				h := append(hq.history[frag], w[len(w)-1])
				from := w[len(w)-1].At.Add(-l.warmupHistory())
				i := 0
				for i < len(h)-1 && (h[i].At.Before(from) || len(h)-i > maxHistory) {
					i++
				}
				hq.history[frag] = h[i:]
			}
		}
	}
}

// alignWindows pairs the new windows of several instances (each list
// oldest first): each round holds one window of every instance, of the
// same second (the window's end rounded to the longest window length
// reported), oldest round first. upto[i] is the end of the newest window
// of instance i that is consumed: those of the rounds and those of
// seconds older than the newest round that some instance lacks.
func alignWindows(wins [][]*pb.TaskStats) (rounds [][]*pb.TaskStats, upto []int64) {
	upto = make([]int64, len(wins))
	if len(wins) == 0 {
		return nil, upto
	}
	var g int64
	for _, w := range wins {
		for _, ts := range w {
			if ts.WindowMs <= 0 {
				return alignInOrder(wins)
			}
			g = max(g, ts.WindowMs)
		}
	}
	slot := func(ts *pb.TaskStats) int64 { return (ts.ReportedAtMs + g/2) / g }
	bySlot := make([]map[int64]*pb.TaskStats, len(wins))
	for i, w := range wins {
		bySlot[i] = map[int64]*pb.TaskStats{}
		for _, ts := range w {
			bySlot[i][slot(ts)] = ts // a later window of the same second wins
		}
	}
	var complete []int64
	for sl := range bySlot[0] {
		all := true
		for _, m := range bySlot[1:] {
			if m[sl] == nil {
				all = false
				break
			}
		}
		if all {
			complete = append(complete, sl)
		}
	}
	if len(complete) == 0 {
		return nil, upto
	}
	slices.Sort(complete)
	last := complete[len(complete)-1]
	for _, sl := range complete {
		round := make([]*pb.TaskStats, len(wins))
		for i := range wins {
			round[i] = bySlot[i][sl]
		}
		rounds = append(rounds, round)
	}
	for i, w := range wins {
		for _, ts := range w {
			if slot(ts) <= last {
				upto[i] = max(upto[i], ts.ReportedAtMs)
			}
		}
	}
	return rounds, upto
}

// alignInOrder pairs windows of workers that do not say their length:
// round i holds the i-th new window of every instance, as many rounds as
// the fewest windows of an instance.
func alignInOrder(wins [][]*pb.TaskStats) (rounds [][]*pb.TaskStats, upto []int64) {
	upto = make([]int64, len(wins))
	n := -1
	for _, w := range wins {
		if n < 0 || len(w) < n {
			n = len(w)
		}
	}
	for i := range max(n, 0) {
		round := make([]*pb.TaskStats, len(wins))
		for j, w := range wins {
			round[j] = w[i]
			upto[j] = w[i].ReportedAtMs
		}
		rounds = append(rounds, round)
	}
	return rounds, upto
}
