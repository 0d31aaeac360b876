package worker

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/authz"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// How long a worker trusts the org's answer about a token. A revoked or
// expired token keeps working on a worker that checked it recently for at
// most tokenCachePositive (expiry itself is honoured to the millisecond:
// an entry never outlives its token); a token just created may be refused
// for up to tokenCacheNegative after a failed attempt.
const (
	tokenCachePositive = 30 * time.Second
	tokenCacheNegative = 5 * time.Second
	tokenCacheMax      = 4096
)

// howToPassToken tells a data-plane client how to present a token. Flags
// are avoided on purpose: they show in `ps`.
const howToPassToken = "pass it with --token-file FILE or the FEDSTREAM_TOKEN environment variable"

// dataPlaneAuth checks every call to a worker's data plane against the
// role table (rpc/authz), from a gRPC interceptor so the data-plane
// handlers stay unaware of it.
//
// Callers are the org's workers (their tasks subscribe to upstream
// streams and acknowledge them) or clients holding a token (tail reads a
// sink's results, ingest writes records). A caller holds the worker role
// through a worker certificate of this org (mutual TLS) or, over
// plaintext only, a token with the worker role (the org's join token,
// which every worker is configured with). Client tokens are checked with
// the org's coordinators (TokenService.AuthorizeToken) through a cache.
//
// Subscribe needs a reader token for a subscription that does not
// acknowledge (no_ack), and the worker role for one that acknowledges:
// an acknowledgement releases tuples for every replica, so only the org's
// own tasks may send one. Ingest needs a writer token. With no join token
// configured (dev mode) every caller is accepted.
type dataPlaneAuth struct {
	org       string
	joinToken string
	// open accepts every caller (dev mode: no join token configured).
	open   bool
	tokens *tokenCache
	// peerIdentity is rpc.PeerIdentity; tests replace it.
	peerIdentity func(ctx context.Context) (rpc.Identity, bool)
	logger       *slog.Logger
}

// callerRole is the role the call's credentials hold. It returns an
// Unauthenticated status when the call carries no credential, and a
// PermissionDenied or Unavailable one when the token cannot be accepted.
// what describes the call for messages ("reading results").
func (a *dataPlaneAuth) callerRole(ctx context.Context, method, what string, need authz.Need) (authz.Role, error) {
	id, overTLS := a.peerIdentity(ctx)
	if overTLS && id.Org == a.org && id.Role == rpc.RoleWorker {
		return authz.RoleWorker, nil
	}
	secret := rpc.TokenFromContext(ctx)
	if secret == "" {
		return "", status.Errorf(codes.Unauthenticated, "%s: missing token: %s needs %s; %s", method, what, need, howToPassToken)
	}
	if a.joinToken != "" && subtle.ConstantTimeCompare([]byte(secret), []byte(a.joinToken)) == 1 {
		if overTLS {
			// Over mutual TLS the worker role is proven by certificate only.
			return "", status.Errorf(codes.PermissionDenied, "%s: the join token does not make a worker over TLS: present the worker's certificate", method)
		}
		return authz.RoleWorker, nil
	}
	role, err := a.tokens.role(ctx, fsm.HashSecret(secret))
	if err != nil {
		if status.Code(err) == codes.PermissionDenied {
			return "", status.Errorf(codes.PermissionDenied, "%s: %s: %s needs %s", method, status.Convert(err).Message(), what, need)
		}
		return "", status.Errorf(codes.Unavailable, "%s: cannot check the token with the org's coordinators: %s", method, status.Convert(err).Message())
	}
	if role == authz.RoleWorker && overTLS {
		return "", status.Errorf(codes.PermissionDenied, "%s: a worker token does not make a worker over TLS: present the worker's certificate", method)
	}
	return role, nil
}

// authorize returns nil when the caller may make this call.
func (a *dataPlaneAuth) authorize(ctx context.Context, method string, first *pb.SubscribeRequest) error {
	need, err := authz.MethodNeed(method)
	if err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	if a.open || need == authz.NeedNone {
		return nil
	}
	what := "this call"
	switch method {
	case pb.DataPlane_Subscribe_FullMethodName:
		what = "reading a stream (fedstream tail)"
		if first != nil && !first.NoAck {
			what = "an acknowledging subscription"
			need = authz.NeedWorker
		} else {
			need = authz.NeedReader
		}
	case pb.DataPlane_Ingest_FullMethodName, pb.DataPlane_IngestSession_FullMethodName:
		what = "ingesting records (fedstream ingest)"
	case pb.DataPlane_FetchSnapshot_FullMethodName:
		what = "fetching a task's snapshot (workers of the org only)"
	}
	role, err := a.callerRole(ctx, method, what, need)
	if err == nil && !role.Allows(need) {
		if need == authz.NeedWorker && method == pb.DataPlane_Subscribe_FullMethodName {
			err = status.Errorf(codes.PermissionDenied, "%s: the caller's role is %s: an acknowledging subscription is for the org's workers only; clients subscribe with no_ack (as fedstream tail does)", method, role)
		} else {
			err = status.Errorf(codes.PermissionDenied, "%s: the token's role is %s: %s needs %s", method, role, what, need)
		}
	}
	if err != nil {
		attrs := []any{"method", method, "code", status.Code(err).String(), "reason", status.Convert(err).Message()}
		if p, ok := peer.FromContext(ctx); ok {
			attrs = append(attrs, "peer", p.Addr.String())
		}
		if first != nil && first.Stream != nil {
			attrs = append(attrs, "query", first.Stream.Query, "task", first.Stream.TaskId)
		}
		a.logger.Warn("data-plane call refused", attrs...)
	}
	return err
}

