package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/coordinator/health"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/benchmark"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// The real-org word count of `fedstream bench scaling` (issue 14, scenario
// a): DS2's experiment run by an org in this process (a coordinator with
// Raft and its health manager, and workers with their data plane over
// mutual TLS), not by the fluid model of package coordinator/health/sim.
//
// DS2's rates are 1M sentences a minute into splitters of at most 100K
// sentences a minute each, and 20 words a sentence into counters of at
// most 1M words a minute each: the optimum is 10 splitters and 20
// counters. Here the source sends realSentences a second (a scale factor
// of realSentences / (1M/60) of DS2's rates) and each operator's capacity
// is set by its calibrated per-tuple cost (queryspec Operator.Cost) in
// the same ratios: a splitter takes a tenth of the source's sentences, a
// counter a twentieth of its words. The cost is a wait, counted as busy
// time by the sensors (worker/runtime TestCostCountsAsBusy): 30 instances
// burning the CPU at their capacity would need some 30 cores, and this
// machine has 2, so only the waits are calibrated and the real work of
// the query (generating, splitting, routing, counting about ten thousand
// words a second) is small beside them.
//
// The live rescale resizes keyed fragments only, so the splitter is a
// keyed pass-through (an aggregate grouped by the sentence over 50 ms
// windows, costing the splitter's cost per sentence) with the split into
// words fused into its fragment; the counter is a keyed count per word
// over one-second windows.

// Defaults of the real-org run.
const (
	defaultRealSentences = 1000
	defaultRealSettle    = 10 * time.Second
	defaultRealTimeout   = 5 * time.Minute
	realWorkers          = 3
	// realBufferTuples bounds each output stream to about two seconds of
	// the source's sentences. A live rescale switches slots at a cut in
	// stream time above everything produced, so the old instances first
	// work through the backlog in front of them at their old pace: with
	// the default bound (256Ki tuples) a splitter ten times too small
	// sat on some 70 000 sentences, ten minutes of its work.
	realBufferTuples = 2000
	// ds2SentencesPerS is DS2's source rate.
	ds2SentencesPerS = 1000000.0 / 60
)

const realWordcountQuery = `
name: wordcount
autoscale: true
sources:
  - name: lines
    generator: {kind: words, seed: 42, rate: %d}
operators:
  - name: splitter
    type: aggregate
    input: lines
    window: {size: 50ms}
    group_by: [line]
    aggregates: {n: "count()"}
    cost: %s
    parallelism: %d
  - name: words
    type: split
    input: splitter
    field: line
    as: word
  - name: counter
    type: aggregate
    input: words
    window: {size: 1s}
    group_by: [word]
    aggregates: {count: "count()"}
    cost: %s
    parallelism: %d
sinks:
  - {name: counts, input: counter}
`

// RealWordcount is the word count measured on a real org.
type RealWordcount struct {
	// Mode is "real_org" (or "simulated" when only the model ran).
	Mode string `json:"mode"`
	// Steps counts the policy's actions that changed an operator's
	// parallelism, and Seconds is when the last of them was taken: the
	// figures DS2 and Dhalion are compared on. Rebalances counts the slot
	// rebalances (data skew: a word's frequency makes its counter
	// partition hotter than the others) taken in the same run, which move
	// slots and change no parallelism; they are in Actions too.
	Steps         int            `json:"steps"`
	Seconds       float64        `json:"seconds"`
	Rebalances    int            `json:"rebalances"`
	Final         map[string]int `json:"final"`
	Optimal       map[string]int `json:"optimal"`
	Overprovision float64        `json:"overprovision"`
	// Converged: every operator ended within one instance of its optimum.
	Converged   bool              `json:"converged"`
	Actions     []RealAction      `json:"actions"`
	Calibration RealCalibration   `json:"calibration"`
	Setup       string            `json:"setup"`
	LoadAvg     map[string]string `json:"load_avg"`
	RanS        float64           `json:"ran_s"`
}

