package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/rpc"
)

// Errors of peer verification.
var (
	// ErrNoCertificate means the process has no certificate yet (a worker
	// before its first registration).
	ErrNoCertificate = errors.New("tlsutil: no certificate loaded yet")
	// ErrPeerIdentity means a peer's verified certificate names another
	// org, role or name than the connection needs.
	ErrPeerIdentity = errors.New("tlsutil: peer certificate identity not accepted")
)

// Credentials are what a process holds for mutual TLS inside its org: the
// org's CA (to verify peers) and, usually, its own certificate. The
// certificate can be replaced at any time (a worker renewing it); new
// connections present the new one.
type Credentials struct {
	org  string
	pool *x509.CertPool

	mu   sync.RWMutex
	cert *tls.Certificate
	id   rpc.Identity
}

// New builds credentials that trust caPEM, for the CA's org. A process
// with a certificate adds it with SetCertificate.
func New(caPEM []byte) (*Credentials, error) {
	ca, err := parseCertPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !ca.IsCA {
		return nil, ErrNotCA
	}
	org := orgOf(ca)
	if org == "" {
		return nil, fmt.Errorf("CA certificate names no org (subject organization): not made by fedstream tls init")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &Credentials{org: org, pool: pool}, nil
}

// Load reads the CA file and, when certFile is not empty, the process's
// own certificate and key.
func Load(caFile, certFile, keyFile string) (*Credentials, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls CA: %w", err)
	}
	c, err := New(caPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", caFile, err)
	}
	if certFile == "" && keyFile == "" {
		return c, nil
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("tls certificate: %w", err)
	}
	keyPEMData, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls key: %w", err)
	}
	if err := c.SetCertificate(certPEM, keyPEMData); err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	return c, nil
}

// Org is the org whose CA these credentials trust.
func (c *Credentials) Org() string { return c.org }

// Pool is the org's CA pool.
func (c *Credentials) Pool() *x509.CertPool { return c.pool }

// SetCertificate installs the process's certificate after checking that
// the org's CA signed it and that it carries an identity of that org.
func (c *Credentials) SetCertificate(certPEM, keyPEMData []byte) error {
	pair, err := tls.X509KeyPair(certPEM, keyPEMData)
	if err != nil {
		return err
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return err
		}
		pair.Leaf = leaf
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("certificate not signed by the org CA of %q: %w", c.org, err)
	}
	id, err := rpc.IdentityFromCert(leaf)
	if err != nil {
		return err
	}
	if id.Org != c.org {
		return fmt.Errorf("%w: certificate is for org %q, the CA for %q", ErrPeerIdentity, id.Org, c.org)
	}
	c.mu.Lock()
	c.cert, c.id = &pair, id
	c.mu.Unlock()
	return nil
}

// Identity is the identity of the installed certificate and its expiry;
// ok is false before one is installed.
func (c *Credentials) Identity() (id rpc.Identity, notAfter time.Time, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.cert == nil {
		return rpc.Identity{}, time.Time{}, false
	}
	return c.id, c.cert.Leaf.NotAfter, true
}

// Lifetime is the installed certificate's validity window.
func (c *Credentials) Lifetime() (notBefore, notAfter time.Time, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.cert == nil {
		return time.Time{}, time.Time{}, false
	}
	return c.cert.Leaf.NotBefore, c.cert.Leaf.NotAfter, true
}

func (c *Credentials) current() *tls.Certificate {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cert
}

// Peer says which identities a connection accepts from the other side:
// the org is always the credentials' own; Roles lists the roles allowed
// (empty: any) and Name, when set, the only name allowed.
type Peer struct {
	Roles []string
	Name  string
}

// check accepts a verified leaf certificate's identity.
func (c *Credentials) check(leaf *x509.Certificate, want Peer) error {
	id, err := rpc.IdentityFromCert(leaf)
	if err != nil {
		return err
	}
	switch {
	case id.Org != c.org:
		return fmt.Errorf("%w: %s is of org %q, this is org %q", ErrPeerIdentity, id, id.Org, c.org)
	case len(want.Roles) > 0 && !slices.Contains(want.Roles, id.Role):
		return fmt.Errorf("%w: %s has role %q, want %v", ErrPeerIdentity, id, id.Role, want.Roles)
	case want.Name != "" && id.Name != want.Name:
		return fmt.Errorf("%w: %s is not %q", ErrPeerIdentity, id, want.Name)
	}
	return nil
}

// ServerConfig is the TLS 1.3 configuration of a server whose clients
// must present a certificate of the org with one of want's roles. With
// optional set, a client may also connect without any certificate (the
// coordinator's port, where a new worker registers with its join token
// before it has one); the server must then refuse such callers everything
// else (see rpc.PeerIdentity). A client certificate, when given, is always
// verified.
func (c *Credentials) ServerConfig(want Peer, optional bool) *tls.Config {
	auth := tls.RequireAndVerifyClientCert
	if optional {
		auth = tls.VerifyClientCertIfGiven
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: auth,
		ClientCAs:  c.pool,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if cert := c.current(); cert != nil {
				return cert, nil
			}
			return nil, ErrNoCertificate
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 {
				if optional && len(cs.PeerCertificates) == 0 {
					return nil
				}
				return fmt.Errorf("%w: no verified client certificate", ErrPeerIdentity)
			}
			return c.check(cs.VerifiedChains[0][0], want)
		},
	}
}

// ClientConfig is the TLS 1.3 configuration of a client that accepts only
// a server whose certificate the org's CA signed with an identity want
// allows. The host name is not checked: the identity is (see the package
// comment). The client presents its own certificate when it has one.
func (c *Credentials) ClientConfig(want Peer) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Verification is done in VerifyConnection below, against the org
		// CA and the identity, instead of against a host name.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert := c.current(); cert != nil {
				return cert, nil
			}
			return &tls.Certificate{}, nil // none yet: send no certificate
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: server sent no certificate", ErrPeerIdentity)
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("server certificate not signed by the CA of org %q: %w", c.org, err)
			}
			return c.check(leaf, want)
		},
	}
}

// DialOption is the gRPC transport credential of a client connection
// accepting servers as want says.
func (c *Credentials) DialOption(want Peer) grpc.DialOption {
	return grpc.WithTransportCredentials(newCreds(c.ClientConfig(want)))
}

// ServerOption is the gRPC transport credential of a server accepting
// clients as want says (optional: see ServerConfig).
func (c *Credentials) ServerOption(want Peer, optional bool) grpc.ServerOption {
	return grpc.Creds(newCreds(c.ServerConfig(want, optional)))
}

// ClearCertificate forgets the process's certificate: new connections
// present none (a worker whose certificate expired registers again).
func (c *Credentials) ClearCertificate() {
	c.mu.Lock()
	c.cert, c.id = nil, rpc.Identity{}
	c.mu.Unlock()
}
