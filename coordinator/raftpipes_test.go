package coordinator

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/rpc"
)

// fakeFollower is a raft transport on loopback that answers every
// AppendEntries with success, until the test ends; over mutual TLS as
// coordinator c9 of c's org when c is not nil.
func fakeFollower(t *testing.T, c *testCluster) *raft.NetworkTransport {
	t.Helper()
	var tr *raft.NetworkTransport
	if c == nil {
		var err error
		if tr, err = raft.NewTCPTransport("127.0.0.1:0", nil, 2, 10*time.Second, io.Discard); err != nil {
			t.Fatal(err)
		}
	} else {
		layer, err := newTLSStreamLayer("127.0.0.1:0", testCreds(t, c.ca, rpc.RoleCoordinator, "c9"), nil)
		if err != nil {
			t.Fatal(err)
		}
		tr = raft.NewNetworkTransport(layer, 2, 10*time.Second, io.Discard)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case rpc := <-tr.Consumer():
				rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done; _ = tr.Close() })
	return tr
}

// stuckPipelineSend opens a pipeline on tr to a follower and leaves a send
// blocked in it the way a leader's replication goroutine blocks once
// raft's pipelineDecode has stopped reading: the first response is never
// consumed, so the pipeline's decoder holds it and the second send waits
// for the decoder for ever. The returned channel yields that send's error.
func stuckPipelineSend(t *testing.T, tr raft.Transport, to raft.ServerAddress) <-chan error {
	t.Helper()
	p, err := tr.AppendEntriesPipeline("follower", to)
	if err != nil {
		t.Fatal(err)
	}
	req := func() *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 1}
	}
	if _, err := p.AppendEntries(req(), &raft.AppendEntriesResponse{}); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		_, err := p.AppendEntries(req(), &raft.AppendEntriesResponse{})
		res <- err
	}()
	return res
}

// TestTransportCloseFreesBlockedPipeline: closing the transport returns a
// send blocked in a pipeline (hashicorp/raft's own Close leaves it blocked
// for ever, and with it raft.Shutdown).
func TestTransportCloseFreesBlockedPipeline(t *testing.T) {
	follower := fakeFollower(t, nil)
	nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 10*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tr := newRaftTransport(nt)
	res := stuckPipelineSend(t, tr, follower.LocalAddr())
	select {
	case err := <-res:
		t.Fatalf("second send returned (%v) while the first response was unconsumed: the set-up does not block", err)
	default:
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err == nil {
			t.Fatal("blocked send succeeded after the transport closed")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("send still blocked 30s after the transport closed")
	}
	// A pipeline asked for after Close is refused.
	if _, err := tr.AppendEntriesPipeline("follower", follower.LocalAddr()); err == nil {
		t.Fatal("pipeline opened on a closed transport")
	}
}

// TestShutdownFreesBlockedRaftPipeline: Server.Shutdown returns and frees a
// send blocked in one of its Raft transport's pipelines.
func TestShutdownFreesBlockedRaftPipeline(t *testing.T) {
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[c.leader()]
	follower := fakeFollower(t, c)
	res := stuckPipelineSend(t, s.transport, follower.LocalAddr())
	stopped := make(chan error, 1)
	go func() { stopped <- s.Shutdown() }()
	select {
	case err := <-stopped:
		if err != nil && !errors.Is(err, raft.ErrRaftShutdown) {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Shutdown did not return within 60s")
	}
	select {
	case err := <-res:
		if err == nil {
			t.Fatal("blocked send succeeded after shutdown")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("send still blocked 30s after Shutdown returned")
	}
}
