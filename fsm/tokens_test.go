package fsm

import (
	"errors"
	"testing"
	"time"
)

// created is the creation time test tokens carry (Unix ms).
const created = int64(1_700_000_000_000)

// newToken builds a token created at `created` that expires ttl ms later
// (0: never).
func newToken(id, secret, role string, ttl int64) Token {
	tok := NewToken(id, secret, role, "test "+id)
	tok.CreatedUnixMs = created
	if ttl > 0 {
		tok.ExpiresUnixMs = created + ttl
	}
	return tok
}

// TestTokenStore is the token store's table test: create, duplicate id or
// secret, validation, revoke, unknown id, and idempotency keys.
func TestTokenStore(t *testing.T) {
	type op struct {
		typ     MessageType
		body    any
		wantErr error
		wantVal string // the id the command returns
		dedup   bool
	}
	create := func(tok Token, key string) CreateTokenRequest {
		return CreateTokenRequest{Token: tok, IdempotencyKey: key}
	}
	cases := []struct {
		name string
		ops  []op
		// ids that must exist afterwards, with their roles; others must not.
		want map[string]string
	}{
		{
			name: "create each role",
			ops: []op{
				{typ: CreateTokenType, body: create(newToken("a", "sa", RoleAdmin, 0), ""), wantVal: "a"},
				{typ: CreateTokenType, body: create(newToken("w", "sw", RoleWriter, 0), ""), wantVal: "w"},
				{typ: CreateTokenType, body: create(newToken("r", "sr", RoleReader, 60_000), ""), wantVal: "r"},
				{typ: CreateTokenType, body: create(newToken("u", "su", RoleAuditor, 0), ""), wantVal: "u"},
				{typ: CreateTokenType, body: create(newToken("j", "sj", RoleWorker, 0), ""), wantVal: "j"},
			},
			want: map[string]string{"a": RoleAdmin, "w": RoleWriter, "r": RoleReader, "u": RoleAuditor, "j": RoleWorker},
		},
		{
			name: "refuses bad tokens",
			ops: []op{
				{typ: CreateTokenType, body: create(newToken("", "s", RoleAdmin, 0), ""), wantErr: ErrInvalidRequest},
				{typ: CreateTokenType, body: create(newToken("x", "s", "root", 0), ""), wantErr: ErrInvalidRequest},
				{typ: CreateTokenType, body: create(Token{ID: "x", SecretHash: "plain", Role: RoleAdmin, CreatedUnixMs: created}, ""), wantErr: ErrInvalidRequest},
				{typ: CreateTokenType, body: create(Token{ID: "x", SecretHash: HashSecret("s"), Role: RoleAdmin}, ""), wantErr: ErrInvalidRequest},
				{typ: CreateTokenType, body: create(Token{ID: "x", SecretHash: HashSecret("s"), Role: RoleAdmin, CreatedUnixMs: created, ExpiresUnixMs: created}, ""), wantErr: ErrInvalidRequest},
			},
			want: map[string]string{},
		},
		{
			name: "duplicate id or secret",
			ops: []op{
				{typ: CreateTokenType, body: create(newToken("a", "s1", RoleAdmin, 0), ""), wantVal: "a"},
				{typ: CreateTokenType, body: create(newToken("a", "s2", RoleReader, 0), ""), wantErr: ErrTokenExists},
				{typ: CreateTokenType, body: create(newToken("b", "s1", RoleReader, 0), ""), wantErr: ErrTokenExists},
			},
			want: map[string]string{"a": RoleAdmin},
		},
		{
			name: "revoke, and revoke unknown id",
			ops: []op{
				{typ: CreateTokenType, body: create(newToken("a", "s1", RoleReader, 0), ""), wantVal: "a"},
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "a"}, wantVal: "a"},
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "a"}, wantErr: ErrTokenNotFound},
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "nope"}, wantErr: ErrTokenNotFound},
				// The secret of a revoked token is free again.
				{typ: CreateTokenType, body: create(newToken("b", "s1", RoleWriter, 0), ""), wantVal: "b"},
			},
			want: map[string]string{"b": RoleWriter},
		},
		{
			name: "duplicate idempotency key returns the first result",
			ops: []op{
				{typ: CreateTokenType, body: create(newToken("a", "s1", RoleReader, 0), "k1"), wantVal: "a"},
				// A retry: same key, same token.
				{typ: CreateTokenType, body: create(newToken("a", "s1", RoleReader, 0), "k1"), wantVal: "a", dedup: true},
				// Same key, another token: still the first result, nothing stored.
				{typ: CreateTokenType, body: create(newToken("b", "s2", RoleAdmin, 0), "k1"), wantVal: "a", dedup: true},
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "a", IdempotencyKey: "k2"}, wantVal: "a"},
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "a", IdempotencyKey: "k2"}, wantVal: "a", dedup: true},
				// A key used by another command type is refused.
				{typ: RevokeTokenType, body: RevokeTokenRequest{ID: "a", IdempotencyKey: "k1"}, wantErr: ErrIdempotencyKeyReused},
			},
			want: map[string]string{},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			for i, o := range tc.ops {
				res := h.apply(o.typ, o.body)
				if o.wantErr != nil {
					if !errors.Is(res.Err, o.wantErr) {
						t.Fatalf("op %d (%s): err %v, want %v", i, o.typ, res.Err, o.wantErr)
					}
					continue
				}
				if res.Err != nil {
					t.Fatalf("op %d (%s): %v", i, o.typ, res.Err)
				}
				if got, _ := res.Value.(string); got != o.wantVal || res.Deduplicated != o.dedup {
					t.Fatalf("op %d (%s): value %v dedup %v, want %q dedup %v", i, o.typ, res.Value, res.Deduplicated, o.wantVal, o.dedup)
				}
			}
			toks, err := h.state().Tokens(nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, tok := range toks {
				got[tok.ID] = tok.Role
				if by, _ := h.state().TokenByHash(tok.SecretHash); by == nil || by.ID != tok.ID {
					t.Errorf("TokenByHash(%s) = %+v", tok.ID, by)
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("tokens %v, want %v", got, tc.want)
			}
			for id, role := range tc.want {
				if got[id] != role {
					t.Fatalf("tokens %v, want %v", got, tc.want)
				}
			}
			roundTrip(t, h.fsm)
		})
	}
}

func TestTokenExpiry(t *testing.T) {
	never := newToken("a", "s", RoleReader, 0)
	ttl := newToken("b", "s", RoleReader, 60_000)
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	for _, c := range []struct {
		tok  Token
		now  int64
		want bool
	}{
		{never, created + 1e12, false},
		{ttl, created, false},
		{ttl, created + 59_999, false},
		{ttl, created + 60_000, true},
		{ttl, created + 1e9, true},
	} {
		if got := c.tok.Expired(at(c.now)); got != c.want {
			t.Errorf("token %s (expires %d) at %d: expired %v, want %v", c.tok.ID, c.tok.ExpiresUnixMs, c.now, got, c.want)
		}
	}
}