// RealAction is one entry of the action log of the real run.
type RealAction struct {
	AtS       float64 `json:"at_s"`
	Fragment  string  `json:"fragment"`
	Diagnosis string  `json:"diagnosis"`
	Action    string  `json:"action"`
	From      int     `json:"from"`
	To        int     `json:"to"`
	Outcome   string  `json:"outcome"`
	// EvaluatedS is when the outcome was judged: a settling time after
	// the action was carried out (a rescale returns once finished), 0
	// while pending.
	EvaluatedS float64 `json:"evaluated_s"`
	// TrueRate is the true processing rate per instance the policy
	// measured (tuples per useful second), against the calibrated
	// capacity in Calibration.
	TrueRate float64 `json:"true_rate"`
	// Symptoms are the symptoms behind the diagnosis and what the
	// detectors saw (the log's symptoms), Detail what the action was to
	// do, OutcomeDetail why it was judged as it was.
	Symptoms      string `json:"symptoms,omitempty"`
	Detail        string `json:"detail,omitempty"`
	OutcomeDetail string `json:"outcome_detail,omitempty"`
}

// RealCalibration says how DS2's rates were scaled to this machine.
type RealCalibration struct {
	ScaleFactor         float64 `json:"scale_factor"`
	SourceSentencesPerS int     `json:"source_sentences_per_s"`
	WordsPerSentence    float64 `json:"words_per_sentence"`
	SplitterCost        string  `json:"splitter_cost"`
	SplitterCapacity    float64 `json:"splitter_capacity_per_s"`
	CounterCost         string  `json:"counter_cost"`
	CounterCapacity     float64 `json:"counter_capacity_per_s"`
	Note                string  `json:"note"`
}

type realOptions struct {
	sentences int
	settle    time.Duration
	timeout   time.Duration
	logger    *slog.Logger
	progress  io.Writer
}

// wordsPerSentence is the mean number of words of the words generator's
// first n sentences (seed 42, as the query's).
func wordsPerSentence(n int) (float64, error) {
	g, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 42}, 0)
	if err != nil {
		return 0, err
	}
	var t tuple.Tuple
	words := 0
	for range n {
		if !g.Next(&t) {
			return 0, fmt.Errorf("the words generator stopped")
		}
		words += len(strings.Fields(t.Values[0].S))
	}
	return float64(words) / float64(n), nil
}

// hottestCounterShare is the largest share of the word count's words (n
// sentences of its generator) that one of counters partitions receives
// under the initial slot map (slot s to partition s*counters/NumSlots).
// The words follow a Zipf law: with 20 counters three partitions take
// 2.3-2.8 times the mean share, so "60% of capacity" is well over it for
// them.
func hottestCounterShare(n, counters int) (float64, error) {
	g, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 42}, 0)
	if err != nil {
		return 0, err
	}
	var t tuple.Tuple
	per := make([]int, counters)
	words := 0
	for range n {
		if !g.Next(&t) {
			return 0, fmt.Errorf("the words generator stopped")
		}
		for _, w := range strings.Fields(t.Values[0].S) {
			per[queryspec.PartitionOfSlot(queryspec.Slot([]tuple.Value{tuple.Str(w)}), counters)]++
			words++
		}
	}
	hot := 0
	for _, c := range per {
		hot = max(hot, c)
	}
	return float64(hot) / float64(words), nil
}

// realCalibration scales DS2's word count to sentences per second.
func realCalibration(sentences int) (RealCalibration, error) {
	wps, err := wordsPerSentence(100000)
	if err != nil {
		return RealCalibration{}, err
	}
	c := RealCalibration{ScaleFactor: float64(sentences) / ds2SentencesPerS, SourceSentencesPerS: sentences, WordsPerSentence: wps,
		SplitterCapacity: float64(sentences) / 10, CounterCapacity: float64(sentences) * wps / 20}
	// Durations rounded to the microsecond (what the query's text keeps).
	sp := time.Duration(float64(time.Second) / c.SplitterCapacity).Round(time.Microsecond)
	ct := time.Duration(float64(time.Second) / c.CounterCapacity).Round(time.Microsecond)
	if sp <= 0 || ct <= 0 || sp > queryspec.MaxOperatorCost || ct > queryspec.MaxOperatorCost {
		return c, fmt.Errorf("--sentences %d gives per-tuple costs of %s and %s: want both in (0, %s]", sentences, sp, ct, queryspec.MaxOperatorCost)
	}
	c.SplitterCost, c.CounterCost = sp.String(), ct.String()
	c.SplitterCapacity, c.CounterCapacity = 1/sp.Seconds(), 1/ct.Seconds()
	c.Note = fmt.Sprintf("DS2's rates times %.3f: the source sends %d sentences/s of %.2f words; a splitter takes at most %.0f sentences/s (%s a sentence), a counter at most %.0f words/s (%s a word), so the optimum is DS2's 10 splitters + 20 counters; the costs are waits counted as busy time (30 instances could not burn 2 cores each)",
		c.ScaleFactor, sentences, wps, c.SplitterCapacity, c.SplitterCost, c.CounterCapacity, c.CounterCost)
	return c, nil
}

