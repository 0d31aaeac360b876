package sim

import (
	"fmt"
	"math/rand"

	"github.com/fedstream/fedstream/coordinator/health"
)

// Report is what `fedstream bench scaling --json` prints.
type Report struct {
	Wordcount  Wordcount   `json:"wordcount"`
	LoadChange LoadChange  `json:"load_change"`
	Noise      Noise       `json:"noise"`
	Diagnoses  []Diagnosed `json:"diagnoses"`
	// Recovery: a slow instance whose slowness is in its data, not its
	// worker: the first repair (a move) does not help, its pair is
	// blacklisted, the next resolver is used.
	Recovery Recovery `json:"blacklist_recovery"`
	Model    string   `json:"model"`
}

// Wordcount is scenario (a).
type Wordcount struct {
	Steps         int            `json:"steps"`
	Seconds       int            `json:"seconds"`
	Final         map[string]int `json:"final"`
	Optimal       map[string]int `json:"optimal"`
	Overprovision float64        `json:"overprovision"`
	Actions       []Entry        `json:"actions"`
}

// LoadChange is scenario (b).
type LoadChange struct {
	Actions      int     `json:"actions"`
	Oscillations int     `json:"oscillations"`
	Log          []Entry `json:"log"`
}

// Noise is scenario (d).
type Noise struct {
	SimulatedS int `json:"simulated_s"`
	Actions    int `json:"actions"`
}

// Diagnosed is one injected fault of scenario (c) and the diagnosis the
// policy made first ("" if none).
type Diagnosed struct {
	Injected  string `json:"injected"`
	Diagnosed string `json:"diagnosed"`
	Action    string `json:"action"`
	// Then and Recovered, for the fault whose first repair cannot work
	// (the blacklist recovery): what followed the first action
	// (diagnosis/action:outcome each), and whether its pair was
	// blacklisted and another repair fixed the fault.
	Then      []string `json:"then,omitempty"`
	Recovered *bool    `json:"recovered,omitempty"`
}

// Recovery reports the blacklist scenario.
type Recovery struct {
	Actions   []string `json:"actions"`
	Recovered bool     `json:"recovered"`
}

// The word count of DS2's experiment, per second: a source of 1M
// sentences a minute, splitters of at most 100K sentences a minute each,
// 20 words a sentence, counters of at most 1M words a minute each. The
// optimum is 10 splitters and 20 counters.
func wordcountPlant(rate func(int) float64, splitters, counters int) *Plant {
	return &Plant{Rate: rate, Buffer: 20000, Ops: []*Op{
		{Name: "splitter", Cap: 100000.0 / 60, Sel: 20, Parallelism: splitters},
		{Name: "counter", Cap: 1000000.0 / 60, Sel: 0.01, Parallelism: counters},
	}}
}

const sentencesPerSec = 1000000.0 / 60

