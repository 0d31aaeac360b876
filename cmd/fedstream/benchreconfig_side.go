package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"runtime/metrics"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/config"
	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/worker/benchmark"
)

// The tracking overhead measured side by side: three processes, each an
// org of its own running the scenario's query in one mode (tracking off,
// submitted at the final definition; static and dynamic, each brought to
// it by one completed plan), at the same paced rate over the same
// generated data, all at once. Each measures its own CPU time (getrusage:
// exact, unlike a profile's samples) and its sink's results in the same
// windows of wall time, and a window's overhead is 1 - off's CPU per
// result / the mode's. A burst of another program, a slow phase of the
// machine, hits the three alike and cancels in each window's ratio: run
// one after the other (the sequential method) the modes' CPU per result
// differed by ±5-26 % from one run to the next, the tracking costing a
// fraction of a percent. The figure is the mean over the windows with a
// 95 % confidence interval (Student's t over the windows).
//
// Splitting one process's CPU by query with a labelled profile was
// measured first and set aside: the kernel delivers the profiling signal
// on its tick, about 250 samples per CPU-second whatever the rate asked,
// so a minute of the three queries gives a few thousand samples each, a
// spread of several percent.

// sideRounds is the default number of side-by-side rounds (fresh
// processes each, started in a rotating order).
const sideRounds = 3

// sideChild is what a side-by-side child process reports: Ready once its
// query runs in its mode (Placement where its tasks run), then Windows.
type sideChild struct {
	Ready     bool         `json:"ready,omitempty"`
	Placement string       `json:"placement,omitempty"`
	Windows   []sideWindow `json:"windows,omitempty"`
	Error     string       `json:"error,omitempty"`
}

// sideWindow is one window of a child: its process's CPU time and the
// results its benchmark consumer received.
type sideWindow struct {
	CPUNanos int64 `json:"cpu_ns"`
	Results  int   `json:"results"`
	// GCCycles and AllocBytes: the process's garbage collections and
	// allocation in the window.
	GCCycles   int64 `json:"gc_cycles"`
	AllocBytes int64 `json:"alloc_bytes"`
}

// runOverhead measures the tracking overhead by cfg.OverheadMethod.
func runOverhead(ctx context.Context, o *reconfigOrg, cfg benchmark.ReconfigConfig, res *benchmark.ReconfigResult, prog *benchreport.Progress) error {
	if cfg.OverheadMethod == benchmark.OverheadSequential {
		return orgOverhead(ctx, o, cfg, res, prog, cfg.OverheadProfile)
	}
	return orgOverheadSide(ctx, cfg, res, prog)
}

