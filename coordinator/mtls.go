package coordinator

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/authz"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// withoutCertificate lists the only calls a caller without a certificate
// may make on the coordinator's port: a new worker registering with the
// join token and a certificate request (it has no certificate before the
// coordinators sign one). Everything else needs an org certificate.
var withoutCertificate = map[string]bool{
	workerMethod + "Register": true,
}

// certGate refuses, under mTLS, every call whose caller presented no
// certificate of the org, except those in withoutCertificate. The TLS
// handshake has already verified any certificate presented (chain to the
// org CA, identity of the org); here only its absence is handled.
type certGate struct{ org string }

func (g certGate) check(ctx context.Context, method string) error {
	if withoutCertificate[method] {
		return nil
	}
	// What anyone may call (health checks, reflection) needs no
	// certificate either: load balancers and orchestrators probe the
	// port without one.
	if need, err := authz.MethodNeed(method); err == nil && need == authz.NeedNone {
		return nil
	}
	id, ok := rpc.PeerIdentity(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s: a client certificate of org %s is required (see fedstream tls init)", method, g.org)
	}
	if id.Org != g.org {
		return status.Errorf(codes.PermissionDenied, "%s: certificate of org %s, this is org %s", method, id.Org, g.org)
	}
	return nil
}

func (g certGate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g certGate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// hostOf is the host part of a host:port address ("" if it has none), for
// the host SAN of a worker's certificate.
func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return h
}

// errNoCAKey is returned to a worker registering with, or renewing on, a
// coordinator that cannot sign its certificate.
var errNoCAKey = status.Error(codes.FailedPrecondition, "this coordinator has no CA key (tls-ca-key) and cannot sign worker certificates: give every coordinator the org's ca-key.pem")

// signWorker signs a worker's certificate request for its id.
func (s *Server) signWorker(csr []byte, workerID, addr string) ([]byte, error) {
	if s.cfg.CA == nil {
		return nil, errNoCAKey
	}
	cert, err := s.cfg.CA.SignCSR(csr, rpc.Identity{Org: s.cfg.Org, Role: rpc.RoleWorker, Name: workerID}, []string{hostOf(addr)}, s.cfg.WorkerCertTTL)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "worker certificate request: %v", err)
	}
	return cert, nil
}

// checkCSR refuses a malformed request before anything is committed.
func checkCSR(csr []byte) error {
	if err := tlsutil.CheckCSR(csr); err != nil {
		return status.Errorf(codes.InvalidArgument, "register: csr: %v", err)
	}
	return nil
}

// callerKey carries, on a call a follower forwards, the identity of the
// follower's own caller (its verified certificate's URI; absent when that
// caller had none).
const callerKey = "x-fedstream-caller"

// callerIdentity is who made a call: the verified certificate of the peer,
// or, on a call forwarded by a coordinator of this org (proven by its
// certificate), the identity that coordinator vouches for. A peer that is
// not a coordinator cannot make anyone else's identity count: its
// x-fedstream-caller is ignored. ok is false when the caller presented no
// certificate (a new worker registering; plaintext mode).
func (s *Server) callerIdentity(ctx context.Context) (rpc.Identity, bool) {
	peer, ok := rpc.PeerIdentity(ctx)
	if !ok {
		return rpc.Identity{}, false
	}
	if peer.Org != s.cfg.Org || peer.Role != rpc.RoleCoordinator || !isForwarded(ctx) {
		return peer, true
	}
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(callerKey)
	if len(v) != 1 {
		return rpc.Identity{}, false
	}
	id, err := parseIdentity(v[0])
	if err != nil || id.Org != s.cfg.Org {
		return rpc.Identity{}, false
	}
	return id, true
}

// parseIdentity reads the fedstream://ORG/ROLE/NAME form of an identity.
func parseIdentity(s string) (rpc.Identity, error) {
	u, err := url.Parse(s)
	if err != nil {
		return rpc.Identity{}, err
	}
	role, name, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if u.Scheme != "fedstream" || u.Host == "" || !ok || role == "" || name == "" || strings.Contains(name, "/") {
		return rpc.Identity{}, fmt.Errorf("%w: %q", rpc.ErrNoIdentity, s)
	}
	return rpc.Identity{Org: u.Host, Role: role, Name: name}, nil
}
