package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"runtime/metrics"
	"runtime/trace"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fedstream/fedstream/worker/benchmark"
	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// `bench reconfig --stalls`: what the process and each task of a run did
// while the sink received nothing for longer than stallGap. A sampler
// reads, every stallTick, every task's counters (records drawn, tuples
// taken and emitted, time blocked on a full output) from the org's
// runtimes, the CPU time and run-queue wait of the process's threads
// (/proc/self/task/*/schedstat) and the machine's idle and steal time
// (/proc/stat). A stall is then told apart:
//   - every task's counters flat and the sampler itself late (its ticks
//     far apart), the threads waiting in the run queue more than they
//     ran: the process was not given the CPU;
//   - one task flat first (or blocked on its output) while the process
//     ran: the stage that stopped the stream.

// stallGap is the shortest gap at the sink reported as a stall: ten
// times the boundary interval of the benchmark's org, well above the
// release rhythm (a batch every 5 ms).
const stallGap = 100 * time.Millisecond

// maxStallTraces bounds the flight-recorder traces written per run.
const maxStallTraces = 3

// stallTick is the sampler's period.
const stallTick = 10 * time.Millisecond

// procEvery is how many ticks apart the sampler reads the process's and
// the machine's CPU accounting.
const procEvery = 5

// stallLead is how far before a stall the tasks' counters are read for
// the stretches they stood still.
const stallLead = 200 * time.Millisecond

type stallPoint struct {
	in, out uint64
	blocked int64
	queue   int
	gate    wrt.MergeGate
}

type stallSample struct {
	at time.Duration // since the run's start
	// Process threads: CPU time and time runnable but waiting for a CPU
	// (ns, schedstat); machine: idle and steal (jiffies, all CPUs).
	run, wait   int64
	idle, steal int64
	gcCycles    uint64 // completed GC cycles of the process
	proc        bool   // run, wait, idle and steal were read at this sample
	tasks       map[string]stallPoint
}

// stallSampler samples an org run (see above) until stopped.
type stallSampler struct {
	r      *orgRun
	mu     sync.Mutex
	points []stallSample
	// fr, when set, is a flight recorder; the first stall seen is written
	// to traceFile (once).
	fr        *trace.FlightRecorder
	traceFile string
	ticks     int           // samples taken (sampler goroutine only)
	traced    int           // traces written
	tracedTo  time.Duration // end of the newest gap looked at
}

func newStallSampler(r *orgRun, traceFile string) *stallSampler {
	s := &stallSampler{r: r, traceFile: traceFile}
	if traceFile != "" {
		s.fr = trace.NewFlightRecorder(trace.FlightRecorderConfig{MinAge: 3 * time.Second, MaxBytes: 256 << 20})
		if err := s.fr.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "flight recorder:", err)
			s.fr = nil
		}
	}
	return s
}

