package runtime

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestPacedSchedule: without a pace the schedule is the rate's (integer
// arithmetic, as before paces existed); a pace's factor scales the rate
// (0.8: records come 1/0.8 times further apart); bad factors are refused
// and leave the factor as it was.
func TestPacedSchedule(t *testing.T) {
	if got := paced(1000, 1000, 1, nil, 1); got != time.Second {
		t.Errorf("no pace: record 1000 at 1000/s due after %s, want 1s", got)
	}
	if got := paced(1000, 1000, 2, nil, 1); got != 500*time.Millisecond {
		t.Errorf("speedup 2: %s, want 500ms", got)
	}
	p, err := NewPace(1)
	if err != nil {
		t.Fatal(err)
	}
	if got := paced(800, 1000, 1, p, 0.8); got != time.Second {
		t.Errorf("pace 0.8: record 800 at 1000/s due after %s, want 1s", got)
	}
	if got := paced(1300, 1000, 1, p, 1.3); got < time.Second-time.Microsecond || got > time.Second+time.Microsecond {
		t.Errorf("pace 1.3: record 1300 at 1000/s due after %s, want 1s", got)
	}
	v := p.ver.Load()
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1), 2e6} {
		if err := p.Set(bad); !errors.Is(err, ErrBadPace) {
			t.Errorf("Set(%v): %v, want ErrBadPace", bad, err)
		}
	}
	if p.Factor() != 1 || p.ver.Load() != v {
		t.Errorf("refused factors changed the pace: %v (version %d, was %d)", p.Factor(), p.ver.Load(), v)
	}
	if err := p.Set(0.8); err != nil || p.Factor() != 0.8 || p.ver.Load() != v+1 {
		t.Errorf("Set(0.8): %v, factor %v, version %d", err, p.Factor(), p.ver.Load())
	}
}
