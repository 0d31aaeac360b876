package health

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// TrueRate is DS2's true processing rate of one instance of f: the tuples
// it takes per second of useful time (input rate divided by busy share),
// from the window's totals. ok is false when the window holds too little
// useful time for the rate to mean anything (c.MinBusy): an almost idle
// task's rate/busy is noise and would overestimate what it can do.
//
// Only completed releases count (see trueRates): with sensor windows
// shorter than a release, the releases going on at the window's ends
// would otherwise count their busy time without their tuples or the
// other way round.
func TrueRate(f *Fragment, c Config) (perInstance float64, ok bool) {
	byP := map[int][]Instance{}
	for _, s := range f.Samples {
		for _, i := range s.Instances {
			byP[i.Partition] = append(byP[i.Partition], i)
		}
	}
	in, busy := 0.0, 0.0
	for _, ins := range byP {
		t, u, _ := completedWork(ins)
		in += t
		busy += u
	}
	if busy < c.MinBusy || in <= 0 {
		return 0, false
	}
	return in / busy, true
}

// selectivity is f's output per input tuple over the window (1 when it
// took nothing).
func selectivity(f *Fragment) float64 {
	in, out := 0.0, 0.0
	for _, s := range f.Samples {
		for _, i := range s.Instances {
			in += i.InRate
			out += i.OutRate
		}
	}
	if in <= 0 {
		return 1
	}
	return out / in
}

// sourceDemand is what a source would emit unblocked: its configured rate
// when known, else its output rate scaled up by the share of time it was
// blocked, at most doubled. A blocked source may be catching up with a
// backlog, which says nothing of the rate it must sustain: without a
// known rate, scaling goes at most twice as far per step as what flows
// now, and takes a few steps instead of one.
func sourceDemand(f *Fragment) float64 {
	if f.SourceRate > 0 {
		// Records drawn per second, through the operators fused into the
		// source.
		return f.SourceRate * selectivity(f)
	}
	if len(f.Samples) == 0 {
		return 0
	}
	out, blocked := 0.0, 0.0
	for _, s := range f.Samples {
		for _, i := range s.Instances {
			out += i.OutRate
		}
		blocked += mean(s.Instances, func(i Instance) float64 { return i.BlockedMs })
	}
	n := float64(len(f.Samples))
	free := max(0.5, 1-blocked/n/1000)
	return out / n / free
}

// Demand propagates the sources' demand through the query, DS2's way: the
// target input rate of each fragment is the sum of its upstreams' target
// output rates, a fragment's target output its target input times its
// observed selectivity. Fragments are visited once their upstreams are.
func Demand(q *Query) map[string]float64 {
	in, out := map[string]float64{}, map[string]float64{}
	done := map[string]bool{}
	for progress := true; progress; {
		progress = false
		for i := range q.Fragments {
			f := &q.Fragments[i]
			if done[f.Name] {
				continue
			}
			ready := true
			for _, u := range f.Upstreams {
				if q.Fragment(u) != nil && !done[u] {
					ready = false
				}
			}
			if !ready {
				continue
			}
			if f.Source || len(f.Upstreams) == 0 {
				out[f.Name] = sourceDemand(f)
			} else {
				for _, u := range f.Upstreams {
					in[f.Name] += out[u]
				}
				out[f.Name] = in[f.Name] * selectivity(f)
			}
			done[f.Name], progress = true, true
		}
	}
	return in
}

// Needed is the parallelism that serves demand at util busy share with
// instances of the given true rate, within 1..maxP.
func Needed(demand, trueRate, util float64, maxP int) int {
	if trueRate <= 0 || util <= 0 {
		return 1
	}
	n := int(math.Ceil(demand/(trueRate*util) - 1e-9))
	return min(max(n, 1), maxP)
}

// Decision is the resolver choice for one query: one action (nil when
// none), and the diagnoses for which no action could be taken, which the
// loop reports as alerts.
type Decision struct {
	Diagnosis Diagnosis
	Action    string
	// From and To are the fragment's parallelism before and after a
	// scaling action.
	From, To int
	// Why explains the parameters (the DS2 figures for scaling).
	Why string
	// Target is the fragment the action changes when it is not the
	// diagnosed one ("" : Diagnosis.Fragment): the source scale_sources
	// gives more partitions.
	Target string
	// Slots are the slot moves of a rebalance (ActRebalanceSlots), by
	// slot.
	Slots []SlotMove
	// Skipped says which resolvers were passed over and why.
	Skipped []string
}

