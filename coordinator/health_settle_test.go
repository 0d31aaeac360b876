package coordinator

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator/health"
)

// TestHealthEvaluatesRescaleOnlyOnceFinished: a rescale still under way
// (past its go, its tasks working through their backlog to the cut) is
// not judged, however long past its settling time: its action stays
// pending, and is due a settling time after the rescale is seen to have
// finished, on a window from after it. Before, the action was judged (and
// its pair counted) while the rescale went on.
func TestHealthEvaluatesRescaleOnlyOnceFinished(t *testing.T) {
	t.Parallel()
	settle := 30 * time.Second
	full := func() []health.Sample {
		out := make([]health.Sample, health.DefaultConfig().MinSamples)
		for i := range out {
			out[i] = health.Sample{Instances: []health.Instance{{InRate: 100, Busy: 0.5}}}
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		action   string
		underWay bool
		judged   bool
	}{
		{"scale-up under way", health.ActScaleUp, true, false},
		{"scale-down under way", health.ActScaleDown, true, false},
		{"rebalance under way", health.ActRebalanceSlots, true, false},
		{"scale-up finished", health.ActScaleUp, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			l := &healthLoop{s: s, cfg: HealthConfig{Settle: settle}, queries: map[string]*healthQuery{},
				underWay: func(q, f string) bool { return tc.underWay && q == "wc" && f == "splitter" }}
			l.cfg.fill()
			hq := l.query("wc")
			start := time.Now()
			hq.pending = &pendingHealth{id: "a", fragment: "splitter", diagnosis: health.DiagUnderProvisioned, action: tc.action, due: start}
			hq.window["splitter"] = full()
			q := &health.Query{Name: "wc", Fragments: []health.Fragment{{Name: "splitter", Parallelism: 1, Scalable: true, Samples: hq.window["splitter"]}}}
			// Three settling times late: before, the action was judged.
			now := start.Add(3 * settle)
			judged := func() (wrote bool) {
				// Judging writes the outcome to the Raft log, which this
				// bare server does not have: reaching it is the verdict.
				defer func() {
					if recover() != nil {
						wrote = true
					}
				}()
				l.evaluate(context.Background(), "wc", hq, q, now)
				return hq.pending == nil
			}()
			if judged != tc.judged {
				t.Fatalf("judged %v, want %v", judged, tc.judged)
			}
			if tc.judged {
				return
			}
			if hq.pending == nil || !hq.pending.due.Equal(now.Add(settle)) || !hq.quietUntil.Equal(now.Add(settle)) || len(hq.window) != 0 {
				t.Fatalf("pending %+v quiet until %v window %d: want still pending, due and quiet until a settling time from now, window restarted",
					hq.pending, hq.quietUntil, len(hq.window))
			}
		})
	}
}
