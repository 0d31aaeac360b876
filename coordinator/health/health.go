// Package health is the health manager's policy: symptom detectors,
// diagnosers, the resolver choice and a DS2-style scaling resolver. It
// does no I/O and keeps no clock: the coordinator's policy loop
// (coordinator/health_loop.go) feeds it windows of the per-task figures the
// workers report and carries out what it decides through the plan applier.
//
// The flow, for one query and one window of samples:
//
//	Detect  -> Symptoms per fragment (backpressure, large or growing
//	           queue, rate skew, queue skew, idle capacity) and the query's
//	           throughput against its SLO;
//	Diagnose -> at most one Diagnosis per fragment, from the symptom set as
//	           in Dhalion's table (similar rates and queues: under-provisioned;
//	           one instance with a larger queue at a similar rate: slow
//	           instance; one with a larger queue and a higher rate: data
//	           skew), plus over-provisioned and SLO violated;
//	Resolve -> the first resolver of the diagnosis whose diagnosis/action
//	           pair is not blacklisted, with its parameters (for scaling:
//	           the parallelism DS2's true processing rates call for).
//
// Everything is a pure function of its inputs, so each step is tested on
// recorded windows.
package health

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Instance is one task's figures in one report.
type Instance struct {
	Task      string
	Partition int
	Worker    string
	// InRate and OutRate are tuples per second taken and emitted. A
	// source's InRate is the records it draws (generated, ingested, read),
	// before the operators fused into it.
	InRate, OutRate float64
	// Busy is the share of wall time spent processing (useful time), 0..1.
	Busy float64
	// Queue is the number of tuples received and not yet processed.
	Queue float64
	// BlockedMs is the time per second blocked on a full output buffer.
	BlockedMs float64
	// Unacked are the tuples of its output streams its consumers have not
	// acknowledged yet. Consumers pull, so the backlog in front of a slow
	// consumer lives in its upstream's output buffer: until that buffer is
	// full (and the upstream blocks), this is where it shows.
	Unacked float64
	// LagS is a generator source's lag behind its schedule, in seconds,
	// at the sample's end (0: on schedule, or not a generator with a
	// rate, or a worker that does not report it).
	LagS float64
	// WindowS is the length of the sensor window the figures cover, in
	// seconds (0: unknown), and OpenBusyS the busy time of the release in
	// progress at its end: counted in Busy as it runs, while its tuples
	// count in InRate only once it ends (see trueRates).
	WindowS, OpenBusyS float64
}

// Sample is one reading of every instance of a fragment.
type Sample struct {
	At        time.Time
	Instances []Instance
	// Keys are the key slots the fragment's upstream tasks sampled among
	// the tuples they routed to it since their previous report (slot ->
	// sampled tuples; each report names only its most frequent slots),
	// and KeysSampled how many tuples those tasks sampled in all. Only
	// keyed fragments have them (the data-skew resolver, Rebalance).
	Keys        map[int]float64
	KeysSampled float64
}

// Fragment is a window of samples of one fragment, oldest first, with
// what the policy must know of its place in the query.
type Fragment struct {
	Name string
	// Scalable: a keyed operator, which live rescaling can resize.
	Scalable bool
	// Source: a source fragment; SourceRate is its configured rate in
	// records per second over all its partitions (0: unknown), before the
	// operators fused into it.
	Source     bool
	SourceRate float64
	// SourceScalable: a source whose partitions a live rescale can add
	// (a generator; see Decision.Target).
	SourceScalable bool
	// SourceWhyNot says why a generator source cannot be rescaled (what
	// reads it), "" when it can or is no generator.
	SourceWhyNot string
	// Sink: a sink fragment.
	Sink        bool
	Parallelism int
	// Owners is a keyed fragment's slot map: the partition owning each
	// hash slot (nil when unknown, or while a rescale is under way).
	Owners      []int
	Upstreams   []string
	Downstreams []string
	Samples     []Sample
}

// Query is what the policy sees of one query.
type Query struct {
	Name string
	// SLO is the throughput the query must sustain, in input records per
	// second its sources take (see Throughput); 0: none.
	SLO       float64
	Fragments []Fragment
}

// Fragment returns the fragment named name, or nil.
func (q *Query) Fragment(name string) *Fragment {
	for i := range q.Fragments {
		if q.Fragments[i].Name == name {
			return &q.Fragments[i]
		}
	}
	return nil
}

