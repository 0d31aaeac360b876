package source

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/fedstream/fedstream/worker/tuple"
)

// A ward of patients read round-robin (record n is patient n%vitalsPatients).
// Each vital sign follows a mean-reverting random walk around the patient's
// baseline; a few seeded "unstable" patients alternate between calm spells
// and episodes of fever, tachycardia and low blood pressure, so that
// threshold queries (examples/vitals.yaml) find something.
const (
	vitalsPatients       = 32
	vitalsUnstable       = 3
	vitalsCalmReadings   = 300 // an unstable patient's calm spell lasts up to this many readings
	vitalsEpisodeMinimum = 100 // ... and an episode between this and twice as many
	vitalsReversion      = 0.1 // fraction of the distance to the target closed per reading
)

type vitalSigns struct{ temp, hr, rr, sys, dia float64 }

type patient struct {
	name      string
	baseline  vitalSigns
	current   vitalSigns
	unstable  bool
	inEpisode bool
	remaining int // readings until the state flips (unstable patients)
}

// episode is what an unstable patient drifts towards during an episode.
var episode = vitalSigns{temp: 39.3, hr: 132, rr: 28, sys: 92, dia: 55}

type vitals struct {
	clock
	schema   *tuple.Schema
	rng      *rand.Rand
	patients []patient
}

func newVitals(c clock, schema *tuple.Schema, rng *rand.Rand) *vitals {
	g := &vitals{clock: c, schema: schema, rng: rng, patients: make([]patient, vitalsPatients)}
	for i := range g.patients {
		p := &g.patients[i]
		p.name = fmt.Sprintf("patient-%03d", i+1)
		p.baseline = vitalSigns{
			temp: 36.5 + rng.Float64()*0.7,
			hr:   62 + rng.Float64()*20,
			rr:   12 + rng.Float64()*5,
			sys:  110 + rng.Float64()*20,
			dia:  70 + rng.Float64()*12,
		}
		p.current = p.baseline
	}
	for _, i := range rng.Perm(vitalsPatients)[:vitalsUnstable] {
		p := &g.patients[i]
		p.unstable = true
		p.remaining = 1 + rng.IntN(vitalsCalmReadings)
	}
	return g
}

func (g *vitals) Schema() *tuple.Schema { return g.schema }

func (g *vitals) Next(t *tuple.Tuple) bool {
	n, stime, ok := g.tick()
	if !ok {
		return false
	}
	p := &g.patients[n%vitalsPatients]
	if p.unstable {
		p.remaining--
		if p.remaining <= 0 {
			p.inEpisode = !p.inEpisode
			if p.inEpisode {
				p.remaining = vitalsEpisodeMinimum + g.rng.IntN(vitalsEpisodeMinimum+1)
			} else {
				p.remaining = 1 + g.rng.IntN(vitalsCalmReadings)
			}
		}
	}
	target := p.baseline
	if p.inEpisode {
		target = episode
	}
	c := &p.current
	c.temp = g.step(c.temp, target.temp, 0.05)
	c.hr = g.step(c.hr, target.hr, 2)
	c.rr = g.step(c.rr, target.rr, 0.7)
	c.sys = g.step(c.sys, target.sys, 2.5)
	c.dia = g.step(c.dia, target.dia, 2)
	t.STime = stime
	t.Values = append(t.Values[:0],
		tuple.Timestamp(stime),
		tuple.Str(p.name),
		tuple.Float(math.Round(c.temp*10)/10),
		tuple.Int(int64(math.Round(c.hr))),
		tuple.Int(int64(math.Round(c.rr))),
		tuple.Int(int64(math.Round(c.sys))),
		tuple.Int(int64(math.Round(c.dia))))
	return true
}

// step moves v a fraction of the way to target plus Gaussian noise.
func (g *vitals) step(v, target, noise float64) float64 {
	return v + (target-v)*vitalsReversion + g.rng.NormFloat64()*noise
}
