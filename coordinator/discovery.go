package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/internal/retry"
)

// Serf tags every coordinator carries. Serf is for discovery and failure
// detection only: nothing authoritative is decided from it except the one
// bootstrap, which raft makes idempotent.
const (
	tagOrg    = "org"
	tagRole   = "role"
	tagID     = "id"
	tagGRPC   = "grpc"
	tagRaft   = "raft"
	tagExpect = "expect"
	// tagProto is the replication protocol the node's build speaks
	// (fsm.ProtocolVersion); see canPropose.
	tagProto = "proto"

	roleCoordinator = "coordinator"
)

// member is a coordinator as seen through serf.
type member struct {
	Name, Org, ID, GRPCAddr, RaftAddr string
	Expect                            int
	Status                            serf.MemberStatus
}

func parseMember(m serf.Member) (member, bool) {
	if m.Tags[tagRole] != roleCoordinator {
		return member{}, false
	}
	// A malformed tag counts as 0: the member is not counted for
	// bootstrap (maybeBootstrap logs members whose expectation differs).
	expect, err := strconv.Atoi(m.Tags[tagExpect])
	if err != nil {
		expect = 0
	}
	return member{
		Name: m.Name, Org: m.Tags[tagOrg], ID: m.Tags[tagID],
		GRPCAddr: m.Tags[tagGRPC], RaftAddr: m.Tags[tagRaft],
		Expect: expect, Status: m.Status,
	}, true
}

func (s *Server) setupSerf() error {
	host, portStr, err := net.SplitHostPort(s.cfg.SerfAddr)
	if err != nil {
		return fmt.Errorf("serf-addr %q: %w", s.cfg.SerfAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("serf-addr %q: bad port: %w", s.cfg.SerfAddr, err)
	}
	conf := serf.DefaultConfig()
	conf.Init()
	conf.NodeName = s.cfg.NodeID + "." + s.cfg.Org
	conf.Tags = map[string]string{
		tagOrg: s.cfg.Org, tagRole: roleCoordinator, tagID: s.cfg.NodeID,
		tagGRPC: s.GRPCAddr(), tagRaft: s.cfg.RaftAddr, tagExpect: strconv.Itoa(s.cfg.BootstrapExpect),
		tagProto: strconv.Itoa(fsm.ProtocolVersion),
	}
	ml := memberlist.DefaultLANConfig()
	if iv := s.cfg.Timings.GossipInterval; iv > 0 {
		ml = fastGossip(conf, iv)
	}
	ml.BindAddr = host
	ml.BindPort = port
	ml.AdvertiseAddr = host
	ml.AdvertisePort = port
	ml.Logger = logging.StdLogger(s.logger, "memberlist")
	if len(s.cfg.GossipKey) > 0 {
		// Every gossip message is encrypted and authenticated with the
		// org's key; messages without it are dropped (memberlist verifies
		// incoming and encrypts outgoing by default once a key is set).
		ml.SecretKey = s.cfg.GossipKey
		ml.GossipVerifyIncoming, ml.GossipVerifyOutgoing = true, true
	}
	conf.MemberlistConfig = ml
	conf.Logger = logging.StdLogger(s.logger, "serf")
	// A restarted node keeps its name: let it reclaim it at once.
	conf.EnableNameConflictResolution = false
	s.serfEvents = make(chan serf.Event, 256)
	conf.EventCh = s.serfEvents
	s.serf, err = serf.Create(conf)
	if err != nil {
		return fmt.Errorf("start serf on %s: %w", s.cfg.SerfAddr, err)
	}
	// memberlist resolves port 0 into conf.BindPort.
	s.cfg.SerfAddr = net.JoinHostPort(host, strconv.Itoa(ml.BindPort))
	return nil
}

// retryJoin joins the configured serf addresses, retrying until one answers
// or the server stops.
func (s *Server) retryJoin(ctx context.Context) {
	err := retry.Do(ctx, retry.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}, 0,
		func(_ int, err error, delay time.Duration) {
			s.logger.Warn("serf join failed; retrying", "addrs", s.cfg.Join, "err", err, "retry_in", delay)
		},
		func(context.Context) error {
			n, err := s.serf.Join(s.cfg.Join, true)
			if err == nil && n == 0 {
				err = errors.New("no address answered")
			}
			if err == nil {
				s.logger.Info("joined serf pool", "contacted", n)
			}
			return err
		})
	if err != nil && ctx.Err() == nil {
		s.logger.Error("serf join gave up", "err", err)
	}
}

