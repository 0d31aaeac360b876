// Package sim runs the health manager's policy (package health) against a
// fluid model of a query instead of a running org: the scenarios of
// `fedstream bench scaling`. The model is a chain of operators, each with a
// processing capacity per instance, a selectivity and bounded input
// queues; a full queue blocks the operator feeding it, as the data plane's
// bounded buffers do. The driver mirrors the leader's loop (one sample a
// second, a window per operator, settling after each action, evaluation
// and blacklist from the action log), with actions taking effect at once.
// What it measures is the policy: how many steps it takes, how far it
// lands from the optimum, whether noise or load changes make it act, which
// diagnosis it makes. It says nothing of how long a live rescale takes.
package sim

import (
	"math"
	"time"

	"github.com/fedstream/fedstream/coordinator/health"
)

// Op is one operator of the modelled chain.
type Op struct {
	Name string
	// Cap is what one instance processes per second at full busy.
	Cap float64
	// Sel is the output per input tuple.
	Sel         float64
	Parallelism int
	// Slow is a partition whose capacity is divided by SlowFactor (1 or
	// less: none). SlowFollowsWorker: moving it elsewhere cures it.
	Slow              int
	SlowFactor        float64
	SlowFollowsWorker bool
	// Hot is a partition that receives (1+Skew) times the share of the
	// others (Skew 0: none).
	Hot  int
	Skew float64

	queues []float64
}

// Plant is the modelled query: a source with a rate (per second, given
// the second), then Ops in a chain, then a sink.
type Plant struct {
	Rate func(sec int) float64
	Ops  []*Op
	// Buffer bounds each instance's input queue (tuples).
	Buffer float64
	// KnownRate: the policy is told the source's rate (as the leader is
	// told a generator's); otherwise it infers it from how long the source
	// was blocked.
	KnownRate bool

	backlog float64
}

func (o *Op) shares() []float64 {
	out := make([]float64, o.Parallelism)
	total := float64(o.Parallelism)
	if o.Skew > 0 && o.Hot < o.Parallelism {
		total += o.Skew
	}
	for i := range out {
		out[i] = 1 / total
		if o.Skew > 0 && i == o.Hot {
			out[i] = (1 + o.Skew) / total
		}
	}
	return out
}

func (o *Op) capOf(i int) float64 {
	if i == o.Slow && o.SlowFactor > 1 {
		return o.Cap / o.SlowFactor
	}
	return o.Cap
}

// accept is the most tuples o can take now without any queue passing
// buffer.
func (o *Op) accept(buffer float64) float64 {
	best := math.Inf(1)
	for i, s := range o.shares() {
		if s > 0 {
			best = min(best, max(0, buffer-o.queues[i])/s)
		}
	}
	return best
}

// rescale gives o n instances, its queued tuples spread over them.
func (o *Op) rescale(n int) {
	total := 0.0
	for _, q := range o.queues {
		total += q
	}
	o.Parallelism = n
	o.queues = make([]float64, n)
	for i, s := range o.shares() {
		o.queues[i] = total * s
	}
}

// step advances the plant by one second and returns one sample per
// fragment (source "src", the ops, sink "out").
func (p *Plant) step(sec int) map[string][]health.Instance {
	for _, o := range p.Ops {
		if len(o.queues) != o.Parallelism {
			o.rescale(o.Parallelism)
		}
	}
	out := map[string][]health.Instance{}
	// Downstream first, so that what an operator processes frees room
	// for its upstream in the same second.
	emitted := 0.0 // the last operator's output, into the sink
	for k := len(p.Ops) - 1; k >= 0; k-- {
		o := p.Ops[k]
		want := make([]float64, o.Parallelism)
		total := 0.0
		for i := range want {
			want[i] = min(o.queues[i], o.capOf(i))
			total += want[i]
		}
		room := math.Inf(1)
		if k+1 < len(p.Ops) {
			room = p.Ops[k+1].accept(p.Buffer) / o.Sel
		}
		f, blocked := 1.0, 0.0
		if total > room {
			f = room / total
			blocked = 1 - f
		}
		ins := make([]health.Instance, o.Parallelism)
		done := 0.0
		for i := range want {
			n := want[i] * f
			o.queues[i] -= n
			done += n
			ins[i] = health.Instance{Partition: i, InRate: n, OutRate: n * o.Sel, Busy: n / o.capOf(i), Queue: o.queues[i], BlockedMs: blocked * 1000}
		}
		if k+1 < len(p.Ops) {
			next := p.Ops[k+1]
			for i, s := range next.shares() {
				next.queues[i] += done * o.Sel * s
			}
		} else {
			emitted = done * o.Sel
		}
		out[o.Name] = ins
	}
	offered := p.Rate(sec) + p.backlog
	e := min(offered, p.Ops[0].accept(p.Buffer))
	p.backlog = offered - e
	for i, s := range p.Ops[0].shares() {
		p.Ops[0].queues[i] += e * s
	}
	blocked := 0.0
	if offered > 0 {
		blocked = 1 - e/offered
	}
	out["src"] = []health.Instance{{InRate: e, OutRate: e, Busy: 0.01, BlockedMs: blocked * 1000}}
	out["out"] = []health.Instance{{InRate: emitted}}
	return out
}

