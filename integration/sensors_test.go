package integration

import (
	"context"
	"testing"
	"time"

	"github.com/fedstream/fedstream/coordinator"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestSensorWindowsReachTheLeaderAsTheyClose: with a heartbeat TTL of 20 s
// (a heartbeat every 5 s), the leader still receives every task's figures
// per sensor window (250 ms here), each soon after it closed: two
// successive figures of a task that query stats shows are one window
// apart, not one heartbeat interval.
func TestSensorWindowsReachTheLeaderAsTheyClose(t *testing.T) {
	t.Parallel()
	o := newLiveOrgWith(t, 1, func(c *coordinator.Config) {
		c.Timings.HeartbeatTTL = 20 * time.Second
	})
	o.submit(t, "sw", 1)
	var prev *pb.TaskStats
	deadline := time.Now().Add(60 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no two successive windows of sw/counts/p0/r0 one window apart; last seen %v", prev)
		}
		resp, err := o.admin.QueryStats(context.Background(), &pb.QueryStatsRequest{Query: "sw"})
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range resp.Tasks {
			if ts.Task != "sw/counts/p0/r0" || ts.ReportedAtMs == 0 {
				continue
			}
			if ts.WindowMs != 250 {
				t.Fatalf("window %d ms, want the worker's 250 ms sensor window: %v", ts.WindowMs, ts)
			}
			if prev != nil && ts.ReportedAtMs > prev.ReportedAtMs {
				// Under a loaded machine a tick may come late, or a poll
				// miss a window: a heartbeat interval (5 s) apart would
				// still be far more than this.
				if gap := ts.ReportedAtMs - prev.ReportedAtMs; gap <= 1000 {
					return
				}
			}
			prev = ts
		}
		time.Sleep(50 * time.Millisecond) // polling interval, not synchronisation
	}
}
