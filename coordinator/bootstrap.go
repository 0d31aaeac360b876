package coordinator

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// Bootstrap. A node started with bootstrap_expect N and no Raft state
// bootstraps a new cluster only when all of these hold:
//
//  1. At least N coordinators of its org that expect N too are alive in
//     serf and have proved their identity on their Raft address
//     (verifyCoordinator): the candidate set, itself included.
//  2. Every proven coordinator of the org it sees (any bootstrap_expect)
//     answers RaftState, and none has Raft state (a log, a configuration
//     or a known leader). If one has, a cluster exists: this node never
//     bootstraps (for the life of the process) and waits for that
//     cluster's leader to add it (reconcileVoters), or, if it is already
//     in that cluster's configuration (it lost its data dir), for the
//     leader's replication to refill its log.
//  3. Every candidate reports the same candidate set as this node's. Each
//     node publishes its set at the start of an attempt and keeps it until
//     the attempt ends, bootstrapping or not, so two nodes that see each
//     other cannot bootstrap different sets: whichever asks second sees
//     either the other's set (equal, or it does not bootstrap) or its Raft
//     state.
//
// The configuration is the whole candidate set, not trimmed to N: all
// coordinators already there when the cluster forms are voters, as every
// later one will be once the leader adds it (Consul does the same). A
// coordinator that cannot be asked (down, unreachable, an older build
// without RaftState) holds bootstrap back until it can: bootstrapping
// without knowing whether it already belongs to a cluster could make a
// second one.
//
// What this cannot rule out: nodes whose serf views never overlap (a
// partitioned gossip pool) each see N others and bootstrap apart, as with
// any bootstrap_expect scheme; and a node that lost its data dir forgot
// the vote it cast in the current term (Raft's usual caveat for a wiped
// voter).

// probeTimeout bounds one RaftState call.
const probeTimeout = 3 * time.Second

// bootstrapRetry paces the bootstrap loop between membership changes.
var bootstrapRetry = retry.Policy{Initial: 250 * time.Millisecond, Max: 3 * time.Second}

// kickBootstrap wakes the bootstrap loop.
func (s *Server) kickBootstrap() {
	select {
	case s.bootstrapKick <- struct{}{}:
	default:
	}
}

// runBootstrap is the bootstrap loop: an attempt now, then one on every
// membership change and at a backoff, until this node has Raft state or
// found a cluster to join.
func (s *Server) runBootstrap(ctx context.Context) {
	if s.cfg.BootstrapExpect == 0 || s.bootstrapped {
		return
	}
	b := bootstrapRetry.New()
	for {
		if s.bootstrapAttempt(ctx) {
			return
		}
		t := time.NewTimer(b.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.bootstrapKick:
			b.Reset()
		case <-t.C:
		}
		t.Stop()
	}
}

// hasRaftState reports whether this node has a Raft log, snapshot or
// configuration.
func (s *Server) hasRaftState() bool {
	if s.raft.LastIndex() > 0 {
		return true
	}
	cf := s.raft.GetConfiguration()
	return cf.Error() == nil && len(cf.Configuration().Servers) > 0
}

// bootstrapPeer is one coordinator id of the org as the bootstrap sees it:
// its proven Raft address and the gRPC addresses serf members claiming the
// id advertise.
type bootstrapPeer struct {
	id, raftAddr string
	grpcAddrs    []string
	expect       int
}

// bootstrapView returns the proven coordinators of the org, sorted by id:
// the candidates (this node included) and the others (another
// bootstrap_expect; asked for their state, not part of the set).
func (s *Server) bootstrapView() (candidates, others []bootstrapPeer) {
	byID := map[string]*bootstrapPeer{}
	var order []string
	for _, m := range s.orgCoordinators() {
		if m.ID == "" {
			continue
		}
		if m.ID != s.cfg.NodeID {
			if err := s.verifyCoordinator(m); err != nil {
				s.logger.Warn("not counting serf member towards bootstrap", "member", m.Name, "err", err)
				continue
			}
		} else if m.RaftAddr != s.cfg.RaftAddr || m.Name != s.serf.LocalMember().Name {
			continue // someone else claiming this node's id
		}
		p, ok := byID[m.ID]
		if !ok {
			p = &bootstrapPeer{id: m.ID, raftAddr: m.RaftAddr, expect: m.Expect}
			byID[m.ID] = p
			order = append(order, m.ID)
		} else if p.raftAddr != m.RaftAddr || p.expect != m.Expect {
			// Two members proving the same id at different addresses (a
			// restart racing its old entry): undecidable until serf
			// settles; leave the id out of this attempt.
			s.logger.Warn("two serf members prove the same coordinator id differently; waiting for serf to settle",
				"id", m.ID, "raft_addrs", []string{p.raftAddr, m.RaftAddr})
			p.raftAddr = ""
		}
		p.grpcAddrs = append(p.grpcAddrs, m.GRPCAddr)
	}
	sort.Strings(order)
	for _, id := range order {
		p := byID[id]
		switch {
		case p.raftAddr == "":
		case p.expect == s.cfg.BootstrapExpect:
			candidates = append(candidates, *p)
		default:
			if p.expect != 0 {
				s.logger.Error("coordinator of this org expects a different cluster size; not counting it",
					"id", p.id, "its_expect", p.expect, "our_expect", s.cfg.BootstrapExpect)
			}
			others = append(others, *p)
		}
	}
	return candidates, others
}

