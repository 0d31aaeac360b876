package coordinator

import (
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/rpctest"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// A client idle on the coordinator's port and pinging at the policy's
// minimum interval is never sent a too_many_pings GoAway (grpc's default
// server minimum is 5 minutes; clients ping every 30 s).
func TestCoordinatorAcceptsClientKeepalive(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	tlsConf := testCreds(t, c.ca, rpc.RoleClient, "test").ClientConfig(tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}})
	interval := rpc.DefaultKeepalive.MinPingInterval + 200*time.Millisecond
	if err := rpctest.IdlePings(c.cfgs[l].GRPCAddr, tlsConf, interval, 4); err != nil {
		t.Fatalf("idle pings every %v: %v", interval, err)
	}
}
