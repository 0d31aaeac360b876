package coordinator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// forwarder sends writes that reach a follower on to the leader.
type forwarder struct {
	s     *Server
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func newForwarder(s *Server) *forwarder {
	return &forwarder{s: s, conns: map[string]*grpc.ClientConn{}}
}

// conn returns the connection to the coordinator leaderID at addr. Under
// mTLS the connection accepts only a server whose certificate the org CA
// signed for fedstream://ORG/coordinator/LEADER-ID: addr comes from serf,
// which anyone holding the gossip key can write to, but the identity comes
// from Raft, so a forwarded call (and the tokens it carries) reaches the
// leader or nobody.
func (f *forwarder) conn(addr, leaderID string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := leaderID + "@" + addr
	if c, ok := f.conns[key]; ok {
		return c, nil
	}
	var opts []grpc.DialOption
	if creds := f.s.cfg.TLS; creds != nil {
		opts = append(opts, creds.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}, Name: leaderID}))
	}
	c, err := rpc.Dial(addr, "", opts...)
	if err != nil {
		return nil, err
	}
	f.conns[key] = c
	return c, nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for addr, c := range f.conns {
		if err := c.Close(); err != nil {
			f.s.logger.Debug("close connection to leader", "addr", addr, "err", err)
		}
	}
	f.conns = map[string]*grpc.ClientConn{}
}

// errNoLeader is returned when no leader became known within the hold
// (holdUntil).
var errNoLeader = status.Error(codes.Unavailable, "no coordinator leader is known: the org's cluster has no quorum or is electing; retry")

// leaderOrForward runs local when this node is the leader and its set-up
// ran in this term; otherwise it forwards the call to the leader, holding
// it up to ForwardWait while no leader is known or this node, elected,
// has not yet applied what its predecessor committed (its barrier), and
// never past a quarter of the caller's time before its deadline (see
// holdUntil). It returns handled=true when the call was forwarded or
// refused.
func (s *Server) leaderOrForward(ctx context.Context, method string, req, resp proto.Message) (handled bool, err error) {
	deadline := holdUntil(ctx, time.Now(), s.cfg.Timings.ForwardWait)
	for {
		if s.IsLeader() {
			if s.setUpTerm.Load() == s.raft.CurrentTerm() {
				return false, nil
			}
			// Elected, barrier not done: wait below, as for an unknown leader.
			if h := s.cfg.hooks.heldForSetUp; h != nil {
				h()
			}
		} else if leaderAddr, leaderID := s.raft.LeaderWithID(); leaderID != "" && string(leaderID) != s.cfg.NodeID {
			if isForwarded(ctx) {
				return true, status.Error(codes.Unavailable, "leadership changed while the call was being forwarded; retry")
			}
			if addrs := s.grpcAddrsOf(string(leaderID), string(leaderAddr)); len(addrs) > 0 {
				return true, s.forwardTo(ctx, addrs, string(leaderID), method, req, resp)
			}
		}
		if time.Now().After(deadline) {
			return true, errNoLeader
		}
		select {
		case <-ctx.Done():
			return true, status.FromContextError(ctx.Err()).Err()
		case <-s.ctx.Done():
			return true, status.Error(codes.Unavailable, "coordinator is shutting down")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// holdUntil is when a call held while no leader can serve it (an
// election, a new leader's barrier) is answered errNoLeader: after wait,
// but a quarter of the caller's remaining time before its deadline at
// the latest. Unavailable says "retry", which a caller does, with a
// fresh deadline; a hold that ran out the caller's deadline answered
// DeadlineExceeded, which callers take as final. A call reaching one
// org's leader through another's (a federation message) passes
// through two such holds: under load, with both orgs electing, a
// proposal delivered to a partner without a leader was held 5 s by each
// of its two coordinators in turn, and the proposer's 10 s call ended in
// DeadlineExceeded (TestFederationPoolTwoOrgsContract at load 30-50).
func holdUntil(ctx context.Context, now time.Time, wait time.Duration) time.Time {
	until := now.Add(wait)
	if dl, ok := ctx.Deadline(); ok {
		if early := dl.Add(-dl.Sub(now) / 4); early.Before(until) {
			until = early
		}
	}
	return until
}

// forwardTo sends the call to the leader leaderID, trying the gRPC
// addresses serf gives for that id in turn: one that fails the TLS
// handshake (an impostor: it cannot show the leader's certificate) is
// skipped, and the call never reaches it.
func (s *Server) forwardTo(ctx context.Context, addrs []string, leaderID, method string, req, resp proto.Message) error {
	in, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{forwardedKey: []string{s.cfg.NodeID}}
	if v := in.Get("authorization"); len(v) > 0 {
		out.Set("authorization", v...)
	}
	// The leader sees this coordinator as the peer; it learns who the
	// caller was from here (see callerIdentity), and trusts it only
	// because the peer proved it is a coordinator of the org.
	if id, ok := s.callerIdentity(ctx); ok {
		out.Set(callerKey, id.String())
	}
	octx := metadata.NewOutgoingContext(ctx, out)
	s.metrics.forwarded.WithLabelValues(methodName(method)).Inc()
	var err error
	for _, addr := range addrs {
		var conn *grpc.ClientConn
		conn, err = s.forwarder.conn(addr, leaderID)
		if err != nil {
			err = status.Errorf(codes.Unavailable, "dial leader %s at %s: %v", leaderID, addr, err)
			continue
		}
		err = conn.Invoke(octx, method, req, resp)
		if status.Code(err) == codes.Unavailable && conn.GetState() == connectivity.TransientFailure {
			s.logger.Warn("leader address did not prove the leader's identity; skipping it", "leader", leaderID, "addr", addr, "err", err)
			continue
		}
		return err
	}
	return err
}

// apply commits one command through Raft on the leader and returns the
// FSM's result. Errors are gRPC statuses.
func (s *Server) apply(ctx context.Context, t fsm.MessageType, body any) (*fsm.ApplyResult, error) {
	if h := s.cfg.hooks.command; h != nil {
		body = h(t, body)
	}
	if err := s.canPropose(t); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	buf, err := fsm.Encode(t, body)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode command: %v", err)
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	start := time.Now()
	var fut raft.ApplyFuture = s.raft.Apply(buf, timeout)
	if h := s.cfg.hooks.applyFuture; h != nil {
		fut = h(t, fut)
	}
	// The wait ends with ctx too: raft may never answer (see awaitFuture),
	// and the leader's loops, whose ctx Server.Shutdown cancels before it
	// waits for them, commit through here.
	if err := awaitFuture(ctx, fut); err != nil {
		switch {
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return nil, status.Errorf(status.FromContextError(err).Code(), "gave up waiting for the commit; the write may or may not have committed, retry with the same idempotency key: %v", err)
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return nil, status.Errorf(codes.Unavailable, "leadership lost while committing; the write may or may not have committed, retry with the same idempotency key: %v", err)
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return nil, status.Errorf(codes.DeadlineExceeded, "commit timed out: %v", err)
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, status.Error(codes.Unavailable, "coordinator is shutting down")
		}
		return nil, status.Errorf(codes.Internal, "raft apply: %v", err)
	}
	s.metrics.commit.Observe(time.Since(start).Seconds())
	res, ok := fut.Response().(*fsm.ApplyResult)
	if !ok {
		return nil, status.Errorf(codes.Internal, "unexpected FSM response %T", fut.Response())
	}
	return res, nil
}
