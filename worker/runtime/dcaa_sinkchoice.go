package runtime

import (
	"time"

	"github.com/fedstream/fedstream/worker/dcaa"
)

// Which upstream replica a DCAA sink's input reads after a failure
// (issue 10 item 2: "another replica of that upstream in this
// preference: STABLE, then UP_FAILURE, then STABILIZATION"). A sink runs
// no DCAA machine, so it chooses as the machine's inputs do
// (dcaa.Preferred): not a replica that failed it recently (suspected for
// dcaa.Suspicion), then the best state the coordinator's hints give
// (taskHints; a replica it never heard of counts as Unknown), then the
// nearest number from its own. A replica's last hinted state may be
// stale (a killed worker reports nothing more, so its replicas stay
// STABLE in the hints): suspicion is what keeps the input from going
// back to it. With two replicas the choice is always the other replica,
// as the plain rotation had it.

// sinkChoice is a DCAA sink input's memory of the upstream replicas that
// failed it, owned by input.run.
type sinkChoice struct {
	fails   map[int]int       // replica -> failed subscriptions in a row
	suspect map[int]time.Time // replica -> when it last failed
}

// failed notes that replica r failed the input at now.
func (c *sinkChoice) failed(r int, now time.Time) {
	if c.fails == nil {
		c.fails, c.suspect = map[int]int{}, map[int]time.Time{}
	}
	c.fails[r]++
	c.suspect[r] = now
}

// delivered notes that replica r delivered: it is not suspected.
func (c *sinkChoice) delivered(r int) {
	delete(c.fails, r)
	delete(c.suspect, r)
}

// next is the index in cands of the replica the input reads next.
func (c *sinkChoice) next(in *input, cands []Placement, now time.Time) int {
	k := 0
	for _, pl := range cands {
		k = max(k, pl.Replica+1)
	}
	detect := in.t.detectTimeout()
	rank := func(r int) int {
		if h, ok := in.t.hints.get(hintKey{in.upstream, in.upPartition, r}); ok {
			return dcaa.Rank(h.state)
		}
		return dcaa.Rank(dcaa.Unknown)
	}
	suspected := func(r int) (bool, int64) {
		at, ok := c.suspect[r]
		if !ok {
			return false, 0
		}
		return now.Sub(at) < dcaa.Suspicion(detect, c.fails[r]), at.UnixNano()
	}
	placed := func(r int) int {
		for i, pl := range cands {
			if pl.Replica == r {
				return i
			}
		}
		return -1
	}
	// A replica number without a placement (not placed yet) is not a
	// choice: rank it last, suspected since ever.
	r := dcaa.Preferred(in.t.spec.Replica, k, func(r int) int {
		if placed(r) < 0 {
			return 1 << 20
		}
		return rank(r)
	}, func(r int) (bool, int64) {
		if placed(r) < 0 {
			return true, 1<<63 - 1
		}
		return suspected(r)
	})
	return max(placed(r), 0)
}
