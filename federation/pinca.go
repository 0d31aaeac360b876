package federation

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"

	"github.com/fedstream/fedstream/federation/ledger"
)

// FieldCA is the field of a pin record holding the partner's CA
// certificate (PEM). Cross-org connections with that partner are verified
// against this certificate alone.
const FieldCA = "ca"

var (
	// ErrBadCA: a certificate offered as a partner's CA is not a CA
	// certificate of that org.
	ErrBadCA = errors.New("not a CA certificate of that org")
	// ErrNoPinnedCA: the partner's CA certificate is not pinned, so no
	// cross-org connection with it can be verified.
	ErrNoPinnedCA = errors.New("no pinned CA certificate for org")
)

// ParseOrgCA parses a PEM CA certificate and checks that it is a CA
// certificate made for org (fedstream tls init names the org as the
// subject's organization).
func ParseOrgCA(org string, caPEM []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(caPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w %q: no PEM CERTIFICATE block", ErrBadCA, org)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadCA, org, err)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, fmt.Errorf("%w %q: the certificate is not a CA (give the org's ca.pem)", ErrBadCA, org)
	}
	if !slices.Contains(cert.Subject.Organization, org) {
		return nil, fmt.Errorf("%w %q: the CA is of org %v", ErrBadCA, org, cert.Subject.Organization)
	}
	return cert, nil
}

// PinWithCA pins partner org's public signing key and its CA certificate
// in one pin record. Pinning what is already pinned does nothing; a key or
// CA that differs from the pinned one is refused (ErrKeyMismatch): a pin
// is never replaced. A CA added to a key pinned earlier without one is a
// second pin record with the same key.
func (o *Org) PinWithCA(ctx context.Context, org string, key ed25519.PublicKey, caPEM []byte) error {
	if len(caPEM) == 0 {
		return o.Pin(ctx, org, key)
	}
	if _, err := ParseOrgCA(org, caPEM); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if org == o.name {
		return fmt.Errorf("%w: cannot pin a key for this org itself (%s)", ErrKeyMismatch, org)
	}
	if len(key) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: key for %s is %d bytes, want %d", ErrKeyMismatch, org, len(key), ed25519.PublicKeySize)
	}
	es, err := o.entries()
	if err != nil {
		return err
	}
	keys := keysOf(es)
	pinnedKey, hasKey := keys[org]
	if hasKey && !pinnedKey.Equal(key) {
		return fmt.Errorf("%w: %s presents %s, pinned %s", ErrKeyMismatch, org, ledger.EncodePublicKey(key), ledger.EncodePublicKey(pinnedKey))
	}
	pinnedCA, hasCA := caOf(es, org)
	if hasCA {
		if pinnedCA != string(caPEM) {
			return fmt.Errorf("%w: %s's CA certificate differs from the one pinned", ErrKeyMismatch, org)
		}
		return nil
	}
	id := "pin-" + org
	if hasKey {
		id += "-ca"
	}
	r := ledger.Record{Kind: ledger.KindPin, ID: id, A: o.name, B: org, Time: o.now().UTC(),
		Fields: map[string]string{ledger.FieldKey: ledger.EncodePublicKey(key), FieldCA: string(caPEM)}}
	return o.appendLocked(ctx, ledger.Signed{Record: r, Signatures: []ledger.Signature{ledger.Sign(r, o.name, o.key)}})
}

// PinnedCA returns partner org's pinned CA certificate (PEM); ok is false
// when none is pinned.
func (o *Org) PinnedCA(org string) (caPEM []byte, ok bool, err error) {
	es, err := o.entries()
	if err != nil {
		return nil, false, err
	}
	ca, ok := caOf(es, org)
	return []byte(ca), ok, nil
}

// caOf is the CA the first pin record of org with one names (later ones
// cannot differ: PinWithCA refuses).
func caOf(es []ledger.Entry, org string) (string, bool) {
	for _, e := range es {
		if e.Record.Kind == ledger.KindPin && e.Record.B == org && e.Record.Fields[FieldCA] != "" {
			return e.Record.Fields[FieldCA], true
		}
	}
	return "", false
}
