package rpc

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Keepalive is the HTTP/2 ping policy of both ends of every fedstream gRPC
// connection. A client pings a connection with calls open (a `tail`
// waiting for results, a worker's assignment long poll) after Time without
// traffic and drops it when no answer comes within Timeout. A server
// accepts pings as often as every MinPingInterval, also on a connection
// with no call open; a client pinging more often gets a GoAway
// ("too_many_pings"). The invariant is MinPingInterval < Time: grpc's
// default server minimum (5 minutes) is above the client's 30 s, which is
// what made `fedstream tail` fail whenever results paused.
type Keepalive struct {
	Time            time.Duration
	Timeout         time.Duration
	MinPingInterval time.Duration
}

// DefaultKeepalive is the policy of every fedstream process. Time is well
// above grpc-go's floor for clients (10 s); MinPingInterval is far below
// it, so that any fedstream client is within policy, and still turns away
// a peer that floods pings.
var DefaultKeepalive = Keepalive{Time: 30 * time.Second, Timeout: 10 * time.Second, MinPingInterval: time.Second}

// DialOption is the client side of the policy.
func (k Keepalive) DialOption() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: k.Time, Timeout: k.Timeout})
}

// ServerOptions are the server side of the policy.
func (k Keepalive) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: k.MinPingInterval, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: k.Time, Timeout: k.Timeout}),
	}
}

// ServerOptions are the options every fedstream gRPC server (coordinator,
// worker) starts with: today the keepalive policy that matches Dial's.
func ServerOptions() []grpc.ServerOption { return DefaultKeepalive.ServerOptions() }