// orgCoordinators lists the alive coordinators of this node's org.
func (s *Server) orgCoordinators() []member {
	var out []member
	for _, m := range s.serf.Members() {
		mm, ok := parseMember(m)
		if !ok || mm.Org != s.cfg.Org || mm.Status != serf.StatusAlive {
			continue
		}
		out = append(out, mm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// grpcAddrsOf lists the gRPC addresses serf members of this org claim for
// the coordinator nodeID: first those whose Raft address is raftAddr (the
// leader's, from Raft's own state), then alive ones. Serf tags are
// claims, not proof: callers verify the certificate of whatever answers.
func (s *Server) grpcAddrsOf(nodeID, raftAddr string) []string {
	if nodeID == s.cfg.NodeID {
		return []string{s.GRPCAddr()}
	}
	type cand struct {
		addr string
		rank int
	}
	var cands []cand
	for _, m := range s.serf.Members() {
		mm, ok := parseMember(m)
		if !ok || mm.Org != s.cfg.Org || mm.ID != nodeID || mm.GRPCAddr == "" {
			continue
		}
		rank := 2
		if raftAddr != "" && mm.RaftAddr == raftAddr {
			rank = 0
		} else if mm.Status == serf.StatusAlive {
			rank = 1
		}
		cands = append(cands, cand{mm.GRPCAddr, rank})
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].rank < cands[j].rank })
	var out []string
	for _, c := range cands {
		out = append(out, c.addr)
	}
	return out
}

// coordinatorAddrs lists the gRPC addresses of the org's alive coordinators.
func (s *Server) coordinatorAddrs() []string {
	var out []string
	for _, m := range s.orgCoordinators() {
		out = append(out, m.GRPCAddr)
	}
	return out
}

func (s *Server) handleSerfEvents(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-s.serfEvents:
			me, ok := ev.(serf.MemberEvent)
			if !ok {
				continue
			}
			// Any change of membership may complete (or spoil) the set
			// a node bootstraps with; the loop decides (bootstrap.go).
			s.kickBootstrap()
			switch me.Type {
			case serf.EventMemberJoin, serf.EventMemberUpdate:
				if s.IsLeader() {
					s.reconcileVoters(ctx)
				}
			case serf.EventMemberLeave, serf.EventMemberFailed, serf.EventMemberReap:
				// The leader's reapVoters looks at once (a member
				// that left is removed without waiting for its tick).
				select {
				case s.membersChanged <- struct{}{}:
				default:
				}
			}
		}
	}
}

// reconcileVoters adds coordinators of this org that serf sees but the Raft
// configuration lacks (nodes started with bootstrap_expect 0, beyond the
// bootstrap set, or back after the leader removed them, with or without
// their data dir), once each has proved its identity. A voter whose
// proven Raft address changed (restarted elsewhere with the same id) gets
// its new address. A voter already in the configuration at its address is
// left alone even if it lost its data dir: Raft's replication finds its
// log empty and sends it the log (or a snapshot) from the start. Only the
// leader calls it.
func (s *Server) reconcileVoters(ctx context.Context) {
	cf := s.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		s.logger.Warn("reconcile voters: read raft configuration", "err", err)
		return
	}
	known := map[raft.ServerID]raft.ServerAddress{}
	for _, srv := range cf.Configuration().Servers {
		known[srv.ID] = srv.Address
	}
	for _, m := range s.orgCoordinators() {
		if m.RaftAddr == "" || m.ID == s.cfg.NodeID {
			continue
		}
		addr, isKnown := known[raft.ServerID(m.ID)]
		if isKnown && addr == raft.ServerAddress(m.RaftAddr) {
			continue
		}
		// Serf tags are claims: the member proves it is coordinator m.ID
		// of this org, at this Raft address, before it gets a vote (or
		// moves an existing one there).
		if err := s.verifyCoordinator(m); err != nil {
			s.logger.Warn("not adding serf member as a raft voter", "member", m.Name, "err", err)
			continue
		}
		if isKnown {
			s.logger.Info("coordinator's raft address changed; updating the raft configuration", "member", m.Name, "from", addr, "to", m.RaftAddr)
		} else {
			s.logger.Info("adding coordinator to raft configuration", "member", m.Name)
		}
		// AddVoter with an id already present updates its address.
		if err := awaitFuture(ctx, s.raft.AddVoter(raft.ServerID(m.ID), raft.ServerAddress(m.RaftAddr), 0, 5*time.Second)); err != nil {
			s.logger.Warn("add voter failed", "member", m.Name, "err", err)
		}
	}
}

// fastGossip is the memberlist configuration of a pool gossiping every
// iv (tests and dev shorten gossip so that failures show in seconds, not
// the libraries' LAN or WAN defaults), with conf's reaping and
// reconnection scaled to match.
//
// A member is declared failed once it missed a probe (ProbeTimeout, then
// the indirect probes of the rest of ProbeInterval) and did not refute
// the suspicion within SuspicionMult probe intervals. With a suspicion
// of 2 intervals and a probe timeout of 2 gossip intervals (0.8 s and
// 0.2 s at 100 ms) a member of a loaded 2-core machine, starved for a
// second, was declared failed and came back: 31 such flaps among three
// coordinators in 90 s at load ~50. The LAN defaults' multiplier (4)
// and a probe timeout of 3 intervals saw none in three 90 s runs at load
// 40-63 (the old setting 1 and 2 beside them); a coordinator really
// gone is seen failed after ~2-3.5 s instead of ~1.3-2.3 s.
func fastGossip(conf *serf.Config, iv time.Duration) *memberlist.Config {
	ml := memberlist.DefaultLocalConfig()
	ml.GossipInterval = iv
	ml.ProbeInterval = 4 * iv
	ml.ProbeTimeout = 3 * iv
	ml.SuspicionMult = memberlist.DefaultLANConfig().SuspicionMult
	conf.ReapInterval = time.Second
	conf.ReconnectInterval = time.Second
	conf.ReconnectTimeout = time.Hour
	return ml
}
