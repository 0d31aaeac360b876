package coordinator

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
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

// signWorker signs a worker's certificate request for its id.
func (s *Server) signWorker(csr []byte, workerID, addr string) ([]byte, error) {
	if s.cfg.CA == nil {
		return nil, status.Error(codes.FailedPrecondition, "this coordinator has no CA key (tls-ca-key) and cannot sign worker certificates: give every coordinator the org's ca-key.pem")
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
