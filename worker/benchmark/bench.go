// Package benchmark measures the data plane: the engine's throughput across
// two worker processes on loopback against hand-written baselines over raw
// TCP, and with batching against without. `fedstream bench dataplane` runs
// it; the workers are child processes of the same binary
// (`fedstream bench-worker`) driven by a small JSON protocol on their
// stdin/stdout (see ServeWorker).
//
// Scenarios, each between worker 1 (sender side) and worker 2:
//
//   - raw TCP: 100-byte records written through a 256 KiB buffered writer
//     over one connection, read and counted by the other process.
//   - forward: query blob-source -> map -> sink, source and map (fused
//     into the source's task) on worker 1, sink on worker 2. The blob
//     generator's records encode to 100
//     bytes, the raw baseline's record size, and cost it a few ns each, so
//     the engine, not the input, is what is measured.
//   - word count: words-source -> split into words on worker 1, keyed
//     exchange by word to a 2-partition aggregate count() group by word and
//     the sink on worker 2.
//   - hand-written word count: the same generator, the same whitespace
//     rules, the same hash partitioning (same slots) and counting in plain
//     Go over 2 raw TCP connections (one receiving goroutine per
//     partition).
//   - unbatched: the forward pipeline with every task-to-task message
//     carrying one tuple (acknowledgements stay cumulative).
//
// Engine rates run from the Apply of the source task (worker 1's clock)
// to the final boundary reaching a client tailing the sink (worker 2);
// both workers share the machine's wall clock.
package benchmark

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/benchreport"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/runtime"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// RawRecordBytes is the record size of the raw TCP baseline.
const RawRecordBytes = 100

// wordCountPartitions is the parallelism of the keyed counting stage in
// both word counts.
const wordCountPartitions = 2

// benchSeed seeds the generator of every scenario.
const benchSeed = 42

// DefaultDuration is the default target time of one measured run of a
// scenario.
const DefaultDuration = 2 * time.Second

// ErrMismatch means a scenario produced a result other than the one its
// input determines (records lost or duplicated, wrong counts).
var ErrMismatch = errors.New("benchmark: wrong result")

// Config configures Run. Zero values mean the defaults.
type Config struct {
	// Duration is the target measured time of each scenario (default 5s):
	// a short pilot estimates the rate, then the input is sized so that
	// the measured run lasts about Duration.
	Duration time.Duration
	// Records, when > 0, fixes the input of every scenario and skips the
	// pilots (tests).
	Records int64
	// Launch starts the two workers (default DefaultLauncher).
	Launch Launcher
	// Logger receives progress at debug level and problems (default
	// slog.Default()).
	Logger *slog.Logger
	// Only, when not empty, names the scenarios to run (for profiling one
	// of them); ratios whose two figures were not both measured are 0.
	Only []string
	// Rounds is how many interleaved rounds of every scenario run after
	// sizing (default DefaultRounds; with Records set, default 1).
	Rounds int
	// Plaintext runs the data plane and the raw TCP baselines without TLS.
	// By default both use mutual TLS 1.3, as an org does: the workers'
	// data plane with certificates of a CA made for the run, the raw
	// baselines over tls.Conn with the same certificates.
	Plaintext bool
	// Progress, when not nil, reports every sizing run and every measured
	// round as it ends (the command's progress lines on stderr).
	Progress *benchreport.Progress
}

// DefaultRounds is the default number of measured rounds.
const DefaultRounds = 5

// ScenarioNames lists the scenarios in the order Run runs them.
var ScenarioNames = []string{"raw_tcp", "forward", "unbatched", "wordcount", "handwritten_wordcount"}

// ErrUnknownScenario means Config.Only names no scenario of ScenarioNames.
var ErrUnknownScenario = errors.New("benchmark: unknown scenario")

// Scenario is the measurement of one scenario.
type Scenario struct {
	Name    string  `json:"name"`
	Records int64   `json:"records"`
	Seconds float64 `json:"seconds"`
	// PerSecond is records (lines for word counts) per second.
	PerSecond float64 `json:"per_second"`
	// RecordBytes is the mean bytes per record: the encoded tuple for
	// engine records, the record for raw TCP, the line for the
	// hand-written word count.
	RecordBytes float64 `json:"record_bytes,omitempty"`
	// Rounds is the rate of each round; the figures above are those of
	// the median round.
	Rounds []float64 `json:"rounds"`
	// CPUNanosPerRecord is the CPU time each worker process (sender,
	// receiver) spent per record (line) in the median round: a cost that
	// drifts less with the machine's load than the rates do.
	CPUNanosPerRecord [2]float64 `json:"cpu_ns_per_record"`
}

