package dcaa

import "slices"

// Waiting is how many tuples input i brought that wait, unreleased, for
// other inputs: its stable data below its own stable boundary and its
// tentative data below its own coverage. The runtime stops taking the
// input's batches while that is at its bound (flow control: the
// upstream's output buffer fills and holds the upstream back), so what
// the machine holds for release stays within the bound per input
// whatever the failure: a strict query (which never releases
// tentatively), a rescale's hold, or a share of X longer than the
// buffer lasts.
//
// Only data the input covers counts: data above its own boundary waits
// for that input's next boundary, which must be taken for anything to
// move, so stopping the input for it could stop the task for good. The
// input furthest behind therefore never waits (the stable merge's rule:
// see runtime's merger.add).
func (m *Machine) Waiting(i int) int {
	in := m.inputs[i]
	n := 0
	if in.stableB > m.released {
		n = in.from(in.stableB) - in.from(m.released)
	}
	if len(in.tent) > 0 {
		cov := in.coverage()
		for k := range in.tent {
			if in.tent[k].STime < cov {
				n++
			}
		}
	}
	return n
}

// stepsBelow is how many of the input's stable steps are below w (steps
// are kept in increasing order).
func (in *inputState) stepsBelow(w int64) int {
	k, _ := slices.BinarySearch(in.steps, w)
	return k
}