// runRealWordcount runs the word count on an in-process org until the
// health manager has acted and stayed quiet for a settling time and a
// window after its last evaluation, or until the timeout.
func runRealWordcount(ctx context.Context, o realOptions) (*RealWordcount, error) {
	cal, err := realCalibration(o.sentences)
	if err != nil {
		return nil, err
	}
	r := &RealWordcount{Mode: "real_org", Calibration: cal, Optimal: map[string]int{"splitter": 10, "counter": 20},
		LoadAvg: map[string]string{"start": benchmark.LoadAverage()}}
	r.Setup = fmt.Sprintf("one process: 1 coordinator (Raft, health loop every 1s, settling %s, 10-sample window) and %d workers (mutual TLS, 1 s sensor windows, output buffers of %d tuples); both operators start at parallelism 1", o.settle, realWorkers, realBufferTuples)
	progress := func(format string, args ...any) {
		if o.progress != nil {
			fmt.Fprintf(o.progress, "bench scaling: real org: "+format+"\n", args...)
		}
	}
	dir, err := os.MkdirTemp("", "fedstream-bench-scaling-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fed, err := startDev(context.WithoutCancel(ctx), devOptions{org: "bench", coordinators: 1, workers: realWorkers, dataDir: dir,
		logger: o.logger, noHTTP: true, health: coordinator.HealthConfig{Interval: time.Second, Settle: o.settle}, sensorWindow: time.Second,
		bufferTuples: realBufferTuples})
	if err != nil {
		return nil, err
	}
	defer fed.stop()
	f := &clientFlags{addr: fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: fed.tlsDir}}
	if err := fed.waitReady(ctx, f, realWorkers); err != nil {
		return nil, err
	}
	conn, err := f.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	admin, hc := pb.NewAdminServiceClient(conn), pb.NewHealthServiceClient(conn)
	y := fmt.Sprintf(realWordcountQuery, o.sentences, cal.SplitterCost, 1, cal.CounterCost, 1)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = admin.SubmitQuery(cctx, &pb.SubmitQueryRequest{Yaml: []byte(y), Filename: "wordcount.yaml"})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("submit the word count: %w", err)
	}
	start := time.Now()
	progress("submitted: source %d sentences/s, splitter %s a sentence, counter %s a word", o.sentences, cal.SplitterCost, cal.CounterCost)
	deadline := start.Add(o.timeout)
	quiet := o.settle + 15*time.Second
	var lastChange time.Time
	seen := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := hc.Actions(cctx, &pb.HealthActionsRequest{Query: "wordcount"})
		cancel()
		if err != nil {
			progress("reading the action log: %v", err)
			continue
		}
		r.Actions, r.Steps, r.Seconds, r.Rebalances = r.Actions[:0], 0, 0, 0
		acted := false
		pending := false
		for _, a := range resp.Actions {
			if a.Action == "none" {
				continue // an alert, not a step
			}
			var m health.Metrics
			_ = json.Unmarshal([]byte(a.Metrics), &m)
			at := time.UnixMilli(a.AtMs).Sub(start).Seconds()
			r.Actions = append(r.Actions, RealAction{AtS: math.Round(at*10) / 10, Fragment: a.Fragment, Diagnosis: a.Diagnosis, Action: a.Action,
				From: int(a.FromParallelism), To: int(a.ToParallelism), Outcome: a.Outcome, TrueRate: math.Round(m.TrueRate),
				Symptoms: a.Symptoms, Detail: a.Detail, OutcomeDetail: a.OutcomeDetail})
			if a.EvaluatedAtMs > 0 {
				r.Actions[len(r.Actions)-1].EvaluatedS = math.Round(time.UnixMilli(a.EvaluatedAtMs).Sub(start).Seconds()*10) / 10
			}
			acted = true
			if a.FromParallelism != a.ToParallelism {
				r.Steps++
				r.Seconds = math.Round(at*10) / 10
			} else {
				r.Rebalances++
			}
			pending = pending || a.Outcome == "pending"
			if seen[a.Id] != a.Outcome {
				seen[a.Id] = a.Outcome
				lastChange = time.Now()
				progress("%.1f s: %s %s %s %d -> %d (true rate %.0f/s per instance): %s", at, a.Fragment, a.Diagnosis, a.Action, a.FromParallelism, a.ToParallelism, m.TrueRate, a.Outcome)
			}
		}
		if !pending && acted && time.Since(lastChange) > quiet {
			break
		}
		if time.Now().After(deadline) {
			progress("timed out after %s", o.timeout)
			break
		}
	}
	cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	q, err := admin.GetQuery(cctx, &pb.GetQueryRequest{Name: "wordcount"})
	cancel()
	if err != nil {
		return nil, err
	}
	r.Final = map[string]int{}
	// Partitions that own slots: a rescale's new partitions exist from
	// its prepare on, but take part only once it finished.
	for _, t := range q.Tasks {
		if t.Replica == 0 && (t.Fragment == "splitter" || t.Fragment == "counter") && t.SlotCount > 0 {
			r.Final[t.Fragment]++
		}
	}
	r.Converged = true
	fin, opt := 0, 0
	for op, n := range r.Optimal {
		fin += r.Final[op]
		opt += n
		if d := r.Final[op] - n; d > 1 || d < -1 {
			r.Converged = false
		}
	}
	r.Overprovision = math.Round(float64(fin-opt)/float64(opt)*1000) / 1000
	r.RanS = math.Round(time.Since(start).Seconds())
	r.LoadAvg["end"] = benchmark.LoadAverage()
	sort.Slice(r.Actions, func(i, j int) bool { return r.Actions[i].AtS < r.Actions[j].AtS })
	return r, nil
}

