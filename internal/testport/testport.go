// Package testport hands tests loopback addresses on ports that the
// operating system does not give out by itself.
//
// A test that restarts a server on the port it had before (a Raft node is
// named by its address, so a restarted coordinator must come back on it)
// cannot let the OS choose that port: ports chosen for port-0 listeners and
// for outgoing connections come from the ephemeral range (Linux: 32768 and
// up), and while the server is down another test's connection can take
// its port ("bind: address already in use" on restart, seen at load 20).
// The ports handed out here lie below that range, where only listeners
// that ask for a port by number bind.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
)

// Base and Span bound the ports handed out: [Base, Base+Span). They lie
// below Linux's ephemeral range and above 20000+n, where the coordinator
// tests name fake workers that never listen.
const Base, Span = 21000, 11000

// next walks the span from a random place, so that two test processes
// (go test runs packages in parallel) rarely probe the same ports.
var next = func() *atomic.Int64 {
	var p atomic.Int64
	p.Store(rand.Int64N(Span))
	return &p
}()

// Loopback returns n addresses 127.0.0.1:PORT whose TCP and UDP ports were
// both free a moment ago (serf listens on both with one number). Nothing
// holds them afterwards: a program that takes one in between makes the
// caller's start fail loudly, never silently.
func Loopback(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	for tries := 0; len(out) < n; tries++ {
		if tries > Span {
			t.Fatalf("no %d free loopback ports in [%d, %d)", n, Base, Base+Span)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", Base+int(next.Add(1))%Span)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			_ = l.Close()
			continue
		}
		// Closed only once all n are chosen, so no address repeats.
		defer l.Close()
		defer u.Close()
		out = append(out, addr)
	}
	return out
}