// Result is what Run measured. Rates are records (or lines) per second.
type Result struct {
	RawTCPRPS          float64 `json:"raw_tcp_rps"`
	ForwardRPS         float64 `json:"forward_rps"`
	ForwardRatio       float64 `json:"forward_ratio"`
	WordcountLinesPS   float64 `json:"wordcount_lines_ps"`
	HandwrittenLinesPS float64 `json:"handwritten_lines_ps"`
	WordcountRatio     float64 `json:"wordcount_ratio"`
	UnbatchedRPS       float64 `json:"unbatched_rps"`
	BatchingGain       float64 `json:"batching_gain"`
	// RawTCPRecordBytes is the record size of the raw baseline,
	// ForwardRecordBytes the mean encoded size of the forward pipeline's
	// records as the sink delivers them.
	RawTCPRecordBytes  int     `json:"raw_tcp_record_bytes"`
	ForwardRecordBytes float64 `json:"forward_record_bytes"`
	// BlobGeneratorRPS and WordsGeneratorRPS are the forward pipeline's
	// and the word counts' generators alone on one goroutine (records per
	// second): the ceilings of the scenarios that read them.
	BlobGeneratorRPS  float64    `json:"blob_generator_rps"`
	WordsGeneratorRPS float64    `json:"words_generator_rps"`
	Scenarios         []Scenario `json:"scenarios"`
	// Rounds is the number of measured rounds: rates are the median
	// round's, ratios the median of the rounds' ratios.
	Rounds int `json:"rounds"`
	// TLS says whether the data plane and the raw baselines ran over
	// mutual TLS (the default) or plaintext (--plaintext).
	TLS        bool `json:"tls"`
	GOMAXPROCS int  `json:"gomaxprocs"`
	NumCPU     int  `json:"num_cpu"`
	// Timing says from where to where every scenario is timed.
	Timing string `json:"timing"`
	// EngineSettings lists each setting in which the bench's engines
	// differ from a production worker's, and why.
	EngineSettings []EngineSetting `json:"engine_settings"`
}

// EngineSetting is one way the bench's engines are configured unlike a
// production worker.
type EngineSetting struct {
	Setting    string `json:"setting"`
	Bench      string `json:"bench"`
	Production string `json:"production"`
	Why        string `json:"why"`
}

// timing is Result.Timing.
const timing = "every scenario, engine and baseline alike, from the sending worker receiving its start request " +
	"(before it connects or starts its tasks) to the receiving worker holding the last record (the engine's sink " +
	"reporting its input exhausted, or the baseline's receiver reaching end of stream); both sides generate every " +
	"record they send with the same generators"

// engineSettings lists how newEngine departs from a production worker
// (runtime.Options defaults and dataplane.BufferOptions defaults). The
// workers' GC target is production's (config.DefaultWorkerGCPercent), and
// batches, acknowledgements and transport options are the data plane's
// own.
func engineSettings() []EngineSetting {
	return []EngineSetting{
		{
			Setting:    "subscription retry backoff",
			Bench:      fmt.Sprintf("%s..%s", benchRetryMin, benchRetryMax),
			Production: "20ms..1s",
			Why: "a downstream task started before its upstream polls for it; in a run of about 2 s the production " +
				"first delay would be counted as up to 1 % of the run. It only applies while tasks start.",
		},
		{
			Setting:    "sink result ring",
			Bench:      fmt.Sprintf("%d tuples, %d MiB", sinkRingTuples, sinkRingBytes>>20),
			Production: fmt.Sprintf("%d tuples, %d MiB", 64<<10, dataplane.DefaultMaxBytes>>20),
			Why: "the ring never waits for its readers: the bench's reader of the results must not fall a whole ring " +
				"behind when the loaded machine deschedules it, or the run fails with a gap",
		},
		{
			Setting: "output buffer byte bound (task to task)",
			Bench: fmt.Sprintf("%d MiB (the %d-tuple bound, %d MiB of 100-byte records, binds first)",
				sinkRingBytes>>20, dataplane.DefaultMaxTuples, dataplane.DefaultMaxTuples*RawRecordBytes>>20),
			Production: fmt.Sprintf("%d MiB, %d tuples", dataplane.DefaultMaxBytes>>20, dataplane.DefaultMaxTuples),
			Why:        "it shares its byte bound with the sink ring; the network windows (1 MiB a stream) keep far less than either bound in flight",
		},
	}
}