func (a *dataPlaneAuth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.authorize(ctx, info.FullMethod, nil); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *dataPlaneAuth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if a.open || info.FullMethod != pb.DataPlane_Subscribe_FullMethodName {
		if err := a.authorize(ss.Context(), info.FullMethod, nil); err != nil {
			return err
		}
		return handler(srv, ss)
	}
	// What a subscription may do depends on its first request: read it
	// here and hand it to the handler as if it had not been read.
	first := new(pb.SubscribeRequest)
	if err := ss.RecvMsg(first); err != nil {
		return err
	}
	if err := a.authorize(ss.Context(), info.FullMethod, first); err != nil {
		return err
	}
	return handler(srv, &peekedStream{ServerStream: ss, first: first})
}

// peekedStream replays the first message the interceptor read.
type peekedStream struct {
	grpc.ServerStream
	first *pb.SubscribeRequest
}

func (p *peekedStream) RecvMsg(m any) error {
	if p.first == nil {
		return p.ServerStream.RecvMsg(m)
	}
	dst, ok := m.(*pb.SubscribeRequest)
	if !ok {
		return status.Errorf(codes.Internal, "data-plane auth: subscription receives %T, not a SubscribeRequest", m)
	}
	proto.Reset(dst)
	proto.Merge(dst, p.first)
	p.first = nil
	return nil
}

// tokenCache remembers the org's answers about token hashes: roles for
// tokenCachePositive (never past the token's expiry), refusals for
// tokenCacheNegative, at most tokenCacheMax entries. Failures to reach the
// org are not remembered.
type tokenCache struct {
	// ask returns the role of a token hash and its expiry (zero: never),
	// or a PermissionDenied status when the org refuses the token.
	ask func(ctx context.Context, hash string) (authz.Role, time.Time, error)
	now func() time.Time

	mu      sync.Mutex
	entries map[string]tokenEntry
}

type tokenEntry struct {
	role  authz.Role
	err   error // a PermissionDenied status
	until time.Time
}

func newTokenCache(ask func(ctx context.Context, hash string) (authz.Role, time.Time, error)) *tokenCache {
	return &tokenCache{ask: ask, now: time.Now, entries: map[string]tokenEntry{}}
}

func (c *tokenCache) role(ctx context.Context, hash string) (authz.Role, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[hash]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.role, e.err
	}
	role, expires, err := c.ask(ctx, hash)
	switch {
	case err == nil:
		e = tokenEntry{role: role, until: now.Add(tokenCachePositive)}
		if !expires.IsZero() && expires.Before(e.until) {
			e.until = expires
		}
	case status.Code(err) == codes.PermissionDenied:
		e = tokenEntry{err: err, until: now.Add(tokenCacheNegative)}
	default:
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= tokenCacheMax {
		c.evictLocked(now)
	}
	c.entries[hash] = e
	return e.role, e.err
}

// evictLocked drops expired entries, and if none had expired, an arbitrary
// tenth of them: the cache is bounded whatever callers present.
func (c *tokenCache) evictLocked(now time.Time) {
	for h, e := range c.entries {
		if !now.Before(e.until) {
			delete(c.entries, h)
		}
	}
	for h := range c.entries {
		if len(c.entries) < tokenCacheMax*9/10 {
			return
		}
		delete(c.entries, h)
	}
}

// askOrg asks the org's coordinators what a token hash may do.
func (w *Worker) askOrg(ctx context.Context, hash string) (authz.Role, time.Time, error) {
	var resp *pb.AuthorizeTokenResponse
	err := w.callConn(ctx, 5*time.Second, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = pb.NewTokenServiceClient(conn).AuthorizeToken(ctx, &pb.AuthorizeTokenRequest{TokenHash: hash})
		return err
	})
	if err != nil {
		return "", time.Time{}, err
	}
	role, err := authz.ParseRole(resp.Role)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("coordinator answered: %w", err)
	}
	var expires time.Time
	if resp.ExpiresUnixMs > 0 {
		expires = time.UnixMilli(resp.ExpiresUnixMs)
	}
	return role, expires, nil
}
