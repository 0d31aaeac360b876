package coordinator

import (
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/fsm"
)

// loseFirstAnswer is an option for every node of a cluster: the leader
// that proposes the cluster's first command of type mt commits it, then
// hands its leadership to another voter and answers "leadership lost"
// (raft.ErrLeadershipLost), as a leader that lost a quorum between the
// commit and its answer does: the write committed, the client cannot
// tell and retries. fired becomes 1 when it did; cluster is read then
// (set it once the cluster runs).
func loseFirstAnswer(mt fsm.MessageType, fired *atomic.Int32, cluster *atomic.Pointer[testCluster]) func(*Config) {
	return func(c *Config) {
		c.hooks.applyFuture = func(t fsm.MessageType, f raft.ApplyFuture) raft.ApplyFuture {
			if t != mt || !fired.CompareAndSwap(0, 1) {
				return f
			}
			return lostAnswerFuture{ApplyFuture: f, cluster: cluster}
		}
	}
}

type lostAnswerFuture struct {
	raft.ApplyFuture
	cluster *atomic.Pointer[testCluster]
}

func (f lostAnswerFuture) Error() error {
	if err := f.ApplyFuture.Error(); err != nil {
		return err
	}
	if c := f.cluster.Load(); c != nil {
		for _, n := range c.nodes {
			if n != nil && n.IsLeader() {
				// A failed transfer still loses the answer: the retry
				// then meets the same leader, which must answer it alike.
				_ = n.raft.LeadershipTransfer().Error()
				break
			}
		}
	}
	return raft.ErrLeadershipLost
}
