package coordinator

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
)

// authenticator checks the bearer token of every call against the role the
// method needs: WorkerService calls need the join token, AdminService calls
// the admin token. The health service is open. With no token configured at
// all (dev mode) everything is accepted.
type authenticator struct {
	joinToken, adminToken string
}

func (a *authenticator) check(ctx context.Context, method string) error {
	if a.joinToken == "" && a.adminToken == "" {
		return nil
	}
	var want []string
	var what string
	switch {
	case strings.HasPrefix(method, "/fedstream.v1.WorkerService/"):
		want, what = []string{a.joinToken, a.adminToken}, "the worker join token"
	case strings.HasPrefix(method, "/fedstream.v1.AdminService/"):
		want, what = []string{a.adminToken}, "the admin token"
	default:
		return nil
	}
	got := rpc.TokenFromContext(ctx)
	if got == "" {
		return status.Errorf(codes.Unauthenticated, "%s: missing token: this call needs %s (pass --token or set FEDSTREAM_TOKEN)", method, what)
	}
	for _, w := range want {
		if w != "" && subtle.ConstantTimeCompare([]byte(got), []byte(w)) == 1 {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "%s: wrong token: it does not match %s", method, what)
}

func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// forwardedKey marks a call a follower forwarded, so that a node that lost
// leadership meanwhile does not forward it again (no forwarding loops).
const forwardedKey = "x-fedstream-forwarded"

func isForwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}