// bootstrapAttempt is one attempt; it returns true when the loop is done
// (this node has Raft state, bootstrapped, or found a cluster to join).
func (s *Server) bootstrapAttempt(ctx context.Context) bool {
	if s.hasRaftState() {
		s.bootstrapped = true
		s.logger.Info("raft state present (added to a cluster); bootstrap not needed")
		return true
	}
	candidates, others := s.bootstrapView()
	ids := make([]string, len(candidates))
	for i, p := range candidates {
		ids[i] = p.id
	}
	// Published for the whole attempt (see the rules above).
	s.candidates.Store(&ids)
	if len(candidates) < s.cfg.BootstrapExpect {
		return false
	}
	for _, p := range append(slices.Clone(candidates), others...) {
		if p.id == s.cfg.NodeID {
			continue
		}
		st, err := s.probeRaftState(ctx, p)
		if err != nil {
			s.logger.Warn("cannot ask a coordinator whether it belongs to a raft cluster; not bootstrapping yet", "id", p.id, "err", err)
			return false
		}
		if st.LastIndex > 0 || len(st.Configuration) > 0 || st.LeaderId != "" {
			s.bootstrapped = true
			s.logger.Info("a coordinator of this org already belongs to a raft cluster; not bootstrapping: waiting for that cluster's leader to add this node",
				"peer", p.id, "peer_last_index", st.LastIndex, "peer_term", st.Term, "leader", st.LeaderId, "configuration", st.Configuration)
			return true
		}
		if p.expect == s.cfg.BootstrapExpect && !slices.Equal(st.BootstrapCandidates, ids) {
			s.logger.Debug("coordinators do not see the same bootstrap set yet; waiting",
				"peer", p.id, "peer_set", st.BootstrapCandidates, "our_set", ids)
			return false
		}
	}
	voters := make([]raft.Server, len(candidates))
	for i, p := range candidates {
		voters[i] = raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.id), Address: raft.ServerAddress(p.raftAddr)}
	}
	err := s.raft.BootstrapCluster(raft.Configuration{Servers: voters}).Error()
	if err == raft.ErrCantBootstrap {
		// State appeared meanwhile (a leader's entries arrived).
		s.bootstrapped = true
		return true
	}
	if err != nil {
		s.logger.Error("raft bootstrap failed; retrying", "err", err)
		return false
	}
	s.bootstrapped = true
	s.selfBootstrapped.Store(true)
	s.logger.Info("raft cluster bootstrapped", "voters", ids)
	return true
}

// probeRaftState asks the coordinator p for its Raft state, trying the
// gRPC addresses members claiming its id advertise. Under mTLS only the
// certificate of coordinator p.id of this org is accepted, so an answer
// comes from that coordinator or from nobody.
func (s *Server) probeRaftState(ctx context.Context, p bootstrapPeer) (*pb.RaftStateResponse, error) {
	var opts []grpc.DialOption
	if s.cfg.TLS != nil {
		opts = append(opts, s.cfg.TLS.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}, Name: p.id}))
	}
	var errs []error
	for _, addr := range p.grpcAddrs {
		if addr == "" {
			continue
		}
		resp, err := s.callRaftState(ctx, addr, opts)
		if err == nil && resp.NodeId != p.id {
			err = fmt.Errorf("answered as %q", resp.NodeId)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("coordinator %s advertises no gRPC address", p.id)
	}
	return nil, fmt.Errorf("coordinator %s: %v", p.id, errs)
}

func (s *Server) callRaftState(ctx context.Context, addr string, opts []grpc.DialOption) (*pb.RaftStateResponse, error) {
	conn, err := rpc.Dial(addr, "", opts...)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := conn.Close(); err != nil {
			s.logger.Debug("close probe connection", "addr", addr, "err", err)
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return pb.NewCoordinatorPeerServiceClient(conn).RaftState(cctx, &pb.RaftStateRequest{})
}

// peerService answers other coordinators of the org (rpc/authz:
// NeedCoordinator). It never forwards: each node speaks for itself.
type peerService struct {
	pb.UnimplementedCoordinatorPeerServiceServer
	s *Server
}

// RaftState reports this node's Raft state and bootstrap candidate set.
func (p *peerService) RaftState(context.Context, *pb.RaftStateRequest) (*pb.RaftStateResponse, error) {
	s := p.s
	resp := &pb.RaftStateResponse{
		NodeId:          s.cfg.NodeID,
		LastIndex:       s.raft.LastIndex(),
		Term:            s.raft.CurrentTerm(),
		BootstrapExpect: int32(s.cfg.BootstrapExpect),
	}
	if cf := s.raft.GetConfiguration(); cf.Error() == nil {
		for _, srv := range cf.Configuration().Servers {
			resp.Configuration = append(resp.Configuration, string(srv.ID))
		}
	}
	if _, id := s.raft.LeaderWithID(); id != "" {
		resp.LeaderId = string(id)
	}
	if c := s.candidates.Load(); c != nil {
		resp.BootstrapCandidates = *c
	}
	return resp, nil
}
