package coordinator

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// Config is everything one coordinator node needs. Zero durations take the
// defaults of DefaultTimings.
type Config struct {
	Org    string
	NodeID string
	// DataDir holds the Raft log, stable store and snapshots.
	DataDir  string
	GRPCAddr string
	RaftAddr string
	SerfAddr string
	// BootstrapExpect is the number of voters of this org that must be seen
	// in serf before the cluster bootstraps; 0 means never bootstrap (the
	// node waits to be added by an existing leader).
	BootstrapExpect int
	// Join lists serf addresses of other coordinators (any org).
	Join []string
	// GossipKey encrypts and authenticates serf gossip (16, 24 or 32
	// bytes; fedstream keygen makes one). Required unless InsecurePlaintext:
	// a process without it can neither join nor read the gossip.
	GossipKey []byte

	// JoinToken authorises workers (role worker); AdminToken is the
	// bootstrap admin, who creates the org's other tokens (see
	// authenticator). With both empty the coordinator runs in dev mode and
	// accepts any caller.
	JoinToken  string
	AdminToken string

	// TLS are the coordinator's credentials: the org CA and its own
	// certificate, which must carry fedstream://ORG/coordinator/NODE-ID.
	// Every port (gRPC, Raft) then requires mutual TLS. nil is allowed
	// only with InsecurePlaintext.
	TLS *tlsutil.Credentials
	// CA is the org CA with its key, to sign the certificates of workers
	// that register (nil: this coordinator cannot register workers over
	// TLS and says so).
	CA *tlsutil.CA
	// WorkerCertTTL is the lifetime of a worker certificate (default
	// tlsutil.DefaultWorkerValidity); workers renew at about 2/3 of it.
	WorkerCertTTL time.Duration
	// InsecurePlaintext runs every port without TLS: only for tests of
	// that mode and for debugging; it is logged loudly and shown by status.
	InsecurePlaintext bool
	// HTTPAddr, when set, is where the coordinator serves /metrics,
	// /healthz, /readyz and what is mounted with HandleHTTP (host:port;
	// port 0 picks one).
	HTTPAddr string

	// Federation places the coordinator in the federation pool (see
	// FederationConfig); zero: in no federation.
	Federation FederationConfig

	Timings Timings
	Limits  Limits
	// Health configures the health manager's policy loop on the leader
	// (health_loop.go).
	Health HealthConfig
	Logger *slog.Logger

	// hooks are fault-injection seams for in-package tests; nil in
	// production.
	hooks hooks
}

// hooks replace parts of a node's machinery in tests.
type hooks struct {
	// barrier replaces raft's Barrier in the leader's set-up.
	barrier func(timeout time.Duration) error
	// applyFuture replaces the future of each command apply proposes (a
	// test's may never answer, as raft's own may not at shutdown).
	applyFuture func(fsm.MessageType, raft.ApplyFuture) raft.ApplyFuture
	// raftStream wraps the mutual-TLS stream layer Raft's transport runs
	// on (tests wrap it to drop traffic). Plaintext nodes ignore it.
	raftStream func(raft.StreamLayer) raft.StreamLayer
	// rescaleStall and resumeEvery replace rescaleStall and resumeEvery
	// (rescale_resume.go) when positive.
	rescaleStall, resumeEvery time.Duration
	// watchServed, when set, is told for every assignment watch that
	// returned a new index when its wait woke (or the first read ran)
	// and when its response was built (BenchmarkReconfigAckPath).
	watchServed func(worker string, index uint64, woke, built time.Time)
	// heartbeat, when set, runs first for every heartbeat the leader
	// takes; an error refuses it (a test makes a live worker look
	// silent: a false detection, as CPU starvation causes).
	heartbeat func(worker string) error
	// heldForSetUp, when set, is told each time a call waits because
	// this node leads but its set-up has not run in this term.
	heldForSetUp func()
	// moveChecked, when set, runs in task move and in a move to a
	// partner org once the move's own checks have passed, before its plan
	// is submitted (a test holds two moves there, so that both pass their
	// checks before either commits).
	moveChecked func(taskID string)
	// command, when set, may rewrite the body of every command this node
	// proposes (a test holds back a copy's reports to order two moves'
	// ends).
	command func(t fsm.MessageType, body any) any
	// withhold, when set, is asked for every task assigned to a worker
	// when its assignments are served; true leaves the task out (a test
	// makes a move's new copy never run).
	withhold func(worker, taskID string, generation int) bool
	// stableStore wraps the store Raft keeps its term and vote in (a
	// test makes each write slow, as a busy disk's fsync is).
	stableStore func(raft.StableStore) raft.StableStore
}