// orgOverheadSide measures cfg.ThroughputRuns side-by-side rounds and
// fills res's overhead figures.
func orgOverheadSide(ctx context.Context, cfg benchmark.ReconfigConfig, res *benchmark.ReconfigResult, prog *benchreport.Progress) error {
	var st, dyn []float64
	for round := range cfg.ThroughputRuns {
		ws, placement, warmup, err := sideRound(ctx, cfg, round)
		if err != nil {
			return err
		}
		res.OverheadWarmupWindows += warmup
		res.OverheadPlacements = append(res.OverheadPlacements, placement)
		for _, w := range ws {
			prog.Note("overhead round %d: µs per result off %.3f static %.3f dynamic %.3f (results %d %d %d): static %+.2f%% dynamic %+.2f%%",
				round, w.MicrosPerResult["off"], w.MicrosPerResult[fsm.TrackingStatic], w.MicrosPerResult[fsm.TrackingDynamic],
				w.Results["off"], w.Results[fsm.TrackingStatic], w.Results[fsm.TrackingDynamic], 100*w.Static, 100*w.Dynamic)
			st, dyn = append(st, w.Static), append(dyn, w.Dynamic)
		}
		res.OverheadWindows = append(res.OverheadWindows, ws...)
	}
	res.OverheadStatic, res.OverheadStaticCI95 = benchmark.MeanCI95(st)
	res.OverheadDynamic, res.OverheadDynamicCI95 = benchmark.MeanCI95(dyn)
	var off []float64
	for _, w := range res.OverheadWindows {
		off = append(off, w.MicrosPerResult["off"])
	}
	res.CPUMicrosPerResultOff = medianOf(off)
	res.OverheadBasis = fmt.Sprintf("side by side: three processes at once, each an org running the same final query at %d results/s over the same generated data, tracking off (submitted so), static, dynamic (each after one completed plan); each process's CPU time (getrusage) per result at its sink in the same %v windows of wall time (the leading windows before all three kept pace left out, later ones merged until they kept pace again); overhead = 1 - off's / the mode's per window, mean over %d windows (%d rounds, %d windows of warm-up left out) with a 95%% confidence interval (t)",
		cfg.Sources*cfg.Rate, cfg.ThroughputWindow, len(res.OverheadWindows), cfg.ThroughputRuns, res.OverheadWarmupWindows)
	if len(res.OverheadWindows) < 2 {
		res.OverheadBasis += "; fewer than two windows (the processes never kept pace together): no interval"
	}
	prog.Note("overhead over %d windows (%d of warm-up left out): static %.2f%% ± %.2f%%, dynamic %.2f%% ± %.2f%% (95%% CI; -1 when there is none)",
		len(res.OverheadWindows), res.OverheadWarmupWindows, 100*res.OverheadStatic, 100*res.OverheadStaticCI95, 100*res.OverheadDynamic, 100*res.OverheadDynamicCI95)
	return nil
}

// errSideChild means a side-by-side child process failed.
var errSideChild = errors.New("bench reconfig: side-by-side overhead process")

