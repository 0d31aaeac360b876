package coordinator

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/authz"
)

// Why a presented token grants nothing. Neither message names or echoes
// the secret.
var (
	// errTokenUnknown: no token of the org has this secret (it was never
	// created, or it was revoked).
	errTokenUnknown = errors.New("wrong token: it matches no token of this org (never created, or revoked)")
	// errTokenExpired: the token exists but its TTL has passed.
	errTokenExpired = errors.New("token expired")
)

// howToPass tells a caller how to present a token, for Unauthenticated
// errors. Flags are avoided on purpose: they show in `ps`.
func howToPass(need authz.Need) string {
	if need == authz.NeedWorker {
		return "start the worker with --join-token-file FILE or the FEDSTREAM_JOIN_TOKEN environment variable"
	}
	return "pass it with --token-file FILE or the FEDSTREAM_TOKEN environment variable"
}

// authenticator checks every call against the role table (rpc/authz): it
// finds the caller's role from its credential and refuses the call unless
// that role allows the method's need.
//
// Credentials, in order: a worker certificate of this org (mutual TLS)
// holds the worker role; a bearer token that equals the configured admin
// token holds admin and one that equals the configured join token holds
// worker (config tokens bootstrap an org: the first admin creates the
// other tokens with them); any other bearer token is looked up by the hash
// of its secret in the replicated token table, and holds that token's role
// until it expires or is revoked. With no token configured at all (dev
// mode) every caller is accepted.
type authenticator struct {
	org                   string
	joinToken, adminToken string
	// tokens returns the replicated state holding the token table.
	tokens func() *fsm.StateStore
	now    func() time.Time
	// peerIdentity is rpc.PeerIdentity; tests replace it.
	peerIdentity func(ctx context.Context) (rpc.Identity, bool)
	// plaintext is set when the coordinator runs without TLS: no caller
	// can prove it is a coordinator, so calls that need one are let
	// through (as the plaintext Raft port lets anyone in).
	plaintext bool
}

func newAuthenticator(org, joinToken, adminToken string, tokens func() *fsm.StateStore) *authenticator {
	return &authenticator{org: org, joinToken: joinToken, adminToken: adminToken, tokens: tokens, now: time.Now, peerIdentity: rpc.PeerIdentity}
}

func (a *authenticator) devMode() bool { return a.joinToken == "" && a.adminToken == "" }

// sameHash compares two secret hashes in constant time; an empty config
// token matches nothing.
func sameHash(hash, configured string) bool {
	return configured != "" && subtle.ConstantTimeCompare([]byte(hash), []byte(fsm.HashSecret(configured))) == 1
}

// roleOfHash returns the role of the token whose secret hashes to hash, and
// its expiry (zero: never). Errors are errTokenUnknown or errTokenExpired
// (wrapped with the expiry time), or a state read failure.
func (a *authenticator) roleOfHash(hash string) (authz.Role, time.Time, error) {
	switch {
	case sameHash(hash, a.adminToken):
		return authz.RoleAdmin, time.Time{}, nil
	case sameHash(hash, a.joinToken):
		return authz.RoleWorker, time.Time{}, nil
	}
	tok, err := a.tokens().TokenByHash(hash)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("read tokens: %w", err)
	}
	if tok == nil {
		return "", time.Time{}, errTokenUnknown
	}
	var expires time.Time
	if tok.ExpiresUnixMs > 0 {
		expires = time.UnixMilli(tok.ExpiresUnixMs)
	}
	if tok.Expired(a.now()) {
		return "", expires, fmt.Errorf("%w at %s (token %s)", errTokenExpired, expires.UTC().Format(time.RFC3339), tok.ID)
	}
	return authz.Role(tok.Role), expires, nil
}

// check returns nil when the caller may call method, else an
// Unauthenticated (no credential) or PermissionDenied (a credential that
// does not allow it) status naming what is needed.
func (a *authenticator) check(ctx context.Context, method string) error {
	need, err := authz.MethodNeed(method)
	if err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	if need == authz.NeedCoordinator {
		return a.checkCoordinator(ctx, method)
	}
	if need == authz.NeedNone || a.devMode() {
		return nil
	}
	if id, ok := a.peerIdentity(ctx); ok && id.Org == a.org && id.Role == rpc.RoleWorker && authz.RoleWorker.Allows(need) {
		return nil
	}
	secret := rpc.TokenFromContext(ctx)
	if secret == "" {
		return status.Errorf(codes.Unauthenticated, "%s: missing token: this call needs %s; %s", method, need, howToPass(need))
	}
	role, _, err := a.roleOfHash(fsm.HashSecret(secret))
	switch {
	case errors.Is(err, errTokenUnknown), errors.Is(err, errTokenExpired):
		return status.Errorf(codes.PermissionDenied, "%s: %v: this call needs %s", method, err, need)
	case err != nil:
		return status.Errorf(codes.Internal, "%s: check token: %v", method, err)
	case !role.Allows(need):
		return status.Errorf(codes.PermissionDenied, "%s: the token's role is %s: this call needs %s", method, role, need)
	}
	return nil
}

// checkCoordinator admits a call that needs a coordinator of the org: the
// caller's verified certificate must say so, whatever tokens it carries
// and even in dev mode (no token grants it).
func (a *authenticator) checkCoordinator(ctx context.Context, method string) error {
	if a.plaintext {
		return nil
	}
	id, ok := a.peerIdentity(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s: this call needs %s", method, authz.NeedCoordinator)
	}
	if id.Org != a.org || id.Role != rpc.RoleCoordinator {
		return status.Errorf(codes.PermissionDenied, "%s: caller is %s: this call needs %s", method, id, authz.NeedCoordinator)
	}
	return nil
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
