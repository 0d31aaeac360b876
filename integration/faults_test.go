package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCutLinkBetweenWorkerProcesses: workers started with --faults-file
// (the same file for all); while the replicated ward query runs, the
// file cuts every worker's data-plane connections to the worker running
// replica 0 of a keyed aggregate partition. Its consumers switch to
// replica 1 and every result the CLI tail prints equals the reference,
// once; the other workers log the cut subscriptions.
func TestCutLinkBetweenWorkerProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	want := wardReference(t, pacedWard, 100*time.Millisecond)
	faults := filepath.Join(t.TempDir(), "faults")
	o := startOrg(t, 1, 3, "--faults-file", faults)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// The query has no end, as in TestHeldLinkBetweenWorkerProcesses
	// (there, why): with the reference's 10 s of input the cut came after
	// every subscription had ended, and none failed on it (1 run of 4,
	// four copies of the DCAA tests at load 100-200).
	w := startWardQuery(ctx, t, o, endlessWard)
	const lost = "ward/per_patient/p0/r0"
	cut := ""
	got := w.results(t, len(want), func(n int) {
		if cut != "" || n < len(want)/4 {
			return
		}
		id := w.tasks(t)[lost].Worker
		ws := o.workerListNow(t)
		for _, wk := range ws {
			if wk.ID == id {
				cut = wk.Addr
			}
		}
		if cut == "" {
			t.Fatalf("no address for worker %s", id)
		}
		if err := os.WriteFile(faults, []byte("cut "+cut+" reset\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if cut == "" {
		t.Fatal("the link was never cut: the test would prove nothing")
	}
	sameWard(t, got, want)
	waitFor(t, 10*time.Second, "a subscription failing on the cut link in some worker's log", func() bool {
		for _, p := range o.workers {
			if strings.Contains(p.out.String(), "link cut by fault injection") {
				return true
			}
		}
		return false
	})
	for _, p := range o.workers {
		if !strings.Contains(p.out.String(), "FAULT INJECTION") {
			t.Fatalf("%s did not log that it obeys a fault file", p.name)
		}
	}
}
