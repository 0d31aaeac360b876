package dcaa

import (
	"testing"
)

// Two stages, every replica of a source partition cut for longer than
// X: both replicas of the first stage go tentative, then reconcile one
// at a time. The second stage's replica that reads the one reconciling
// second takes the first one's corrections in the background
// (Config.Background) and moves to it at its REC_DONE. Its stable
// output is still the reference's, tuple for tuple, and it is stable
// again no later than without the background subscription: with the
// coordinator's reports of the upstream replicas' states, and without
// (as in the runtime, where a task hears only the replicas it reads).
func TestBackgroundCorrectionsTwoStages(t *testing.T) {
	for _, reports := range []bool{false, true} {
		t.Run(map[bool]string{false: "in-band states only", true: "with reports"}[reports], func(t *testing.T) {
			backgroundTwoStages(t, reports)
		})
	}
}

func backgroundTwoStages(t *testing.T, reports bool) {
	shares, err := SplitDelay(xBound, []GraphNode{{Name: "src"}, {Name: "agg", Inputs: []string{"src"}, Delays: true},
		{Name: "agg2", Inputs: []string{"agg"}, Delays: true}})
	if err != nil {
		t.Fatal(err)
	}
	stableAgain := map[bool][]int64{} // per background: when each agg2 replica was last STABLE again
	for _, bg := range []bool{false, true} {
		build := func(h *harness) *stage {
			h.reports = reports
			first := h.addStage(stageOpts{name: "agg", window: "20ms", sum: "v", inSch: srcSchema,
				cfg: Config{Share: shares["agg"], Detect: detect, ReplayChunk: 1}}, h.srcGroups())
			return h.addStage(stageOpts{name: "agg2", window: "40ms", sum: "n", inSch: h.aggSchema(srcSchema, "v"),
				cfg: Config{Share: shares["agg2"], Detect: detect, Background: bg}}, [][]producer{first.producers()})
		}
		sc := scenario{parts: 2, k: 2, endMs: 900, runMs: 1300, build: build,
			script: func(h *harness, st *stage) { h.cutSource(h.stages[0], 0, 300, 600) }}
		ref, got, _ := sc.run(t)
		promotions := uint64(0)
		for _, r := range got.reps {
			if r.view.Tentative == 0 || r.view.Undos == 0 {
				t.Fatalf("background %v: %s: %d tentative, %d UNDO: the failure did not reach the second stage", bg, r.name(), r.view.Tentative, r.view.Undos)
			}
			checkCorrectionOrder(t, r)
			promotions += r.m.Figures().Promotions
			last := int64(0)
			for k := len(r.states) - 1; k > 0; k-- {
				if r.states[k] == Stable && r.states[k-1] != Stable {
					last = int64(k)
					break
				}
			}
			stableAgain[bg] = append(stableAgain[bg], last)
		}
		checkStable(t, ref, got)
		if bg && promotions == 0 {
			t.Fatal("no input took a stabilizing replica's corrections in the background")
		}
		if !bg && promotions != 0 {
			t.Fatalf("%d promotions without Config.Background", promotions)
		}
	}
	t.Logf("second stage stable again at tick (without, with background): %v, %v", stableAgain[false], stableAgain[true])
	for i := range stableAgain[true] {
		if stableAgain[true][i] > stableAgain[false][i] {
			t.Fatalf("agg2/r%d stable again at tick %d with the background subscription, %d without", i, stableAgain[true][i], stableAgain[false][i])
		}
	}
}