// Limits bound what queries may ask of the org's workers. A submit over a
// limit is refused with an error naming the limit, its value, what the
// query needs and how to raise it.
type Limits struct {
	// MaxTasksPerQuery bounds the tasks of one query (fragments x
	// partitions x replicas). 0 derives it from the org's capacity (see
	// derivedTaskLimit).
	MaxTasksPerQuery int
	// MaxTasksPerOrg bounds the tasks of all running queries together,
	// the new query's included. 0 derives it like MaxTasksPerQuery.
	MaxTasksPerOrg int
}

// minTaskLimit is the floor of a derived task limit: an org whose workers
// have not registered yet (or are all down) still accepts a modest query,
// whose tasks wait, pending, for workers.
const minTaskLimit = 64

// derivedTaskLimit is the default of both task limits: the org's capacity,
// the sum over workers not down (ready, or unknown just after an
// election) of their cores times tasksPerCore, which is
// also how many tasks placement puts on a worker at most. Tasks beyond it
// could never run at once (the finding behind this limit: 2,728 tasks of
// which 64 ran, the rest pending while the workers held their buffers), so
// a query that needs more is refused instead of accepted half-placed.
func derivedTaskLimit(readyCores int) int {
	return max(minTaskLimit, readyCores*tasksPerCore)
}

// Timings are the protocol's clocks. Tests shorten them.
type Timings struct {
	// HeartbeatTTL is how long a worker may stay silent before it is marked down.
	HeartbeatTTL time.Duration
	// LeaderGrace is the extra time a newly elected leader gives every worker
	// before declaring it down (the old leader's heartbeats are not known).
	LeaderGrace time.Duration
	// RaftHeartbeat, RaftElection and RaftLeaderLease tune hashicorp/raft:
	// a follower that hears no leader for RaftHeartbeat (to twice it)
	// stands for election; a candidate gives a round (pre-vote, then
	// vote) RaftElection (to twice it) before it starts another; a leader
	// that heard no quorum for RaftLeaderLease steps down. Raft requires
	// RaftLeaderLease <= RaftHeartbeat <= RaftElection.
	RaftHeartbeat   time.Duration
	RaftElection    time.Duration
	RaftLeaderLease time.Duration
	// ForwardWait bounds how long a follower holds a write while no leader is known.
	ForwardWait time.Duration
	// MaxWatchWait caps a WatchAssignments long poll.
	MaxWatchWait time.Duration
	// GossipInterval tunes serf/memberlist probing (0: LAN defaults).
	GossipInterval time.Duration
	// RemoveDownWorkersAfter is how long a worker may stay down before
	// the leader removes its record (its tasks were placed elsewhere when
	// it went down). A worker removed and later back registers again.
	RemoveDownWorkersAfter time.Duration
	// DeadVoterTimeout is how long a Raft voter may stay failed (or gone
	// from serf) before the leader removes it from the configuration. A
	// voter that leaves gracefully is removed at once. The default, 72 h
	// (Consul's reconnect timeout), keeps a coordinator that is down for
	// maintenance or a long partition in place: removing it early would
	// only re-add it later, and removal is a manual decision an operator
	// can take sooner (fedstream operator raft remove-peer). Meanwhile the
	// failed voter counts towards the quorum, which is why it is removed
	// at all.
	DeadVoterTimeout time.Duration
	// LeaderSetupTimeout bounds how long a new leader retries its set-up
	// (barrier, marking workers unknown) before it gives leadership away
	// rather than stay a leader that does nothing.
	LeaderSetupTimeout time.Duration
	// MoveCatchUpBound bounds how long a live move waits, once its new
	// copy runs, for that copy to catch up with the old one before
	// consumers switch to it anyway (logged): a new copy that cannot
	// catch up (its input is faster than it) must not keep the old copy
	// running for ever.
	MoveCatchUpBound time.Duration
	// MoveStartBound bounds how long a live move that leaves its old copy
	// running waits for its new copy to run: a move whose new copy has
	// not run by then (refused, failed, its worker silent) is rolled back
	// to the old copy, which never stopped (boundMoves). A move that does
	// not end must not hold its neighbours in the stream for ever: a
	// producer's move waits while its consumer moves (streamMoves). It
	// gives the snapshot fetch of a large state time: a new copy that
	// runs within it is bound by MoveCatchUpBound from then on.
	MoveStartBound time.Duration
	// PartnerTimeout is how long a partner org may stay unreachable (or
	// failed in the federation pool) before the tasks it hosts for this
	// org are placed at home again, and before the tasks this org hosts
	// for it are dropped (cross-org migration).
	PartnerTimeout time.Duration
}

