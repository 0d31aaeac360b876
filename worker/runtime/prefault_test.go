package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// bulkTLSPair is a bulk server and a client over mutual TLS on loopback.
func bulkTLSPair(tb testing.TB) (*bulkServer, *bulkClient) {
	tb.Helper()
	ca, err := tlsutil.NewCA("org")
	if err != nil {
		tb.Fatal(err)
	}
	creds := func(name string) *tlsutil.Credentials {
		cert, key, err := ca.Issue(rpc.Identity{Org: "org", Role: rpc.RoleWorker, Name: name}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			tb.Fatal(err)
		}
		c, err := tlsutil.New(ca.CertPEM)
		if err == nil {
			err = c.SetCertificate(cert, key)
		}
		if err != nil {
			tb.Fatal(err)
		}
		return c
	}
	workers := tlsutil.Peer{Roles: []string{rpc.RoleWorker}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	b, err := newBulkServer(lis, creds("server").ServerConfig(workers, false), log)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(b.close)
	return b, newBulkClient(BulkOptions{ClientTLS: creds("fetcher").ClientConfig(workers)})
}

// bulkSend serves data over b's next offer in bulkWriteBytes parts and
// receives it with cli into a fresh buffer (dst nil: the size comes
// first, as an inline offer sends it).
func bulkSend(ctx context.Context, b *bulkServer, cli *bulkClient, data []byte, parts int) ([]byte, error) {
	token, conns, withdraw, err := b.offer()
	if err != nil {
		return nil, err
	}
	defer withdraw()
	served := make(chan error, 1)
	go func() {
		_, err := serveBulk(ctx, conns, func(emit func([]byte) error) error {
			var size [8]byte
			n := uint64(len(data) * parts)
			for i := range size {
				size[i] = byte(n >> (56 - 8*i))
			}
			if err := emit(size[:]); err != nil {
				return err
			}
			for range parts {
				if err := emit(data); err != nil {
					return err
				}
			}
			return nil
		})
		served <- err
	}()
	got, err := cli.receive(ctx, "127.0.0.1:1", b.port, token, nil, nil, nil)
	if serr := <-served; err == nil {
		err = serr
	}
	return got, err
}

// TestBulkReceivePrefaulted: a buffer large enough to be prefaulted while
// the bytes arrive (prefaulter) holds exactly the bytes sent: making its
// pages present beside the reader never changes one.
func TestBulkReceivePrefaulted(t *testing.T) {
	if !prefaultSupported {
		t.Skip("no prefaulting on this platform")
	}
	b, cli := bulkTLSPair(t)
	data := make([]byte, 3*prefaultStepBytes+4321)
	_, _ = rand.Read(data)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const parts = 3 // over prefaultMinBytes
	got, err := bulkSend(ctx, b, cli, data, parts)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != parts*len(data) {
		t.Fatalf("received %d bytes, want %d", len(got), parts*len(data))
	}
	for i := range parts {
		if !bytes.Equal(got[i*len(data):(i+1)*len(data)], data) {
			t.Fatalf("part %d differs from what was sent", i)
		}
	}
	// The pages are present and unchanged after prefaulting them again.
	before := bytes.Clone(got)
	if !prefaultPages(got) || !bytes.Equal(before, got) {
		t.Fatal("prefaulting present pages failed or changed them")
	}
}

// BenchmarkBulkReceiveFresh: 64 MiB over a mutual-TLS bulk connection
// into fresh memory (returned to the OS before each transfer, as in a
// worker that receives its first large snapshot), with and without
// prefaulting the buffer ahead of the reader, alternately so that both
// see the same load on a shared machine. It reports the fastest
// transfer of each (ms-off, ms-on): the one least disturbed by others,
// and the process's mean CPU time (user and system, both ends of the
// transfer) per transfer (cpu-ms-off, cpu-ms-on).
//
//	go test -run '^$' -bench BulkReceiveFresh -benchtime 10x ./worker/runtime/
func BenchmarkBulkReceiveFresh(b *testing.B) {
	srv, cli := bulkTLSPair(b)
	data := make([]byte, bulkWriteBytes)
	_, _ = rand.Read(data)
	const parts = 128 // 64 MiB
	defer func(was bool) { prefaultEnabled = was }(prefaultEnabled)
	best := [2]time.Duration{time.Hour, time.Hour}
	var cpu [2]time.Duration
	b.SetBytes(2 * int64(len(data)*parts))
	for range b.N {
		for i, on := range []bool{false, true} {
			prefaultEnabled = on && prefaultSupported
			debug.FreeOSMemory()
			began, cpuBefore := time.Now(), processCPU()
			got, err := bulkSend(context.Background(), srv, cli, data, parts)
			if err != nil || len(got) != len(data)*parts {
				b.Fatal(err)
			}
			best[i] = min(best[i], time.Since(began))
			cpu[i] += processCPU() - cpuBefore
		}
	}
	b.ReportMetric(float64(best[0].Microseconds())/1000, "ms-off")
	b.ReportMetric(float64(best[1].Microseconds())/1000, "ms-on")
	b.ReportMetric(float64(cpu[0].Microseconds())/1000/float64(b.N), "cpu-ms-off")
	b.ReportMetric(float64(cpu[1].Microseconds())/1000/float64(b.N), "cpu-ms-on")
}