// Scenario (c) on a real org: a keyed operator of 4 instances at 95% of
// their calibrated capacity (1900 lines/s, 2 ms a line, keyed by line),
// one of which runs on a worker whose costs are slowed (each tuple costs
// it 25%, 50% or 100% more). The worker is the org's fourth; the bench
// moves the operator's instances so that exactly one runs on it.
const realSlowQuery = `
name: slow
autoscale: true
sources:
  - name: lines
    generator: {kind: words, seed: 7, rate: 1900}
operators:
  - name: op
    type: aggregate
    input: lines
    window: {size: 50ms}
    group_by: [line]
    aggregates: {n: "count()"}
    parallelism: 4
    cost: 2ms
sinks:
  - {name: out, input: op}
`

// RealDiagnosed is one injected fault on the real org and the first
// diagnosis the health manager made, its action and its outcome.
type RealDiagnosed struct {
	Injected  string  `json:"injected"`
	Diagnosed string  `json:"diagnosed"`
	Action    string  `json:"action"`
	Outcome   string  `json:"outcome"`
	AtS       float64 `json:"at_s"`
	Detail    string  `json:"detail,omitempty"`
	// SlowPartition is the partition run by the slow worker;
	// DiagnosedPartition the one the diagnosis named (-1: none).
	SlowPartition      int `json:"slow_partition"`
	DiagnosedPartition int `json:"diagnosed_partition"`
}

// runRealSlowInstance runs scenario (c) for one slowdown (0.25: each
// tuple costs 25% more on the slow worker).
func runRealSlowInstance(ctx context.Context, o realOptions, slow float64) (RealDiagnosed, error) {
	res := RealDiagnosed{Injected: fmt.Sprintf("slow instance %.0f%%", slow*100)}
	return runRealFault(ctx, o, res, realSlowQuery, "slow", slow)
}

