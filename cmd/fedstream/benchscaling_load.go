package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"math/rand"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/coordinator/health"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/benchmark"
	"github.com/fedstream/fedstream/worker/runtime"
)

// Scenarios (b) and (d) of `fedstream bench scaling` on a real org: the
// word count of scenario (a), started at DS2's optimum (10 splitters, 20
// counters), whose load is changed while it runs. The load is the
// source's real rate: every worker's generator sources are paced by one
// runtime.Pace, a factor on their wall-clock rate that the bench changes
// (the tuples' stimes stay those of the query's rate; the sensors measure
// what really flows, nothing is faked).
//
//   - load change (b), Dhalion's experiment: full load for a warm-up,
//     then 80% of it, then 30% more (104%), each phase a fixed time;
//     every action from the submission on is counted (and those of each
//     phase), and an oscillation is a scale-down of an operator after a
//     scale-up of it.
//   - noise (d): an hour of stationary load, 60% of capacity with +-20%
//     noise (a new factor every second, the mean times a uniform draw
//     from 0.8..1.2; capacity is that of the bottleneck, the counter
//     partition with the most words: see runRealNoise),
//     compressed in time by a ratio: the sensor window, the policy's
//     interval and its settling time are divided by it, and the noise
//     changes every compressed second. The policy sees the same number
//     of samples as in an hour; each sample holds as many tuples as a
//     one-second sample of the word count at 1/ratio of the rate, which
//     is the run being compressed. Every action taken from the query's
//     submission on is counted, those of the warm-up at the mean load
//     before the noise too (and also reported apart): a user who submits
//     a query at a steady load sees them all.

// Defaults of the real-org load scenarios.
const (
	defaultLoadWarmup = 30 * time.Second
	defaultLoadPhase  = 40 * time.Second
	defaultNoiseRatio = 30
	// loadJudgeWait bounds the wait, after the last phase, for the
	// actions still pending to be judged (a splitter's rescale under a
	// backlog takes tens of seconds, then the settling time).
	loadJudgeWait = time.Minute
	// noiseCounters is the noise scenario's counter parallelism (DS2's).
	noiseCounters = 20
	// noiseHour is the stationary time the noise scenario stands for.
	noiseHour = time.Hour
	// noiseWarmup is the wall time the noise scenario runs at its mean
	// load before the noise starts: the 31 tasks start and catch up with
	// what the source sent meanwhile. Its actions count as the others:
	// the load is stationary from the submission on.
	noiseWarmup = 15 * time.Second
)

// RealLoadChange is scenario (b) measured on a real org.
type RealLoadChange struct {
	Mode string `json:"mode"`
	// Actions counts the health manager's actions (scalings, moves,
	// rebalances; not alerts) from the query's submission on;
	// WarmupActions those of them before the load's drop, at full load
	// (each phase's are in Phases).
	Actions       int `json:"actions"`
	WarmupActions int `json:"warmup_actions"`
	// Oscillations counts the scale-downs of an operator after a
	// scale-up of it (the whole run); Reversals any change of direction
	// (a scale-up after a scale-down too), the model's count.
	Oscillations int `json:"oscillations"`
	Reversals    int `json:"reversals"`
	// Pending counts the actions not judged yet when the run ended.
	Pending int               `json:"pending"`
	Phases  []RealLoadPhase   `json:"phases"`
	Log     []RealAction      `json:"log"`
	Setup   string            `json:"setup"`
	LoadAvg map[string]string `json:"load_avg"`
	RanS    float64           `json:"ran_s"`
}

// RealLoadPhase is one phase of the load-change scenario: the source's
// pace factor, the source rate the sensors measured in it (mean of the
// samples of its second half), and each operator's partitions at its end.
type RealLoadPhase struct {
	Name         string         `json:"name"`
	Factor       float64        `json:"factor"`
	FromS        float64        `json:"from_s"`
	ToS          float64        `json:"to_s"`
	SourceRate   float64        `json:"measured_source_rate"`
	Parallelism  map[string]int `json:"parallelism"`
	ActionsInIt  int            `json:"actions"`
	ExpectedRate float64        `json:"expected_source_rate"`
}

