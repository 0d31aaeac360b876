package coordinator

import (
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/fsm"
)

// unansweredFuture is an apply future raft never answers, as raft's own
// are not when it shuts down with their entry queued for the FSM; its
// Error returns only once release is closed (the test's clean-up).
type unansweredFuture struct{ release chan struct{} }

func (f unansweredFuture) Error() error { <-f.release; return raft.ErrRaftShutdown }
func (unansweredFuture) Index() uint64  { return 0 }
func (unansweredFuture) Response() any  { return nil }

// TestShutdownWhileLeaderSetUpWriteUnanswered: Shutdown returns while the
// new leader's first write (the org identity, ensureOrgIdentity) waits on
// a future raft never answers. It used to wait for the leader loop, which
// waited on the future for ever (a test binary stuck 8 minutes).
func TestShutdownWhileLeaderSetUpWriteUnanswered(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	blocked := make(chan struct{})
	var once sync.Once
	c := newTestClusterWith(t, 1, "", "", testTimings(), func(cfg *Config) {
		cfg.hooks.applyFuture = func(mt fsm.MessageType, f raft.ApplyFuture) raft.ApplyFuture {
			if mt != fsm.AppendLedgerEntryType {
				return f
			}
			once.Do(func() { close(blocked) })
			return unansweredFuture{release: release}
		}
	})
	// Registered after the cluster's: runs first, and frees the waiter
	// (and, before the fix, the stuck Shutdown) whatever the outcome.
	t.Cleanup(func() { close(release) })
	select {
	case <-blocked:
	case <-time.After(60 * time.Second):
		t.Fatal("the leader never proposed the org identity")
	}
	srv := c.nodes[0]
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Shutdown() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown did not return within 30s while the leader's set-up write was unanswered")
	}
}
