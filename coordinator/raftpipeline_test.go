package coordinator

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/rpc"
)

// TestRaftReplicationIsNotPipelined: the coordinator's Raft transport
// refuses append pipelines, so raft replicates without them (see the
// comment in setupRaft: a pipeline can wedge a follower's replication and
// raft.Shutdown for ever). The peer is a real transport over the org's
// mutual TLS, so a pipeline would open if the transport allowed one.
func TestRaftReplicationIsNotPipelined(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[c.leader()]
	layer, err := newTLSStreamLayer("127.0.0.1:0", testCreds(t, c.ca, rpc.RoleCoordinator, "c9"), nil)
	if err != nil {
		t.Fatal(err)
	}
	peer := raft.NewNetworkTransport(layer, 2, 10*time.Second, io.Discard)
	t.Cleanup(func() { _ = peer.Close() })
	p, err := s.transport.AppendEntriesPipeline("c9", peer.LocalAddr())
	if err == nil {
		_ = p.Close()
		t.Fatal("the Raft transport opened an append pipeline")
	}
	if !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("pipeline refused with %v, want ErrPipelineReplicationNotSupported", err)
	}
	// Replication without pipelines is what every multi-node cluster test
	// runs on.
}
