package coordinator

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// ListRaftPeers returns the Raft configuration as this coordinator knows
// it (a read: any coordinator answers).
func (as *adminService) ListRaftPeers(ctx context.Context, _ *pb.ListRaftPeersRequest) (*pb.ListRaftPeersResponse, error) {
	s := as.s
	cf := s.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, status.Errorf(codes.Unavailable, "raft configuration: %v", err)
	}
	_, leaderID := s.raft.LeaderWithID()
	resp := &pb.ListRaftPeersResponse{LeaderId: string(leaderID)}
	for _, srv := range cf.Configuration().Servers {
		resp.Peers = append(resp.Peers, &pb.Peer{Id: string(srv.ID), Addr: string(srv.Address), Suffrage: srv.Suffrage.String()})
	}
	return resp, nil
}

// RemoveRaftPeer removes a server from the Raft configuration (on the
// leader; a follower forwards). A coordinator that is still running and
// still in serf is added again by the leader as soon as it shows up, so
// this is for coordinators that are gone for good.
func (as *adminService) RemoveRaftPeer(ctx context.Context, req *pb.RemoveRaftPeerRequest) (*pb.RemoveRaftPeerResponse, error) {
	s := as.s
	if req.Id == "" {
		return nil, status.Error(codes.InvalidArgument, "remove-peer: the peer's id is required")
	}
	resp := &pb.RemoveRaftPeerResponse{}
	if handled, err := s.leaderOrForward(ctx, adminMethod+"RemoveRaftPeer", req, resp); handled {
		return resp, err
	}
	cf := s.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, status.Errorf(codes.Unavailable, "raft configuration: %v", err)
	}
	found := false
	for _, srv := range cf.Configuration().Servers {
		found = found || string(srv.ID) == req.Id
	}
	if !found {
		return nil, status.Errorf(codes.NotFound, "remove-peer: %q is not in the raft configuration (see operator raft list-peers)", req.Id)
	}
	if err := awaitFuture(ctx, s.raft.RemoveServer(raft.ServerID(req.Id), 0, 10*time.Second)); err != nil {
		return nil, status.Errorf(codes.Unavailable, "remove-peer %s: %v", req.Id, err)
	}
	s.logger.Warn("coordinator removed from the raft configuration by an operator", "id", req.Id)
	return resp, nil
}