// Allowed reports whether a diagnosis/action pair may be used on a
// fragment of the query, and why not (blacklisted, or no way to carry it
// out here).
type Allowed func(fragment, diagnosis, action string) (ok bool, why string)

// priority orders diagnoses: relieve a bottleneck before saving capacity.
var priority = map[string]int{DiagSlowInstance: 0, DiagDataSkew: 1, DiagUnderProvisioned: 2, DiagSLOViolated: 3, DiagOverProvisioned: 4}

// Choose picks the action for a query: the diagnoses in priority order,
// for each its resolvers in order, skipping pairs allowed refuses and
// scaling that would change nothing. The first workable one wins (one
// intrusive action at a time); the diagnoses left without any are
// returned as alerts.
func Choose(q *Query, ds []Diagnosis, c Config, allowed Allowed) (chosen *Decision, alerts []Decision) {
	sorted := append([]Diagnosis(nil), ds...)
	sort.SliceStable(sorted, func(i, j int) bool { return priority[sorted[i].Name] < priority[sorted[j].Name] })
	demand := Demand(q)
	for _, d := range sorted {
		dec := Decision{Diagnosis: d}
		if hotKeyOnly(q, d, demand, c, &dec) {
			alerts = append(alerts, dec)
			continue
		}
		for _, act := range Resolvers[d.Name] {
			if ok, why := allowed(d.Fragment, d.Name, act); !ok {
				// Say what the action would have done: an alert then
				// names what is missing (the sources' rate an SLO needs).
				if probe := dec; act == ActScaleSources {
					if fill(q, &probe, act, demand, c); probe.Why != "" {
						why += " (needed: " + probe.Why + ")"
					}
				}
				dec.Skipped = append(dec.Skipped, act+": "+why)
				continue
			}
			if ok, why := fill(q, &dec, act, demand, c); !ok {
				dec.Skipped = append(dec.Skipped, act+": "+why)
				continue
			}
			dec.Action = act
			break
		}
		if dec.Action == "" {
			alerts = append(alerts, dec)
			continue
		}
		if chosen == nil {
			c := dec
			chosen = &c
		}
	}
	return chosen, alerts
}

// hotKeyOnly reports whether d, a data skew or a slow instance, is only
// a key slot hotter than one instance processes (TooHotSlot): then no
// resolver can help (a partition slow only because its key is hot is not
// a slow instance), and dec says why for the alert.
func hotKeyOnly(q *Query, d Diagnosis, demand map[string]float64, c Config, dec *Decision) bool {
	if d.Name != DiagDataSkew && d.Name != DiagSlowInstance || d.Partition < 0 {
		return false
	}
	h, hot := TooHotSlot(q.Fragment(d.Fragment), d.Partition, demand[d.Fragment], c)
	if !hot {
		return false
	}
	for _, act := range Resolvers[d.Name] {
		dec.Skipped = append(dec.Skipped, act+": "+h.Why())
	}
	return true
}

