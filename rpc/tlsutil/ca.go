// Package tlsutil issues and loads an org's certificates and builds the
// mutual-TLS configurations every fedstream connection inside an org uses.
//
// Trust model: one CA per org. Every certificate the CA signs carries
// exactly one identity URI SAN, fedstream://ORG/ROLE/NAME (rpc.Identity).
// Peers are verified by that identity (org, role and, where the caller
// knows it, name), not by host name: a worker's address is whatever it
// advertises, while the identity is what the CA vouched for. Host SANs are
// still written so other tools can talk to the processes.
package tlsutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/fedstream/fedstream/rpc"
)

// Validity of what tls init and the coordinators issue.
const (
	// CAValidity is an org CA's lifetime. Rotating a CA means re-issuing
	// every certificate, so it is long.
	CAValidity = 10 * 365 * 24 * time.Hour
	// NodeValidity is the lifetime of the coordinator and client
	// certificates tls init writes (operators re-run it to rotate).
	NodeValidity = 2 * 365 * 24 * time.Hour
	// DefaultWorkerValidity is the lifetime of a certificate a coordinator
	// signs for a worker; the worker renews it at about two thirds of it.
	DefaultWorkerValidity = 24 * time.Hour
	// clockSkew backdates NotBefore so a peer whose clock is a little
	// behind still accepts a fresh certificate.
	clockSkew = 5 * time.Minute
)

// Errors of this package.
var (
	// ErrBadPEM means a file or field does not hold the PEM block expected.
	ErrBadPEM = errors.New("tlsutil: not a PEM certificate, key or request")
	// ErrNotCA means the CA file holds a certificate that is not a CA.
	ErrNotCA = errors.New("tlsutil: certificate is not a CA")
	// ErrBadIdentity means an identity has an empty part or a '/' in one.
	ErrBadIdentity = errors.New("tlsutil: identity needs org, role and name without '/'")
	// ErrBadCSR means a certificate request's signature does not verify.
	ErrBadCSR = errors.New("tlsutil: invalid certificate request")
)

// CA is an org's certificate authority: the only holder of its key signs.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is the PEM encoding of Cert (what ca.pem holds).
	CertPEM []byte
}

// Org is the org the CA belongs to (its subject's organization).
func (ca *CA) Org() string { return orgOf(ca.Cert) }

func orgOf(c *x509.Certificate) string {
	if len(c.Subject.Organization) > 0 {
		return c.Subject.Organization[0]
	}
	return ""
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func validIdentity(id rpc.Identity) error {
	for _, p := range []string{id.Org, id.Role, id.Name} {
		if p == "" || containsAny(p, "/?#@: ") {
			return fmt.Errorf("%w: %q", ErrBadIdentity, id.String())
		}
	}
	return nil
}

func containsAny(s, chars string) bool {
	for _, c := range s {
		for _, d := range chars {
			if c == d {
				return true
			}
		}
	}
	return false
}

// NewCA creates a self-signed ECDSA P-256 CA for org.
func NewCA(org string) (*CA, error) {
	if err := validIdentity(rpc.Identity{Org: org, Role: "ca", Name: "ca"}); err != nil {
		return nil, err
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "fedstream " + org + " CA", Organization: []string{org}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// KeyPEM is the PEM encoding of the CA's private key (what ca-key.pem holds).
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.Key) }

func keyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// LoadCA reads a CA certificate and its key.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("tls CA certificate: %w", err)
	}
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s: %w", certFile, ErrNotCA)
	}
	keyData, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls CA key: %w", err)
	}
	key, err := parseKeyPEM(keyData)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("tls CA key %s does not belong to the certificate %s", keyFile, certFile)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}

func parseCertPEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, ErrBadPEM
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, ErrBadPEM
	}
	var k any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, ErrBadPEM
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: unsupported key type %T", ErrBadPEM, k)
	}
	return s, nil
}

// template is the leaf certificate the CA signs for id: usable as a server
// and as a client certificate, since coordinators and workers are both.
func (ca *CA) template(id rpc.Identity, hosts []string, ttl time.Duration) (*x509.Certificate, error) {
	if err := validIdentity(id); err != nil {
		return nil, err
	}
	if id.Org != ca.Org() {
		return nil, fmt.Errorf("tlsutil: CA of org %q cannot issue a certificate for org %q", ca.Org(), id.Org)
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: id.Role + "/" + id.Name, Organization: []string{id.Org}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id.URI()},
	}
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return tmpl, nil
}

// Issue creates a key pair and a certificate for id, valid for ttl, with
// hosts (IP addresses or DNS names) as extra SANs. It returns both PEM encoded.
func (ca *CA) Issue(id rpc.Identity, hosts []string, ttl time.Duration) (certPEM, keyPEMOut []byte, err error) {
	tmpl, err := ca.template(id, hosts, ttl)
	if err != nil {
		return nil, nil, err
	}
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), kp, nil
}

// SignCSR signs the public key of a PEM certificate request for id. The
// identity and lifetime are the CA's decision: whatever names the request
// itself asks for are ignored, so a requester cannot choose who it is.
func (ca *CA) SignCSR(csrPEM []byte, id rpc.Identity, hosts []string, ttl time.Duration) ([]byte, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, ErrBadPEM
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	tmpl, err := ca.template(id, hosts, ttl)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// NewCSR creates a key pair and a certificate request for it; the CA
// decides the identity, so the request carries none.
func NewCSR() (csrPEM, keyPEMOut []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), kp, nil
}

// CheckCSR reports whether csrPEM is a certificate request whose
// signature verifies (proof that the requester holds the key).
func CheckCSR(csrPEM []byte) error {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return ErrBadPEM
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	return nil
}
