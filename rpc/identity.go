package rpc

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Certificate roles. An org's CA signs every certificate with exactly one
// of them, so a process proves what it is, not only which org it is in.
const (
	RoleCoordinator = "coordinator"
	RoleWorker      = "worker"
	RoleClient      = "client"
)

// identityScheme is the URI scheme of the SAN that carries an Identity:
// fedstream://ORG/ROLE/NAME.
const identityScheme = "fedstream"

// ErrNoIdentity is returned when a certificate carries no fedstream
// identity URI, or one that does not parse.
var ErrNoIdentity = errors.New("rpc: certificate carries no fedstream identity")

// Identity is who a verified certificate says its holder is: the org whose
// CA signed it, the role it was issued for and the holder's name (the
// coordinator's node id, the worker's id, or a client name).
type Identity struct {
	Org  string
	Role string
	Name string
}

// URI is the SAN form of the identity, fedstream://ORG/ROLE/NAME.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: identityScheme, Host: id.Org, Path: "/" + id.Role + "/" + id.Name}
}

func (id Identity) String() string { return id.URI().String() }

// IdentityFromCert reads the identity a certificate's URI SAN carries. It
// does not verify the certificate: callers use it on chains that TLS has
// already verified against the org CA.
func IdentityFromCert(cert *x509.Certificate) (Identity, error) {
	for _, u := range cert.URIs {
		if u.Scheme != identityScheme {
			continue
		}
		role, name, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		if u.Host == "" || !ok || role == "" || name == "" {
			return Identity{}, fmt.Errorf("%w: malformed %q", ErrNoIdentity, u.String())
		}
		return Identity{Org: u.Host, Role: role, Name: name}, nil
	}
	return Identity{}, ErrNoIdentity
}

// PeerIdentity returns the identity of the caller of an incoming gRPC call
// from its verified client certificate. ok is false when the call did not
// arrive over mutual TLS (plaintext dev mode) or the certificate carries
// no identity.
func PeerIdentity(ctx context.Context) (id Identity, ok bool) {
	p, found := peer.FromContext(ctx)
	if !found || p.AuthInfo == nil {
		return Identity{}, false
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := IdentityFromCert(info.State.VerifiedChains[0][0])
	if err != nil {
		return Identity{}, false
	}
	return id, true
}