// runRealFault runs query (named name, whose keyed operator of 4
// instances is op) on a 4-worker org and reports the first diagnosis made
// on op. slow > 0 makes the fourth worker slow by that much and puts one
// instance of op on it.
func runRealFault(ctx context.Context, o realOptions, res RealDiagnosed, query, name string, slow float64) (RealDiagnosed, error) {
	progress := func(format string, args ...any) {
		if o.progress != nil {
			fmt.Fprintf(o.progress, "bench scaling: real org, %s: "+format+"\n", append([]any{res.Injected}, args...)...)
		}
	}
	dir, err := os.MkdirTemp("", "fedstream-bench-slow-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	const workers = 4
	fed, err := startDev(context.WithoutCancel(ctx), devOptions{org: "bench", coordinators: 1, workers: workers, dataDir: dir,
		logger: o.logger, noHTTP: true, health: coordinator.HealthConfig{Interval: time.Second, Settle: o.settle}, sensorWindow: time.Second,
		bufferTuples: realBufferTuples, lastCostScale: map[bool]float64{true: 1 + slow}[slow > 0]})
	if err != nil {
		return res, err
	}
	defer fed.stop()
	f := &clientFlags{addr: fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: fed.tlsDir}}
	if err := fed.waitReady(ctx, f, workers); err != nil {
		return res, err
	}
	conn, err := f.dial()
	if err != nil {
		return res, err
	}
	defer conn.Close()
	admin, hc := pb.NewAdminServiceClient(conn), pb.NewHealthServiceClient(conn)
	call := func(fn func(ctx context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return fn(cctx)
	}
	if err := call(func(ctx context.Context) error {
		_, err := admin.SubmitQuery(ctx, &pb.SubmitQueryRequest{Yaml: []byte(query), Filename: name + ".yaml"})
		return err
	}); err != nil {
		return res, fmt.Errorf("submit: %w", err)
	}
	slowID := fed.workers[workers-1].ID()
	// Exactly one instance of op on the slow worker: move the others
	// off it, or one onto it.
	var q *pb.QueryInfo
	if err := call(func(ctx context.Context) error {
		var err error
		q, err = admin.GetQuery(ctx, &pb.GetQueryRequest{Name: name})
		return err
	}); err != nil {
		return res, err
	}
	var onSlow, elsewhere []*pb.TaskInfo
	for _, t := range q.Tasks {
		if t.Fragment != "op" {
			continue
		}
		if t.WorkerId == slowID {
			onSlow = append(onSlow, t)
		} else {
			elsewhere = append(elsewhere, t)
		}
	}
	var moves [][2]string // task, to worker
	res.DiagnosedPartition = -1
	switch {
	case slow <= 0:
	case len(onSlow) == 0 && len(elsewhere) > 0:
		moves = append(moves, [2]string{elsewhere[0].TaskId, slowID})
		res.SlowPartition = int(elsewhere[0].Partition)
	case len(onSlow) > 1:
		for i, t := range onSlow[1:] {
			moves = append(moves, [2]string{t.TaskId, fed.workers[i%(workers-1)].ID()})
		}
		fallthrough
	case len(onSlow) == 1:
		res.SlowPartition = int(onSlow[0].Partition)
	}
	for _, m := range moves {
		if err := call(func(ctx context.Context) error {
			_, err := admin.MoveTask(ctx, &pb.MoveTaskRequest{TaskId: m[0], ToWorker: m[1]})
			return err
		}); err != nil {
			return res, fmt.Errorf("move %s to %s: %w", m[0], m[1], err)
		}
	}
	start := time.Now()
	if slow > 0 {
		progress("running, one instance of 4 on the slow worker (%d moves to get there)", len(moves))
	} else {
		progress("running")
	}
	deadline := start.Add(o.timeout)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Second):
		}
		var resp *pb.HealthActionsResponse
		if err := call(func(ctx context.Context) error {
			var err error
			resp, err = hc.Actions(ctx, &pb.HealthActionsRequest{Query: name})
			return err
		}); err != nil {
			continue
		}
		var a *pb.HealthAction
		for _, x := range resp.Actions {
			if x.Fragment == "op" {
				a = x
				break
			}
		}
		if a == nil {
			continue
		}
		res.Diagnosed, res.Action, res.Outcome, res.Detail = a.Diagnosis, a.Action, a.Outcome, a.Detail
		if _, err := fmt.Sscanf(a.Detail, "partition %d:", &res.DiagnosedPartition); err != nil {
			res.DiagnosedPartition = -1
		}
		res.AtS = math.Round(time.UnixMilli(a.AtMs).Sub(start).Seconds()*10) / 10
		if a.Outcome != "pending" {
			progress("%.1f s: %s, %s: %s", res.AtS, a.Diagnosis, a.Action, a.Outcome)
			return res, nil
		}
	}
	progress("timed out after %s (first action: %q %q %q)", o.timeout, res.Diagnosed, res.Action, res.Outcome)
	return res, nil
}