// fill sets the parameters of act for dec, or says why it does not apply.
func fill(q *Query, dec *Decision, act string, demand map[string]float64, c Config) (bool, string) {
	f := q.Fragment(dec.Diagnosis.Fragment)
	if f == nil {
		return false, "unknown fragment"
	}
	switch act {
	case ActScaleUp, ActScaleDown:
		if !f.Scalable {
			return false, "not a keyed operator: it cannot be rescaled"
		}
		rate, ok := TrueRate(f, c)
		if !ok {
			return false, "too little useful time in the window to know its true processing rate"
		}
		want := demand[f.Name]
		if act == ActScaleUp {
			n := Needed(want, rate, c.TargetUtil, c.MaxParallelism)
			if n <= f.Parallelism {
				// DS2 trusts its model: more instances than the demand
				// needs would be overshoot (a backlog left by an earlier
				// shortage drains on its own).
				if f.Parallelism >= c.MaxParallelism {
					return false, fmt.Sprintf("already at the maximum parallelism %d", c.MaxParallelism)
				}
				return false, fmt.Sprintf("demand %.0f tuples/s needs %d instances at %.0f%% busy with a true rate of %.0f: it has %d",
					want, n, c.TargetUtil*100, rate, f.Parallelism)
			}
			dec.From, dec.To = f.Parallelism, n
			dec.Why = fmt.Sprintf("demand %.0f tuples/s, true rate %.0f tuples/s per instance at %.0f%% target busy: %d instances", want, rate, c.TargetUtil*100, n)
			return true, ""
		}
		n := Needed(want, rate, c.DownUtil, c.MaxParallelism)
		if n >= f.Parallelism {
			return false, fmt.Sprintf("demand %.0f tuples/s needs %d instances at %.0f%% busy: no fewer than now", want, n, c.DownUtil*100)
		}
		dec.From, dec.To = f.Parallelism, n
		dec.Why = fmt.Sprintf("demand %.0f tuples/s, true rate %.0f tuples/s per instance at %.0f%% busy: %d instances", want, rate, c.DownUtil*100, n)
		return true, ""
	case ActMove:
		if dec.Diagnosis.Partition < 0 {
			return false, "no single instance to move"
		}
		dec.Why = fmt.Sprintf("move partition %d of %s to another worker", dec.Diagnosis.Partition, f.Name)
		return true, ""
	case ActRebalanceSlots:
		if dec.Diagnosis.Partition < 0 {
			return false, "no hot partition"
		}
		moves, loads, ok, why := Rebalance(f, dec.Diagnosis.Partition, c)
		if !ok {
			return false, why
		}
		moved := 0.0
		list := make([]string, len(moves))
		for i, m := range moves {
			moved += m.Rate
			list[i] = fmt.Sprintf("%d->p%d", m.Slot, m.To)
		}
		dec.Slots, dec.From, dec.To = moves, f.Parallelism, f.Parallelism
		dec.Why = fmt.Sprintf("%d hash slots (%.0f tuples/s by the key samples) from partition %d to less loaded partitions (%s); estimated loads after: %s",
			len(moves), moved, dec.Diagnosis.Partition, strings.Join(list, " "), fmtLoads(loads))
		return true, ""
	case ActScaleSources:
		if dec.Diagnosis.Name == DiagOverProvisioned {
			if !f.Source {
				return false, "not a source"
			}
			from, to, why, ok := SourceDown(q, f, c)
			if !ok {
				return false, why
			}
			dec.Target, dec.From, dec.To = f.Name, from, to
			dec.Why = why
			return true, ""
		}
		return sourcesFor(q, dec, c)
	case ActOffload:
		// Offloading helps only a fragment that needs more instances than
		// it has (and did not get them: a scale-up was skipped, the org
		// lacking capacity or the pair being blacklisted).
		if !f.Scalable {
			return false, "not a keyed operator"
		}
		rate, ok := TrueRate(f, c)
		if !ok {
			return false, "too little useful time in the window to know its true processing rate"
		}
		want := demand[f.Name]
		n := Needed(want, rate, c.TargetUtil, c.MaxParallelism)
		if n <= f.Parallelism {
			return false, fmt.Sprintf("demand %.0f tuples/s needs %d instances, it has %d: more capacity would not help", want, n, f.Parallelism)
		}
		dec.From, dec.To = f.Parallelism, n
		dec.Why = fmt.Sprintf("demand %.0f tuples/s needs %d instances of %s at a true rate of %.0f, it has %d: offer its tasks to a contract partner",
			want, n, f.Name, rate, f.Parallelism)
		return true, ""
	}
	return false, "no resolver carries it out in this build"
}

func fmtLoads(loads map[int]float64) string {
	ps := make([]int, 0, len(loads))
	for p := range loads {
		ps = append(ps, p)
	}
	sort.Ints(ps)
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("p%d %.0f/s", p, loads[p])
	}
	return strings.Join(parts, ", ")
}

