package dataplane

import (
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// inBand is the DCAA state an output stream advertises to its
// subscribers: stamped on every batch sent, and sent alone (a heartbeat:
// a batch without tuples) when the stream has had nothing to send for a
// heartbeat interval, so that a subscriber which hears nothing at all for
// longer than its detection timeout can take the producer for failed
// (process paused, link held, worker gone). Streams of queries without
// replicas have no heartbeat and send the state unset, as before.
type inBand struct {
	state     atomic.Int32 // fedstreampb.ReplicaState
	tentWM    atomic.Int64
	heartbeat atomic.Int64 // nanoseconds; 0: no heartbeats
}

// SetHeartbeat makes the stream send a heartbeat batch to each
// acknowledging data subscription after every interval every without
// data (0 turns heartbeats off). Tail clients get none.
func (b *OutputBuffer) SetHeartbeat(every time.Duration) { b.inband.heartbeat.Store(int64(every)) }

// Heartbeat is the heartbeat interval (0: none).
func (b *OutputBuffer) Heartbeat() time.Duration { return time.Duration(b.inband.heartbeat.Load()) }

// SetStreamState sets the producer's replica state and tentative
// watermark advertised from now on (see fedstreampb.Batch).
func (b *OutputBuffer) SetStreamState(st fedstreampb.ReplicaState, tentWM int64) {
	b.inband.tentWM.Store(tentWM)
	b.inband.state.Store(int32(st))
}

// StreamState is the advertised replica state and tentative watermark.
func (b *OutputBuffer) StreamState() (fedstreampb.ReplicaState, int64) {
	return fedstreampb.ReplicaState(b.inband.state.Load()), b.inband.tentWM.Load()
}

// StateFunc receives the producer's advertised state with every batch a
// subscription receives, heartbeats included (see OnStreamState).
type StateFunc func(st fedstreampb.ReplicaState, tentWM int64)

// OnStreamState makes the subscriber call fn for every message it
// receives (before delivering its tuples), and, on a local stream, once
// per heartbeat interval while it waits for data: the caller learns that
// the producer is alive and what state it advertises. Call it before Run.
func (s *Subscriber) OnStreamState(fn StateFunc) { s.onState = fn }

// heartbeatTimer returns a channel firing after buf's heartbeat interval
// (nil when it has none) and its stop function.
func heartbeatTimer(buf *OutputBuffer) (<-chan time.Time, func() bool) {
	hb := buf.Heartbeat()
	if hb <= 0 {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(hb)
	return t.C, t.Stop
}