// Data skew on a real org: the same operator of 4 instances, keyed by k,
// where k is the line, except for the lines whose length modulo 97 is
// below a threshold, which all get the key "hot": the partition owning
// "hot" receives more tuples than the others. The threshold is chosen
// from the generator's own lines for the skew asked for, and the skew
// reached is reported.
const realSkewQuery = `
name: skew
autoscale: true
sources:
  - name: lines
    generator: {kind: words, seed: 7, rate: %d}
operators:
  - name: keyed
    type: map
    input: lines
    fields: {k: "len(line) %% 97 < %d ? 'hot' : line"}
  - name: op
    type: aggregate
    input: keyed
    window: {size: 50ms}
    group_by: [k]
    aggregates: {n: "count()"}
    parallelism: 4
    cost: 2ms
sinks:
  - {name: out, input: op}
`

// skewThreshold picks the threshold of realSkewQuery whose hot share
// comes closest to skew more tuples for the hot partition than for the
// others, and returns the skew reached and the hot partition.
func skewThreshold(skew float64) (threshold int, reached float64, hot int, err error) {
	g, err := source.NewGenerator(&queryspec.Generator{Kind: "words", Seed: 7}, 0)
	if err != nil {
		return 0, 0, 0, err
	}
	const n = 50000
	var t tuple.Tuple
	var residues [97]int
	for range n {
		if !g.Next(&t) {
			return 0, 0, 0, fmt.Errorf("the words generator stopped")
		}
		residues[len(t.Values[0].S)%97]++
	}
	hot = queryspec.PartitionOfSlot(queryspec.Slot([]tuple.Value{tuple.Str("hot")}), 4)
	best := math.Inf(1)
	cum := 0
	for th := 0; th <= 97; th++ {
		f := float64(cum) / n
		// The hot partition gets f plus its quarter of the rest.
		got := (f + (1-f)/4) / ((1 - f) / 4)
		if d := math.Abs(got - 1 - skew); d < best {
			best, threshold, reached = d, th, got-1
		}
		if th < 97 {
			cum += residues[th]
		}
	}
	return threshold, reached, hot, nil
}

// runRealSkew runs scenario (c)'s data skew for one skew (0.1: the hot
// partition receives 10% more tuples than each other one) at 95% of the
// operator's capacity, as the model does.
func runRealSkew(ctx context.Context, o realOptions, skew float64) (RealDiagnosed, error) {
	res := RealDiagnosed{Injected: fmt.Sprintf("data skew %.0f%%", skew*100), SlowPartition: -1, DiagnosedPartition: -1}
	th, reached, hot, err := skewThreshold(skew)
	if err != nil {
		return res, err
	}
	res.Injected = fmt.Sprintf("data skew %.0f%% (reached %.1f%%)", skew*100, reached*100)
	res.SlowPartition = hot
	// 95% of 4 instances of 500 tuples/s; the hot one takes (1+s)/(4+s)
	// of it, more than it can from a skew of about 5.3%.
	y := fmt.Sprintf(realSkewQuery, 1900, th)
	return runRealFault(ctx, o, res, y, "skew", 0)
}
