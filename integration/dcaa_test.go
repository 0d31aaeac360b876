package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHeldLinkBetweenWorkerProcesses: as TestCutLinkBetweenWorkerProcesses,
// but the links to the worker running replica 0 of a keyed aggregate
// partition are held (bytes stop, nothing fails: a network partition or a
// paused process). Before DCAA's failure detection nothing noticed and the
// consumers waited forever; now they hear no heartbeat, move to replica 1,
// and every result the CLI tail prints equals the reference, once. The
// query's status shows each task replica's DCAA state.
func TestHeldLinkBetweenWorkerProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	want := wardReference(t, pacedWard, 100*time.Millisecond)
	faults := filepath.Join(t.TempDir(), "faults")
	o := startOrg(t, 1, 3, "--faults-file", faults)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// The query has no end; its first results, as many as the
	// reference's, are compared. The hold is timed by the count tail
	// printed, and under load tail lags the query by seconds (its process
	// starts, connects, then reads the sink's buffer in a burst): with
	// the reference's 10 s of input, the hold came after every sink had
	// read its last input, nothing read across it, and no consumer could
	// detect it (1 run of 8, four copies of the DCAA tests at load 53).
	w := startWardQuery(ctx, t, o, endlessWard)
	const lost = "ward/per_patient/p0/r0"
	held := ""
	got := w.results(t, len(want), func(n int) {
		if held != "" || n < len(want)/4 {
			return
		}
		id := w.tasks(t)[lost].Worker
		ws := o.workerListNow(t)
		for _, wk := range ws {
			if wk.ID == id {
				held = wk.Addr
			}
		}
		if held == "" {
			t.Fatalf("no address for worker %s", id)
		}
		if err := os.WriteFile(faults, []byte("cut "+held+" hold\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if held == "" {
		t.Fatal("the link was never held: the test would prove nothing")
	}
	sameWard(t, got, want)
	waitFor(t, 10*time.Second, "a consumer in some worker's log taking the held replica for failed", func() bool {
		for _, p := range o.workers {
			if strings.Contains(p.out.String(), "silent past the detection timeout") {
				return true
			}
		}
		return false
	})
	_ = os.WriteFile(faults, nil, 0o644)

	var q struct {
		Tasks []struct {
			ID           string `json:"id"`
			ReplicaState string `json:"replica_state"`
		} `json:"tasks"`
	}
	waitFor(t, 20*time.Second, "every task replica reporting its DCAA state", func() bool {
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		defer qcancel()
		if err := cli(qctx, t, &q, "query", "status", "ward", "--addr", o.grpc[0], "--token", o.adminToken); err != nil {
			t.Fatal(err)
		}
		for _, tk := range q.Tasks {
			switch tk.ReplicaState {
			case "STABLE", "UP_FAILURE", "STABILIZATION":
			default:
				return false
			}
		}
		return len(q.Tasks) > 0
	})
}