// measurement is one run of a scenario.
type measurement struct {
	records int64
	bytes   int64
	elapsed time.Duration
	counts  map[string]int64
	// cpu is the CPU time each worker process used during the run.
	cpu [2]time.Duration
}

func (m measurement) perSecond() float64 {
	if m.elapsed <= 0 {
		return 0
	}
	return float64(m.records) / m.elapsed.Seconds()
}

// bench is one benchmark session: two workers.
type bench struct {
	cfg    Config
	log    *slog.Logger
	w1, w2 *workerClient
	seq    int
	// refCounts caches the reference word counts by number of lines.
	refCounts map[int64]map[string]int64
}

// Run starts two workers, runs every scenario and stops the workers
// (whatever happens; a cancelled ctx stops them at once).
//
// Each scenario is first sized (see measure), then all of them run in
// Config.Rounds interleaved rounds: on a shared machine the speed drifts
// by tens of percent within a minute, so a ratio compares two figures
// measured next to each other, round by round, and the median round's
// ratio is reported (as is each scenario's median rate). The two figures
// of every ratio run one right after the other (forward sits between raw
// TCP and unbatched), and every other round runs the scenarios in reverse
// order, so that a steady drift favours each side of a ratio equally
// often.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	for _, name := range cfg.Only {
		if !slices.Contains(ScenarioNames, name) {
			return nil, fmt.Errorf("%w %q (have %s)", ErrUnknownScenario, name, strings.Join(ScenarioNames, ", "))
		}
	}
	b, err := start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer b.stop()
	rounds := max(1, b.cfg.Rounds)
	res := &Result{RawTCPRecordBytes: RawRecordBytes, GOMAXPROCS: goruntime.GOMAXPROCS(0), NumCPU: goruntime.NumCPU(), Rounds: rounds, TLS: !cfg.Plaintext,
		Timing: timing, EngineSettings: engineSettings()}
	all := []struct {
		name  string
		pilot int64
		run   func(context.Context, int64) (measurement, error)
	}{
		{"raw_tcp", 1 << 20, b.rawTCP},
		{"forward", 50_000, func(ctx context.Context, n int64) (measurement, error) { return b.forward(ctx, n, false) }},
		{"unbatched", 10_000, func(ctx context.Context, n int64) (measurement, error) { return b.forward(ctx, n, true) }},
		{"wordcount", 50_000, b.engineWordCount},
		{"handwritten_wordcount", 200_000, b.handWordCount},
	}
	type sized struct {
		name string
		n    int64
		run  func(context.Context, int64) (measurement, error)
		runs []measurement
	}
	var scenarios []*sized
	for _, s := range all {
		if len(cfg.Only) > 0 && !slices.Contains(cfg.Only, s.name) {
			continue
		}
		n, err := b.size(ctx, s.name, s.pilot, s.run)
		if err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.name, err)
		}
		scenarios = append(scenarios, &sized{name: s.name, n: n, run: s.run})
	}
	for r := range rounds {
		order := slices.Clone(scenarios)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			m, err := b.runOnce(ctx, s.run, s.n)
			if err != nil {
				return nil, fmt.Errorf("scenario %s: %w", s.name, err)
			}
			s.runs = append(s.runs, m)
			b.log.Info("scenario done", "scenario", s.name, "round", r+1, "records", m.records,
				"seconds", m.elapsed.Seconds(), "per_second", int64(m.perSecond()))
			b.cfg.Progress.Step(s.name, r+1, rounds, fmt.Sprintf("%s  (%d in %.2fs)",
				benchreport.Rate(m.perSecond(), unitOf(s.name)), m.records, m.elapsed.Seconds()))
		}
	}
	// rates[name][r] is the rate of round r.
	rates := map[string][]float64{}
	for _, s := range scenarios {
		for _, m := range s.runs {
			rates[s.name] = append(rates[s.name], m.perSecond())
		}
		mid := medianRun(s.runs)
		sc := Scenario{Name: s.name, Records: mid.records, Seconds: mid.elapsed.Seconds(), PerSecond: mid.perSecond(), Rounds: rates[s.name]}
		if mid.records > 0 {
			sc.RecordBytes = float64(mid.bytes) / float64(mid.records)
			for i, c := range mid.cpu {
				sc.CPUNanosPerRecord[i] = float64(c.Nanoseconds()) / float64(mid.records)
			}
		}
		if s.name == "forward" {
			res.ForwardRecordBytes = sc.RecordBytes
		}
		res.Scenarios = append(res.Scenarios, sc)
	}
	res.RawTCPRPS = median(rates["raw_tcp"])
	res.ForwardRPS = median(rates["forward"])
	res.WordcountLinesPS = median(rates["wordcount"])
	res.HandwrittenLinesPS = median(rates["handwritten_wordcount"])
	res.UnbatchedRPS = median(rates["unbatched"])
	res.ForwardRatio = medianRatio(rates["forward"], rates["raw_tcp"])
	res.WordcountRatio = medianRatio(rates["wordcount"], rates["handwritten_wordcount"])
	res.BatchingGain = medianRatio(rates["forward"], rates["unbatched"])

	b.cfg.Progress.Note("generators alone, then done")
	genTime := min(b.cfg.Duration/10, 500*time.Millisecond)
	if res.BlobGeneratorRPS, err = generatorRate(ctx, blobGenerator(0), genTime); err != nil {
		return nil, err
	}
	if res.WordsGeneratorRPS, err = generatorRate(ctx, wordsGenerator(0, benchSeed), genTime); err != nil {
		return nil, err
	}
	return res, nil
}