// RealNoise is scenario (d) measured on a real org.
type RealNoise struct {
	Mode string `json:"mode"`
	// SimulatedS is the stationary time the run stands for, Ratio its
	// compression, WallS how long the noise ran (after the warm-up).
	SimulatedS int     `json:"simulated_s"`
	Ratio      int     `json:"ratio"`
	WallS      float64 `json:"wall_s"`
	// Actions counts the health manager's actions (not alerts) from the
	// query's submission on; WarmupActions those of them in the warm-up
	// at the mean load before the noise.
	Actions       int    `json:"actions"`
	WarmupActions int    `json:"warmup_actions"`
	Scalings      int    `json:"scalings"`
	Interval      string `json:"policy_interval"`
	Settle        string `json:"settle"`
	// Warmup is the loop's warm-up after the query's start: the
	// uncompressed settling time (starting 31 tasks and catching up with
	// what the source sent meanwhile take wall time, which the
	// compression does not shorten).
	Warmup       string `json:"policy_warmup"`
	SensorWindow string `json:"sensor_window"`
	// MeanLoad and Noise: the source's pace is MeanLoad*(1+-Noise) of
	// the calibrated full load; MeasuredMeanRate the source rate the
	// sensors measured over the counted part. MeanLoad puts the counter
	// partition with the most words (HottestShare of them) at 60% of its
	// capacity; Splitters is the splitters' parallelism (10).
	HottestShare     float64           `json:"hottest_counter_share"`
	Splitters        int               `json:"splitters"`
	MeanLoad         float64           `json:"mean_load"`
	Noise            float64           `json:"noise"`
	MeasuredMeanRate float64           `json:"measured_mean_source_rate"`
	Parallelism      map[string]int    `json:"parallelism"`
	Log              []RealAction      `json:"log"`
	Setup            string            `json:"setup"`
	LoadAvg          map[string]string `json:"load_avg"`
}

// wordcountOrg is an in-process org running the word count.
type wordcountOrg struct {
	fed   *devFederation
	conn  *grpc.ClientConn
	admin pb.AdminServiceClient
	hc    pb.HealthServiceClient
	dir   string
	start time.Time
}

type wordcountOrgConfig struct {
	sentences           int
	splitters, counters int
	interval, settle    time.Duration
	// warmup is the health loop's warm-up (0: one settling time).
	warmup time.Duration
	window time.Duration
	pace   *runtime.Pace
	logger *slog.Logger
}

// startWordcountOrg starts an org of realWorkers workers and submits the
// word count at the given parallelism; start is when it was submitted.
func startWordcountOrg(ctx context.Context, c wordcountOrgConfig, cal RealCalibration) (_ *wordcountOrg, err error) {
	w := &wordcountOrg{}
	if w.dir, err = os.MkdirTemp("", "fedstream-bench-load-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	w.fed, err = startDev(context.WithoutCancel(ctx), devOptions{org: "bench", coordinators: 1, workers: realWorkers, dataDir: w.dir,
		logger: c.logger, noHTTP: true, health: coordinator.HealthConfig{Interval: c.interval, Settle: c.settle, Warmup: c.warmup}, sensorWindow: c.window,
		bufferTuples: realBufferTuples, sourcePace: c.pace})
	if err != nil {
		return nil, err
	}
	f := &clientFlags{addr: w.fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: w.fed.tlsDir}}
	if err := w.fed.waitReady(ctx, f, realWorkers); err != nil {
		return nil, err
	}
	if w.conn, err = f.dial(); err != nil {
		return nil, err
	}
	w.admin, w.hc = pb.NewAdminServiceClient(w.conn), pb.NewHealthServiceClient(w.conn)
	y := fmt.Sprintf(realWordcountQuery, c.sentences, cal.SplitterCost, c.splitters, cal.CounterCost, c.counters)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := w.admin.SubmitQuery(cctx, &pb.SubmitQueryRequest{Yaml: []byte(y), Filename: "wordcount.yaml"}); err != nil {
		return nil, fmt.Errorf("submit the word count: %w", err)
	}
	w.start = time.Now()
	return w, nil
}

func (w *wordcountOrg) close() {
	if w.conn != nil {
		w.conn.Close()
	}
	if w.fed != nil {
		w.fed.stop()
	}
	os.RemoveAll(w.dir)
}

