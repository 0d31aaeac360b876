package coordinator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
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

func (f *forwarder) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.conns[addr]; ok {
		return c, nil
	}
	c, err := rpc.Dial(addr, "")
	if err != nil {
		return nil, err
	}
	f.conns[addr] = c
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

// errNoLeader is returned when no leader became known within ForwardWait.
var errNoLeader = status.Error(codes.Unavailable, "no coordinator leader is known: the org's cluster has no quorum or is electing; retry")

// leaderOrForward runs local when this node is the leader; otherwise it
// forwards the call to the leader, holding it up to ForwardWait while no
// leader is known. It returns handled=true when the call was forwarded.
func (s *Server) leaderOrForward(ctx context.Context, method string, req, resp proto.Message) (handled bool, err error) {
	deadline := time.Now().Add(s.cfg.Timings.ForwardWait)
	for {
		if s.IsLeader() {
			return false, nil
		}
		_, leaderID := s.raft.LeaderWithID()
		if leaderID != "" && string(leaderID) != s.cfg.NodeID {
			if isForwarded(ctx) {
				return true, status.Error(codes.Unavailable, "leadership changed while the call was being forwarded; retry")
			}
			addr := s.grpcAddrOf(string(leaderID))
			if addr != "" {
				return true, s.forwardTo(ctx, addr, method, req, resp)
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

func (s *Server) forwardTo(ctx context.Context, addr, method string, req, resp proto.Message) error {
	conn, err := s.forwarder.conn(addr)
	if err != nil {
		return status.Errorf(codes.Unavailable, "dial leader at %s: %v", addr, err)
	}
	in, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{forwardedKey: []string{s.cfg.NodeID}}
	if v := in.Get("authorization"); len(v) > 0 {
		out.Set("authorization", v...)
	}
	return conn.Invoke(metadata.NewOutgoingContext(ctx, out), method, req, resp)
}

// apply commits one command through Raft on the leader and returns the
// FSM's result. Errors are gRPC statuses.
func (s *Server) apply(ctx context.Context, t fsm.MessageType, body any) (*fsm.ApplyResult, error) {
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
	fut := s.raft.Apply(buf, timeout)
	if err := fut.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return nil, status.Errorf(codes.Unavailable, "leadership lost while committing; the write may or may not have committed, retry with the same idempotency key: %v", err)
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return nil, status.Errorf(codes.DeadlineExceeded, "commit timed out: %v", err)
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, status.Error(codes.Unavailable, "coordinator is shutting down")
		}
		return nil, status.Errorf(codes.Internal, "raft apply: %v", err)
	}
	res, ok := fut.Response().(*fsm.ApplyResult)
	if !ok {
		return nil, status.Errorf(codes.Internal, "unexpected FSM response %T", fut.Response())
	}
	return res, nil
}