// sourcesFor sizes the sources for a missed throughput SLO: when no
// source is held back (none blocked past BackpressureMs in the window),
// the sources are what limits the query. The throughput is what the
// sources take (Throughput), so the records per second missing are the
// SLO minus the throughput; any one source would have to take them on
// top of what it takes now, and each source's part of the Why says so.
// A source with a configured rate per partition needs that many more
// partitions: the first generator source that does becomes the
// decision's Target, From and To, sized to make up the whole deficit in
// one step (one source per action). Its configured rate is scaled by
// what it must take over what it sustains now (what it takes, at most
// its configured rate), so that a source short of its configured rate
// (busy with the operators fused into it) gets the partitions for its
// real rate, and one catching up with its schedule is not undersized. Without one, the decision cannot be
// carried out and its Why says what the sources would need.
func sourcesFor(q *Query, dec *Decision, c Config) (bool, string) {
	if q.SLO <= 0 {
		return false, "no throughput SLO"
	}
	tp, n := 0.0, 0
	for k := 0; ; k++ {
		v, ok := Throughput(q, k)
		if !ok {
			break
		}
		tp += v
		n++
	}
	if n == 0 || tp <= 0 {
		return false, "no throughput measured"
	}
	tp /= float64(n)
	deficit := max(q.SLO-tp, 0)
	var parts []string
	var target *Fragment
	from, to := 0, 0
	for i := range q.Fragments {
		f := &q.Fragments[i]
		if !f.Source {
			continue
		}
		if b := mean(f.Samples, blockedMs); b > c.BackpressureMs {
			return false, fmt.Sprintf("source %s is held back (blocked %.0f ms/s): the sources are not the bottleneck", f.Name, b)
		}
		in := mean(f.Samples, func(s Sample) float64 { return sum(s.Instances, func(i Instance) float64 { return i.InRate }) })
		part := fmt.Sprintf("%s from %.0f to %.0f tuples/s", f.Name, in, in+deficit)
		if b := mean(f.Samples, func(s Sample) float64 { return mean(s.Instances, func(i Instance) float64 { return i.Busy }) }); b > c.TargetUtil {
			// The operators fused into the source (a split, a map) take
			// its time: it needs more partitions, not a higher rate.
			part += fmt.Sprintf(", busy %.0f%%", b*100)
		}
		if f.SourceRate > 0 && f.Parallelism > 0 && in > 0 {
			// What it sustains: no more than its configured rate (a
			// generator behind its schedule, after a start or a stall,
			// takes more until it has caught up), less when it cannot
			// keep it (busy).
			sustained := min(in, f.SourceRate)
			per := f.SourceRate / float64(f.Parallelism)
			want := Needed(f.SourceRate*(in+deficit)/sustained, per, 1, c.MaxParallelism)
			part += fmt.Sprintf(" (%d -> %d partitions at %.0f records/s each)", f.Parallelism, want, per)
			if f.SourceWhyNot != "" {
				part += " (cannot be rescaled: " + f.SourceWhyNot + ")"
			}
			if f.SourceScalable && want > f.Parallelism && target == nil {
				// One source at a time (one intrusive action): the
				// first that can grow.
				target, from, to = f, f.Parallelism, want
			}
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return false, "no source in the query"
	}
	dec.Why = fmt.Sprintf("throughput %.0f/s for an SLO of %.0f/s: sources %s", tp, q.SLO, strings.Join(parts, "; "))
	if target == nil {
		return false, "no generator source with a rate per partition can take more partitions: " + dec.Why
	}
	dec.Target, dec.From, dec.To = target.Name, from, to
	return true, ""
}

// SourceDown sizes a generator source that sends more than the query's
// throughput SLO needs: from its partitions to the fewest whose share of
// the lowest throughput of the window still meets the SLO with the SLO
// margin on top (throughput * to/from >= SLO * (1 + SLOMargin)). The
// margin keeps the result clear of the point where the SLO counts as
// missed (SLO * (1 - SLOMargin)), as DownUtil keeps an operator's
// scale-down clear of its scale-up. ok is false (why says why) unless
// the source can give up a partition: it must be the query's only source
// (which of several to shrink, and by how much each, is a choice not
// built), a generator with a rate per partition that a live rescale can
// resize, not held back, and every sample of the window must have a
// throughput.
func SourceDown(q *Query, f *Fragment, c Config) (from, to int, why string, ok bool) {
	switch {
	case q.SLO <= 0:
		return 0, 0, "no throughput SLO", false
	case !f.Source || f.SourceRate <= 0 || !f.SourceScalable:
		return 0, 0, "not a generator source with a rate per partition that can be rescaled", false
	case f.Parallelism <= 1:
		return 0, 0, "a single partition", false
	}
	for i := range q.Fragments {
		if o := &q.Fragments[i]; o.Source && o.Name != f.Name {
			return 0, 0, "the query has several sources: scaling one of several down is not built", false
		}
	}
	if b := mean(f.Samples, blockedMs); b > c.BackpressureMs {
		return 0, 0, fmt.Sprintf("held back (blocked %.0f ms/s)", b), false
	}
	low, n := math.Inf(1), 0
	for k := 0; ; k++ {
		tp, ok := Throughput(q, k)
		if !ok {
			break
		}
		low, n = min(low, tp), n+1
	}
	if n < max(c.MinSamples, 1) || low <= 0 {
		return 0, 0, "no throughput over a full window", false
	}
	from = f.Parallelism
	perPart := low / float64(from)
	want := q.SLO * (1 + c.SLOMargin)
	to = Needed(want, perPart, 1, c.MaxParallelism)
	why = fmt.Sprintf("throughput at least %.0f/s over the window from %d partitions (%.0f/s each) for an SLO of %.0f/s: %d partitions give %.0f/s, above the SLO plus %.0f%%",
		low, from, perPart, q.SLO, to, perPart*float64(to), c.SLOMargin*100)
	if to >= from {
		return from, from, why + ": no fewer than now", false
	}
	return from, to, why, true
}

func sum[T any](xs []T, f func(T) float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += f(x)
	}
	return s
}

