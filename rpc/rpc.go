// Package rpc holds the wire contract (fedstream.proto, generated code in
// fedstreampb) and the small helpers every process uses to dial and to carry
// credentials.
package rpc

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// authHeader carries "Bearer <token>".
const authHeader = "authorization"

// TokenFromContext returns the bearer token of an incoming call, or "".
func TokenFromContext(ctx context.Context) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	for _, v := range md.Get(authHeader) {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			return t
		}
	}
	return ""
}

// tokenCreds attaches a bearer token to every call. It does not require
// transport security: mTLS arrives with the security issue.
type tokenCreds string

func (t tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{authHeader: "Bearer " + string(t)}, nil
}
func (t tokenCreds) RequireTransportSecurity() bool { return false }

// Dial opens a client connection to addr that sends token (if any) with
// every call. The connection is lazy: errors surface on the first call.
func Dial(addr, token string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		DefaultKeepalive.DialOption(),
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(tokenCreds(token)))
	}
	opts = append(opts, extra...)
	return grpc.NewClient(addr, opts...)
}
