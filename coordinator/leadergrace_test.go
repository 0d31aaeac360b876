package coordinator

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/fsm"
)

// slowFuture is an apply future whose answer comes after delay, then
// runs then.
type slowFuture struct {
	raft.ApplyFuture
	delay time.Duration
	then  func()
}

func (f slowFuture) Error() error {
	err := f.ApplyFuture.Error()
	time.Sleep(f.delay) // a slow commit: fault injection, not synchronisation
	f.then()
	return err
}

// TestNewLeaderGraceRunsFromWhenItServes: a new leader whose set-up
// takes longer than the heartbeat TTL plus its grace (its commit of the
// unknown marks is slow, as under load) does not declare down a worker
// whose heartbeats it could not serve meanwhile (they are held until
// the set-up ran) and that reaches it soon after. Before, the grace ran
// from before that commit: it had passed when the leader began serving,
// and the worker was marked down at the first check
// (TestLeaderChangeKeepsHealthyWorkersReady failed so at load 35).
func TestNewLeaderGraceRunsFromWhenItServes(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	var served atomic.Int64 // when the slow commit ended (unix nanos)
	tm := testTimings()
	c := newTestClusterWith(t, 1, "", "", tm, func(cfg *Config) {
		cfg.hooks.applyFuture = func(mt fsm.MessageType, f raft.ApplyFuture) raft.ApplyFuture {
			if mt != fsm.SetWorkerStatusType || !armed.CompareAndSwap(true, false) {
				return f
			}
			return slowFuture{ApplyFuture: f, delay: tm.HeartbeatTTL + tm.LeaderGrace + 300*time.Millisecond,
				then: func() { served.Store(time.Now().UnixNano()) }}
		}
		// Heartbeats reach the leader half a second after it serves
		// (and not before: a heartbeat held through the set-up would
		// land at once).
		cfg.hooks.heartbeat = func(string) error {
			if at := served.Load(); armed.Load() || (at != 0 && time.Since(time.Unix(0, at)) < 500*time.Millisecond) {
				return status.Error(codes.Unavailable, "test: heartbeat late")
			}
			return nil
		}
		cfg.Timings.LeaderSetupTimeout = time.Minute
	})
	l := c.leader()
	w := c.startWorker(t, l, "w1")
	waitFor(t, 30*time.Second, "w1 ready", func() bool {
		rec, err := c.nodes[l].State().Worker(nil, w.id)
		return err == nil && rec != nil && rec.Status == statusReady
	})
	// The node comes back as leader of a new term; its set-up marks w1
	// unknown, slowly.
	armed.Store(true)
	c.stop(l)
	c.start(l)
	waitFor(t, 30*time.Second, "the set-up's slow commit ended", func() bool { return served.Load() != 0 })
	// The set-up marked w1 unknown; its first heartbeat served marks it
	// ready again, and from then on its deadline is renewed.
	for {
		rec, err := c.nodes[l].State().Worker(nil, w.id)
		if err != nil || rec == nil {
			t.Fatalf("worker w1: %v %v", rec, err)
		}
		if rec.Status == statusDown {
			t.Fatal("w1 was marked down: the new leader's grace ran out before it served heartbeats")
		}
		if rec.Status == statusReady {
			return
		}
		time.Sleep(20 * time.Millisecond) // sampling period, not synchronisation
	}
}