// Metrics are the figures an action is judged by, over a window: the
// query's throughput and, for the fragment acted on, its upstreams' mean
// blocked time, its mean queue and mean busy share.
type Metrics struct {
	Throughput  float64 `json:"throughput"`
	UpBlockedMs float64 `json:"up_blocked_ms"`
	// UpUnacked: the most tuples per instance an upstream holds not yet
	// taken.
	UpUnacked   float64 `json:"up_unacked"`
	Queue       float64 `json:"queue"`
	Busy        float64 `json:"busy"`
	Parallelism int     `json:"parallelism"`
	// TrueRate per instance (tuples per useful second), 0 when unknown.
	TrueRate float64 `json:"true_rate"`
	// Instances are the fragment's per-partition window means.
	Instances []InstanceMeans `json:"instances,omitempty"`
}

// InstanceMeans are one partition's window means.
type InstanceMeans struct {
	Partition int     `json:"partition"`
	InRate    float64 `json:"in_rate"`
	Busy      float64 `json:"busy"`
	Queue     float64 `json:"queue"`
}

// Measure takes the Metrics of fragment frag of q over its window.
func Measure(q *Query, frag string, c Config) Metrics {
	var m Metrics
	n := 0
	for k := 0; ; k++ {
		tp, ok := Throughput(q, k)
		if !ok {
			break
		}
		m.Throughput += tp
		n++
	}
	if n > 0 {
		m.Throughput /= float64(n)
	}
	f := q.Fragment(frag)
	if f == nil {
		return m
	}
	m.Parallelism = f.Parallelism
	if r, ok := TrueRate(f, c); ok {
		m.TrueRate = r
	}
	m.Queue = mean(f.Samples, queueMean)
	m.Busy = mean(f.Samples, func(s Sample) float64 { return mean(s.Instances, func(i Instance) float64 { return i.Busy }) })
	for _, u := range f.Upstreams {
		if uf := q.Fragment(u); uf != nil {
			m.UpBlockedMs = max(m.UpBlockedMs, mean(uf.Samples, blockedMs))
			m.UpUnacked = max(m.UpUnacked, mean(uf.Samples, unackedMean))
		}
	}
	rates := perPartition(f, f.Samples, func(i Instance) float64 { return i.InRate })
	busy := perPartition(f, f.Samples, func(i Instance) float64 { return i.Busy })
	queue := perPartition(f, f.Samples, func(i Instance) float64 { return i.Queue })
	for p := range rates {
		m.Instances = append(m.Instances, InstanceMeans{Partition: p, InRate: rates[p], Busy: busy[p], Queue: queue[p]})
	}
	sort.Slice(m.Instances, func(i, j int) bool { return m.Instances[i].Partition < m.Instances[j].Partition })
	return m
}