// raftElectionRound is the election timeout of DefaultTimings and
// FastTimings: how long a candidate gives one round before it starts
// another, in a later term. A round writes the term and the vote to the
// stable store (one bolt transaction, two fsyncs, each) on the candidate
// and again on every voter: six transactions one after another at worst.
// On a busy machine (load 30-50 on two cores, its disk shared) rounds
// that succeeded took 0.1 to 3.4 s; with a 1 s timeout (a round has 1-2
// s) most were cut short, and the next began in a new term that every
// node had to write again: orgs of two coordinators went without a leader
// for a minute. The timeout only bounds a round that does not finish; a
// leader's failure is still detected after RaftHeartbeat and a round on a
// quiet machine takes milliseconds.
const raftElectionRound = 3 * time.Second

// DefaultTimings suit a real deployment on a LAN. The leader lease is as
// long as Raft allows (RaftHeartbeat): a leader that steps down because
// a starved follower answered late (0.5-0.7 s at load 30-50, when the
// lease was 500 ms) leaves the org without a leader until an election,
// seconds on such a machine. Raft allows no longer lease: a follower that
// stopped hearing the leader stands for election after RaftHeartbeat at
// the earliest, and a deposed leader should have stepped down by then.
func DefaultTimings() Timings {
	return Timings{
		HeartbeatTTL:     10 * time.Second,
		LeaderGrace:      10 * time.Second,
		RaftHeartbeat:    1000 * time.Millisecond,
		RaftElection:     raftElectionRound,
		RaftLeaderLease:  1000 * time.Millisecond,
		ForwardWait:      5 * time.Second,
		MaxWatchWait:     5 * time.Minute,
		DeadVoterTimeout: 72 * time.Hour,

		RemoveDownWorkersAfter: time.Hour,
		LeaderSetupTimeout:     30 * time.Second,
		MoveCatchUpBound:       30 * time.Second,
		MoveStartBound:         time.Minute,
		PartnerTimeout:         15 * time.Second,
	}
}

// FastTimings suit tests and the single-process dev federation on loopback.
func FastTimings() Timings {
	return Timings{
		HeartbeatTTL:    2 * time.Second,
		LeaderGrace:     2 * time.Second,
		RaftHeartbeat:   400 * time.Millisecond,
		RaftElection:    raftElectionRound,
		RaftLeaderLease: 400 * time.Millisecond,
		ForwardWait:     5 * time.Second,
		MaxWatchWait:    time.Minute,
		GossipInterval:  100 * time.Millisecond,

		LeaderSetupTimeout: 5 * time.Second,
		MoveCatchUpBound:   30 * time.Second,
		PartnerTimeout:     3 * time.Second,
	}
}

