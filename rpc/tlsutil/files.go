package tlsutil

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fedstream/fedstream/rpc"
)

// File names inside a TLS directory written by InitDir (fedstream tls init).
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// CertFiles are the certificate and key file names of one identity in a
// TLS directory: ROLE-NAME.pem and ROLE-NAME-key.pem.
func CertFiles(role, name string) (cert, key string) {
	base := role + "-" + name
	return base + ".pem", base + "-key.pem"
}

// ErrExists means tls init would overwrite an existing CA.
var ErrExists = errors.New("tlsutil: a CA already exists there")

// InitOptions are what InitDir writes.
type InitOptions struct {
	Org string
	// Coordinators are node ids to issue coordinator certificates for.
	Coordinators []string
	// Clients are names to issue client certificates for (the CLI).
	Clients []string
	// Hosts are the host SANs of the coordinator certificates.
	Hosts []string
}

// WrittenFile is one file InitDir wrote.
type WrittenFile struct {
	Path string `json:"path"`
	// Kind is "ca", "ca-key", "cert" or "key".
	Kind string `json:"kind"`
	// Identity is the fedstream identity URI of a certificate or key.
	Identity string `json:"identity,omitempty"`
}

// InitDir creates an org CA in dir and certificates for o's coordinators
// and clients. It refuses to replace an existing CA (every certificate of
// the org depends on it). Keys are written 0600, certificates 0644.
func InitDir(dir string, o InitOptions) ([]WrittenFile, error) {
	if _, err := os.Stat(filepath.Join(dir, CAFile)); err == nil {
		return nil, fmt.Errorf("%w: %s (remove it to start a new org CA)", ErrExists, filepath.Join(dir, CAFile))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ca, err := NewCA(o.Org)
	if err != nil {
		return nil, err
	}
	return ca.WriteDir(dir, o)
}

// WriteDir writes the CA and o's certificates into dir.
func (ca *CA) WriteDir(dir string, o InitOptions) ([]WrittenFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var out []WrittenFile
	write := func(name string, data []byte, mode os.FileMode, kind, id string) error {
		p := filepath.Join(dir, name)
		if err := writeFile(p, data, mode); err != nil {
			return err
		}
		out = append(out, WrittenFile{Path: p, Kind: kind, Identity: id})
		return nil
	}
	kp, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := write(CAFile, ca.CertPEM, 0o644, "ca", ""); err != nil {
		return nil, err
	}
	if err := write(CAKeyFile, kp, 0o600, "ca-key", ""); err != nil {
		return nil, err
	}
	issue := func(role, name string, hosts []string) error {
		id := rpc.Identity{Org: ca.Org(), Role: role, Name: name}
		certPEM, keyPEMData, err := ca.Issue(id, hosts, NodeValidity)
		if err != nil {
			return err
		}
		cf, kf := CertFiles(role, name)
		if err := write(cf, certPEM, 0o644, "cert", id.String()); err != nil {
			return err
		}
		return write(kf, keyPEMData, 0o600, "key", id.String())
	}
	for _, n := range o.Coordinators {
		if err := issue(rpc.RoleCoordinator, n, o.Hosts); err != nil {
			return nil, err
		}
	}
	for _, n := range o.Clients {
		if err := issue(rpc.RoleClient, n, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// writeFile replaces path with data, creating it with mode (an existing
// file's mode is reset too, so a key never stays world-readable).
func writeFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Paths resolves the three TLS files of a process: explicit files win,
// otherwise they come from dir by the InitDir names for role and name.
// cert and key are "" when neither a file nor a directory names them.
func Paths(dir, caFile, certFile, keyFile, role, name string) (ca, cert, key string) {
	ca, cert, key = caFile, certFile, keyFile
	if dir == "" {
		return
	}
	if ca == "" {
		ca = filepath.Join(dir, CAFile)
	}
	cf, kf := CertFiles(role, name)
	if cert == "" && name != "" {
		cert = filepath.Join(dir, cf)
	}
	if key == "" && name != "" {
		key = filepath.Join(dir, kf)
	}
	return
}
