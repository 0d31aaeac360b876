package main

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/benchmark"
	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// TestStallsTellStarvationFromAStoppedStage: a gap at the sink during
// which one task stopped emitting while the process ran is reported as
// that task's stall, not as starvation; a gap during which the sampler
// itself was late and the threads waited for a CPU is starvation.
func TestStallsTellStarvationFromAStoppedStage(t *testing.T) {
	const ms = time.Millisecond
	// Run 1: every 10 ms the process runs 5 ms and waits 1 ms; the
	// source emits all along, flag stops from 100 to 300 ms.
	s := &stallSampler{}
	var src, flag, sink uint64
	for at := time.Duration(0); at <= 400*ms; at += stallTick {
		src += 75
		// Partition 3's boundaries stop at 100 ms while partition 0's
		// go on: flag waits for partition 3.
		gate := wrt.MergeGate{Lowest: int64(at), Highest: int64(at), UpPartition: 0}
		if at < 100*ms || at >= 300*ms {
			flag += 75
			sink += 75
		} else {
			gate = wrt.MergeGate{Lowest: int64(100 * ms), Highest: int64(at), UpPartition: 3}
		}
		s.points = append(s.points, stallSample{at: at, proc: true, run: int64(at / 2), wait: int64(at / 10), idle: int64(at / (10 * ms)),
			tasks: map[string]stallPoint{"q/ward/p0/r0": {out: src}, "q/flag/p0/r0": {out: flag, queue: int(src - flag), gate: gate}, "q/alerts/p0/r0": {in: sink}}})
	}
	recv := []benchmark.ReconfigRecord{{At: 95 * ms}, {At: 101 * ms}, {At: 305 * ms}, {At: 310 * ms}}
	got := s.stalls(recv)
	if len(got) != 1 {
		t.Fatalf("stalls %+v, want one", got)
	}
	st := got[0]
	if st.Starved || st.SamplerLateMs != 0 || st.GapMs != 204 {
		t.Fatalf("a stopped stage reported as %+v", st)
	}
	byTask := map[string]benchmark.ReconfigStallTask{}
	for _, tk := range st.Tasks {
		byTask[tk.Task] = tk
	}
	if f := byTask["q/flag/p0/r0"]; f.FlatFromMs != 90 || f.FlatMs != 200 || f.QueueMax < 1000 || f.GateSpreadMs != 190 || f.GateInput != "port 0, upstream partition 3" {
		t.Fatalf("flag %+v: flat from 90 ms for 200 ms, waiting for partition 3 up to 190 ms behind, expected", f)
	}
	if w := byTask["q/ward/p0/r0"]; w.FlatMs != 0 {
		t.Fatalf("the source emitted all along, got %+v", w)
	}

	// Run 2: the sampler's ticks stop from 100 to 350 ms; meanwhile the
	// threads got 3 ms of CPU and waited 400 ms, the machine never idle.
	s = &stallSampler{}
	var cpu, wait int64
	for at := time.Duration(0); at <= 500*ms; at += stallTick {
		if at > 100*ms && at < 350*ms {
			continue
		}
		if at == 350*ms {
			cpu, wait = cpu+int64(3*ms), wait+int64(400*ms)
		} else {
			cpu, wait = cpu+int64(5*ms), wait+int64(ms)
		}
		src += 75
		s.points = append(s.points, stallSample{at: at, proc: true, run: cpu, wait: wait, tasks: map[string]stallPoint{"q/ward/p0/r0": {out: src}}})
	}
	got = s.stalls([]benchmark.ReconfigRecord{{At: 98 * ms}, {At: 352 * ms}})
	if len(got) != 1 || !got[0].Starved || got[0].SamplerLateMs != 240 || got[0].RunQueueWaitMs < 400 {
		t.Fatalf("starvation reported as %+v", got)
	}

	// Run 3: a loaded machine, the sampler on time, the threads waiting
	// 1.5 times the elapsed time (a CPU's worth and a half, not two): a
	// gap there (a quiescent update's pause) is not starvation.
	s = &stallSampler{}
	for at := time.Duration(0); at <= 300*ms; at += stallTick {
		s.points = append(s.points, stallSample{at: at, proc: true, run: int64(at / 4), wait: int64(at * 3 / 2), tasks: map[string]stallPoint{}})
	}
	got = s.stalls([]benchmark.ReconfigRecord{{At: 50 * ms}, {At: 250 * ms}})
	if len(got) != 1 || got[0].Starved {
		t.Fatalf("a pause on a loaded machine reported as %+v", got)
	}
}