// Config holds the thresholds of the detectors and the resolvers. The
// zero value is not useful; DefaultConfig gives tested values.
type Config struct {
	// MinSamples is how many samples a window needs before any detector
	// speaks; Persist how many of the latest must all show a symptom.
	MinSamples, Persist int
	// BackpressureMs: upstream blocked time (ms per second, averaged over
	// an upstream's instances) above which a fragment is a bottleneck.
	BackpressureMs float64
	// QueueHigh: a mean queue per instance above it is large.
	QueueHigh float64
	// SkewRatio: an instance whose rate (or queue) is above SkewRatio
	// times the median of the others is skewed. The instance with the
	// larger queue has a similar rate (slow instance) up to SimilarRatio
	// times the others' median, a higher one (data skew) above it: under
	// backpressure every instance is held to what the slowest takes, so a
	// slow instance runs at the others' rate while a hot one runs faster
	// by its extra share of the keys.
	SkewRatio, SimilarRatio float64
	// SlowRatio: a slow instance is slow: it takes fewer tuples per
	// second of useful time (its true processing rate over the window)
	// than the others' median by this factor. A partition with a larger
	// queue at the others' rate that is as fast as they are per useful
	// second has more to do, not less speed (more keys, or the backlog
	// of a start or a burst held in front of it): moving it cannot help.
	// 0: no such check.
	SlowRatio float64
	// QueueSkewMin: a queue below it is never a skewed one.
	QueueSkewMin float64
	// IdleBusy: a fragment whose instances all stay below this busy share
	// for the whole window, with no backpressure and small queues, has
	// idle capacity.
	IdleBusy float64
	// TargetUtil is the busy share the scaling resolver sizes instances
	// for when scaling up; DownUtil when scaling down (lower, so that a
	// scale-down never lands next to the scale-up threshold).
	TargetUtil, DownUtil float64
	// SLOMargin: throughput below SLO*(1-SLOMargin) violates the SLO.
	SLOMargin float64
	// MinBusy: below this total useful time (seconds over the window) a
	// fragment's true processing rate is not trusted (rate/busy of an
	// almost idle task is noise).
	MinBusy float64
	// MaxParallelism bounds what the resolver asks for.
	MaxParallelism int
	// SaturatedBusy and HotSamples: a partition whose mean busy share
	// over a window of at least HotSamples samples is at or above
	// SaturatedBusy, taking tuples faster than SimilarRatio times the
	// others' median, is hot: it receives more keys than the others and
	// has no time left for them (SymHotPartition). A window that long
	// keeps a partition's busy moments (a second at 100% is common on a
	// loaded machine) from passing for saturation.
	SaturatedBusy float64
	HotSamples    int
	// RebalanceTolerance: the data-skew resolver moves slots until the
	// hot partition's estimated load is within this factor of the mean
	// (at least 1).
	RebalanceTolerance float64
}

// DefaultConfig returns the thresholds the loop uses unless configured.
func DefaultConfig() Config {
	return Config{MinSamples: 4, Persist: 3, BackpressureMs: 100, QueueHigh: 1000, SkewRatio: 1.5, SimilarRatio: 1.05, SlowRatio: 1.1,
		QueueSkewMin: 200, IdleBusy: 0.3, TargetUtil: 0.97, DownUtil: 0.6, SLOMargin: 0.05, MinBusy: 0.2, MaxParallelism: 256,
		RebalanceTolerance: 1.1, SaturatedBusy: 0.97, HotSamples: 8}
}

// Symptom names.
const (
	SymBackpressure = "backpressure"
	SymLargeQueue   = "large_queue"
	SymGrowingQueue = "growing_queue"
	SymRateSkew     = "rate_skew"
	SymQueueSkew    = "queue_skew"
	SymIdle         = "idle_capacity"
	// SymHotPartition: one partition saturated (busy at SaturatedBusy or
	// more over the window) while taking more tuples per second than the
	// others (above SimilarRatio times their median): data skew seen
	// from the rates alone, before any backlog builds up.
	SymHotPartition = "hot_partition"
	SymBelowSLO     = "throughput_below_slo"
	// SymAboveSLO: a generator source sends more than the throughput SLO
	// needs, by at least one partition (see SourceDown).
	SymAboveSLO = "throughput_above_slo"
)

// Symptoms are what the detectors found on one fragment.
type Symptoms struct {
	Fragment string
	Set      map[string]bool
	// Outlier is the instance (partition) with the skewed queue or rate,
	// -1 when none; Faster the one with the skewed rate (rate_skew), -1
	// when none (another partition than Outlier when the queue skew's
	// differs).
	Outlier, Faster int
	// Why says in words what was seen.
	Why []string
}

func (s *Symptoms) add(name, why string) {
	if s.Set == nil {
		s.Set = map[string]bool{}
	}
	s.Set[name] = true
	s.Why = append(s.Why, why)
}

// Has reports whether the symptom was detected.
func (s Symptoms) Has(name string) bool { return s.Set[name] }

