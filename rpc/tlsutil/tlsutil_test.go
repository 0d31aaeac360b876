package tlsutil

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc"
)

func mustCA(t *testing.T, org string) *CA {
	t.Helper()
	ca, err := NewCA(org)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func creds(t *testing.T, ca *CA, role, name string) *Credentials {
	t.Helper()
	c, err := New(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if role != "" {
		certPEM, keyPEM, err := ca.Issue(rpc.Identity{Org: ca.Org(), Role: role, Name: name}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SetCertificate(certPEM, keyPEM); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// handshake runs one TLS handshake over loopback and returns the client's
// and the server's errors.
func handshake(t *testing.T, server, client *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		err = tc.Handshake()
		if err == nil {
			// TLS 1.3: the client certificate is checked after the client's
			// handshake returns; read so the client sees a refusal.
			_, err = tc.Write([]byte{1})
		}
		done <- err
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, client)
	clientErr = tc.Handshake()
	if clientErr == nil {
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, clientErr = tc.Read(make([]byte, 1))
	}
	return clientErr, <-done
}

func TestMutualTLSAcceptsOnlyTheOrgsIdentities(t *testing.T) {
	acme, other := mustCA(t, "acme"), mustCA(t, "other")
	coord := creds(t, acme, rpc.RoleCoordinator, "c1")
	anyCoord := Peer{Roles: []string{rpc.RoleCoordinator}}
	cases := []struct {
		name     string
		client   *tls.Config
		server   *tls.Config
		clientOK bool
	}{
		{"same org coordinator", creds(t, acme, rpc.RoleCoordinator, "c2").ClientConfig(Peer{Roles: []string{rpc.RoleCoordinator}, Name: "c1"}),
			coord.ServerConfig(anyCoord, false), true},
		{"client without certificate", creds(t, acme, "", "").ClientConfig(anyCoord), coord.ServerConfig(anyCoord, false), false},
		{"client without certificate, optional", creds(t, acme, "", "").ClientConfig(anyCoord), coord.ServerConfig(anyCoord, true), true},
		{"other org's client", creds(t, other, rpc.RoleCoordinator, "c2").ClientConfig(anyCoord), coord.ServerConfig(anyCoord, false), false},
		{"other org's client, optional", creds(t, other, rpc.RoleCoordinator, "c2").ClientConfig(anyCoord), coord.ServerConfig(anyCoord, true), false},
		{"worker where a coordinator is needed", creds(t, acme, rpc.RoleWorker, "w1").ClientConfig(anyCoord), coord.ServerConfig(anyCoord, false), false},
		{"server with the wrong name", creds(t, acme, rpc.RoleCoordinator, "c2").ClientConfig(Peer{Roles: []string{rpc.RoleCoordinator}, Name: "c3"}),
			coord.ServerConfig(anyCoord, false), false},
		{"server of another org", creds(t, acme, rpc.RoleCoordinator, "c2").ClientConfig(anyCoord),
			creds(t, other, rpc.RoleCoordinator, "c1").ServerConfig(anyCoord, false), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cerr, serr := handshake(t, tc.server, tc.client)
			if tc.clientOK && (cerr != nil || serr != nil) {
				t.Fatalf("want success, got client %v, server %v", cerr, serr)
			}
			if !tc.clientOK && cerr == nil && serr == nil {
				t.Fatal("connection accepted, want refused")
			}
		})
	}
}

func TestSignCSRDecidesTheIdentity(t *testing.T) {
	ca := mustCA(t, "acme")
	csr, key, err := NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	id := rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: "w-1"}
	certPEM, err := ca.SignCSR(csr, id, nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetCertificate(certPEM, key); err != nil {
		t.Fatal(err)
	}
	got, notAfter, ok := c.Identity()
	if !ok || got != id {
		t.Fatalf("identity %v, want %v", got, id)
	}
	if time.Until(notAfter) > 2*time.Minute {
		t.Fatalf("certificate valid until %v, want about a minute", notAfter)
	}
	if _, err := ca.SignCSR([]byte("junk"), id, nil, time.Minute); !errors.Is(err, ErrBadPEM) {
		t.Fatalf("junk request: %v, want ErrBadPEM", err)
	}
	if _, err := ca.SignCSR(csr, rpc.Identity{Org: "other", Role: "worker", Name: "x"}, nil, time.Minute); err == nil {
		t.Fatal("CA signed for another org")
	}
	// Another org's certificate is refused as one's own.
	otherPEM, otherKey, _ := mustCA(t, "other").Issue(rpc.Identity{Org: "other", Role: "worker", Name: "w"}, nil, time.Hour)
	if err := c.SetCertificate(otherPEM, otherKey); err == nil {
		t.Fatal("installed a certificate another CA signed")
	}
}

func TestInitDirWritesPrivateKeysOwnerOnly(t *testing.T) {
	dir := t.TempDir()
	files, err := InitDir(dir, InitOptions{Org: "acme", Coordinators: []string{"c1", "c2"}, Clients: []string{"admin"}, Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2+2*3 {
		t.Fatalf("wrote %d files: %+v", len(files), files)
	}
	for _, f := range files {
		st, err := os.Stat(f.Path)
		if err != nil {
			t.Fatal(err)
		}
		if (f.Kind == "key" || f.Kind == "ca-key") && st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f.Path, st.Mode().Perm())
		}
	}
	ca, cert, key := Paths(dir, "", "", "", rpc.RoleCoordinator, "c2")
	c, err := Load(ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if id, _, _ := c.Identity(); id != (rpc.Identity{Org: "acme", Role: rpc.RoleCoordinator, Name: "c2"}) {
		t.Fatalf("loaded identity %v", id)
	}
	if _, err := LoadCA(filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := InitDir(dir, InitOptions{Org: "acme"}); !errors.Is(err, ErrExists) {
		t.Fatalf("second init: %v, want ErrExists", err)
	}
}