// Evaluate judges an action after its settling time from the metrics
// before it and after: a repair (scale up, move, ...) improved things when
// the pressure it addressed is gone (upstreams no longer blocked, queue
// no longer large, an SLO met) or the throughput rose by a tenth; a scale
// down when it brought no pressure back and kept the throughput.
func Evaluate(action, diagnosis string, before, after Metrics, slo float64, c Config) (improved bool, why string) {
	calm := after.UpBlockedMs <= c.BackpressureMs && after.Queue <= c.QueueHigh && after.UpUnacked <= c.QueueHigh
	if action == ActScaleSources && diagnosis == DiagOverProvisioned {
		// A source given fewer partitions lowers the throughput on
		// purpose: it must still meet the SLO, with nothing backlogged.
		if calm && after.Throughput >= slo*(1-c.SLOMargin) {
			return true, fmt.Sprintf("SLO still met: throughput %.0f/s (was %.0f/s) for an SLO of %.0f/s", after.Throughput, before.Throughput, slo)
		}
		return false, fmt.Sprintf("SLO missed or backlog after it: throughput %.0f/s (was %.0f/s) for an SLO of %.0f/s, queue %.0f",
			after.Throughput, before.Throughput, slo, after.Queue)
	}
	if action == ActScaleDown {
		if calm && after.Throughput >= before.Throughput*0.9 {
			return true, fmt.Sprintf("no backpressure after it, throughput %.0f/s (was %.0f/s)", after.Throughput, before.Throughput)
		}
		return false, fmt.Sprintf("backpressure or lost throughput after it: upstream blocked %.0f ms/s, queue %.0f, throughput %.0f/s (was %.0f/s)",
			after.UpBlockedMs, after.Queue, after.Throughput, before.Throughput)
	}
	if diagnosis == DiagSLOViolated && slo > 0 {
		calm = after.Throughput >= slo*(1-c.SLOMargin)
	}
	if diagnosis == DiagDataSkew {
		// A hot partition needs no backlog to be diagnosed, so the
		// absence of one says nothing: the repair worked when no
		// partition is left saturated ahead of the others. Otherwise a
		// rebalance that moved too little would be judged improved and
		// taken again at every settling time.
		if p, hot := hotMeans(after.Instances, c); hot {
			return false, fmt.Sprintf("partition %d still hot: %.0f tuples/s at %.0f%% busy; throughput %.0f/s (was %.0f/s)",
				p.Partition, p.InRate, p.Busy*100, after.Throughput, before.Throughput)
		}
	}
	switch {
	case calm:
		return true, fmt.Sprintf("symptom gone: upstream blocked %.0f ms/s (was %.0f), queue %.0f (was %.0f), throughput %.0f/s (was %.0f/s)",
			after.UpBlockedMs, before.UpBlockedMs, after.Queue, before.Queue, after.Throughput, before.Throughput)
	case after.Throughput > before.Throughput*1.1:
		return true, fmt.Sprintf("throughput rose to %.0f/s from %.0f/s", after.Throughput, before.Throughput)
	}
	return false, fmt.Sprintf("symptom still there: upstream blocked %.0f ms/s (was %.0f), queue %.0f (was %.0f), throughput %.0f/s (was %.0f/s)",
		after.UpBlockedMs, before.UpBlockedMs, after.Queue, before.Queue, after.Throughput, before.Throughput)
}