// run samples every stallTick until ctx ends.
func (s *stallSampler) run(ctx context.Context) {
	if s.fr != nil {
		defer s.fr.Stop()
	}
	tick := time.NewTicker(stallTick)
	defer tick.Stop()
	for {
		s.sample()
		s.maybeTrace()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *stallSampler) sample() {
	p := stallSample{at: time.Since(s.r.start), tasks: map[string]stallPoint{}}
	// The /proc files cost about half a millisecond a reading on a
	// loaded machine: read them every procEvery ticks (and after a late
	// tick), carrying the last reading forward in between.
	s.mu.Lock()
	var last *stallSample
	if n := len(s.points); n > 0 {
		last = &s.points[n-1]
	}
	s.mu.Unlock()
	s.ticks++
	if last == nil || s.ticks%procEvery == 0 || p.at-last.at > 2*stallTick {
		p.run, p.wait = threadSchedstat()
		p.idle, p.steal = machineIdleSteal()
		p.proc = true
	} else {
		p.run, p.wait, p.idle, p.steal = last.run, last.wait, last.idle, last.steal
	}
	gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(gc)
	if gc[0].Value.Kind() == metrics.KindUint64 {
		p.gcCycles = gc[0].Value.Uint64()
	}
	for _, w := range s.r.o.fed.workers {
		for _, st := range w.Runtime().Stats() {
			if st.Query != s.r.name {
				continue
			}
			p.tasks[st.TaskID] = stallPoint{in: st.InTuples, out: st.OutTuples, blocked: st.BlockedNanos, queue: st.Queue, gate: st.Gate}
		}
	}
	s.mu.Lock()
	s.points = append(s.points, p)
	s.mu.Unlock()
}

// maybeTrace writes the flight recorder's window once the sink has
// received nothing for stallGap and then resumed (the window then holds
// the whole stall and a little before it): the first such gap to
// traceFile, and up to maxStallTraces-1 more during which the process
// still ran (its sampler late by less than half the gap: not starved)
// to traceFile-2, -3, ... (sampler goroutine only).
func (s *stallSampler) maybeTrace() {
	if s.fr == nil || s.traced >= maxStallTraces {
		return
	}
	s.r.mu.Lock()
	n := len(s.r.recv)
	var from, to time.Duration
	if n >= 2 {
		// The newest gap among the arrivals of the last 200 ms: it has
		// ended.
		for i := n - 1; i > 0 && s.r.recv[n-1].At-s.r.recv[i].At < 200*time.Millisecond; i-- {
			if g := s.r.recv[i].At - s.r.recv[i-1].At; g > to-from {
				from, to = s.r.recv[i-1].At, s.r.recv[i].At
			}
		}
	}
	s.r.mu.Unlock()
	if to-from < stallGap || from <= s.tracedTo {
		return
	}
	s.tracedTo = to
	s.mu.Lock()
	st := s.describe(from, to)
	s.mu.Unlock()
	if s.traced > 0 && st.SamplerLateMs >= st.GapMs/2 {
		return // starved: the first trace shows one already
	}
	s.traced++
	file := s.traceFile
	if s.traced > 1 {
		file = strings.TrimSuffix(file, ".trace") + "-" + strconv.Itoa(s.traced) + ".trace"
	}
	var b bytes.Buffer
	if _, err := s.fr.WriteTo(&b); err != nil {
		fmt.Fprintln(os.Stderr, "flight recorder:", err)
		return
	}
	if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "flight recorder:", err)
	}
	fmt.Fprintf(os.Stderr, "stall trace %s: gap of %.1f ms at %.1f ms, sampler late %.1f ms\n", file, st.GapMs, st.AtMs, st.SamplerLateMs)
}

// threadSchedstat sums the CPU time and run-queue wait of this
// process's threads (0, 0 where the kernel does not report them).
func threadSchedstat() (run, wait int64) {
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		if err != nil {
			continue
		}
		fs := strings.Fields(string(b))
		if len(fs) < 2 {
			continue
		}
		r, _ := strconv.ParseInt(fs[0], 10, 64)
		w, _ := strconv.ParseInt(fs[1], 10, 64)
		run, wait = run+r, wait+w
	}
	return run, wait
}

// machineIdleSteal reads the idle and steal jiffies of all CPUs.
func machineIdleSteal() (idle, steal int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fs := strings.Fields(line)
	if len(fs) < 9 || fs[0] != "cpu" {
		return 0, 0
	}
	idle, _ = strconv.ParseInt(fs[4], 10, 64)
	steal, _ = strconv.ParseInt(fs[8], 10, 64)
	return idle, steal
}

// stalls finds the gaps of at least stallGap between two sink arrivals
// in recv and describes each with the samples.
func (s *stallSampler) stalls(recv []benchmark.ReconfigRecord) []benchmark.ReconfigStall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []benchmark.ReconfigStall
	for i := 1; i < len(recv); i++ {
		from, to := recv[i-1].At, recv[i].At
		if to-from < stallGap {
			continue
		}
		out = append(out, s.describe(from, to))
	}
	return out
}

func stallMs(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Microsecond)) / 1e3 }

