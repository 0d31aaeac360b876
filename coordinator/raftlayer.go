package coordinator

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// tlsStreamLayer carries hashicorp/raft's network transport over mutual
// TLS. Both directions accept only a certificate of this org with the
// coordinator role; an outgoing connection to an address that Raft's
// configuration gives to a server id also requires that id as the
// certificate's name, so a Raft message for c2 reaches only c2.
type tlsStreamLayer struct {
	net.Listener // plain TCP; Accept wraps each connection
	advertise    net.Addr
	creds        *tlsutil.Credentials
	server       *tls.Config
	// idOf returns the server id Raft's latest configuration gives addr,
	// or "" when it names none (before bootstrap).
	idOf func(raft.ServerAddress) string
}

func newTLSStreamLayer(bind string, creds *tlsutil.Credentials, idOf func(raft.ServerAddress) string) (*tlsStreamLayer, error) {
	lis, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	return &tlsStreamLayer{
		Listener: lis, advertise: lis.Addr(), creds: creds, idOf: idOf,
		server: creds.ServerConfig(tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}}, false),
	}, nil
}

// Accept returns the next connection as a server-side TLS connection. The
// handshake runs on the connection's first read, in the transport's
// per-connection goroutine, so one slow or hostile client cannot hold up
// the accept loop; a client without an acceptable certificate fails that
// read and raft drops the connection before decoding anything.
func (l *tlsStreamLayer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(c, l.server), nil
}

func (l *tlsStreamLayer) Addr() net.Addr { return l.advertise }

// Dial opens a verified connection to the coordinator at address.
func (l *tlsStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	want := tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}}
	if l.idOf != nil {
		want.Name = l.idOf(address)
	}
	return dialTLS(string(address), l.creds.ClientConfig(want), timeout)
}

func dialTLS(addr string, cfg *tls.Config, timeout time.Duration) (*tls.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// raftIDOf is the idOf of the server's stream layer.
func (s *Server) raftIDOf(addr raft.ServerAddress) string {
	r := s.raftRef.Load()
	if r == nil {
		return ""
	}
	// GetConfiguration reads a copy of the latest configuration without
	// going through raft's main loop, so it is safe from the transport.
	cf := r.GetConfiguration()
	if cf.Error() != nil {
		return ""
	}
	id := ""
	for _, srv := range cf.Configuration().Servers {
		if srv.Address == addr {
			if id != "" && id != string(srv.ID) {
				return "" // two ids at one address: left to raft to sort out
			}
			id = string(srv.ID)
		}
	}
	return id
}