// hotMeans applies the hot-partition rule (see Config.SaturatedBusy) to
// per-partition window means: the fastest partition saturated and above
// SimilarRatio times the others' median rate.
func hotMeans(ins []InstanceMeans, c Config) (InstanceMeans, bool) {
	if len(ins) < 2 || c.SaturatedBusy <= 0 {
		return InstanceMeans{}, false
	}
	rates := map[int]float64{}
	byP := map[int]InstanceMeans{}
	for _, i := range ins {
		rates[i.Partition], byP[i.Partition] = i.InRate, i
	}
	p := outlier(rates, c.SimilarRatio, 0)
	if p < 0 || byP[p].Busy < c.SaturatedBusy {
		return InstanceMeans{}, false
	}
	return byP[p], true
}

// Outcome values of an action in the log.
const (
	OutcomePending     = "pending"
	OutcomeImproved    = "improved"
	OutcomeNotImproved = "not_improved"
	// OutcomeFailed: the action could not be carried out (the rescale or
	// move was refused or aborted).
	OutcomeFailed = "failed"
	// OutcomeAlert: a diagnosis no resolver could act on, logged once.
	OutcomeAlert = "alert"
)

// Pair is a diagnosis/action pair of one query, scoped to the fragment
// (operator) the action addressed: a scale-up of one operator that fails
// says nothing of scaling another. Fragment "" is a query-wide pair: what
// a logged action without a fragment counts for (older log entries).
type Pair struct{ Query, Fragment, Diagnosis, Action string }

// queryWide returns the pair without its fragment.
func (p Pair) queryWide() Pair { p.Fragment = ""; return p }

// PairRecord is a pair's evaluated actions and how many of them failed.
type PairRecord struct {
	Evaluated, Failed int
	Blacklisted       bool
}

// Logged is what the blacklist needs of one logged action.
type Logged struct {
	Pair
	Outcome string
}

// Records are the evaluated pairs of the log. A fragment's record
// includes the query-wide record of the same diagnosis/action, so an
// action logged without a fragment counts against every fragment of its
// query, as it did when the blacklist was per query.
type Records map[Pair]PairRecord

// For returns the record that applies to p: its fragment's own, else the
// query-wide one.
func (rs Records) For(p Pair) PairRecord {
	if r, ok := rs[p]; ok {
		return r
	}
	return rs[p.queryWide()]
}

// Blacklist counts each pair's evaluated actions from the log. A pair is
// blacklisted once it has at least minEvaluated evaluated actions and the
// share of them that failed (not improved, or could not be carried out)
// reaches ratio.
func Blacklist(log []Logged, ratio float64, minEvaluated int) Records {
	out := Records{}
	for _, l := range log {
		switch l.Outcome {
		case OutcomeImproved, OutcomeNotImproved, OutcomeFailed:
		default:
			continue
		}
		r := out[l.Pair]
		r.Evaluated++
		if l.Outcome != OutcomeImproved {
			r.Failed++
		}
		out[l.Pair] = r
	}
	for p, r := range out {
		if p.Fragment != "" {
			w := out[p.queryWide()]
			r.Evaluated += w.Evaluated
			r.Failed += w.Failed
		}
		out[p] = r
	}
	for p, r := range out {
		r.Blacklisted = r.Evaluated >= max(minEvaluated, 1) && float64(r.Failed) >= ratio*float64(r.Evaluated)
		out[p] = r
	}
	return out
}

// Scaling is what the scale-down guard needs of one logged action.
type Scaling struct {
	Fragment string
	At       time.Time
	From, To int
	Outcome  string
}

// RecentScaleUp returns when fragment was last scaled up (more partitions
// after than before, by any action not failed) less than gap before now.
// The loop takes no scale-down of a fragment, keyed operator or source,
// so soon after a scale-up of it: a scale-down right after a scale-up is
// the oscillation users of autoscalers complain about, and the figures
// that called for the scale-up are too recent to be outweighed by one
// window.
func RecentScaleUp(log []Scaling, fragment string, now time.Time, gap time.Duration) (time.Time, bool) {
	var last time.Time
	for _, s := range log {
		if s.Fragment != fragment || s.To <= s.From || s.Outcome == OutcomeFailed || s.Outcome == OutcomeAlert {
			continue
		}
		if now.Sub(s.At) < gap && s.At.After(last) {
			last = s.At
		}
	}
	return last, !last.IsZero()
}