// sideRound starts the three processes, starts their windows together
// once all three are ready, and pairs their windows.
func sideRound(ctx context.Context, cfg benchmark.ReconfigConfig, round int) (ws []benchmark.SideWindow, placement string, warmup int, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type child struct {
		mode   string
		cmd    *exec.Cmd
		in     io.WriteCloser
		out    *bufio.Scanner
		stderr bytes.Buffer
	}
	children := make([]*child, len(costModes))
	defer func() {
		for _, c := range children {
			if c != nil && c.cmd.Process != nil {
				_ = c.in.Close() // the child ends when its stdin closes
				_ = c.cmd.Wait()
			}
		}
	}()
	for i := range costModes {
		// Started (and told to start) in another order each round: an
		// A/A run (three processes tracking off) gave the later-started
		// ones up to a few percent more CPU per result under load 50-90,
		// within its noise; rotating spreads any such effect over the
		// modes.
		tracking := costModes[(round+i)%len(costModes)]
		c := &child{mode: costModeName(tracking)}
		c.cmd = exec.CommandContext(ctx, exe, "bench", "reconfig-overhead-child", "--tracking", c.mode,
			"--sources", fmt.Sprint(cfg.Sources), "--rate", fmt.Sprint(cfg.Rate),
			"--windows", fmt.Sprint(cfg.OverheadWindows), "--window", cfg.ThroughputWindow.String(), "--settle", cfg.ThroughputSettle.String())
		if cfg.OverheadProfile != "" && round == 0 {
			c.cmd.Args = append(c.cmd.Args, "--profile", strings.TrimSuffix(cfg.OverheadProfile, ".pprof")+"-"+c.mode)
		}
		c.cmd.Stderr = &c.stderr
		if c.in, err = c.cmd.StdinPipe(); err != nil {
			return nil, "", 0, err
		}
		out, err := c.cmd.StdoutPipe()
		if err != nil {
			return nil, "", 0, err
		}
		c.out = bufio.NewScanner(out)
		c.out.Buffer(nil, 1<<20)
		if err := c.cmd.Start(); err != nil {
			return nil, "", 0, fmt.Errorf("%w: %w", errSideChild, err)
		}
		children[i] = c
	}
	read := func(c *child) (sideChild, error) {
		var m sideChild
		if !c.out.Scan() {
			_ = c.cmd.Wait()
			return m, fmt.Errorf("%w: %s ended: %v; its stderr ends: %s", errSideChild, c.mode, c.out.Err(), tail(c.stderr.String(), 600))
		}
		if err := json.Unmarshal(c.out.Bytes(), &m); err != nil {
			return m, fmt.Errorf("%w: %s: %w", errSideChild, c.mode, err)
		}
		if m.Error != "" {
			return m, fmt.Errorf("%w: %s: %s", errSideChild, c.mode, m.Error)
		}
		return m, nil
	}
	// Read concurrently: a child that fails ends the round at once.
	reports := make([]sideChild, len(children))
	each := func(step func(i int, c *child) error) error {
		errs := make([]error, len(children))
		var wg sync.WaitGroup
		for i, c := range children {
			wg.Go(func() {
				if errs[i] = step(i, c); errs[i] != nil {
					cancel()
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	var places strings.Builder
	if err := each(func(i int, c *child) error {
		m, err := read(c)
		if err == nil && !m.Ready {
			err = fmt.Errorf("%w: %s: want ready first", errSideChild, c.mode)
		}
		reports[i] = m
		return err
	}); err != nil {
		return nil, "", 0, err
	}
	for i, c := range children {
		fmt.Fprintf(&places, "%s[%s] ", c.mode, reports[i].Placement)
	}
	// Back to back: the children's windows start within a millisecond
	// or so of each other.
	for _, c := range children {
		if _, err := io.WriteString(c.in, "go\n"); err != nil {
			return nil, "", 0, fmt.Errorf("%w: %s: %w", errSideChild, c.mode, err)
		}
	}
	if err := each(func(i int, c *child) error {
		m, err := read(c)
		if err == nil && len(m.Windows) != cfg.OverheadWindows {
			err = fmt.Errorf("%w: %s: %d windows, want %d", errSideChild, c.mode, len(m.Windows), cfg.OverheadWindows)
		}
		reports[i] = m
		return err
	}); err != nil {
		return nil, "", 0, err
	}
	modes := make([]string, len(children))
	per := make([][]sideWindow, len(children))
	for i, c := range children {
		modes[i], per[i] = c.mode, reports[i].Windows
	}
	ws, warmup, err = pairWindows(modes, per, int(float64(cfg.Sources*cfg.Rate)*cfg.ThroughputWindow.Seconds()))
	if err != nil {
		return nil, "", 0, err
	}
	for i := range ws {
		ws[i].Round = round
	}
	return ws, places.String(), warmup, nil
}

// pairWindows pairs the processes' windows (per[i] is mode modes[i]'s)
// into benchmark.SideWindows. Consecutive windows are merged until every
// process's results in them are within sideKeptPace of expect per window:
// a process that fell behind in a window (the machine starved it)
// delivers the rest in the next, with CPU spent in both, and the window's
// cost per result would swing both ways; merged, the CPU and the results
// match. A remainder joins the last window. warmup is how many leading
// windows were left out.
func pairWindows(modes []string, per [][]sideWindow, expect int) (ws []benchmark.SideWindow, warmup int, err error) {
	n := len(per[0])
	for i := range modes {
		if len(per[i]) != n {
			return nil, 0, fmt.Errorf("%w: %s reported %d windows, %s %d", errSideChild, modes[i], len(per[i]), modes[0], n)
		}
	}
	atPace := func(i, k int) bool {
		return math.Abs(float64(per[i][k].Results-expect)) <= sideKeptPace*float64(expect)
	}
	// Warm-up: the windows before the first in which every process kept
	// pace are left out. At the start a process may still deliver a
	// backlog of its start (three orgs starting at once on a loaded
	// machine), results whose CPU was spent before the windows.
	from := 0
	for from < n && !func() bool {
		for i := range modes {
			if !atPace(i, from) {
				return false
			}
		}
		return true
	}() {
		from++
	}
	if from == n {
		from = 0 // never at pace: every window, merged into one
	}
	warmup = from
	// The groups' ends (exclusive).
	var ends []int
	for k := from; k < n; k++ {
		kept := true
		for i := range modes {
			got := 0
			for _, w := range per[i][from : k+1] {
				got += w.Results
			}
			want := float64((k + 1 - from) * expect)
			kept = kept && math.Abs(float64(got)-want) <= sideKeptPace*want
		}
		if kept {
			ends, from = append(ends, k+1), k+1
		}
	}
	switch {
	case len(ends) == 0:
		ends = []int{n}
	case from < n:
		ends[len(ends)-1] = n
	}
	from = warmup
	for _, end := range ends {
		w := benchmark.SideWindow{Windows: end - from, CPUMs: map[string]float64{}, Results: map[string]int{}, MicrosPerResult: map[string]float64{}, AllocPerResult: map[string]float64{}}
		for i, m := range modes {
			var sum sideWindow
			for _, x := range per[i][from:end] {
				sum.CPUNanos += x.CPUNanos
				sum.Results += x.Results
				sum.AllocBytes += x.AllocBytes
			}
			if sum.Results <= 0 {
				return nil, 0, fmt.Errorf("%w: %s delivered no result in %d windows", errSideChild, m, end-from)
			}
			w.CPUMs[m] = round1(float64(sum.CPUNanos) / 1e6)
			w.Results[m] = sum.Results
			w.MicrosPerResult[m] = float64(sum.CPUNanos) / 1e3 / float64(sum.Results)
			w.AllocPerResult[m] = math.Round(float64(sum.AllocBytes) / float64(sum.Results))
		}
		w.Static = roundTo([]float64{1 - w.MicrosPerResult["off"]/w.MicrosPerResult[fsm.TrackingStatic]}, 5)[0]
		w.Dynamic = roundTo([]float64{1 - w.MicrosPerResult["off"]/w.MicrosPerResult[fsm.TrackingDynamic]}, 5)[0]
		for m, v := range w.MicrosPerResult {
			w.MicrosPerResult[m] = roundTo([]float64{v}, 3)[0]
		}
		ws = append(ws, w)
		from = end
	}
	return ws, warmup, nil
}

// sideKeptPace is how far a process's results in a window may be from
// the paced rate's for the window to stand alone (pairWindows).
const sideKeptPace = 0.05

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// newBenchReconfigOverheadChildCmd is the hidden `fedstream bench
// reconfig-overhead-child`: one process of the side-by-side tracking
// overhead. It starts an org, runs the scenario's query in its mode,
// says so on stdout ({"ready":true}), starts its windows when a line
// arrives on stdin, and reports them ({"windows":[...]}); it ends when
// stdin closes.
func newBenchReconfigOverheadChildCmd() *cobra.Command {
	var (
		mode                   string
		sources, rate, windows int
		window, settle         time.Duration
		logLevel, profile      string
	)
	cmd := &cobra.Command{
		Use:    "reconfig-overhead-child",
		Short:  "One process of bench reconfig's side-by-side tracking overhead (internal)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tracking := ""
			switch mode {
			case "off":
			case fsm.TrackingStatic, fsm.TrackingDynamic:
				tracking = mode
			default:
				return fmt.Errorf("--tracking %q: want off, static or dynamic", mode)
			}
			if sources <= 0 || rate <= 0 || windows <= 0 || window <= 0 || settle < 0 {
				return fmt.Errorf("--sources, --rate, --windows and --window must be positive")
			}
			setWorkerGC(config.DefaultWorkerGCPercent)
			enc := json.NewEncoder(os.Stdout)
			err := sideChildRun(cmd.Context(), logging.New(cmd.ErrOrStderr(), logLevel, false), tracking, sources, rate, windows, window, settle, profile, enc)
			if err != nil {
				_ = enc.Encode(sideChild{Error: err.Error()})
			}
			// Until the parent is done with this process: its CPU is
			// not the others'.
			_, _ = io.Copy(io.Discard, os.Stdin)
			return err
		},
	}
	cmd.Flags().StringVar(&mode, "tracking", "off", "off, static or dynamic")
	cmd.Flags().IntVar(&sources, "sources", 10, "source partitions")
	cmd.Flags().IntVar(&rate, "rate", 1500, "records/s per source partition")
	cmd.Flags().IntVar(&windows, "windows", 20, "windows")
	cmd.Flags().DurationVar(&window, "window", 3*time.Second, "each window")
	cmd.Flags().DurationVar(&settle, "settle", time.Second, "wait after the plan completed")
	cmd.Flags().StringVar(&logLevel, "log-level", "error", "log level")
	cmd.Flags().StringVar(&profile, "profile", "", "write a CPU profile of the windows to PREFIX.pprof and the heap's allocations to PREFIX.heap")
	return cmd
}

// sideChildRun is the child's work (newBenchReconfigOverheadChildCmd).
func sideChildRun(ctx context.Context, logger *slog.Logger, tracking string, sources, rate, windows int, window, settle time.Duration, profile string, enc *json.Encoder) error {
	o, err := startReconfigOrg(ctx, logger)
	if err != nil {
		return err
	}
	defer o.close()
	name := "sepsis-side-" + costModeName(tracking)
	// Long enough never to end inside the windows, whatever the wait
	// for the other processes.
	limit := int64((settle + time.Duration(windows)*window + 5*time.Minute).Seconds() * float64(rate))
	first := 2
	if tracking != "" {
		first = 1
	}
	r, err := o.submit(ctx, name, benchmark.ReconfigQuery(name, sources, rate, limit, first))
	if err != nil {
		return err
	}
	defer r.end()
	if err := r.waitFor(ctx, "the first result", 60*time.Second, func() bool { return len(r.recv) > 0 }); err != nil {
		return err
	}
	if tracking != "" {
		e, err := r.update(ctx, benchmark.ReconfigQuery(name, sources, rate, limit, 2), fsm.StrategyLive, tracking, orgMargin)
		if err != nil {
			return err
		}
		if err := r.complete(ctx, e); err != nil {
			return err
		}
	}
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	placement, _ := o.placement(name)
	if err := enc.Encode(sideChild{Ready: true, Placement: placement}); err != nil {
		return err
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	// The results are counted and let go: kept, the consumer's slice of
	// them grows by copying, several percent of the process's CPU that
	// lands in whichever window the copy happens.
	total := 0
	results := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		total += len(r.recv)
		r.recv = r.recv[:0]
		return total
	}
	gc := func() (cycles, alloc int64) {
		ms := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:bytes"}}
		metrics.Read(ms)
		return int64(ms[0].Value.Uint64()), int64(ms[1].Value.Uint64())
	}
	if profile != "" {
		stop, err := startCPUProfileFile(profile + ".pprof")
		if err != nil {
			return err
		}
		defer stop()
		defer func() {
			if h, err := os.Create(profile + ".heap"); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(h, 0)
				_ = h.Close()
			}
		}()
	}
	start := time.Now()
	n0, c0 := results(), benchmark.ProcessCPU()
	g0, a0 := gc()
	var ws []sideWindow
	for k := range windows {
		// Boundaries on the start's clock: a late wake-up does not
		// shift the later windows against the other processes'.
		select {
		case <-time.After(time.Until(start.Add(time.Duration(k+1) * window))):
		case <-ctx.Done():
			return ctx.Err()
		}
		n1, c1 := results(), benchmark.ProcessCPU()
		g1, a1 := gc()
		ws = append(ws, sideWindow{CPUNanos: int64(c1 - c0), Results: n1 - n0, GCCycles: g1 - g0, AllocBytes: a1 - a0})
		n0, c0, g0, a0 = n1, c1, g1, a1
	}
	return enc.Encode(sideChild{Windows: ws})
}
