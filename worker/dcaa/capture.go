package dcaa

import (
	"errors"
	"slices"

	"github.com/fedstream/fedstream/worker/tuple"
)

// InputCapture is one input's part of a Capture.
type InputCapture struct {
	// LastStable is the id of the last stable tuple or boundary
	// received: a copy resumes after it.
	LastStable uint64
	// StableBoundary is the highest stable boundary received; Steps the
	// stable boundary values above the release watermark, increasing.
	StableBoundary int64
	Steps          []int64
	// Pending is the stable data received and not released, in order.
	Pending []tuple.Tuple
}

// ErrNotCapturable: the machine holds tentative state (or replays), which
// a copy could not correct; capture it once it is stable again.
var ErrNotCapturable = errors.New("dcaa: the replica holds tentative state or is reconciling")

// Capture returns what a copy of this replica needs to continue from the
// same point (a task snapshot between two events): the release watermark
// and each input's position and pending stable data. Only while the
// operators hold no tentative state.
func (m *Machine) Capture() (released int64, inputs []InputCapture, err error) {
	if m.tentative || m.replaying {
		return 0, nil, ErrNotCapturable
	}
	for _, in := range m.inputs {
		// Deep copies: the kept tuples' memory (and their values') may
		// go back to the decoder's pool before the capture is encoded.
		pending := make([]tuple.Tuple, 0, in.stable.len())
		in.stable.each(func(t *tuple.Tuple) { pending = append(pending, *t.Clone()) })
		inputs = append(inputs, InputCapture{LastStable: in.lastStable, StableBoundary: in.stableB,
			Steps: slices.Clone(in.steps), Pending: pending})
	}
	return m.released, inputs, nil
}

// Resume starts a new machine from a Capture (before Start).
func (m *Machine) Resume(released int64, inputs []InputCapture) error {
	if len(inputs) != len(m.inputs) {
		return errors.New("dcaa: resume: the capture has another number of inputs")
	}
	m.released = released
	for i, c := range inputs {
		in := m.inputs[i]
		in.lastStable, in.stableB = c.LastStable, c.StableBoundary
		in.steps = slices.Clone(c.Steps)
		// A boundary above the watermark is among the steps; one that is
		// not was the input's floor (AddInput).
		in.floored = c.StableBoundary > released && !slices.Contains(in.steps, c.StableBoundary)
		m.dropKept(in, in.stable.len())
		for _, t := range c.Pending {
			in.addStable(t)
		}
	}
	return nil
}
