package tlsutil

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/fedstream/fedstream/rpc"
)

type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// One Write of many TLS records reaches the network in one call, and the
// bytes arrive intact and in order.
func TestOneWriteOneSystemCall(t *testing.T) {
	ca := mustCA(t, "acme")
	srvCreds, cliCreds := creds(t, ca, rpc.RoleWorker, "w1"), creds(t, ca, rpc.RoleWorker, "w2")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16) // ~19 records
	got := make(chan []byte, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- nil
			return
		}
		s := Server(c, srvCreds.ServerConfig(Peer{}, false))
		defer s.Close()
		b, _ := io.ReadAll(io.LimitReader(s, int64(2*len(payload))))
		got <- b
	}()
	raw, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingConn{Conn: raw}
	c := Client(counted, cliCreds.ClientConfig(Peer{}))
	if _, err := c.Write(payload[:1]); err != nil { // handshake and a first record
		t.Fatal(err)
	}
	before := counted.writes.Load()
	if _, err := c.Write(payload[1:]); err != nil {
		t.Fatal(err)
	}
	if n := counted.writes.Load() - before; n != 1 {
		t.Fatalf("%d network writes for one Write of %d bytes, want 1", n, len(payload)-1)
	}
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if b := <-got; !bytes.Equal(b, append(append([]byte(nil), payload...), payload...)) {
		t.Fatalf("received %d bytes, not the %d written", len(b), 2*len(payload))
	}
}
