package operator

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The restore tests (from a stream, from arriving bytes) restore the
// same states the same ways and compare with Restore; this file holds
// what they share.

// restoreCase is an operator of snapshotCases, alone or chained behind
// the filter, and the state it holds after half of a random stream: what
// a restore test restores into a fresh copy (build) and compares with.
type restoreCase struct {
	seed    uint64
	chained bool
	build   func() Operator
	state   []byte
}

// forEachRestoreCase calls check, in a subtest per snapshot case, for
// three seeds of a random stream (r, seeded with the seed and stream, has
// drawn the events and is for check's own draws) and for the operator
// alone and, when it reads connSchema alone, chained behind the filter.
func forEachRestoreCase(t *testing.T, stream uint64, check func(t *testing.T, rc restoreCase, r *rand.Rand)) {
	for _, sc := range snapshotCases() {
		t.Run(sc.name, func(t *testing.T) {
			for seed := range uint64(3) {
				r := rand.New(rand.NewPCG(seed, stream))
				events := randomStream(r, sc.inputs, 300)
				for _, chained := range []bool{false, true} {
					if chained && (len(sc.inputs) != 1 || sc.inputs[0] != connSchema) {
						continue // the filter in front reads connSchema
					}
					build := func() Operator {
						op := mustNew(t, sc.def, sc.inputs...)
						if chained {
							return Chain(mustNew(t, snapshotCases()[0].def, connSchema), op)
						}
						return op
					}
					state := stateAfter(t, build(), events[:len(events)/2])
					check(t, restoreCase{seed: seed, chained: chained, build: build, state: state}, r)
				}
			}
		})
	}
}

// stateAfter feeds op the events and returns its snapshot.
func stateAfter(t *testing.T, op Operator, events []event) []byte {
	t.Helper()
	var f feeder
	f.feed(t, op, events, Collect())
	state, err := op.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return state
}

// slidingState is the state of the sliding aggregate of snapshotCases
// after 150 events of a random stream drawn from r: what the tests of
// broken-off restores restore, with its case.
func slidingState(t *testing.T, r *rand.Rand) (snapshotCase, []byte) {
	t.Helper()
	sc := snapshotCases()[5]
	return sc, stateAfter(t, mustNew(t, sc.def, sc.inputs...), randomStream(r, sc.inputs, 300)[:150])
}

// sameRestored fails unless op, restored, encodes to state: it holds
// exactly the state Restore gives. what names the restore and case.
func sameRestored(t *testing.T, op Operator, state []byte, what string) {
	t.Helper()
	again, err := op.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, state) {
		t.Fatalf("%s encodes differently", what)
	}
}
