package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/authz"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// tokenService administers the org's tokens (admins) and tells workers
// what a token presented on their data plane may do.
type tokenService struct {
	pb.UnimplementedTokenServiceServer
	s *Server
}

const tokenMethod = "/fedstream.v1.TokenService/"

// Bounds on what a client may store in a token.
const (
	minSecretLen      = 16
	maxSecretLen      = 512
	maxDescriptionLen = 256
)

// NewTokenSecret draws a token secret: 32 random bytes, URL-safe base64,
// prefixed so that a leaked secret is recognisable as a fedstream token.
func NewTokenSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "fst_" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

func tokenInfo(t *fsm.Token) *pb.TokenInfo {
	return &pb.TokenInfo{Id: t.ID, Role: t.Role, Description: t.Description, CreatedUnixMs: t.CreatedUnixMs, ExpiresUnixMs: t.ExpiresUnixMs}
}

func (ts *tokenService) CreateToken(ctx context.Context, req *pb.CreateTokenRequest) (*pb.CreateTokenResponse, error) {
	s := ts.s
	if _, err := authz.ParseRole(req.Role); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "create token: %v", err)
	}
	if req.TtlMs < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "create token: negative ttl %dms (0 means no expiry)", req.TtlMs)
	}
	if len(req.Description) > maxDescriptionLen || !utf8.ValidString(req.Description) {
		return nil, status.Errorf(codes.InvalidArgument, "create token: the description must be UTF-8 of at most %d bytes", maxDescriptionLen)
	}
	if req.Secret == "" {
		// Drawn here, before any forwarding, so the leader stores the
		// secret this call will return.
		secret, err := NewTokenSecret()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "create token: draw a secret: %v", err)
		}
		req.Secret = secret
	}
	if n := len(req.Secret); n < minSecretLen || n > maxSecretLen {
		return nil, status.Errorf(codes.InvalidArgument, "create token: a secret must be %d to %d bytes (leave it empty to have one drawn)", minSecretLen, maxSecretLen)
	}
	hash := fsm.HashSecret(req.Secret)
	if sameHash(hash, s.cfg.AdminToken) || sameHash(hash, s.cfg.JoinToken) {
		return nil, status.Error(codes.InvalidArgument, "create token: that secret is one of the configured (bootstrap) tokens")
	}
	resp := &pb.CreateTokenResponse{}
	if handled, err := s.leaderOrForward(ctx, tokenMethod+"CreateToken", req, resp); handled {
		if err == nil {
			// Callers use a new token at once, often on this node.
			s.waitForToken(ctx, hash, true)
		}
		return resp, err
	}
	now := time.Now()
	tok := fsm.Token{
		ID: newID("tok-"), SecretHash: hash, Role: req.Role, Description: req.Description,
		CreatedUnixMs: now.UnixMilli(),
	}
	if req.TtlMs > 0 {
		tok.ExpiresUnixMs = tok.CreatedUnixMs + req.TtlMs
	}
	key := ""
	if req.IdempotencyKey != "" {
		key = "token/" + req.IdempotencyKey
	}
	res, err := s.apply(ctx, fsm.CreateTokenType, fsm.CreateTokenRequest{Token: tok, IdempotencyKey: key})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if errors.Is(res.Err, fsm.ErrTokenExists) {
			return nil, status.Error(codes.AlreadyExists, "create token: a token with this secret already exists")
		}
		return nil, status.Errorf(codes.FailedPrecondition, "create token: %v", res.Err)
	}
	id, ok := res.Value.(string)
	if !ok {
		return nil, status.Errorf(codes.Internal, "create token: the FSM returned %T, not the token id", res.Value)
	}
	stored, err := s.State().Token(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "create token: read it back: %v", err)
	}
	// A retry with the same idempotency key returns the first token; it is
	// only this call's token if it holds this call's secret.
	if stored == nil || stored.SecretHash != hash {
		return nil, status.Errorf(codes.FailedPrecondition, "create token: idempotency key %q already created token %s with another secret", req.IdempotencyKey, id)
	}
	s.logger.Info("token created", "token", stored.ID, "role", stored.Role, "expires_unix_ms", stored.ExpiresUnixMs)
	return &pb.CreateTokenResponse{Token: tokenInfo(stored), Secret: req.Secret}, nil
}