func (t *Timings) fill() {
	d := DefaultTimings()
	set := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&t.HeartbeatTTL, d.HeartbeatTTL)
	set(&t.LeaderGrace, d.LeaderGrace)
	set(&t.RaftHeartbeat, d.RaftHeartbeat)
	set(&t.RaftElection, d.RaftElection)
	set(&t.RaftLeaderLease, d.RaftLeaderLease)
	set(&t.ForwardWait, d.ForwardWait)
	set(&t.MaxWatchWait, d.MaxWatchWait)
	set(&t.RemoveDownWorkersAfter, d.RemoveDownWorkersAfter)
	set(&t.DeadVoterTimeout, d.DeadVoterTimeout)
	set(&t.LeaderSetupTimeout, d.LeaderSetupTimeout)
	set(&t.MoveCatchUpBound, d.MoveCatchUpBound)
	set(&t.MoveStartBound, d.MoveStartBound)
	set(&t.PartnerTimeout, d.PartnerTimeout)
}

// ErrInvalidConfig is returned by New when the configuration cannot work.
var ErrInvalidConfig = errors.New("invalid coordinator configuration")

func (c *Config) validate() error {
	var errs []error
	req := func(name, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		}
	}
	req("org", c.Org)
	req("node-id", c.NodeID)
	req("data-dir", c.DataDir)
	for name, addr := range map[string]string{"grpc-addr": c.GRPCAddr, "raft-addr": c.RaftAddr, "serf-addr": c.SerfAddr} {
		if addr == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %v", name, addr, err))
		}
	}
	switch c.BootstrapExpect {
	case 0, 1, 3, 5:
	default:
		if c.BootstrapExpect < 0 || c.BootstrapExpect > 7 {
			errs = append(errs, fmt.Errorf("bootstrap-expect %d: want 1, 3 or 5 (0 to join an existing cluster)", c.BootstrapExpect))
		}
	}
	if c.Limits.MaxTasksPerQuery < 0 || c.Limits.MaxTasksPerOrg < 0 {
		errs = append(errs, fmt.Errorf("max-tasks-per-query %d, max-tasks-per-org %d: want 0 (derived from the workers' cores) or a positive number",
			c.Limits.MaxTasksPerQuery, c.Limits.MaxTasksPerOrg))
	}
	switch {
	case c.TLS == nil && !c.InsecurePlaintext:
		errs = append(errs, errors.New("TLS is required: give tls-dir (or tls-ca, tls-cert and tls-key; see fedstream tls init), or run with --insecure-plaintext"))
	case c.TLS != nil && c.InsecurePlaintext:
		errs = append(errs, errors.New("both TLS credentials and insecure-plaintext given: choose one"))
	case c.TLS != nil:
		want := rpc.Identity{Org: c.Org, Role: rpc.RoleCoordinator, Name: c.NodeID}
		if id, _, ok := c.TLS.Identity(); !ok {
			errs = append(errs, errors.New("TLS credentials carry no certificate of this coordinator (tls-cert, tls-key)"))
		} else if id != want {
			errs = append(errs, fmt.Errorf("TLS certificate is for %s, this coordinator is %s", id, want))
		}
		if c.CA != nil && c.CA.Org() != c.Org {
			errs = append(errs, fmt.Errorf("CA key is of org %q, this coordinator is of org %q", c.CA.Org(), c.Org))
		}
	}
	switch {
	case len(c.GossipKey) == 0 && !c.InsecurePlaintext:
		errs = append(errs, errors.New("a gossip key is required (--gossip-key-file or FEDSTREAM_GOSSIP_KEY; fedstream keygen makes one), or run with --insecure-plaintext"))
	case len(c.GossipKey) != 0 && len(c.GossipKey) != 16 && len(c.GossipKey) != 24 && len(c.GossipKey) != 32:
		errs = append(errs, fmt.Errorf("gossip key is %d bytes: want 32 (16 or 24 also work); fedstream keygen makes one", len(c.GossipKey)))
	}
	errs = append(errs, c.Federation.validate(c)...)
	if c.WorkerCertTTL <= 0 {
		c.WorkerCertTTL = tlsutil.DefaultWorkerValidity
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	if c.Logger == nil {
		c.Logger = logging.Discard()
	}
	c.Timings.fill()
	return nil
}