// RunAll runs every scenario; seed makes the noise reproducible.
func RunAll(seed int64) Report {
	r := Report{Model: "the policy of coordinator/health against a fluid model of the query (package coordinator/health/sim); actions take effect at once"}

	// (a) From 1 splitter and 1 counter, the generator's rate known.
	p := wordcountPlant(func(int) float64 { return sentencesPerSec }, 1, 1)
	p.KnownRate = true
	d := NewDriver(p)
	d.Run(0, 1200)
	opt := map[string]int{"splitter": 10, "counter": 20}
	final := p.Parallelism()
	sf, so := 0, 0
	for k, v := range opt {
		so += v
		sf += final[k]
	}
	last := 0
	for _, e := range d.Scalings() {
		last = e.Sec
	}
	r.Wordcount = Wordcount{Steps: Steps(d.Log), Seconds: last, Final: final, Optimal: opt,
		Overprovision: float64(sf-so) / float64(so), Actions: d.Log}

	// (b) Converged for the full rate, the load drops 20% for 10 minutes,
	// then rises 30% for 10 minutes; the source's arrival rate is
	// measured (as a Kafka topic's append rate would be).
	rate := func(sec int) float64 {
		switch {
		case sec < 600:
			return sentencesPerSec
		case sec < 1200:
			return sentencesPerSec * 0.8
		default:
			return sentencesPerSec * 0.8 * 1.3
		}
	}
	p = wordcountPlant(rate, 1, 1)
	p.KnownRate = true
	d = NewDriver(p)
	d.Run(0, 1800)
	var after []Entry
	for _, e := range d.Log {
		if e.Sec >= 600 {
			after = append(after, e)
		}
	}
	r.LoadChange = LoadChange{Actions: len(after), Oscillations: Oscillations(d.Log), Log: d.Log}

	// (d) An hour of one-second samples of a provisioned word count whose
	// load varies +-20% around 60% of its capacity.
	rng := rand.New(rand.NewSource(seed))
	p = wordcountPlant(func(int) float64 { return sentencesPerSec * 0.6 * (1 + 0.4*(rng.Float64()-0.5)) }, 10, 20)
	d = NewDriver(p)
	d.Run(0, 3600)
	r.Noise = Noise{SimulatedS: 3600, Actions: len(d.Scalings())}

	// (c) One keyed operator of 4 instances at 95% load: one instance
	// slowed (each tuple costs it 25%, 50%, 100% more), or one receiving
	// more keys than the others.
	one := func(op Op) Diagnosed {
		op.Name, op.Cap, op.Sel, op.Parallelism = "op", 1000, 1, 4
		p := &Plant{Rate: func(int) float64 { return 3800 }, Buffer: 5000, KnownRate: true, Ops: []*Op{&op}}
		d := NewDriver(p)
		d.Run(0, 300)
		for _, e := range d.Log {
			return Diagnosed{Diagnosed: e.Diagnosis, Action: e.Action}
		}
		return Diagnosed{}
	}
	for _, slow := range []float64{25, 50, 100} {
		got := one(Op{Slow: 2, SlowFactor: 1 + slow/100, SlowFollowsWorker: true})
		got.Injected = fmt.Sprintf("slow instance %.0f%%", slow)
		r.Diagnoses = append(r.Diagnoses, got)
	}
	for _, skew := range []float64{5, 10, 20, 50} {
		got := one(Op{Hot: 0, Skew: skew / 100, Slow: -1})
		got.Injected = fmt.Sprintf("data skew %.0f%%", skew)
		r.Diagnoses = append(r.Diagnoses, got)
	}

	// Blacklist recovery: the slowness follows the instance's data, so
	// moving it does not help.
	op := &Op{Name: "op", Cap: 1000, Sel: 1, Parallelism: 4, Slow: 2, SlowFactor: 2}
	p = &Plant{Rate: func(int) float64 { return 3800 }, Buffer: 5000, KnownRate: true, Ops: []*Op{op}}
	d = NewDriver(p)
	d.Run(0, 600)
	for _, e := range d.Log {
		r.Recovery.Actions = append(r.Recovery.Actions, fmt.Sprintf("%s/%s:%s", e.Diagnosis, e.Action, e.Outcome))
	}
	if len(d.Log) >= 2 && d.Log[0].Action == "move" && d.Log[0].Outcome == "not_improved" {
		for _, e := range d.Log[1:] {
			if e.Action == "scale_up" && e.Outcome == health.OutcomeImproved {
				r.Recovery.Recovered = true
			}
			if e.Action == "move" {
				r.Recovery.Recovered = false
				break
			}
		}
	}
	// The same run in the diagnoses list: a wrong first repair, its pair
	// blacklisted, the next one fixing the fault.
	rec := Diagnosed{Injected: "slow instance 100% in its data (a move cannot cure it)", Recovered: &r.Recovery.Recovered}
	for i, e := range d.Log {
		if i == 0 {
			rec.Diagnosed, rec.Action = e.Diagnosis, e.Action+":"+e.Outcome
			continue
		}
		rec.Then = append(rec.Then, fmt.Sprintf("%s/%s:%s", e.Diagnosis, e.Action, e.Outcome))
	}
	r.Diagnoses = append(r.Diagnoses, rec)
	return r
}
