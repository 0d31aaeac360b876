package integration

import (
	"testing"
	"time"
)

// TestKillLeaderProcess: 3 coordinator and 2 worker processes; SIGKILL the
// leader; a surviving coordinator must report a new leader and both workers
// ready within 10 seconds.
func TestKillLeaderProcess(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	o := startOrg(t, 3, 2)
	var leader string
	waitFor(t, 30*time.Second, "a leader and 2 ready workers", func() bool {
		st, err := o.status(t, 0)
		if err != nil || st.LeaderID == "" {
			return false
		}
		ws, err := o.workerList(t, 0)
		if err != nil {
			return false
		}
		ready := 0
		for _, w := range ws {
			if w.Status == "ready" {
				ready++
			}
		}
		leader = st.LeaderID
		return ready == 2
	})
	li := int(leader[1] - '1')
	o.coords[li].kill()
	survivor := (li + 1) % 3
	took := waitFor(t, 10*time.Second, "a new leader and both workers ready", func() bool {
		st, err := o.status(t, survivor)
		if err != nil || st.LeaderID == "" || st.LeaderID == leader {
			return false
		}
		ws, err := o.workerList(t, survivor)
		if err != nil || len(ws) != 2 {
			return false
		}
		for _, w := range ws {
			if w.Status != "ready" {
				return false
			}
		}
		return true
	})
	t.Logf("new leader and 2 ready workers reported %v after SIGKILL of %s", took, leader)
}
