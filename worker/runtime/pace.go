package runtime

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// Pace is a factor on the wall-clock pace of the generator sources of a
// runtime (Options.SourcePace) that may change while they run: the
// health manager's benchmarks change a running query's load with it
// (fedstream bench scaling). A generator at rate r sends r*factor
// records a second; their stimes stay those of rate r, so results are
// unchanged and only the load in wall time changes. A change re-anchors
// the pacing at the record it finds: a source that was behind schedule
// (held back by backpressure) does not catch up on what it owed.
type Pace struct {
	bits atomic.Uint64 // math.Float64bits of the factor
	ver  atomic.Uint64 // bumped by every Set
}

// ErrBadPace means a pace factor is not a positive finite number.
var ErrBadPace = errors.New("a source pace must be a positive finite factor")

// maxPace bounds the factor: a generator's pacing divides by it.
const maxPace = 1e6

// NewPace returns a pace at factor f (see Set).
func NewPace(f float64) (*Pace, error) {
	p := &Pace{}
	if err := p.Set(f); err != nil {
		return nil, err
	}
	return p, nil
}

// Set changes the factor; the sources take it at their next record.
func (p *Pace) Set(f float64) error {
	if !(f > 0) || f > maxPace || math.IsInf(f, 0) {
		return fmt.Errorf("%w: %v", ErrBadPace, f)
	}
	p.bits.Store(math.Float64bits(f))
	p.ver.Add(1)
	return nil
}

// Factor returns the current factor.
func (p *Pace) Factor() float64 { return math.Float64frombits(p.bits.Load()) }