// Entry is one action (or alert) of a run.
type Entry struct {
	Sec       int    `json:"sec"`
	Fragment  string `json:"fragment"`
	Diagnosis string `json:"diagnosis"`
	Action    string `json:"action"`
	From      int    `json:"from,omitempty"`
	To        int    `json:"to,omitempty"`
	Outcome   string `json:"outcome"`
}

// Driver runs the policy on a plant as the leader's loop would.
type Driver struct {
	Plant  *Plant
	Policy health.Config
	// Settle and Window in seconds (samples).
	Settle, Window int
	// SLO of the modelled query (0: none).
	SLO float64
	// FailureRatio and MinEvaluated make the blacklist, as in
	// coordinator.HealthConfig.
	FailureRatio float64
	MinEvaluated int

	Log []Entry

	windows    map[string][]health.Sample
	quietUntil int
	pending    int // index in Log, -1 none
	before     health.Metrics
	alerted    map[string]bool
}

func (d *Driver) query(sec int) *health.Query {
	q := &health.Query{Name: "sim", SLO: d.SLO}
	names := []string{"src"}
	for _, o := range d.Plant.Ops {
		names = append(names, o.Name)
	}
	names = append(names, "out")
	for i, n := range names {
		f := health.Fragment{Name: n, Samples: d.windows[n], Parallelism: 1}
		if i > 0 {
			f.Upstreams = []string{names[i-1]}
		}
		if i+1 < len(names) {
			f.Downstreams = []string{names[i+1]}
		}
		switch {
		case i == 0:
			f.Source = true
			if d.Plant.KnownRate {
				f.SourceRate = d.Plant.Rate(sec)
			}
		case i == len(names)-1:
			f.Sink = true
		default:
			f.Scalable, f.Parallelism = true, d.Plant.Ops[i-1].Parallelism
		}
		q.Fragments = append(q.Fragments, f)
	}
	return q
}

func (d *Driver) op(name string) *Op {
	for _, o := range d.Plant.Ops {
		if o.Name == name {
			return o
		}
	}
	return nil
}