// actions returns the health manager's actions on the word count (not
// its alerts), oldest first.
func (w *wordcountOrg) actions(ctx context.Context) ([]RealAction, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := w.hc.Actions(cctx, &pb.HealthActionsRequest{Query: "wordcount"})
	if err != nil {
		return nil, err
	}
	var out []RealAction
	for _, a := range resp.Actions {
		if a.Action == "none" {
			continue
		}
		var m health.Metrics
		_ = json.Unmarshal([]byte(a.Metrics), &m)
		ra := RealAction{AtS: math.Round(time.UnixMilli(a.AtMs).Sub(w.start).Seconds()*10) / 10, Fragment: a.Fragment, Diagnosis: a.Diagnosis,
			Action: a.Action, From: int(a.FromParallelism), To: int(a.ToParallelism), Outcome: a.Outcome, TrueRate: math.Round(m.TrueRate),
			Symptoms: a.Symptoms, Detail: a.Detail, OutcomeDetail: a.OutcomeDetail}
		if a.EvaluatedAtMs > 0 {
			ra.EvaluatedS = math.Round(time.UnixMilli(a.EvaluatedAtMs).Sub(w.start).Seconds()*10) / 10
		}
		out = append(out, ra)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].AtS < out[j].AtS })
	return out, nil
}

// sourceRate is the source's output rate in its latest sensor figures
// (sentences a second, all its partitions).
func (w *wordcountOrg) sourceRate(ctx context.Context) (float64, bool) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := w.admin.QueryStats(cctx, &pb.QueryStatsRequest{Query: "wordcount"})
	if err != nil {
		return 0, false
	}
	rate, seen := 0.0, false
	for _, ts := range resp.Tasks {
		if queryFragment(ts.Task) == "lines" {
			rate += ts.OutTps
			seen = true
		}
	}
	return rate, seen
}

// queryFragment is the fragment of a task id (query/fragment/pN/rM).
func queryFragment(id string) string {
	if parts := strings.SplitN(id, "/", 3); len(parts) == 3 {
		return parts[1]
	}
	return ""
}

// parallelism is each operator's partitions that own slots.
func (w *wordcountOrg) parallelism(ctx context.Context) map[string]int {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q, err := w.admin.GetQuery(cctx, &pb.GetQueryRequest{Name: "wordcount"})
	out := map[string]int{}
	if err != nil {
		return out
	}
	for _, t := range q.Tasks {
		if t.Replica == 0 && (t.Fragment == "splitter" || t.Fragment == "counter") && t.SlotCount > 0 {
			out[t.Fragment]++
		}
	}
	return out
}

// oscillations counts, over log (oldest first), the scale-downs of an
// operator after a scale-up of it, and every change of direction.
func oscillations(log []RealAction) (upThenDown, reversals int) {
	dir := map[string]string{}
	for _, a := range log {
		if a.Action != health.ActScaleUp && a.Action != health.ActScaleDown {
			continue
		}
		if prev, ok := dir[a.Fragment]; ok && prev != a.Action {
			reversals++
			if prev == health.ActScaleUp {
				upThenDown++
			}
		}
		dir[a.Fragment] = a.Action
	}
	return upThenDown, reversals
}

type loadOptions struct {
	realOptions
	warmup, phase time.Duration
	ratio         int
	seed          int64
	// noiseWarmup and noiseSpan replace the constants noiseWarmup and
	// noiseHour when positive (tests).
	noiseWarmup, noiseSpan time.Duration
}

func (o loadOptions) say(what, format string, args ...any) {
	if o.progress != nil {
		fmt.Fprintf(o.progress, "bench scaling: real org, "+what+": "+format+"\n", args...)
	}
}

