package coordinator

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// parallelTests is how many of this package's tests run at once (all but
// eight call t.Parallel). They mostly wait: for Raft elections, leases,
// heartbeat timeouts and gossip, with one or two CPUs busy at most for
// short spells; run one after another they took 7.8 minutes on 2 cores
// while using 1.7 minutes of CPU. testing's default, GOMAXPROCS, would
// overlap only two of them on such a machine. Each test has its own
// clusters on port-0 listeners, its own temporary directories and no
// package-level state to share (fakeWorkerPort is atomic).
//
// The exception: the tests that run real workers (the cross-org tests'
// two orgs of two workers each, with queries generating 20000 records a
// second) keep a core busy for most of their run, and their timings leave
// little room (a 2 s heartbeat TTL, a 3 s partner timeout, a move's new
// copy catching up within 36 s). Run beside the others on a 2-core
// machine other work loaded, cross-org moves rolled back
// (TestCrossOrgSinkAtPartnerIsTailed, TestCrossOrgDeadPartnerTasksComeHome).
// They stay serial: go test runs the serial tests first, one at a time,
// and the parallel ones after them. So do
// TestPlanFieldsWaitForEveryCoordinator, whose plan once waited out its
// deadline when run beside the others, and TestTokensInCluster, which
// does not retry a call a leader change interrupts. Four at a time: with
// six, a leader changed under TestTokensInCluster at load 2; fewer at
// once leave each more CPU, and the package is no longer make test's
// longest either way.
const parallelTests = 4

// TestMain raises -test.parallel to parallelTests unless the command line
// sets it: -parallel 1 runs the tests one at a time (with
// FEDSTREAM_TEST_LOG set, so that their logs do not interleave).
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelTests)); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