// Names lists the detected symptoms, sorted.
func (s Symptoms) Names() []string {
	out := make([]string, 0, len(s.Set))
	for n := range s.Set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Diagnosis names.
const (
	DiagUnderProvisioned = "under_provisioned"
	DiagSlowInstance     = "slow_instance"
	DiagDataSkew         = "data_skew"
	DiagOverProvisioned  = "over_provisioned"
	DiagSLOViolated      = "slo_violated"
)

// Action names. The loop carries out each one it allows (see Allowed);
// ActScaleSources gives a generator source the partitions a missed
// throughput SLO needs (Decision.Target), through the live rescale of
// sources; for sources that cannot be rescaled (ingest, kafka, a
// generator without a rate) it says what they would need, in an alert.
const (
	ActScaleUp   = "scale_up"
	ActScaleDown = "scale_down"
	ActMove      = "move"
	// ActRebalanceSlots gives hash slots of a hot partition to less
	// loaded ones (Rebalance), through the live rescale.
	ActRebalanceSlots = "rebalance_slots"
	ActScaleSources   = "scale_sources"
	// ActOffload hands tasks to a contract partner through the
	// bounded-price mechanism when the org lacks capacity (the federation
	// load manager, through the loop's Offloader).
	ActOffload = "offload"
)

// Resolvers lists, per diagnosis, the actions to try in order; the choice
// skips blacklisted pairs and actions the loop cannot carry out.
var Resolvers = map[string][]string{
	DiagUnderProvisioned: {ActScaleUp, ActOffload},
	DiagSlowInstance:     {ActMove, ActScaleUp},
	DiagDataSkew:         {ActRebalanceSlots, ActScaleUp},
	// A keyed operator scales down, a generator source sending more than
	// the SLO needs gives up partitions (scale_sources, down).
	DiagOverProvisioned: {ActScaleDown, ActScaleSources},
	DiagSLOViolated:     {ActScaleUp, ActScaleSources, ActOffload},
}

// mean returns the mean of f over xs (0 for none).
func mean[T any](xs []T, f func(T) float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += f(x)
	}
	return s / float64(len(xs))
}

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

// perPartition averages f over the window for each partition.
func perPartition(f *Fragment, samples []Sample, get func(Instance) float64) map[int]float64 {
	sum, n := map[int]float64{}, map[int]int{}
	for _, s := range samples {
		for _, in := range s.Instances {
			sum[in.Partition] += get(in)
			n[in.Partition]++
		}
	}
	for p := range sum {
		sum[p] /= float64(n[p])
	}
	return sum
}

// outlier returns the partition whose value is above ratio times the
// median of the others (and above floor), or -1.
func outlier(vals map[int]float64, ratio, floor float64) int {
	if len(vals) < 2 {
		return -1
	}
	best, bestV := -1, math.Inf(-1)
	for p, v := range vals {
		if v > bestV || v == bestV && p < best {
			best, bestV = p, v
		}
	}
	var others []float64
	for p, v := range vals {
		if p != best {
			others = append(others, v)
		}
	}
	if m := median(others); bestV > floor && bestV > ratio*m {
		return best
	}
	return -1
}

// latest returns the last n samples of f (all when fewer).
func latest(f *Fragment, n int) []Sample {
	if n <= 0 || n > len(f.Samples) {
		n = len(f.Samples)
	}
	return f.Samples[len(f.Samples)-n:]
}

// blockedMs is the mean blocked time per instance of f in one sample.
func blockedMs(s Sample) float64 {
	return mean(s.Instances, func(i Instance) float64 { return i.BlockedMs })
}

// unackedMean is the mean of the tuples held for consumers per instance
// of one sample.
func unackedMean(s Sample) float64 {
	return mean(s.Instances, func(i Instance) float64 { return i.Unacked })
}

// queueMean is the mean queue per instance of one sample.
func queueMean(s Sample) float64 {
	return mean(s.Instances, func(i Instance) float64 { return i.Queue })
}

// sampleAt returns f's sample nearest to at (by index from the end:
// samples of the fragments of one query are taken together).
func sampleFromEnd(f *Fragment, k int) (Sample, bool) {
	if k >= len(f.Samples) {
		return Sample{}, false
	}
	return f.Samples[len(f.Samples)-1-k], true
}

// blocking reports whether f blocked on its outputs in each of its
// latest samples.
func blocking(f *Fragment, c Config) bool {
	if f == nil || len(f.Downstreams) == 0 || len(f.Samples) < c.Persist {
		return false
	}
	return all(latest(f, c.Persist), func(s Sample) bool { return blockedMs(s) > c.BackpressureMs })
}

// bottleneckOf returns, for an upstream fragment that blocks, the
// downstream that holds it back: the busiest one over the window.
func bottleneckOf(q *Query, up *Fragment) string {
	best, bestBusy := "", -1.0
	for _, d := range up.Downstreams {
		df := q.Fragment(d)
		if df == nil {
			continue
		}
		b := 0.0
		for _, s := range df.Samples {
			b += mean(s.Instances, func(i Instance) float64 { return i.Busy })
		}
		if b > bestBusy {
			best, bestBusy = d, b
		}
	}
	return best
}

