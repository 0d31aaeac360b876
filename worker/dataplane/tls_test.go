package dataplane

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// Over mutual TLS with the TLS transport options (a 1 KiB gRPC read buffer:
// most of each frame is read straight out of the decrypted records; 16 KiB
// frames straddle 16 KiB records), every batch arrives byte for byte as
// the buffer holds it.
func TestSubscribeOverTLSWithSmallReadBuffer(t *testing.T) {
	ca, err := tlsutil.NewCA("acme")
	if err != nil {
		t.Fatal(err)
	}
	creds := func(name string) *tlsutil.Credentials {
		cert, key, err := ca.Issue(rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: name}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tlsutil.New(ca.CertPEM)
		if err == nil {
			err = c.SetCertificate(cert, key)
		}
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	peer := tlsutil.Peer{Roles: []string{rpc.RoleWorker}}

	const n = 3000
	buf := NewOutputBuffer(BufferOptions{})
	for id := uint64(1); id <= n; id++ {
		// Payloads of varying length, so tuples fall anywhere in frames
		// and records.
		payload := bytes.Repeat([]byte{byte('a' + id%26)}, int(100+id*37%900))
		if err := buf.Append(context.Background(), dataTuple(id, string(payload))); err != nil {
			t.Fatal(err)
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(ServerOptions(), creds("w1").ServerOption(peer, false))
	srv := grpc.NewServer(append(opts, TLSServerOptions()...)...)
	fedstreampb.RegisterDataPlaneServer(srv, NewServer(&mapResolver{bufs: map[string]*OutputBuffer{"up": buf}}, nil, nil))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()

	pool := NewPool(append([]grpc.DialOption{creds("w2").DialOption(peer)}, TLSDialOptions()...)...)
	defer pool.Close()
	conn, err := pool.Conn(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fedstreampb.SubscribeRequest{Stream: &fedstreampb.StreamRef{Query: "q", TaskId: "up"}, Subscriber: "t", NoAck: true}); err != nil {
		t.Fatal(err)
	}
	var after uint64
	for after < n {
		b, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		want, count, last, _, _, err := buf.Read(after, len(b.Data))
		if err != nil {
			t.Fatal(err)
		}
		if uint32(count) != b.Count || last != b.LastId || !bytes.Equal(b.Data, want) {
			t.Fatal(fmt.Errorf("batch after id %d: %d tuples to %d, %d bytes; the buffer holds %d to %d, %d bytes (equal: %v)",
				after, b.Count, b.LastId, len(b.Data), count, last, len(want), bytes.Equal(b.Data, want)))
		}
		after = b.LastId
	}
}
