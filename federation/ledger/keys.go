package ledger

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrKeyFile: a key file is unreadable, malformed or too open.
var ErrKeyFile = errors.New("bad org signing key file")

// SigningKeyFile is the name of the org's private signing key in a
// coordinator's data directory.
const SigningKeyFile = "org-signing.key"

// EncodePublicKey is the text form of a public key inside records: base64
// (standard, padded) of the 32 raw bytes.
func EncodePublicKey(k ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(k) }

// DecodePublicKey reverses EncodePublicKey.
func DecodePublicKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("public key %q is not %d bytes of base64", s, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

// LoadOrCreateSigningKey reads dir/org-signing.key, or creates it with a
// new key (mode 0600) when it does not exist. created reports the latter.
// A key file readable by group or others is refused: the key is the org's
// signature on every contract and move.
func LoadOrCreateSigningKey(dir string) (key ed25519.PrivateKey, created bool, err error) {
	path := filepath.Join(dir, SigningKeyFile)
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, false, fmt.Errorf("generate org signing key: %w", err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			return nil, false, fmt.Errorf("encode org signing key: %w", err)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, false, fmt.Errorf("create %s: %w", dir, err)
		}
		data := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
		// O_EXCL: two processes starting at once never overwrite each
		// other's key.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, false, fmt.Errorf("create %s: %w", path, err)
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			return nil, false, fmt.Errorf("write %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			return nil, false, fmt.Errorf("write %s: %w", path, err)
		}
		return priv, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, false, fmt.Errorf("%w: %s has mode %#o; it must be readable by its owner only (chmod 600)", ErrKeyFile, path, st.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, false, fmt.Errorf("%w: %s holds no PEM PRIVATE KEY block", ErrKeyFile, path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, false, fmt.Errorf("%w: %s: %v", ErrKeyFile, path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, false, fmt.Errorf("%w: %s holds a %T, want an ed25519 key", ErrKeyFile, path, k)
	}
	return priv, false, nil
}

// MarshalSigningKey is the PKCS#8 DER of a signing key.
func MarshalSigningKey(k ed25519.PrivateKey) ([]byte, error) {
	return x509.MarshalPKCS8PrivateKey(k)
}

// ParseSigningKey reads PKCS#8 DER holding an ed25519 key.
func ParseSigningKey(der []byte) (ed25519.PrivateKey, error) {
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%w: a %T, want an ed25519 key", ErrKeyFile, k)
	}
	return priv, nil
}

// ReplaceSigningKey writes k as dir/org-signing.key (mode 0600) through a
// temporary file and a rename, so a crash leaves the old or the new key,
// never half of one.
func ReplaceSigningKey(dir string, k ed25519.PrivateKey) error {
	der, err := MarshalSigningKey(k)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, SigningKeyFile+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, SigningKeyFile))
}

// PublicKeyPEM is the form of a public key in a keys directory: a PEM
// "PUBLIC KEY" block (PKIX), which openssl also reads.
func PublicKeyPEM(k ed25519.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		// An ed25519.PublicKey always marshals.
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// PublicKeyExt is the extension of public key files in a keys directory:
// ORG.pub holds ORG's key.
const PublicKeyExt = ".pub"

// LoadKeyDir reads every ORG.pub in dir.
func LoadKeyDir(dir string) (Keyring, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read keys directory: %w", err)
	}
	keys := Keyring{}
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), PublicKeyExt) {
			continue
		}
		org := strings.TrimSuffix(e.Name(), PublicKeyExt)
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrKeyFile, err)
		}
		blk, _ := pem.Decode(data)
		if blk == nil || blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("%w: %s holds no PEM PUBLIC KEY block", ErrKeyFile, e.Name())
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrKeyFile, e.Name(), err)
		}
		pk, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("%w: %s holds a %T, want an ed25519 key", ErrKeyFile, e.Name(), k)
		}
		keys[org] = pk
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no ORG%s files in %s", ErrKeyFile, PublicKeyExt, dir)
	}
	return keys, nil
}

// WriteKeyDir writes keys as ORG.pub files into dir.
func WriteKeyDir(dir string, keys Keyring) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for org, k := range keys {
		if org == "" || strings.ContainsAny(org, `/\`) || org == "." || org == ".." {
			return fmt.Errorf("org name %q cannot be a file name", org)
		}
		if err := os.WriteFile(filepath.Join(dir, org+PublicKeyExt), PublicKeyPEM(k), 0o644); err != nil {
			return err
		}
	}
	return nil
}
