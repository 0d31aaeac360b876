package rpc

import "google.golang.org/grpc/credentials"

// BearerToken returns per-call credentials that send token the way Dial
// does, for connections dialled with other options (the data plane's
// connection pool).
func BearerToken(token string) credentials.PerRPCCredentials { return tokenCreds(token) }
