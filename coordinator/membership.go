package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"

	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// Membership rules. Serf says who is around; it is not proof of anything,
// since any process holding the gossip key can claim any tags. So:
//
//   - A serf member becomes a Raft voter (at bootstrap or added by the
//     leader) only after it proved, on its advertised Raft address, that
//     it holds the org CA's certificate fedstream://ORG/coordinator/ID for
//     the id it claims (verifyCoordinator).
//   - A node without Raft state bootstraps only after every proven
//     coordinator of the org it sees answered RaftState without any; if
//     one has state, the node waits to be added (bootstrap.go).
//   - A voter that left serf is removed at once; one that stays failed, or
//     gone from serf, for Timings.DeadVoterTimeout is removed by the
//     leader (reapVoters). Until then it still counts towards the quorum.

// errUnverified is returned when a member does not prove its identity.
var errUnverified = errors.New("coordinator did not prove its identity")

// verifyTimeout bounds one identity check of a member.
const verifyTimeout = 3 * time.Second

// verifyCoordinator dials m's Raft address over mutual TLS and requires the
// certificate of the coordinator m.ID of this org. In plaintext mode there
// is nothing to check.
func (s *Server) verifyCoordinator(m member) error {
	if s.cfg.TLS == nil {
		return nil
	}
	if m.ID == "" || m.RaftAddr == "" {
		return fmt.Errorf("%w: member %s advertises no id or raft address", errUnverified, m.Name)
	}
	want := tlsutil.Peer{Roles: []string{rpc.RoleCoordinator}, Name: m.ID}
	conn, err := dialTLS(m.RaftAddr, s.cfg.TLS.ClientConfig(want), verifyTimeout)
	if err != nil {
		return fmt.Errorf("%w: member %s at %s: %v", errUnverified, m.Name, m.RaftAddr, err)
	}
	// Closing without a request: raft's transport sees EOF and drops the
	// connection quietly.
	_ = conn.Close()
	return nil
}

// deadVoterInterval is how often the leader looks for dead voters.
func (s *Server) deadVoterInterval() time.Duration {
	return min(max(s.cfg.Timings.DeadVoterTimeout/10, 100*time.Millisecond), time.Minute)
}

// reapVoters removes voters that left, or stayed failed (or unknown to
// serf) longer than DeadVoterTimeout. It runs on the leader only.
func (s *Server) reapVoters(ctx context.Context) {
	failedSince := map[raft.ServerID]time.Time{}
	tick := time.NewTicker(s.deadVoterInterval())
	defer tick.Stop()
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-tick.C:
		case <-s.membersChanged:
			now = time.Now()
		}
		s.reapVotersOnce(ctx, now, failedSince)
		// Members whose identity check failed on their join event (say, a
		// transient network error) get another chance.
		s.reconcileVoters(ctx)
	}
}

func (s *Server) reapVotersOnce(ctx context.Context, now time.Time, failedSince map[raft.ServerID]time.Time) {
	cf := s.raft.GetConfiguration()
	if cf.Error() != nil {
		return
	}
	// The state of each coordinator id of this org in serf: alive wins
	// over anything else claimed for the same id.
	state := map[string]serf.MemberStatus{}
	for _, m := range s.serf.Members() {
		mm, ok := parseMember(m)
		if !ok || mm.Org != s.cfg.Org {
			continue
		}
		if cur, seen := state[mm.ID]; !seen || mm.Status == serf.StatusAlive || (cur != serf.StatusAlive && mm.Status == serf.StatusFailed) {
			state[mm.ID] = mm.Status
		}
	}
	servers := cf.Configuration().Servers
	present := map[raft.ServerID]bool{}
	for _, srv := range servers {
		present[srv.ID] = true
		if string(srv.ID) == s.cfg.NodeID {
			continue
		}
		st, known := state[string(srv.ID)]
		var reason string
		switch {
		case known && st == serf.StatusAlive:
			delete(failedSince, srv.ID)
			continue
		case known && st == serf.StatusLeft:
			reason = "it left the cluster"
		default:
			since, ok := failedSince[srv.ID]
			if !ok {
				failedSince[srv.ID] = now
				continue
			}
			if now.Sub(since) < s.cfg.Timings.DeadVoterTimeout {
				continue
			}
			reason = fmt.Sprintf("it has been failed or unreachable in serf for more than %v", s.cfg.Timings.DeadVoterTimeout)
		}
		s.logger.Warn("removing coordinator from the raft configuration", "id", srv.ID, "addr", srv.Address, "reason", reason)
		if err := awaitFuture(ctx, s.raft.RemoveServer(srv.ID, 0, 5*time.Second)); err != nil {
			s.logger.Warn("remove voter failed", "id", srv.ID, "err", err)
			continue
		}
		delete(failedSince, srv.ID)
	}
	for id := range failedSince {
		if !present[id] {
			delete(failedSince, id)
		}
	}
}