func (s *stallSampler) describe(from, to time.Duration) benchmark.ReconfigStall {
	st := benchmark.ReconfigStall{AtMs: stallMs(from), GapMs: stallMs(to - from)}
	// Samples from the last one before the gap to the first one at or
	// after its end: they cover the whole gap even when the sampler
	// itself was late.
	lo := max(0, sort.Search(len(s.points), func(i int) bool { return s.points[i].at >= from })-1)
	hi := min(len(s.points), sort.Search(len(s.points), func(i int) bool { return s.points[i].at >= to })+1)
	if hi-lo < 2 {
		st.Note = "no samples"
		return st
	}
	pts := s.points[lo:hi]
	a, z := pts[0], pts[len(pts)-1]
	for i := 1; i < len(pts); i++ {
		st.SamplerLateMs = max(st.SamplerLateMs, stallMs(pts[i].at-pts[i-1].at-stallTick))
	}
	st.GCCycles = int(z.gcCycles - a.gcCycles)
	// The CPU accounting from the last reading at or before the gap to
	// the first at or after its end (the last one taken if none yet).
	pa, pz := a, z
	for i := lo; i >= 0; i-- {
		if s.points[i].proc {
			pa = s.points[i]
			break
		}
	}
	for i := hi - 1; i < len(s.points); i++ {
		if pz = s.points[i]; pz.proc {
			break
		}
	}
	st.SampledMs = stallMs(pz.at - pa.at)
	st.ProcessCPUMs = stallMs(time.Duration(pz.run - pa.run))
	st.RunQueueWaitMs = stallMs(time.Duration(pz.wait - pa.wait))
	const jiffy = 10 * time.Millisecond // USER_HZ 100
	st.MachineIdleMs = stallMs(time.Duration(pz.idle-pa.idle) * jiffy)
	st.MachineStealMs = stallMs(time.Duration(pz.steal-pa.steal) * jiffy)
	st.Starved = starved(st)
	// Each task's longest stretch without emitting (a sink: without
	// taking) from stallLead before the gap to its end, and when it
	// began: the task that stopped first shows the earliest.
	lead := max(0, sort.Search(len(s.points), func(i int) bool { return s.points[i].at >= from-stallLead })-1)
	pts = s.points[lead:hi]
	for id := range z.tasks {
		var bestFrom, bestTo time.Duration
		flatFrom := pts[0].at
		val := func(p stallSample) uint64 {
			tp := p.tasks[id]
			if strings.Contains(id, "/alerts/") {
				return tp.in
			}
			return tp.out
		}
		// Only stretches reaching into the gap count.
		for i := 1; i < len(pts); i++ {
			if val(pts[i]) != val(pts[i-1]) {
				if pts[i-1].at-flatFrom > bestTo-bestFrom && pts[i-1].at >= from-stallTick {
					bestFrom, bestTo = flatFrom, pts[i-1].at
				}
				flatFrom = pts[i].at
			}
		}
		if z.at-flatFrom > bestTo-bestFrom {
			bestFrom, bestTo = flatFrom, z.at
		}
		tk := benchmark.ReconfigStallTask{
			Task: id, FlatFromMs: stallMs(bestFrom), FlatMs: stallMs(bestTo - bestFrom),
			BlockedMs: stallMs(time.Duration(z.tasks[id].blocked - a.tasks[id].blocked)),
			QueueMax:  maxQueue(pts, id),
		}
		// A merging task: the widest spread of its inputs' boundaries
		// during the gap, and the input lowest then (holding the release
		// back).
		for _, p := range s.points[lo:hi] {
			g := p.tasks[id].gate
			if g.Highest > g.Lowest && stallMs(time.Duration(g.Highest-g.Lowest)) > tk.GateSpreadMs {
				tk.GateSpreadMs = stallMs(time.Duration(g.Highest - g.Lowest))
				tk.GateInput = fmt.Sprintf("port %d, upstream partition %d", g.Port, g.UpPartition)
			}
		}
		st.Tasks = append(st.Tasks, tk)
	}
	sort.Slice(st.Tasks, func(i, j int) bool { return st.Tasks[i].Task < st.Tasks[j].Task })
	return st
}

// starved says the process, not a stage of the stream, stopped during
// the stall: its sampler (which only sleeps and reads counters) was late
// by half the gap or more, or its threads spent on average two of them
// runnable but waiting for a CPU the whole sampled time (as many as the
// process runs Go code on) while the machine had less than a tenth of it
// idle. On a loaded machine threads wait for a CPU all the time; a
// quiescent update's own pause shows less than that.
func starved(st benchmark.ReconfigStall) bool {
	if st.SampledMs <= 0 {
		return false
	}
	busy := st.RunQueueWaitMs >= 2*st.SampledMs && st.MachineIdleMs < st.SampledMs/10
	return busy || st.SamplerLateMs >= st.GapMs/2
}

func maxQueue(pts []stallSample, id string) int {
	q := 0
	for _, p := range pts {
		q = max(q, p.tasks[id].queue)
	}
	return q
}