// Run advances the plant and the policy by secs seconds, from second
// start.
func (d *Driver) Run(start, secs int) {
	if d.windows == nil {
		d.windows, d.alerted, d.pending = map[string][]health.Sample{}, map[string]bool{}, -1
	}
	for sec := start; sec < start+secs; sec++ {
		at := time.Unix(int64(sec), 0)
		for name, ins := range d.Plant.step(sec) {
			w := append(d.windows[name], health.Sample{At: at, Instances: ins})
			if len(w) > d.Window {
				w = w[len(w)-d.Window:]
			}
			d.windows[name] = w
		}
		q := d.query(sec)
		if d.pending >= 0 && sec >= d.Log[d.pending].Sec+d.Settle && len(d.windows["out"]) >= d.Policy.MinSamples {
			e := &d.Log[d.pending]
			ok, _ := health.Evaluate(e.Action, e.Diagnosis, d.before, health.Measure(q, e.Fragment, d.Policy), d.SLO, d.Policy)
			e.Outcome = health.OutcomeNotImproved
			if ok {
				e.Outcome = health.OutcomeImproved
			}
			d.pending = -1
		}
		if sec < d.quietUntil || d.pending >= 0 {
			continue
		}
		syms, below, why := health.Detect(q, d.Policy)
		ds := health.Diagnose(q, syms, below, why, d.Policy)
		if len(ds) == 0 {
			continue
		}
		chosen, alerts := health.Choose(q, ds, d.Policy, d.allowed())
		for _, a := range alerts {
			key := a.Diagnosis.Fragment + "/" + a.Diagnosis.Name
			if !d.alerted[key] {
				d.alerted[key] = true
				d.Log = append(d.Log, Entry{Sec: sec, Fragment: a.Diagnosis.Fragment, Diagnosis: a.Diagnosis.Name, Action: "none", Outcome: health.OutcomeAlert})
			}
		}
		if chosen == nil {
			continue
		}
		d.before = health.Measure(q, chosen.Diagnosis.Fragment, d.Policy)
		o := d.op(chosen.Diagnosis.Fragment)
		switch chosen.Action {
		case health.ActScaleUp, health.ActScaleDown:
			o.rescale(chosen.To)
		case health.ActMove:
			if o.SlowFollowsWorker && o.Slow == chosen.Diagnosis.Partition {
				o.SlowFactor = 1
			}
		}
		d.Log = append(d.Log, Entry{Sec: sec, Fragment: chosen.Diagnosis.Fragment, Diagnosis: chosen.Diagnosis.Name, Action: chosen.Action,
			From: chosen.From, To: chosen.To, Outcome: health.OutcomePending})
		d.pending = len(d.Log) - 1
		d.quietUntil = sec + d.Settle
		d.windows = map[string][]health.Sample{}
	}
}

func (d *Driver) allowed() health.Allowed {
	var logged []health.Logged
	for _, e := range d.Log {
		logged = append(logged, health.Logged{Pair: health.Pair{Query: "sim", Fragment: e.Fragment, Diagnosis: e.Diagnosis, Action: e.Action}, Outcome: e.Outcome})
	}
	bl := health.Blacklist(logged, d.FailureRatio, d.MinEvaluated)
	return func(frag, diag, act string) (bool, string) {
		if bl.For(health.Pair{Query: "sim", Fragment: frag, Diagnosis: diag, Action: act}).Blacklisted {
			return false, "blacklisted"
		}
		switch act {
		case health.ActScaleUp, health.ActScaleDown, health.ActMove:
			return true, ""
		}
		return false, "not modelled"
	}
}

// NewDriver returns a driver with the loop's defaults: the policy's
// default thresholds, a 10-sample window, 30 s settling, pairs blacklisted
// after one evaluated action of which half failed.
func NewDriver(p *Plant) *Driver {
	return &Driver{Plant: p, Policy: health.DefaultConfig(), Settle: 30, Window: 10, FailureRatio: 0.5, MinEvaluated: 1}
}

// Scalings are the log's scale actions.
func (d *Driver) Scalings() []Entry {
	var out []Entry
	for _, e := range d.Log {
		if e.Action == health.ActScaleUp || e.Action == health.ActScaleDown {
			out = append(out, e)
		}
	}
	return out
}

// Oscillations counts operators scaled one way and later the other.
func Oscillations(log []Entry) int {
	dir := map[string]string{}
	n := 0
	for _, e := range log {
		if e.Action != health.ActScaleUp && e.Action != health.ActScaleDown {
			continue
		}
		if prev, ok := dir[e.Fragment]; ok && prev != e.Action {
			n++
		}
		dir[e.Fragment] = e.Action
	}
	return n
}

// Steps counts the distinct seconds at which the policy scaled.
func Steps(log []Entry) int {
	secs := map[int]bool{}
	for _, e := range log {
		if e.Action == health.ActScaleUp || e.Action == health.ActScaleDown {
			secs[e.Sec] = true
		}
	}
	return len(secs)
}

// Parallelism returns each operator's parallelism, by name.
func (p *Plant) Parallelism() map[string]int {
	out := map[string]int{}
	for _, o := range p.Ops {
		out[o.Name] = o.Parallelism
	}
	return out
}