func (ts *tokenService) ListTokens(ctx context.Context, _ *pb.ListTokensRequest) (*pb.ListTokensResponse, error) {
	toks, err := ts.s.State().Tokens(nil)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list tokens: %v", err)
	}
	resp := &pb.ListTokensResponse{}
	for _, t := range toks {
		resp.Tokens = append(resp.Tokens, tokenInfo(t))
	}
	return resp, nil
}

func (ts *tokenService) RevokeToken(ctx context.Context, req *pb.RevokeTokenRequest) (*pb.RevokeTokenResponse, error) {
	s := ts.s
	if req.Id == "" {
		return nil, status.Error(codes.InvalidArgument, "revoke token: the token id is required (fedstream token list shows them)")
	}
	resp := &pb.RevokeTokenResponse{}
	if handled, err := s.leaderOrForward(ctx, tokenMethod+"RevokeToken", req, resp); handled {
		if err == nil {
			hash := ""
			tok, terr := s.State().Token(req.Id)
			if terr != nil {
				return resp, status.Errorf(codes.Internal, "revoke token: read it locally: %v", terr)
			}
			if tok != nil {
				hash = tok.SecretHash
			}
			s.waitForToken(ctx, hash, false)
		}
		return resp, err
	}
	key := ""
	if req.IdempotencyKey != "" {
		key = "revoke/" + req.IdempotencyKey
	}
	res, err := s.apply(ctx, fsm.RevokeTokenType, fsm.RevokeTokenRequest{ID: req.Id, IdempotencyKey: key})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		if errors.Is(res.Err, fsm.ErrTokenNotFound) {
			return nil, status.Errorf(codes.NotFound, "no token with id %q (fedstream token list shows them)", req.Id)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "revoke token %s: %v", req.Id, res.Err)
	}
	s.logger.Info("token revoked", "token", req.Id)
	return resp, nil
}

// AuthorizeToken is a read: any coordinator answers from its own state, so
// a revocation reaches a worker once the coordinator it asks has applied
// it (and the worker's cache entry has expired).
func (ts *tokenService) AuthorizeToken(ctx context.Context, req *pb.AuthorizeTokenRequest) (*pb.AuthorizeTokenResponse, error) {
	if len(req.TokenHash) != 64 {
		return nil, status.Error(codes.InvalidArgument, "authorize token: token_hash must be the 64 hex digits of the secret's SHA-256")
	}
	role, expires, err := ts.s.auth.roleOfHash(req.TokenHash)
	switch {
	case errors.Is(err, errTokenUnknown), errors.Is(err, errTokenExpired):
		return nil, status.Error(codes.PermissionDenied, err.Error())
	case err != nil:
		return nil, status.Errorf(codes.Internal, "authorize token: %v", err)
	}
	resp := &pb.AuthorizeTokenResponse{Role: string(role)}
	if !expires.IsZero() {
		resp.ExpiresUnixMs = expires.UnixMilli()
	}
	return resp, nil
}

// tokenApplyWait bounds how long a follower waits to apply a token change
// it forwarded to the leader.
const tokenApplyWait = 2 * time.Second

// waitForToken waits, for at most tokenApplyWait, until this node's state
// holds (present) or no longer holds (!present) the token with secret hash
// hash, so that a client that created or revoked a token through this node
// sees the change on its next call here. It gives up silently: the change
// is committed and arrives shortly anyway.
func (s *Server) waitForToken(ctx context.Context, hash string, present bool) {
	if hash == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, tokenApplyWait)
	defer cancel()
	for {
		ws := memdb.NewWatchSet()
		if _, err := s.State().Tokens(ws); err != nil {
			s.logger.Warn("waiting for a token change: read tokens", "err", err)
			return
		}
		tok, err := s.State().TokenByHash(hash)
		if err != nil {
			s.logger.Warn("waiting for a token change: read token", "err", err)
			return
		}
		if (tok != nil) == present {
			return
		}
		if err := ws.WatchCtx(ctx); err != nil {
			return
		}
	}
}
