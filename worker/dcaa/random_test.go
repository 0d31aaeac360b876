package dcaa

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Seeded random failure scripts: silent cuts of one or every replica of a
// source partition, refused (killed and later restarted) source
// replicas, and cuts between the replicas of the stage (their
// permission messages), overlapping at random. Whatever happens, in the
// end every replica's stable output is the reference's, tuple for tuple,
// every correction is well formed, no two replicas stabilize at once,
// and no result reached the best replica later than X after the
// reference (plus tick granularity).
func TestRandomFailures(t *testing.T) {
	seeds := 16
	if testing.Short() {
		seeds = 6
	}
	recovered := 0 // runs where some replica went tentative and back
	defer func() {
		if !t.Failed() && recovered == 0 {
			t.Fatal("no run produced a tentative result: the failures tested nothing")
		}
	}()
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			var events []string
			script := func(h *harness, st *stage) {
				for range 1 + rng.IntN(4) {
					from := 100 + rng.Int64N(900)
					d := 10 + rng.Int64N(300)
					p := rng.IntN(2)
					switch rng.IntN(4) {
					case 0: // every replica of partition p silent
						h.cutSource(st, p, from, from+d)
						events = append(events, fmt.Sprintf("cut src%d %d+%d", p, from, d))
					case 1: // one replica silent towards one stage replica
						r, s := rng.IntN(2), rng.IntN(2)
						key := fmt.Sprintf("agg/r%d<src%d/r%d", r, p, s)
						h.at(from, func(h *harness) { h.cut[key] = true })
						h.at(from+d, func(h *harness) { h.cut[key] = false })
						events = append(events, fmt.Sprintf("cut %s %d+%d", key, from, d))
					case 2: // a source replica killed, restarted later
						name := fmt.Sprintf("src%d/r%d", p, rng.IntN(2))
						h.at(from, func(h *harness) { h.dead[name] = true })
						h.at(from+d, func(h *harness) { h.dead[name] = false })
						events = append(events, fmt.Sprintf("kill %s %d+%d", name, from, d))
					case 3: // the stage replicas cannot talk
						h.at(from, func(h *harness) { h.cut["agg/r0<agg/r1"], h.cut["agg/r1<agg/r0"] = true, true })
						h.at(from+d, func(h *harness) { h.cut["agg/r0<agg/r1"], h.cut["agg/r1<agg/r0"] = false, false })
						events = append(events, fmt.Sprintf("split peers %d+%d", from, d))
					}
				}
			}
			sc := scenario{parts: 2, k: 2, endMs: 1400, runMs: 2200, build: oneStage(xBound, detect, 1+rng.IntN(3)), script: script}
			ref, got, _ := sc.run(t)
			t.Logf("failures: %v; tentative tuples per replica: %d, %d", events, got.reps[0].view.Tentative, got.reps[1].view.Tentative)
			checkStable(t, ref, got)
			for _, r := range got.reps {
				checkCorrectionOrder(t, r)
			}
			if got.reps[0].m.Figures().Recoveries+got.reps[1].m.Figures().Recoveries > 0 {
				recovered++
			}
			a, b := got.reps[0], got.reps[1]
			for i := range a.states {
				if a.states[i] == Stabilization && b.states[i] == Stabilization {
					// Allowed only when the peers could not reach each
					// other (a permission request timed out).
					if !peersSplit(events) {
						t.Fatalf("both replicas stabilizing at %d ms", i+1)
					}
				}
			}
			if lat := addedLatency(got, ref); lat > int64(xBound)+slack {
				t.Fatalf("added latency %v > X", time.Duration(lat))
			}
		})
	}
}

func peersSplit(events []string) bool {
	for _, e := range events {
		if len(e) > 5 && e[:5] == "split" {
			return true
		}
	}
	return false
}
