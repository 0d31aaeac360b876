package dcaa

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// released returns the advance of every step the actions release, and
// whether any was tentative or a checkpoint was taken.
func releasedSteps(acts []Action) (steps []int64, tentative bool) {
	for _, a := range acts {
		switch a := a.(type) {
		case Release:
			for _, s := range a.Steps {
				steps = append(steps, s.Advance)
			}
			tentative = tentative || a.Tentative
		case Checkpoint:
			tentative = true
		}
	}
	return steps, tentative
}

// A cut (a rescale's hold, then its cut) bounds the releases: a hold
// releases nothing more, a cut releases up to it with the cut as a step,
// nothing is released tentatively while a cut is set even after an input
// failed past the share, and a cut is refused while the operators hold
// tentative state.
func TestCutBoundsReleases(t *testing.T) {
	ms := int64(time.Millisecond)
	m, err := New(Config{ID: 0, Replicas: 2, Inputs: []int{2, 2}, Share: 50 * time.Millisecond, Detect: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	both := func(now int64, id uint64, st int64) []int64 {
		var steps []int64
		for i := range 2 {
			s, tent := releasedSteps(m.Step(now, Deliver{Input: i, Upstream: Stable, Tuples: []tuple.Tuple{
				{Type: tuple.Stable, ID: id, STime: st - ms}, {Type: tuple.Boundary, ID: id + 1, STime: st}}}))
			if tent {
				t.Fatalf("tentative release at %d", now)
			}
			steps = append(steps, s...)
		}
		return steps
	}
	if got := both(1*ms, 1, 10*ms); len(got) != 1 || got[0] != 10*ms {
		t.Fatalf("released %v, want [10ms]", got)
	}
	if err := m.SetCut(m.Released()); err != nil { // hold
		t.Fatal(err)
	}
	if got := both(2*ms, 3, 20*ms); len(got) != 0 {
		t.Fatalf("held, released %v", got)
	}
	if err := m.SetCut(15 * ms); err != nil {
		t.Fatal(err)
	}
	if got, _ := releasedSteps(m.Step(3*ms, Tick{})); len(got) != 1 || got[0] != 15*ms || m.Released() != 15*ms {
		t.Fatalf("cut at 15ms: released %v (watermark %d)", got, m.Released())
	}
	// Input 1 goes silent while input 0 brings data: with a cut set
	// nothing goes out tentatively, however long it waits.
	for k := range 10 {
		now := int64(4+k*20) * ms
		s, tent := releasedSteps(m.Step(now, Deliver{Input: 0, Upstream: Stable, Tuples: []tuple.Tuple{
			{Type: tuple.Stable, ID: uint64(10 + 2*k), STime: int64(25+k) * ms}, {Type: tuple.Boundary, ID: uint64(11 + 2*k), STime: int64(26+k) * ms}}}))
		if tent || len(s) > 0 {
			t.Fatalf("under a cut at %dms: released %v tentative %v", now/ms, s, tent)
		}
	}
	if m.NextDeadline() < 300*ms && m.NextDeadline() <= m.now {
		t.Fatalf("next deadline %d is already past under a cut (the run loop would spin)", m.NextDeadline())
	}
	if err := m.SetCut(math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	acts := m.Step(400*ms, Tick{})
	if _, tent := releasedSteps(acts); !tent || !m.Tentative() {
		t.Fatalf("cut lifted, input 1 silent past the share: no tentative release (%v)", acts)
	}
	if err := m.SetCut(m.Released()); !errors.Is(err, ErrNotStable) {
		t.Fatalf("cut while tentative: %v, want ErrNotStable", err)
	}
}