// Throughput is the query's throughput in one sample, counted back k
// samples from the end: the input records per second its sources take
// (drawn from a generator, ingested, read from Kafka), summed over the
// sources, each partition counted once. ok is false without sources or
// samples.
//
// It is measured where the sources' records enter the query, as DS2 and
// Dhalion measure a topology's throughput, not as results per second at
// the sinks: a windowed aggregate emits nothing until its window closes
// and a join or a filter emits what the data calls for (the demo's alerts),
// so a sink's rate says how much the query found, not how much it
// processed. A source held back by a bottleneck takes fewer records, so a
// query that cannot keep up still shows a lower throughput.
//
// A source held back by its consumers (see heldBack) is counted by what
// its consumers take of it instead (takenBy): its own draws come in
// bursts then. A consumer acknowledges a batch of its input only once it
// has processed all of it, so a blocked source gets room, and draws, a
// buffer's worth at a time: on the word count of bench scaling, a
// splitter taking 100 sentences/s freed its source's 2000-tuple buffer
// every 20 s, and the source read 0/s in the seconds between, before and
// after a scale-up that took the splitter from 100 to 1000 sentences/s,
// which was judged not improved.
func Throughput(q *Query, k int) (float64, bool) {
	total, any := 0.0, false
	for i := range q.Fragments {
		f := &q.Fragments[i]
		if !f.Source {
			continue
		}
		s, ok := sampleFromEnd(f, k)
		if !ok {
			return 0, false
		}
		any = true
		total += sourceRate(q, f, s, k)
	}
	return total, any
}

// sourceRate is what source f takes in its sample s, k samples back from
// the end: its draws, or, held back, what its consumers take (Throughput).
func sourceRate(q *Query, f *Fragment, s Sample, k int) float64 {
	if heldBack(s) {
		if taken, ok := takenBy(q, f, k); ok {
			return taken
		}
	}
	return sum(s.Instances, func(i Instance) float64 { return i.InRate })
}

// heldBackMs is the blocked time per second above which a source counts
// as held back by its consumers (the default BackpressureMs).
const heldBackMs = 100

// heldBack reports whether a source's sample shows it held back by its
// consumers: blocked on its outputs, or holding for them more than it
// drew in the second. The second test catches a source whose worker
// counts the blocked time of a wait only when the wait ends (builds
// before the sensors counted waits going on): a window blocked
// throughout read no blocked time and no draws.
func heldBack(s Sample) bool {
	if blockedMs(s) > heldBackMs {
		return true
	}
	unacked := sum(s.Instances, func(i Instance) float64 { return i.Unacked })
	return unacked > 0 && unacked > sum(s.Instances, func(i Instance) float64 { return i.InRate })
}

// takenBy is the rate, in records of source f, at which its consumers
// process its output in sample k (counted back from the end): the input
// rate of the slowest downstream fragment that reads f alone (a source
// held back takes at the pace of its slowest consumer), divided by f's
// selectivity over its window (the operators fused into it). ok is false
// when no downstream reads f alone (a join of two sources: its input
// rate is not f's alone).
func takenBy(q *Query, f *Fragment, k int) (float64, bool) {
	rate, found := 0.0, false
	for _, d := range f.Downstreams {
		df := q.Fragment(d)
		if df == nil || len(df.Upstreams) != 1 || df.Upstreams[0] != f.Name {
			continue
		}
		s, ok := sampleFromEnd(df, k)
		if !ok {
			continue
		}
		r := sum(s.Instances, func(i Instance) float64 { return i.InRate })
		if !found || r < rate {
			rate, found = r, true
		}
	}
	if !found {
		return 0, false
	}
	in, out := 0.0, 0.0
	for _, s := range f.Samples {
		in += sum(s.Instances, func(i Instance) float64 { return i.InRate })
		out += sum(s.Instances, func(i Instance) float64 { return i.OutRate })
	}
	if in > 0 && out > 0 {
		rate *= in / out
	}
	return rate, true
}