// unitOf is what a scenario's rate counts.
func unitOf(scenario string) string {
	if strings.Contains(scenario, "wordcount") {
		return "lines"
	}
	return "records"
}

// median is the median of xs (the mean of the middle two for an even
// count), 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianRatio is the median over rounds of a[r]/b[r]; 0 unless both were
// measured in every round.
func medianRatio(a, b []float64) float64 {
	if len(a) == 0 || len(a) != len(b) {
		return 0
	}
	rs := make([]float64, len(a))
	for i := range a {
		rs[i] = ratio(a[i], b[i])
	}
	return median(rs)
}

// medianRun is the run with the median rate (the lower middle one for an
// even count).
func medianRun(runs []measurement) measurement {
	s := slices.Clone(runs)
	slices.SortFunc(s, func(x, y measurement) int { return cmp.Compare(x.perSecond(), y.perSecond()) })
	return s[(len(s)-1)/2]
}

// generatorRate runs generator def alone for about d.
func generatorRate(ctx context.Context, def *queryspec.Generator, d time.Duration) (float64, error) {
	gen, err := source.NewGenerator(def, 0)
	if err != nil {
		return 0, err
	}
	var (
		tp    tuple.Tuple
		n     int64
		start = time.Now()
	)
	for ctx.Err() == nil {
		for range 4096 {
			gen.Next(&tp)
		}
		n += 4096
		if time.Since(start) >= d {
			break
		}
	}
	return float64(n) / time.Since(start).Seconds(), ctx.Err()
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// start launches the two workers and learns their DataPlane addresses.
func start(ctx context.Context, cfg Config) (*bench, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = DefaultRounds
		if cfg.Records > 0 {
			cfg.Rounds = 1
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Launch == nil {
		l, err := DefaultLauncher()
		if err != nil {
			return nil, err
		}
		cfg.Launch = l
	}
	b := &bench{cfg: cfg, log: cfg.Logger}
	for i, w := range []**workerClient{&b.w1, &b.w2} {
		name := fmt.Sprintf("bench-worker-%d", i+1)
		p, err := cfg.Launch(ctx, name)
		if err != nil {
			b.stop()
			return nil, err
		}
		*w = newWorkerClient(name, p)
	}
	var ca *tlsutil.CA
	if !cfg.Plaintext {
		var err error
		if ca, err = tlsutil.NewCA("bench"); err != nil {
			b.stop()
			return nil, err
		}
	}
	for _, w := range []*workerClient{b.w1, b.w2} {
		hello := request{Op: opHello}
		if ca != nil {
			cert, key, err := ca.Issue(rpc.Identity{Org: "bench", Role: rpc.RoleWorker, Name: w.name}, []string{"127.0.0.1"}, 24*time.Hour)
			if err != nil {
				b.stop()
				return nil, err
			}
			hello.TLS = &tlsMaterial{CA: ca.CertPEM, Cert: cert, Key: key}
		}
		resp, err := w.call(ctx, hello)
		if err != nil {
			b.stop()
			return nil, err
		}
		w.addr, w.unbatchedAddr = resp.Addr, resp.UnbatchedAddr
	}
	return b, nil
}

func (b *bench) stop() {
	for _, w := range []*workerClient{b.w1, b.w2} {
		if w != nil {
			if err := w.proc.Stop(); err != nil {
				b.log.Warn("bench worker stop", "worker", w.name, "err", err)
			}
		}
	}
}

// size finds the input of a scenario for the configured duration: runs
// start at pilot records and grow by the measured rate (at most 16x per
// step) until one lasts at least 70% of the duration. With Config.Records
// set, that is the input, unmeasured.
func (b *bench) size(ctx context.Context, name string, pilot int64, run func(context.Context, int64) (measurement, error)) (int64, error) {
	if b.cfg.Records > 0 {
		return b.cfg.Records, nil
	}
	n := pilot
	for range 6 {
		m, err := b.runOnce(ctx, run, n)
		if err != nil {
			return 0, err
		}
		b.log.Debug("sizing run", "scenario", name, "records", n, "elapsed", m.elapsed)
		b.cfg.Progress.Step(name, 0, 0, fmt.Sprintf("sizing: %d in %.2fs, %s", n, m.elapsed.Seconds(),
			benchreport.Rate(m.perSecond(), unitOf(name))))
		if m.elapsed >= b.cfg.Duration*7/10 {
			return n, nil
		}
		// Short runs underestimate the steady rate (start-up costs), so
		// the estimate is refined until a run is long enough.
		target := int64(m.perSecond() * b.cfg.Duration.Seconds())
		n = min(max(target, n+1), 16*n)
	}
	return n, nil
}

// runOnce runs one measurement with a deadline generous enough for any
// sane rate, so that a stalled pipeline fails instead of hanging.
func (b *bench) runOnce(ctx context.Context, run func(context.Context, int64) (measurement, error), n int64) (measurement, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*b.cfg.Duration+30*time.Second)
	defer cancel()
	before, err := b.cpu(ctx)
	if err != nil {
		return measurement{}, err
	}
	m, err := run(ctx, n)
	if err != nil {
		return m, err
	}
	after, err := b.cpu(ctx)
	for i := range after {
		m.cpu[i] = after[i] - before[i]
	}
	return m, err
}

// cpu reads the two workers' CPU times.
func (b *bench) cpu(ctx context.Context) ([2]time.Duration, error) {
	var out [2]time.Duration
	for i, w := range []*workerClient{b.w1, b.w2} {
		r, err := w.call(ctx, request{Op: opCPU})
		if err != nil {
			return out, err
		}
		out[i] = time.Duration(r.CPUNanos)
	}
	return out, nil
}

func elapsed(start, end int64) time.Duration {
	return time.Duration(max(end-start, 1))
}

// rawTCP: worker 1 writes n fixed-size records, worker 2 counts them.
func (b *bench) rawTCP(ctx context.Context, n int64) (measurement, error) {
	l, err := b.w2.call(ctx, request{Op: opTCPListen, RecordBytes: RawRecordBytes, Records: n})
	if err != nil {
		return measurement{}, err
	}
	s, err := b.w1.call(ctx, request{Op: opTCPSend, Addr: l.Addr, Records: n, RecordBytes: RawRecordBytes})
	if err != nil {
		return measurement{}, err
	}
	r, err := b.w2.call(ctx, request{Op: opTCPWait})
	if err != nil {
		return measurement{}, err
	}
	if s.Records != n || r.Records != n {
		return measurement{}, fmt.Errorf("%w: raw TCP sent %d records and received %d, want %d", ErrMismatch, s.Records, r.Records, n)
	}
	return measurement{records: r.Records, bytes: r.Bytes, elapsed: elapsed(s.StartNanos, r.EndNanos)}, nil
}

// handWordCount: the hand-written word count over raw TCP.
func (b *bench) handWordCount(ctx context.Context, n int64) (measurement, error) {
	l, err := b.w2.call(ctx, request{Op: opWCListen, Partitions: wordCountPartitions})
	if err != nil {
		return measurement{}, err
	}
	s, err := b.w1.call(ctx, request{Op: opWCSend, Addr: l.Addr, Records: n, Seed: benchSeed, Partitions: wordCountPartitions})
	if err != nil {
		return measurement{}, err
	}
	r, err := b.w2.call(ctx, request{Op: opWCWait})
	if err != nil {
		return measurement{}, err
	}
	if s.Records != n || r.Records != s.Words {
		return measurement{}, fmt.Errorf("%w: hand-written word count sent %d words of %d lines (want %d lines) and counted %d words",
			ErrMismatch, s.Words, s.Records, n, r.Records)
	}
	if err := b.checkWordCounts("hand-written", n, r.Counts); err != nil {
		return measurement{}, err
	}
	return measurement{records: n, bytes: s.Bytes, elapsed: elapsed(s.StartNanos, r.EndNanos), counts: r.Counts}, nil
}

// forward: the source -> map -> sink query, batched or not.
func (b *bench) forward(ctx context.Context, n int64, unbatched bool) (measurement, error) {
	name := b.queryName("fwd")
	q, err := forwardQuery(name, n)
	if err != nil {
		return measurement{}, err
	}
	r, start, err := b.runQuery(ctx, q, map[string]bool{"records": true}, "out", unbatched, false)
	if err != nil {
		return measurement{}, err
	}
	if r.Records != n {
		return measurement{}, fmt.Errorf("%w: sink delivered %d records, the source produced %d", ErrMismatch, r.Records, n)
	}
	return measurement{records: n, bytes: r.Bytes, elapsed: elapsed(start, r.EndNanos)}, nil
}

// engineWordCount: the word count query.
func (b *bench) engineWordCount(ctx context.Context, n int64) (measurement, error) {
	name := b.queryName("wc")
	q, err := wordCountQuery(name, n)
	if err != nil {
		return measurement{}, err
	}
	r, start, err := b.runQuery(ctx, q, map[string]bool{"lines": true, "words": true}, "out", false, true)
	if err != nil {
		return measurement{}, err
	}
	if err := b.checkWordCounts("engine", n, r.Counts); err != nil {
		return measurement{}, err
	}
	return measurement{records: n, elapsed: elapsed(start, r.EndNanos), counts: r.Counts}, nil
}

// checkWordCounts compares a word count of the first n lines with the
// reference: every word and every count must match. The reference is
// computed once per input size, after the run it checks (never while a
// measured run is going on), and kept for the following rounds.
func (b *bench) checkWordCounts(who string, n int64, got map[string]int64) error {
	want, ok := b.refCounts[n]
	if !ok {
		var err error
		if want, err = referenceWordCounts(n, benchSeed); err != nil {
			return err
		}
		if b.refCounts == nil {
			b.refCounts = map[int64]map[string]int64{}
		}
		b.refCounts[n] = want
	}
	if len(got) != len(want) {
		return fmt.Errorf("%w: %s word count found %d distinct words in %d lines, the reference %d", ErrMismatch, who, len(got), n, len(want))
	}
	for w, c := range want {
		if got[w] != c {
			return fmt.Errorf("%w: %s word count counted %q %d times in %d lines, the reference %d", ErrMismatch, who, w, got[w], n, c)
		}
	}
	return nil
}

// referenceWordCounts counts the words of the first n lines of the words
// generator directly, splitting with strings.Fields (the split operator's
// documented rules) rather than with the tokeniser both word counts use.
func referenceWordCounts(n, seed int64) (map[string]int64, error) {
	gen, err := source.NewGenerator(wordsGenerator(n, seed), 0)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var tp tuple.Tuple
	for gen.Next(&tp) {
		for _, w := range strings.Fields(tp.Values[0].S) {
			out[w]++
		}
	}
	return out, nil
}

func (b *bench) queryName(kind string) string {
	b.seq++
	return fmt.Sprintf("bench-%s-%d", kind, b.seq)
}

// runQuery places the fragments in onWorker1 on worker 1 and the rest on
// worker 2, starts worker 2's tasks and a tail on sink first (they wait
// for their upstreams), then worker 1's, and waits for the tail to see the
// final boundary. It returns the tail's response and the wall time the
// source started. Applying this query's tasks stops the previous query's.
func (b *bench) runQuery(ctx context.Context, q *queryspec.Query, onWorker1 map[string]bool, sink string, unbatched, collect bool) (response, int64, error) {
	specs, err := placeQuery(q, func(fragment string) int {
		if onWorker1[fragment] {
			return 0
		}
		return 1
	}, b.engineAddrs(unbatched))
	if err != nil {
		return response{}, 0, err
	}
	if _, err := b.w2.call(ctx, request{Op: opApply, Tasks: specs[1], Unbatched: unbatched}); err != nil {
		return response{}, 0, err
	}
	sinkTask := queryspec.TaskID(q.Name, sink, 0, 0)
	if _, err := b.w2.call(ctx, request{Op: opTailStart, Query: q.Name, Task: sinkTask, Collect: collect}); err != nil {
		return response{}, 0, err
	}
	s, err := b.w1.call(ctx, request{Op: opApply, Tasks: specs[0], Unbatched: unbatched})
	if err != nil {
		return response{}, 0, err
	}
	r, err := b.w2.call(ctx, request{Op: opTailWait})
	if err != nil {
		return response{}, 0, err
	}
	return r, s.StartNanos, nil
}

// engineAddrs are the DataPlane addresses of the workers' engines.
func (b *bench) engineAddrs(unbatched bool) [2]string {
	if unbatched {
		return [2]string{b.w1.unbatchedAddr, b.w2.unbatchedAddr}
	}
	return [2]string{b.w1.addr, b.w2.addr}
}

// placeQuery builds the task specs of every task of q (one replica), on
// worker index where(fragment), addresses the two workers' DataPlane.
func placeQuery(q *queryspec.Query, where func(fragment string) int, addrs [2]string) ([2][]runtime.TaskSpec, error) {
	var out [2][]runtime.TaskSpec
	plan, err := q.FusedPlan()
	if err != nil {
		return out, err
	}
	var (
		placements []runtime.Placement
		owner      []int
	)
	for _, node := range plan.Nodes {
		for p := range max(1, node.Partitions) {
			for r := range max(1, q.Replicas) {
				w := where(node.Name)
				placements = append(placements, runtime.Placement{
					TaskID: queryspec.TaskID(q.Name, node.Name, p, r), Fragment: node.Name,
					Partition: p, Replica: r, WorkerAddr: addrs[w],
				})
				owner = append(owner, w)
			}
		}
	}
	for i, pl := range placements {
		out[owner[i]] = append(out[owner[i]], runtime.TaskSpec{
			TaskID: pl.TaskID, Query: q.Name, Fragment: pl.Fragment, Partition: pl.Partition,
			Replica: pl.Replica, QueryIndex: 1, Spec: q, Placements: placements,
		})
	}
	return out, nil
}

// blobGenerator is the forward pipeline's input: records that encode to
// RawRecordBytes bytes, like the raw baseline's.
func blobGenerator(records int64) *queryspec.Generator {
	return &queryspec.Generator{Kind: queryspec.GenBlob, Seed: benchSeed, Limit: records, Size: queryspec.DefaultBlobSize}
}

// forwardQuery: blob source -> map (projection of both fields) -> sink.
func forwardQuery(name string, records int64) (*queryspec.Query, error) {
	g := blobGenerator(records)
	return queryspec.Parse(name+".yaml", fmt.Appendf(nil, `
name: %s
replicas: 1
sources:
  - name: records
    generator: {kind: %s, seed: %d, limit: %d, size: %d, rate: 0}
operators:
  - {name: project, type: map, input: records, fields: {seq: seq, payload: payload}}
sinks:
  - {name: out, input: project}
`, name, g.Kind, g.Seed, g.Limit, g.Size))
}

// wordCountQuery: words source -> split into words -> keyed exchange ->
// aggregate count() per word over one window covering the whole (finite)
// input -> sink. At rate 0 stimes advance 1µs per line, so a day-long
// window holds any sane input.
func wordCountQuery(name string, records int64) (*queryspec.Query, error) {
	return queryspec.Parse(name+".yaml", fmt.Appendf(nil, `
name: %s
replicas: 1
sources:
  - name: lines
    generator: {kind: words, seed: %d, limit: %d, rate: 0}
operators:
  - {name: words, type: split, input: lines, field: line, as: %s}
  - name: counts
    type: aggregate
    input: words
    window: {size: 24h}
    group_by: [%[4]s]
    aggregates: {%s: "count()"}
    parallelism: %d
sinks:
  - {name: out, input: counts}
`, name, benchSeed, records, wordField, countField, wordCountPartitions))
}

// WriteText prints the result for people.
func (r *Result) WriteText(w io.Writer) error {
	var sb []byte
	for _, s := range r.Scenarios {
		size := "-"
		if s.RecordBytes > 0 {
			size = fmt.Sprintf("%.1f", s.RecordBytes)
		}
		sb = fmt.Appendf(sb, "%-22s %12.0f /s  (%d records in %.2fs, %s B/record; CPU ns/record: sender %.0f, receiver %.0f)\n",
			s.Name, s.PerSecond, s.Records, s.Seconds, size, s.CPUNanosPerRecord[0], s.CPUNanosPerRecord[1])
	}
	transport := "mutual TLS 1.3 (data plane and raw TCP baselines alike)"
	if !r.TLS {
		transport = "plaintext (data plane and raw TCP baselines alike)"
	}
	sb = fmt.Appendf(sb, "\n(median of %d rounds; ratios are the median of each round's ratio; transport: %s)\n", r.Rounds, transport)
	sb = fmt.Appendf(sb, "forward / raw TCP:              %.3f\n", r.ForwardRatio)
	sb = fmt.Appendf(sb, "word count / hand-written:      %.3f\n", r.WordcountRatio)
	sb = fmt.Appendf(sb, "batching gain (batched/unbatched): %.1fx\n", r.BatchingGain)
	sb = fmt.Appendf(sb, "blob generator alone:           %.0f records/s (ceiling of forward and unbatched)\n", r.BlobGeneratorRPS)
	sb = fmt.Appendf(sb, "words generator alone:          %.0f lines/s (ceiling of both word counts)\n", r.WordsGeneratorRPS)
	sb = fmt.Appendf(sb, "(GOMAXPROCS %d, %d CPUs; raw TCP records are %d bytes, engine records %.1f bytes encoded on average)\n",
		r.GOMAXPROCS, r.NumCPU, r.RawTCPRecordBytes, r.ForwardRecordBytes)
	_, err := w.Write(sb)
	return err
}

// Floors of the ratios (issue 3), drawn on the plot.
const (
	ForwardRatioFloor   = 0.25
	WordcountRatioFloor = 0.50
	BatchingGainFloor   = 10
)

// Charts draws the run for --plot: each scenario's rate per round (log
// scale: the rates differ by orders of magnitude), then each ratio per
// round with its floor.
func (r *Result) Charts() []benchreport.Chart {
	transport := "mutual TLS 1.3"
	if !r.TLS {
		transport = "plaintext"
	}
	rates := benchreport.Chart{
		Title:  fmt.Sprintf("bench dataplane: rate per round (%s)", transport),
		YLabel: "records (lines) per second",
		LogY:   true,
	}
	byName := map[string][]float64{}
	for _, s := range r.Scenarios {
		rates.Series = append(rates.Series, benchreport.Series{Name: s.Name, Y: s.Rounds})
		byName[s.Name] = s.Rounds
	}
	perRound := func(a, b string) []float64 {
		x, y := byName[a], byName[b]
		if len(x) == 0 || len(x) != len(y) {
			return nil
		}
		out := make([]float64, len(x))
		for i := range x {
			out[i] = ratio(x[i], y[i])
		}
		return out
	}
	ratios := benchreport.Chart{
		Title:  "ratios per round",
		YLabel: "ratio",
		Series: []benchreport.Series{
			{Name: "forward / raw TCP", Y: perRound("forward", "raw_tcp")},
			{Name: "word count / hand-written", Y: perRound("wordcount", "handwritten_wordcount")},
		},
		Lines: []benchreport.Line{
			{Name: fmt.Sprintf("forward floor %.2f", ForwardRatioFloor), Y: ForwardRatioFloor},
			{Name: fmt.Sprintf("word count floor %.2f", WordcountRatioFloor), Y: WordcountRatioFloor},
		},
	}
	gain := benchreport.Chart{
		Title:  "batching gain per round",
		YLabel: "batched / unbatched",
		Series: []benchreport.Series{{Name: "forward / unbatched", Y: perRound("forward", "unbatched")}},
		Lines:  []benchreport.Line{{Name: fmt.Sprintf("floor %d", BatchingGainFloor), Y: BatchingGainFloor}},
	}
	return []benchreport.Chart{rates, ratios, gain}
}