// runRealLoadChange runs scenario (b) on a real org.
func runRealLoadChange(ctx context.Context, o loadOptions) (*RealLoadChange, error) {
	cal, err := realCalibration(o.sentences)
	if err != nil {
		return nil, err
	}
	pace, err := runtime.NewPace(1)
	if err != nil {
		return nil, err
	}
	r := &RealLoadChange{Mode: "real_org", LoadAvg: map[string]string{"start": benchmark.LoadAverage()}}
	r.Setup = fmt.Sprintf("one process: 1 coordinator (health loop every 1s, settling %s, 10-sample window) and %d workers (1 s sensor windows); the word count of scenario (a) (%d sentences/s at full load) submitted at 10 splitters + 20 counters; full load for %s, then 80%% for %s, then 104%% (30%% more) for %s",
		o.settle, realWorkers, o.sentences, o.warmup, o.phase, o.phase)
	w, err := startWordcountOrg(ctx, wordcountOrgConfig{sentences: o.sentences, splitters: 10, counters: 20, interval: time.Second, settle: o.settle,
		window: time.Second, pace: pace, logger: o.logger}, cal)
	if err != nil {
		return nil, err
	}
	defer w.close()
	o.say("load change", "submitted at 10 + 20, full load (%d sentences/s) for %s", o.sentences, o.warmup)
	phases := []struct {
		name   string
		factor float64
		d      time.Duration
	}{{"warmup", 1, o.warmup}, {"drop 20%", 0.8, o.phase}, {"rise 30%", 0.8 * 1.3, o.phase}}
	var dropAt float64
	for _, ph := range phases {
		if err := pace.Set(ph.factor); err != nil {
			return nil, err
		}
		from := time.Since(w.start).Seconds()
		if ph.name != "warmup" && dropAt == 0 {
			dropAt = from
		}
		o.say("load change", "%.0f s: %s, pace %.2f", from, ph.name, ph.factor)
		end := time.Now().Add(ph.d)
		var rates []float64
		for time.Now().Before(end) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Second):
			}
			// The second half of the phase: the rate has settled.
			if time.Until(end) < ph.d/2 {
				if rate, ok := w.sourceRate(ctx); ok {
					rates = append(rates, rate)
				}
			}
		}
		p := RealLoadPhase{Name: ph.name, Factor: ph.factor, FromS: math.Round(from*10) / 10, ToS: math.Round(time.Since(w.start).Seconds()*10) / 10,
			Parallelism: w.parallelism(ctx), ExpectedRate: math.Round(float64(o.sentences) * ph.factor)}
		if len(rates) > 0 {
			sum := 0.0
			for _, x := range rates {
				sum += x
			}
			p.SourceRate = math.Round(sum / float64(len(rates)))
		}
		r.Phases = append(r.Phases, p)
	}
	// The actions taken in the last phase are judged a settling time
	// after they are carried out; the load stays as it is meanwhile.
	end := time.Now().Add(min(loadJudgeWait, o.phase+o.settle))
	for time.Now().Before(end) {
		log, err := w.actions(ctx)
		if err != nil {
			return nil, err
		}
		pending := false
		for _, a := range log {
			pending = pending || a.Outcome == "pending"
		}
		if !pending {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	log, err := w.actions(ctx)
	if err != nil {
		return nil, err
	}
	r.Log = log
	for _, a := range log {
		if a.Outcome == "pending" {
			r.Pending++
		}
		r.Actions++
		if a.AtS < dropAt {
			r.WarmupActions++
		}
		for i := range r.Phases {
			if a.AtS >= r.Phases[i].FromS && a.AtS < r.Phases[i].ToS {
				r.Phases[i].ActionsInIt++
			}
		}
		o.say("load change", "%.1f s: %s %s %s %d -> %d: %s", a.AtS, a.Fragment, a.Diagnosis, a.Action, a.From, a.To, a.Outcome)
	}
	r.Oscillations, r.Reversals = oscillations(log)
	r.RanS = math.Round(time.Since(w.start).Seconds())
	r.LoadAvg["end"] = benchmark.LoadAverage()
	return r, nil
}

// runRealNoise runs scenario (d) on a real org.
func runRealNoise(ctx context.Context, o loadOptions) (*RealNoise, error) {
	if o.ratio < 1 {
		return nil, fmt.Errorf("--noise-ratio %d: want at least 1", o.ratio)
	}
	cal, err := realCalibration(o.sentences)
	if err != nil {
		return nil, err
	}
	// 60% of the capacity of the query as submitted: of its bottleneck,
	// the counter partition with the most words (hottestCounterShare), not
	// of the mean counter. At 60% of the mean counter's capacity (600
	// sentences/s) the two hottest partitions ran at 94-95% busy, `words`
	// blocked on them about 1000 ms/s and the counters took about 344 of
	// the 529 sentences/s the source sent (1 s sensor windows): no
	// stationary load, and the health manager's actions were right to
	// see a bottleneck. The query stays at DS2's 10 + 20: its configured
	// rate (1000 sentences/s, which the pace does not change) is the
	// demand the policy sizes by, and 10 splitters are what it needs, so
	// that splitters idle at this load are no over-provisioning it can
	// act on (4 splitters, sized for the paced rate, were scaled to 11 for
	// that demand at the first hot second).
	const target, noise = 0.6, 0.2
	share, err := hottestCounterShare(100000, noiseCounters)
	if err != nil {
		return nil, err
	}
	mean := min(target, target/(share*noiseCounters))
	const splitters = 10
	pace, err := runtime.NewPace(mean)
	if err != nil {
		return nil, err
	}
	warm := noiseWarmup
	if o.noiseWarmup > 0 {
		warm = o.noiseWarmup
	}
	span := noiseHour
	if o.noiseSpan > 0 {
		span = o.noiseSpan
	}
	ratio := time.Duration(o.ratio)
	second, settle := time.Second/ratio, o.settle/ratio
	wall := span / ratio
	r := &RealNoise{Mode: "real_org", SimulatedS: int(span.Seconds()), Ratio: o.ratio, Interval: second.String(), Settle: settle.String(), Warmup: o.settle.String(),
		SensorWindow: second.String(), MeanLoad: mean, Noise: noise, HottestShare: math.Round(share*1e4) / 1e4, Splitters: splitters,
		LoadAvg: map[string]string{"start": benchmark.LoadAverage()}}
	r.Setup = fmt.Sprintf("one process: 1 coordinator and %d workers; the word count of scenario (a) (full load %d sentences/s) at %d splitters + %d counters; sensor window and policy interval 1s/%d = %s, settling %s/%d = %s (10-sample window), the loop's warm-up after the start %s (not compressed: the tasks start in wall time); the source paced at %.1f%% of full load, 60%% of the hottest counter partition's capacity (it gets %.1f%% of the words), with a new factor every %s drawn uniformly from +-%.0f%% (seed %d); %s (wall) at the mean load first; every action from the submission on counted",
		realWorkers, o.sentences, splitters, noiseCounters, o.ratio, second, o.settle, o.ratio, settle, o.settle, mean*100, share*100, second, noise*100, o.seed, warm)
	w, err := startWordcountOrg(ctx, wordcountOrgConfig{sentences: o.sentences, splitters: splitters, counters: noiseCounters, interval: second, settle: settle,
		warmup: o.settle, window: second, pace: pace, logger: o.logger}, cal)
	if err != nil {
		return nil, err
	}
	defer w.close()
	o.say("noise", "submitted at %d + %d; %s at %.0f%% load (60%% of the hottest counter partition's capacity), then %s of noise (%s compressed %dx)", splitters, noiseCounters, warm, mean*100, wall, span, o.ratio)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(warm):
	}
	noiseFrom := time.Since(w.start).Seconds()
	rng := rand.New(rand.NewSource(o.seed))
	t := time.NewTicker(second)
	defer t.Stop()
	began := time.Now()
	end := began.Add(wall)
	var rates []float64
	lastRate := time.Now()
	for time.Now().Before(end) {
		if err := pace.Set(mean * (1 + 2*noise*(rng.Float64()-0.5))); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		if time.Since(lastRate) >= time.Second {
			lastRate = time.Now()
			if rate, ok := w.sourceRate(ctx); ok {
				rates = append(rates, rate)
			}
		}
	}
	r.WallS = math.Round(time.Since(began).Seconds()*10) / 10
	log, err := w.actions(ctx)
	if err != nil {
		return nil, err
	}
	r.Log = log
	for _, a := range log {
		r.Actions++
		if a.From != a.To {
			r.Scalings++
		}
		if a.AtS < noiseFrom {
			r.WarmupActions++
		}
		o.say("noise", "%.1f s: %s %s %s %d -> %d: %s", a.AtS, a.Fragment, a.Diagnosis, a.Action, a.From, a.To, a.Outcome)
	}
	if len(rates) > 0 {
		sum := 0.0
		for _, x := range rates {
			sum += x
		}
		r.MeasuredMeanRate = math.Round(sum / float64(len(rates)))
	}
	r.Parallelism = w.parallelism(ctx)
	r.LoadAvg["end"] = benchmark.LoadAverage()
	return r, nil
}