// Detect runs every detector over the query's window. It returns the
// symptoms of each fragment that has any (sorted by fragment) and whether
// the query's throughput is below its SLO.
func Detect(q *Query, c Config) (out []Symptoms, belowSLO bool, why string) {
	enough := func(f *Fragment) bool { return len(f.Samples) >= c.MinSamples }
	byFrag := map[string]*Symptoms{}
	get := func(name string) *Symptoms {
		s := byFrag[name]
		if s == nil {
			s = &Symptoms{Fragment: name, Outlier: -1, Faster: -1}
			byFrag[name] = s
		}
		return s
	}
	for i := range q.Fragments {
		f := &q.Fragments[i]
		if !enough(f) {
			continue
		}
		recent := latest(f, c.Persist)
		// The downstream that holds f back, unless it is itself held back
		// by its own downstream (blocked on its output in each latest
		// sample): then it has time to spare and is no bottleneck, and
		// the symptom goes to the fragment that holds it back, seen when
		// its turn comes. Without this, of two operators in a row both
		// too small, the upstream one was diagnosed under-provisioned too,
		// could be scaled first, and its scale-up, which cannot raise the
		// throughput the downstream one caps, was judged a failure.
		held := ""
		if len(f.Downstreams) > 0 {
			if d := bottleneckOf(q, f); d != "" && !blocking(q.Fragment(d), c) {
				held = d
			}
		}
		// Backpressure: the fragment blocks on its outputs in each of the
		// latest samples; the symptom belongs to the downstream that holds
		// it back.
		if len(f.Downstreams) > 0 && all(recent, func(s Sample) bool { return blockedMs(s) > c.BackpressureMs }) {
			if d := held; d != "" {
				get(d).add(SymBackpressure, fmt.Sprintf("upstream %s blocked %.0f ms/s on its output", f.Name, blockedMs(recent[len(recent)-1])))
			}
		}
		// The backlog a fragment holds for its consumers, too, is a queue
		// in front of the downstream that holds it back.
		if len(f.Downstreams) > 0 {
			if d := held; d != "" {
				if all(recent, func(s Sample) bool { return unackedMean(s) > c.QueueHigh }) && !draining(recent, unackedMean) {
					get(d).add(SymLargeQueue, fmt.Sprintf("upstream %s holds %.0f tuples per instance not yet taken", f.Name, unackedMean(recent[len(recent)-1])))
				}
				if len(recent) >= 2 && growing(recent, unackedMean) && unackedMean(recent[len(recent)-1])-unackedMean(recent[0]) > c.QueueSkewMin {
					get(d).add(SymGrowingQueue, fmt.Sprintf("tuples upstream %s holds not yet taken grew from %.0f to %.0f per instance", f.Name,
						unackedMean(recent[0]), unackedMean(recent[len(recent)-1])))
				}
			}
		}
		if f.Source {
			continue
		}
		// Large queue: above QueueHigh per instance in each latest sample.
		if all(recent, func(s Sample) bool { return queueMean(s) > c.QueueHigh }) && !draining(recent, queueMean) {
			get(f.Name).add(SymLargeQueue, fmt.Sprintf("queue %.0f tuples per instance", queueMean(recent[len(recent)-1])))
		}
		// Growing queue: strictly growing over the latest samples, by
		// more than QueueSkewMin in all.
		if len(recent) >= 2 && growing(recent, queueMean) && queueMean(recent[len(recent)-1])-queueMean(recent[0]) > c.QueueSkewMin {
			get(f.Name).add(SymGrowingQueue, fmt.Sprintf("queue grew from %.0f to %.0f per instance", queueMean(recent[0]), queueMean(recent[len(recent)-1])))
		}
		// Skews: one partition's window mean above the others'.
		win := latest(f, 0)
		// A larger queue that is draining (a backlog left by a rescale or
		// a burst, worked off by an instance that keeps up) is no slow or
		// hot instance: theirs hold or grow.
		if p := outlier(perPartition(f, win, func(i Instance) float64 { return i.Queue }), c.SkewRatio, c.QueueSkewMin); p >= 0 &&
			!draining(recent, func(s Sample) float64 { return partitionQueue(s, p) }) {
			s := get(f.Name)
			s.add(SymQueueSkew, fmt.Sprintf("partition %d holds a larger queue than the others", p))
			s.Outlier = p
		}
		if p := outlier(perPartition(f, win, func(i Instance) float64 { return i.InRate }), c.SkewRatio, 0); p >= 0 {
			s := get(f.Name)
			s.add(SymRateSkew, fmt.Sprintf("partition %d takes more tuples per second than the others", p))
			s.Faster = p
			if s.Outlier < 0 {
				s.Outlier = p
			}
		}
		if p, why := hotPartition(f, win, c); p >= 0 {
			s := get(f.Name)
			s.add(SymHotPartition, why)
			if s.Outlier < 0 || !s.Has(SymQueueSkew) {
				s.Outlier = p
			}
		}
		// Idle capacity: every instance under IdleBusy in every sample of
		// the window, no blocked upstream, small queues; only where there
		// is an instance to spare.
		if f.Parallelism > 1 && len(win) >= c.MinSamples && all(win, func(s Sample) bool {
			return len(s.Instances) > 0 && queueMean(s) <= c.QueueHigh/10 &&
				all(s.Instances, func(i Instance) bool { return i.Busy < c.IdleBusy })
		}) {
			get(f.Name).add(SymIdle, fmt.Sprintf("every instance under %.0f%% busy for the whole window", c.IdleBusy*100))
		}
	}
	// A backlog anywhere cancels idle capacity everywhere: never scale
	// down in the middle of a backlog.
	backlog := false
	for _, s := range byFrag {
		if s.Has(SymBackpressure) || s.Has(SymLargeQueue) || s.Has(SymGrowingQueue) {
			backlog = true
		}
	}
	if q.SLO > 0 {
		below := c.Persist > 0
		last := 0.0
		for k := 0; k < max(c.Persist, 1); k++ {
			tp, ok := Throughput(q, k)
			if k == 0 {
				last = tp
			}
			if !ok || tp >= q.SLO*(1-c.SLOMargin) {
				below = false
				break
			}
		}
		if below {
			belowSLO, why = true, fmt.Sprintf("throughput %.0f/s below the SLO %.0f/s", last, q.SLO)
		}
	}
	// A source sending more than the SLO needs: only when the whole
	// window met the SLO with room to spare and, below, nothing is
	// backlogged (the same guards as idle capacity).
	if q.SLO > 0 && !backlog && !belowSLO {
		for i := range q.Fragments {
			f := &q.Fragments[i]
			if !f.Source || !enough(f) {
				continue
			}
			if from, to, why, ok := SourceDown(q, f, c); ok {
				get(f.Name).add(SymAboveSLO, fmt.Sprintf("%s: %d partitions would do where %d run (%s)", f.Name, to, from, why))
			}
		}
	}
	// Nor while the SLO is missed.
	if backlog || belowSLO {
		for _, s := range byFrag {
			if s.Has(SymIdle) {
				delete(s.Set, SymIdle)
			}
		}
	}
	for _, s := range byFrag {
		if len(s.Set) > 0 {
			out = append(out, *s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Fragment < out[j].Fragment })
	return out, belowSLO, why
}

// hotPartition returns the partition of f that is saturated and faster
// than the others over the window (see Config.SaturatedBusy), its queue
// not shrinking, or -1. A slow instance is never one: it runs at the
// others' pace or slower.
// Under backpressure every partition is held to what the slowest takes,
// so only the hot one's extra share of the keys shows, by a few percent:
// for 10% more keys than each other partition, at 95% load, the hot
// partition is 1.7% over its capacity and takes about 7% more tuples per
// second than the others, at 99% busy against their 93%.
func hotPartition(f *Fragment, win []Sample, c Config) (int, string) {
	if !f.Scalable || c.SaturatedBusy <= 0 || len(win) < max(c.HotSamples, c.MinSamples) {
		return -1, ""
	}
	rates := perPartition(f, win, func(i Instance) float64 { return i.InRate })
	p := outlier(rates, c.SimilarRatio, 0)
	if p < 0 {
		return -1, ""
	}
	busy := perPartition(f, win, func(i Instance) float64 { return i.Busy })
	if busy[p] < c.SaturatedBusy {
		return -1, ""
	}
	// A partition working off a backlog (left by a burst or a load that
	// just dropped) runs saturated and faster than the others until it
	// has caught up: its queue shrinks. A hot one's holds or grows.
	half := len(win) / 2
	q := func(ss []Sample) float64 { return mean(ss, func(s Sample) float64 { return partitionQueue(s, p) }) }
	if q(win[half:]) < q(win[:half]) {
		return -1, ""
	}
	var others []float64
	for q, v := range rates {
		if q != p {
			others = append(others, v)
		}
	}
	return p, fmt.Sprintf("partition %d takes %.0f tuples/s at %.0f%% busy, %.2f times the others' median (%.0f/s): saturated by more keys than the others",
		p, rates[p], busy[p]*100, rates[p]/median(others), median(others))
}

func all[T any](xs []T, f func(T) bool) bool {
	for _, x := range xs {
		if !f(x) {
			return false
		}
	}
	return true
}

// draining reports whether v fell over the samples: a large backlog that
// shrinks is being worked off, which is no symptom.
func draining(ss []Sample, v func(Sample) float64) bool {
	return len(ss) >= 2 && v(ss[len(ss)-1]) < v(ss[0])
}

// partitionQueue is the queue of partition p in s (0 if absent).
func partitionQueue(s Sample, p int) float64 {
	for _, in := range s.Instances {
		if in.Partition == p {
			return in.Queue
		}
	}
	return 0
}

// growing reports whether v grows from each sample to the next.
func growing(ss []Sample, v func(Sample) float64) bool {
	for i := 1; i < len(ss); i++ {
		if v(ss[i]) <= v(ss[i-1]) {
			return false
		}
	}
	return true
}

// Diagnosis is one explanation of a fragment's symptoms.
type Diagnosis struct {
	Name     string
	Fragment string
	// Partition is the slow or hot instance (slow instance, data skew),
	// -1 otherwise.
	Partition int
	Symptoms  []string
	Why       string
}

// Diagnose turns symptoms into at most one diagnosis per fragment
// (Dhalion's table), plus an SLO violation when the throughput is below
// the SLO and no fragment is already diagnosed as a bottleneck. Sorted by
// fragment.
func Diagnose(q *Query, syms []Symptoms, belowSLO bool, sloWhy string, c Config) []Diagnosis {
	var out []Diagnosis
	bottleneck := false
	for _, s := range syms {
		d := Diagnosis{Fragment: s.Fragment, Partition: -1, Symptoms: s.Names(), Why: strings.Join(s.Why, "; ")}
		pressure := s.Has(SymBackpressure) || s.Has(SymLargeQueue) || s.Has(SymGrowingQueue)
		switch {
		case pressure && s.Has(SymQueueSkew) && s.Outlier >= 0 && !similarRate(q.Fragment(s.Fragment), s.Outlier, c):
			d.Name, d.Partition = DiagDataSkew, s.Outlier
		case pressure && s.Has(SymQueueSkew) && s.Outlier >= 0 && slower(q.Fragment(s.Fragment), s.Outlier, c):
			d.Name, d.Partition = DiagSlowInstance, s.Outlier
		case pressure && s.Has(SymRateSkew) && s.Faster >= 0:
			// Consumers pull: the backlog in front of a hot partition
			// may sit in its upstreams' output buffers (counted per
			// upstream, not per partition) rather than in its own queue.
			// A backlog with one partition far faster than the others
			// (past SkewRatio, where a slow one runs at their pace or
			// slower) is that partition's extra keys: that partition's,
			// not the one with the larger queue when they differ (that
			// one took no more than the others).
			d.Name, d.Partition = DiagDataSkew, s.Faster
		case pressure && heldBySlowest(q.Fragment(s.Fragment), c) >= 0:
			// Under backpressure every partition is held to the pace of
			// the slowest, and once every buffer in front of them is full
			// the slow one's queue is no longer larger either (the queue
			// skew is gone a few seconds after a slow worker starts): what
			// is left is one partition saturated at the others' rate that
			// takes fewer tuples per useful second than they do.
			d.Name, d.Partition = DiagSlowInstance, heldBySlowest(q.Fragment(s.Fragment), c)
		case pressure:
			d.Name = DiagUnderProvisioned
		case s.Has(SymHotPartition) && s.Outlier >= 0:
			// No backlog yet: a hot partition a little over its capacity
			// builds one too slowly for the queue detectors (10% skew at
			// 95% load: about 8 tuples/s), but its rate and busy share
			// tell already. With a backlog the cases above decide: under
			// backpressure a few percent of rate is within the noise of
			// partitions all held to one pace.
			d.Name, d.Partition = DiagDataSkew, s.Outlier
		case s.Has(SymIdle) && q.Fragment(s.Fragment) != nil && q.Fragment(s.Fragment).Scalable:
			d.Name = DiagOverProvisioned
		case s.Has(SymAboveSLO):
			// A generator source sending more than the SLO needs.
			d.Name = DiagOverProvisioned
		default:
			continue
		}
		if pressure {
			bottleneck = true
		}
		out = append(out, d)
	}
	if belowSLO && !bottleneck {
		// The busiest scalable fragment is what limits the throughput.
		if f := busiest(q); f != "" {
			out = append(out, Diagnosis{Name: DiagSLOViolated, Fragment: f, Partition: -1, Symptoms: []string{SymBelowSLO}, Why: sloWhy})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Fragment < out[j].Fragment })
	return out
}

// similarRate reports whether partition p's input rate is within
// SimilarRatio of the median of the other partitions.
func similarRate(f *Fragment, p int, c Config) bool {
	if f == nil {
		return false
	}
	rates := perPartition(f, f.Samples, func(i Instance) float64 { return i.InRate })
	var others []float64
	for q, v := range rates {
		if q != p {
			others = append(others, v)
		}
	}
	m := median(others)
	return m > 0 && rates[p] <= c.SimilarRatio*m
}

// slower reports whether partition p of f takes fewer tuples per second
// of useful time than the median of the others by SlowRatio (see
// Config.SlowRatio), over the window (trueRates). Where that cannot be
// told (no SlowRatio, or too little useful time on either side for a
// true rate) it says yes: Dhalion's table alone decides. But a partition
// that completed no tuple in the window while others did is not slower
// for it: it is in the middle of a release longer than the window, or
// waiting for an input, and the next windows tell its rate (with the
// bench's compressed 33 ms windows a hot counter partition working
// through a release of 100 ms and more took nothing for a whole window
// and was moved as a slow instance).
func slower(f *Fragment, p int, c Config) bool {
	if f == nil || c.SlowRatio <= 0 {
		return true
	}
	rates, took := trueRates(f, c)
	var others []float64
	for q, r := range rates {
		if q != p {
			others = append(others, r)
		}
	}
	r, ok := rates[p]
	if !ok {
		return took[p] || len(others) == 0
	}
	if len(others) == 0 {
		return true
	}
	return r*c.SlowRatio < median(others)
}

// trueRates returns the true processing rate (tuples per second of
// useful time) of each partition of f over its window, where it can be
// told: the partition took tuples, and its useful time reaches its share
// of MinBusy. took says which partitions took any tuple.
//
// The rate counts completed releases only. A task's busy time counts a
// release as it runs and its tuples once it ends, so over a window the
// tuples of a release going on at the window's end are missing while its
// busy time is in, and a release going on at its start brings all its
// tuples and only part of its busy time. With the sensors' OpenBusyS
// (the busy time of the release going on at a sample's end) and window
// lengths, the useful time is the busy time after the first sample, plus
// the release open at its end, less the one open at the window's end:
// exactly the busy time of the releases whose tuples the window counts.
// Without them (older workers, recorded windows) it is the window's
// busy share.
func trueRates(f *Fragment, c Config) (rates map[int]float64, took map[int]bool) {
	byP := map[int][]Instance{}
	for _, s := range f.Samples {
		for _, in := range s.Instances {
			byP[in.Partition] = append(byP[in.Partition], in)
		}
	}
	floor := c.MinBusy / float64(max(len(f.Samples), 1))
	rates, took = map[int]float64{}, map[int]bool{}
	for p, ins := range byP {
		tuples, useful, share := completedWork(ins)
		took[p] = tuples > 0
		if tuples > 0 && useful > 0 && share >= floor {
			rates[p] = tuples / useful
		}
	}
	return rates, took
}

// completedWork sums one partition's samples (oldest first): the tuples
// its completed releases took and their useful time, both per sample
// (as sums of InRate and Busy over the samples are: where the samples
// say their windows, the seconds are divided by the mean window), and
// its busy share over the window.
func completedWork(ins []Instance) (tuples, useful, share float64) {
	timed := len(ins) >= 2
	for _, in := range ins {
		timed = timed && in.WindowS > 0
	}
	if !timed {
		for _, in := range ins {
			tuples += in.InRate
			useful += in.Busy
		}
		return tuples, useful, useful / float64(max(len(ins), 1))
	}
	span, busy := 0.0, 0.0
	for _, in := range ins[1:] {
		tuples += in.InRate * in.WindowS
		busy += in.Busy * in.WindowS
		span += in.WindowS
	}
	useful = max(0, busy+ins[0].OpenBusyS-ins[len(ins)-1].OpenBusyS)
	w := span / float64(len(ins)-1)
	return tuples / w, useful / w, busy / span
}

// heldBySlowest returns the partition of f that holds the others back, or
// -1: saturated (mean busy at SaturatedBusy or more over the window), at
// a rate similar to the others' (within SimilarRatio of their median:
// under backpressure they are held to its pace), and slower per useful
// second than their median by SlowRatio. Partitions all saturated at one
// true rate (an operator too small) have none.
func heldBySlowest(f *Fragment, c Config) int {
	if f == nil || c.SlowRatio <= 0 || c.SaturatedBusy <= 0 || len(f.Samples) < c.MinSamples {
		return -1
	}
	busy := perPartition(f, f.Samples, func(i Instance) float64 { return i.Busy })
	if len(busy) < 2 {
		return -1
	}
	// True rates of completed releases (trueRates): a partition in the
	// middle of a long release reads busy and no tuples, which is no
	// rate of 0.
	rates, _ := trueRates(f, c)
	best, bestTrue := -1, math.Inf(1)
	for p, b := range busy {
		if r, ok := rates[p]; ok && b >= c.SaturatedBusy {
			if r < bestTrue || r == bestTrue && p < best {
				best, bestTrue = p, r
			}
		}
	}
	if best < 0 || !similarRate(f, best, c) {
		return -1
	}
	// Slower than the others even at the others' pace: the same
	// comparison as for a slow instance with a larger queue, and the
	// others must show a true rate (enough useful time).
	n := 0
	for p := range rates {
		if p != best {
			n++
		}
	}
	if n == 0 || !slower(f, best, c) {
		return -1
	}
	return best
}

// busiest returns the scalable fragment with the highest mean busy share,
// "" when none.
func busiest(q *Query) string {
	best, bestB := "", -1.0
	for i := range q.Fragments {
		f := &q.Fragments[i]
		if !f.Scalable || len(f.Samples) == 0 {
			continue
		}
		b := mean(f.Samples, func(s Sample) float64 { return mean(s.Instances, func(i Instance) float64 { return i.Busy }) })
		if b > bestB {
			best, bestB = f.Name, b
		}
	}
	return best
}
