// Package runtime runs the tasks a worker is assigned: source tasks
// (deterministic generators or ingest), operator tasks and sink tasks. It
// owns their output buffers, serves them to subscribers through the
// DataPlane service, and subscribes each task to its upstream tasks.
//
// Every task processes on one goroutine, plus one goroutine per input
// subscription. Operator and sink tasks merge their inputs
// deterministically (SUnion in stable mode): replicas fed identical input
// produce identical output, tuple ids included.
package runtime

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/dcaa"
	"github.com/fedstream/fedstream/worker/operator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Task states reported by States (spelled in rpc/states, which the
// coordinator and the CLI share).
const (
	StateStarting = states.TaskStarting
	StateRunning  = states.TaskRunning
	// StateStalled is a running task that has not moved for
	// Options.StallAfter although it has something to do: its output is
	// blocked, or its input has data its output does not reflect. The
	// message says why; the task is running again once it moves.
	StateStalled = states.TaskStalled
	StateFailed  = states.TaskFailed
	StateStopped = states.TaskStopped
)

// DefaultStallAfter is Options.StallAfter's default.
const DefaultStallAfter = 30 * time.Second

// Placement says where one task of a query runs.
type Placement struct {
	TaskID, Fragment string
	Partition        int
	Replica          int
	// Generation is the copy of the task placed there (see
	// TaskSpec.Generation); a new copy is subscribed to afresh.
	Generation int
	// WorkerAddr is the DataPlane address of the worker running the task.
	WorkerAddr string
}

// SlotRange is the hash slots First..Last (inclusive).
type SlotRange struct{ First, Last int }

// SlotMap is the replicated owner of each hash slot of a keyed fragment.
type SlotMap struct {
	// Epoch grows by one on every reassignment of the fragment's slots.
	Epoch uint64
	// Partitions is the fragment's number of partitions under this map
	// (0: not said; the query definition's parallelism).
	Partitions int
	// Owner[s] is the partition owning slot s; len queryspec.NumSlots.
	Owner []int32
	// Next is the live rescale under way, nil when none is (see
	// docs/DATAPLANE.md, "Rescaling a keyed fragment").
	Next *SlotMapNext
	// Starts, for a generator source fragment, is the stream time each
	// partition's stream starts at (math.MinInt64: the whole stream; a
	// partition a live rescale added starts at its cut). nil: every
	// partition's whole stream.
	Starts []int64
}

// SlotMapNext is a rescale of a keyed fragment in progress: the map it
// moves to and, once Go, the cut: tuples with stime at or above Cut are
// routed by Owner, older ones by the current map.
type SlotMapNext struct {
	Epoch      uint64
	Partitions int
	Owner      []int32
	Go         bool
	Cut        int64
}

// check returns an error unless the map (and, from the go of a rescale,
// the one it moves to) covers every slot with one of partitions
// partitions. Before the go the next map routes nothing (partitionOf), and
// the streams of partitions it adds do not exist yet: an upstream keeps
// routing by the current map.
func (m *SlotMap) check(partitions int) error {
	owners := [][]int32{m.Owner}
	if m.Next != nil && m.Next.Go {
		owners = append(owners, m.Next.Owner)
	}
	for _, owner := range owners {
		if len(owner) != queryspec.NumSlots {
			return fmt.Errorf("slot map of epoch %d has %d slots, want %d", m.Epoch, len(owner), queryspec.NumSlots)
		}
		for s, p := range owner {
			if p < 0 || int(p) >= partitions {
				return fmt.Errorf("slot map of epoch %d gives slot %d to partition %d of %d", m.Epoch, s, p, partitions)
			}
		}
	}
	return nil
}

// partitions returns the number of partitions of the map's fragment that
// run or are being created: both maps' during a rescale (the added ones
// exist from prepare, the removed ones until finish), else the map's; def
// when the map does not say.
func (m *SlotMap) partitions(def int) int {
	if m == nil || m.Partitions <= 0 {
		return def
	}
	n := m.Partitions
	if m.Next != nil {
		n = max(n, m.Next.Partitions)
	}
	return n
}

// streams returns the number of partitions the fragment's upstreams
// produce for and its downstreams read from: the map's, and from the go
// of a rescale both maps' (streams of added partitions start at its cut).
func (m *SlotMap) streams(def int) int {
	if m == nil || m.Partitions <= 0 {
		return def
	}
	n := m.Partitions
	if m.Next != nil && m.Next.Go {
		n = max(n, m.Next.Partitions)
	}
	return n
}

// streamStart returns the lowest stream time the stream of partition p
// can carry: a partition a rescale past its go added starts at its cut
// (its task processes, and so emits, nothing below it), a source
// partition where the map's Starts says; math.MinInt64 otherwise.
func (m *SlotMap) streamStart(p int) int64 {
	switch {
	case m == nil:
		return math.MinInt64
	case p < len(m.Starts):
		return m.Starts[p]
	case m.Next != nil && m.Next.Go && m.Partitions > 0 && p >= m.Partitions:
		return m.Next.Cut
	}
	return math.MinInt64
}

// TaskSpec is one task the worker must run, with what it needs to run it.
type TaskSpec struct {
	TaskID, Query, Fragment string
	Partition, Replica      int
	// QueryIndex identifies the query definition: a task whose index
	// changes is restarted.
	QueryIndex uint64
	Spec       *queryspec.Query
	// PaceOrigin, when not zero, is the wall-clock time the query's paced
	// generators place their record 0 at (fixed in Raft when the query
	// was committed): every partition, replica and later copy paces from
	// it, so their stream times keep step with each other (a merge
	// downstream waits for the latest of them). Zero: a generator paces
	// from its own start. Pacing decides only when records come, never
	// what they are.
	PaceOrigin time.Time
	// Placements lists every task of the query (used to find upstreams).
	Placements []Placement
	// Generation numbers the copies of this task (1 for the first; each
	// move or re-placement starts a new copy with the next one). A task
	// whose generation changes is restarted; copies of other generations
	// subscribe under another name (CopyID).
	Generation int
	// SlotEpoch and Slots are, for a task of a keyed fragment, the epoch
	// of its fragment's slot map and the slots its partition owns.
	SlotEpoch uint64
	Slots     []SlotRange
	// SlotMaps are the slot maps of the query's keyed fragments by
	// fragment name: tasks route each key to the partition owning its
	// slot. A keyed fragment without a map is routed by
	// queryspec.PartitionOfSlot, the map every fragment starts with.
	SlotMaps map[string]*SlotMap
	// FromSnapshot, when set, starts the task from a snapshot of a copy
	// of it (Runtime.SnapshotTask; same query, fragment and partition):
	// with that copy's operator state, subscribed after its input
	// positions, numbering output after its output positions. A snapshot
	// that does not fit leaves the task in StateFailed with the reason.
	// It is used when the task starts: a task of that id already running
	// here is kept as it is (stop it first, as a move does).
	FromSnapshot *TaskSnapshot
	// Bootstrap, when set (and FromSnapshot is not), makes the task fetch
	// its starting snapshot from another copy of its partition when it
	// starts (FetchSnapshot): the old copy of a move (Halt), or a live
	// peer replica after a worker was lost. If that copy cannot be reached
	// the task starts without one and replays from its upstreams' buffers.
	Bootstrap *SnapshotSource
	// InMove: this copy takes part in a live move (the old copy moving
	// out, or the new copy until consumers switch to it). Its TaskState
	// then carries its output Position, against which the coordinator
	// measures the new copy's catch-up. It may change while the task runs.
	InMove bool
	// MovingOut: this copy is the old copy of a live move (its next copy
	// runs elsewhere). AssignIndex is the index of the assignments the
	// spec came from (0: not known). See superseded.go.
	MovingOut   bool
	AssignIndex uint64
	// Reconfig is the query's live reconfiguration state (nil while it
	// has no plan), and MarkersExpected how many markers the task gets per
	// epoch (one per upstream instance), as the coordinator counts them.
	Reconfig        *fsm.QueryReconfig
	MarkersExpected int
	// ReconfigKept is what the leader kept of the task's earlier copies'
	// reconfiguration reports (fsm.ReconfigKept; nil if nothing): a new
	// source copy starts from it (restoreKept). Read when the task starts.
	ReconfigKept *fsm.ReconfigKept
}

// SnapshotSource names the copy of a task a new copy takes its starting
// snapshot from.
type SnapshotSource struct {
	// WorkerAddr is the DataPlane address of the worker running it.
	WorkerAddr string
	TaskID     string
	Generation int
	// Halt: stop-and-copy (a move); see SnapshotOptions.Halt.
	Halt bool
	// Timeout, when longer than Options.BootstrapTimeout, is how long the
	// fetch may take instead (the coordinator's bound on the move: a copy
	// at a partner org fetches across the orgs' relays).
	Timeout time.Duration
	// SourceDown: the copy's worker is declared down (a hand-over): if its
	// snapshot cannot be fetched, the copy is taken for lost, and an
	// ingest source starts afresh rather than refuse to start.
	SourceDown bool
}

// CopyID names this copy of the task in the data plane (its subscriber
// identity): the task id for generation 1, "<task id>@g<generation>" for
// later copies, so an old and a new copy are never taken for one another.
func (s *TaskSpec) CopyID() string {
	if s.Generation <= 1 {
		return s.TaskID
	}
	return fmt.Sprintf("%s@g%d", s.TaskID, s.Generation)
}

// TaskState is the state of one task.
type TaskState struct {
	TaskID string
	// Generation is the copy of the task the state is of.
	Generation int
	// State is one of StateStarting, StateRunning, StateStalled,
	// StateFailed, StateStopped. Message is the reason for it (for
	// StateStalled, what the task waits on), or a note ("input exhausted").
	State   string
	Message string
	// Replica is the task's DCAA replica state (UNSPECIFIED when its
	// query has no replicas); Tentative says its output is tentative now.
	Replica   fedstreampb.ReplicaState
	Tentative bool
	// Lossy says a DCAA correction could not make the task's results
	// exact (it dropped input kept for its replay, or an input brought an
	// UNCORRECTABLE record): its stable stream is no longer its peer
	// replicas', and stays so until the copy is replaced by one
	// bootstrapped from a peer that is not lossy (the coordinator's
	// re-bootstrap, docs/DATAPLANE.md).
	Lossy bool
	// Rescale progress (see rescale.go): the epoch of the rescale the
	// task holds for and its frontier there, and the epoch whose cut it
	// has passed.
	Prepared uint64
	Frontier int64
	CutDone  uint64
	// InMove and Position: the task takes part in a live move
	// (TaskSpec.InMove) and its output position is Position, the sum over
	// its output streams of the id of the last tuple appended. Output ids
	// continue across copies (a copy started from a snapshot numbers its
	// output after the snapshot's output positions), so the positions of
	// an old and a new copy compare. 0 when not InMove.
	InMove   bool
	Position uint64
	// Blocked (with InMove): an append to one of its outputs is blocked
	// (the output is full): the copy goes no further until it is read.
	Blocked bool
	// Live reconfiguration progress (see reconfig.go), set once the task
	// has a reconfiguration: the newest epoch whose versions it loaded,
	// the newest whose markers it has from every input, its frontier
	// (while a plan waits to switch: the highest stream time it produced
	// or, a task other than a source, received) and its marker counts
	// above its level.
	Reconfig         bool
	ReconfigAcked    uint64
	ReconfigLevel    uint64
	ReconfigFrontier int64
	ReconfigMarkers  [reportedMarkers]fsm.ReconfigMarkers
	// ReconfigSwitches (a source): where it switched to each of its
	// newest epochs (newest first, zero entries unused), which the
	// leader keeps for the task's next copies.
	ReconfigSwitches [reportedMarkers]fsm.ReconfigSwitch
}

// Options configures a Runtime. Zero values mean the defaults.
type Options struct {
	Logger *slog.Logger
	// BoundaryInterval is the stime spacing of the BOUNDARY tuples sources
	// emit (default 50ms).
	BoundaryInterval time.Duration
	// Buffer bounds each output stream (MaxBytes, MaxTuples) and sets the
	// subscriber Lease and OverrunGrace; the runtime sets
	// ExpectedSubscribers, Ring and Logger itself.
	Buffer dataplane.BufferOptions
	// CostScale multiplies every operator's calibrated cost on this
	// runtime (0: 1): a slow machine for benchmarks of the health
	// manager (queryspec Operator.Cost is itself for tests and
	// benchmarks).
	CostScale float64
	// ServerOptions configure the DataPlane server further (e.g.
	// dataplane.WithCallerIdentity; by default acknowledgements are keyed
	// by the verified client certificate when there is one).
	ServerOptions []dataplane.ServerOption
	// SourceSpeedup runs generator sources this many times faster than
	// their rate in wall time; stimes, and so results, are unchanged
	// (tests run minutes of stream time in seconds). 0 or 1: real time.
	SourceSpeedup int
	// SourcePace, when set, multiplies the wall-clock pace of the
	// generator sources by its factor, which may change while they run
	// (benchmarks of the health manager change the load with it); nil:
	// factor 1.
	SourcePace *Pace
	// PaceFromOrigin makes paced generators follow their query's pacing
	// origin (TaskSpec.PaceOrigin, see paceAnchor) instead of each its
	// own start. Off by default: with it on two integration tests failed
	// more often under load (docs/QUERY.md, "Generators", says which
	// causes are known). `bench reconfig` turns it on.
	PaceFromOrigin bool
	// StallAfter is how long a task may go without moving, while it has
	// something to do, before it is reported StateStalled (default
	// DefaultStallAfter).
	StallAfter time.Duration
	// SinkBufferTuples bounds the ring buffer of a sink's result stream
	// (default 65536 tuples).
	SinkBufferTuples int
	// InputPendingTuples is the soft bound on tuples buffered per input
	// stream while waiting for the deterministic merge (default 65536).
	InputPendingTuples int
	// RetryMin and RetryMax bound the backoff between subscription
	// attempts (defaults 20ms and 1s).
	RetryMin, RetryMax time.Duration
	// Pool is the connection pool for subscriptions; nil means a private
	// one, closed by Close.
	Pool *dataplane.Pool
	// MaxBatchBytes bounds the encoded tuples of one message the DataPlane
	// server sends (default dataplane.MaxBatchBytes). A message carries at
	// least one tuple, so 1 means one tuple per message: the unbatched data
	// plane, for measurements. Acknowledgements stay cumulative.
	MaxBatchBytes int
	// MaxFuture is how far ahead of an ingest source's time (the later of
	// its newest accepted record and the clock) a record may be dated
	// (default DefaultMaxFuture).
	MaxFuture time.Duration
	// SnapshotChunkBytes is the size of the pieces FetchSnapshot streams
	// a snapshot in (default SnapshotChunkBytes).
	SnapshotChunkBytes int
	// DetectTimeout is how long an input of a query with replicas may
	// hear nothing from the upstream replica it reads (no data, no
	// heartbeat) before it takes that replica for failed and moves to
	// another (default dcaa.DetectTimeout(BoundaryInterval); output
	// streams of such queries send a heartbeat every BoundaryInterval).
	DetectTimeout time.Duration
	// DCAAKeepTuples bounds the stable input a DCAA operator task keeps
	// for its replay while its results are tentative (default
	// DefaultDCAAKeepTuples; see dcaa.Config.KeepLimit): past it a long
	// failure's oldest input goes, and the task's status names the
	// results its correction could not make exact.
	DCAAKeepTuples int
	// DCAANoBackground turns off DCAA's background corrections: an
	// operator task's input reading a tentative upstream replica no
	// longer reads another replica beside it to take its corrections
	// and move to it at its REC_DONE (dcaa.Config.Background), nor does
	// a sink's input (dcaa_sinkbg.go). For comparisons.
	DCAANoBackground bool
	// BootstrapTimeout bounds fetching a new copy's starting snapshot
	// from another worker (TaskSpec.Bootstrap; default 60s), unless the
	// source gives it longer (SnapshotSource.Timeout).
	BootstrapTimeout time.Duration
	// Bulk configures fast snapshot transfer: snapshots served and
	// fetched over connections of their own (see BulkOptions). Zero:
	// this runtime serves snapshots over the FetchSnapshot stream only,
	// and fetches them over plaintext connections from workers that
	// offer them.
	Bulk BulkOptions
}

// DefaultDCAAKeepTuples is the default of Options.DCAAKeepTuples: as
// many tuples as an output buffer holds by default.
const DefaultDCAAKeepTuples = 256 << 10

// DefaultMaxFuture is the default of Options.MaxFuture.
const DefaultMaxFuture = time.Hour

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.BoundaryInterval <= 0 {
		o.BoundaryInterval = 50 * time.Millisecond
	}
	if o.SinkBufferTuples <= 0 {
		o.SinkBufferTuples = 64 << 10
	}
	if o.InputPendingTuples <= 0 {
		o.InputPendingTuples = 64 << 10
	}
	if o.RetryMin <= 0 {
		o.RetryMin = 20 * time.Millisecond
	}
	if o.StallAfter <= 0 {
		o.StallAfter = DefaultStallAfter
	}
	if o.MaxFuture <= 0 {
		o.MaxFuture = DefaultMaxFuture
	}
	if o.SnapshotChunkBytes <= 0 {
		o.SnapshotChunkBytes = SnapshotChunkBytes
	}
	if o.BootstrapTimeout <= 0 {
		o.BootstrapTimeout = time.Minute
	}
	if o.DetectTimeout <= 0 {
		o.DetectTimeout = dcaa.DetectTimeout(o.BoundaryInterval)
	}
	if o.DCAAKeepTuples <= 0 {
		o.DCAAKeepTuples = DefaultDCAAKeepTuples
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(time.Second, o.RetryMin)
	}
}

// Runtime runs a worker's tasks. Safe for concurrent use.
type Runtime struct {
	opts    Options
	log     *slog.Logger
	pool    *dataplane.Pool
	ownPool bool
	server  *dataplane.Server
	// snapshotsServed counts FetchSnapshot answers (see SnapshotsServed),
	// snapshotBytes their encoded bytes (SnapshotBytesServed).
	snapshotsServed atomic.Uint64
	snapshotBytes   atomic.Uint64
	// bulkServed counts the snapshots served over a connection of their
	// own (SnapshotsServedBulk).
	bulkServed atomic.Uint64
	// epochPlans: reconfiguration epochs' plans, parsed once for all the
	// tasks here (reconfig.go).
	epochPlans planCache
	// bootstraps counts tasks started from a fetched snapshot.
	bootstraps atomic.Uint64
	// streamFallbacks counts fetches whose operator state, restored off
	// the connection, did not restore, so that the snapshot was fetched
	// again whole (streamfetch.go).
	streamFallbacks atomic.Uint64
	// tamperStream, in tests, wraps the bytes of a snapshot restored off
	// the connection (fetchOpts.tamper).
	tamperStream func(io.Reader) io.Reader
	// lastBootstrap is the timing of the latest bootstrap (LastBootstrap).
	bootMu        sync.Mutex
	lastBootstrap BootstrapTiming
	// lastServed is the timing of the latest snapshot served (LastServed).
	lastServed ServeTiming
	// afterFetch, when set (tests), runs after a bootstrap snapshot was
	// fetched and before the task starts from it.
	afterFetch func(*TaskSnapshot)
	// pinWait, when set (tests), replaces the pinWait constant: the
	// first attempt's bound on registering with an upstream.
	pinWait time.Duration
	// beforePin, when set (tests), runs as a bootstrap begins pinning
	// the upstreams of the task it bootstraps.
	beforePin func(TaskSpec)
	// pinFault, when set (tests), makes registering with the upstream
	// copy pl before a snapshot fail when it returns true.
	pinFault func(pl Placement) bool
	// beforeAttempt, when set (tests), runs as an input of task begins a
	// subscription to upstream copy pl.
	beforeAttempt func(task string, pl Placement)
	// snapshotFault, when set (tests), is asked by FetchSnapshot before
	// it captures the task named: errTentativeNow makes it refuse as a
	// DCAA replica whose results are tentative does. Atomic: it is set
	// while the data plane's server runs.
	snapshotFault atomic.Pointer[func(taskID string) error]
	// tentativeWait, when set (tests), replaces fetchTentativeWait.
	tentativeWait time.Duration
	// kafkaBeforeWrite, when set (tests), runs before a kafka sink
	// writes a batch.
	kafkaBeforeWrite func(context.Context)
	// dcaaPosted, when set (tests), runs once a DCAA operator input has
	// handed a batch to its machine, before it waits for the machine to
	// take it.
	dcaaPosted func(*input)
	// bulkSrv serves snapshots over connections of their own (nil: not
	// offered); bulkCli fetches them so (nil: never asked for).
	bulkSrv atomic.Pointer[bulkServer]
	bulkCli *bulkClient
	// starveClk measures how long this process could not run, which
	// failure detection does not count as an upstream's silence
	// (dcaa_starve.go); created by starve on first use.
	starveOnce sync.Once
	starveClk  *starveClock

	mu     sync.Mutex
	tasks  map[string]*task
	closed bool

	// progress has capacity one: a pending signal that some task's
	// reconfiguration progress changed (see ProgressChanged).
	progress chan struct{}
	// applying counts the Apply calls under way (ReconfigSettling).
	applying atomic.Int32
	// rcApplies times the Apply calls that handed tasks a new
	// reconfiguration epoch (ReconfigApplies).
	rcApplies reconfigApplies
	// rcHolds times the quiescent pauses of generator sources
	// (ReconfigHolds).
	rcHolds reconfigHolds
	// rcWakeOff: generators waiting to pace are not woken to install a
	// plan (SetReconfigWake).
	rcWakeOff atomic.Bool

	// The stall watchdog (see watch) runs until stopWatch closes.
	stopWatch chan struct{}
	watchDone chan struct{}
}

// New returns a Runtime with no tasks.
func New(opts Options) *Runtime {
	opts.setDefaults()
	r := &Runtime{opts: opts, log: opts.Logger, pool: opts.Pool, tasks: make(map[string]*task), progress: make(chan struct{}, 1)}
	if r.pool == nil {
		r.pool = dataplane.NewPool()
		r.ownPool = true
	}
	sopts := append([]dataplane.ServerOption{dataplane.WithMaxBatchBytes(opts.MaxBatchBytes)}, opts.ServerOptions...)
	r.server = dataplane.NewServer(resolver{r}, ingester{r}, r.log, sopts...)
	if opts.Bulk.Listener != nil {
		if err := r.ServeBulk(opts.Bulk.Listener, opts.Bulk.ServerTLS); err != nil {
			r.log.Error("fast snapshot transfer not offered", "err", err)
		}
	}
	r.bulkCli = newBulkClient(opts.Bulk)
	r.stopWatch, r.watchDone = make(chan struct{}), make(chan struct{})
	go r.watch()
	return r
}

// ProgressChanged signals (at most one pending signal) that some task
// acknowledged a reconfiguration plan or reached a new marker level: the
// worker reports at once instead of at its next interval, since the
// coordinator advances the plan on those reports.
func (r *Runtime) ProgressChanged() <-chan struct{} { return r.progress }

// ReconfigSettling reports whether a reconfiguration handed to this
// runtime is still being installed: an Apply is handing it to the tasks,
// or a running task holds a plan it has not acknowledged yet (a source
// installs it before its next record, a busy task at its next release,
// an ingest source on its next tick: within a boundary interval). The
// worker holds its report meanwhile, briefly, so that one report carries
// the acknowledgements of all its tasks: every report is a Raft write,
// and a second one would wait for the first, whereas the plan switches
// only once every task acknowledged.
func (r *Runtime) ReconfigSettling() bool {
	if r.applying.Load() > 0 {
		return true
	}
	for _, t := range r.tasksByID() {
		if p := t.rc.pending.Load(); p != nil && p.Latest() > t.rc.acked.Load() {
			t.stateMu.Lock()
			running := t.state == StateRunning
			t.stateMu.Unlock()
			if running {
				return true
			}
		}
	}
	return false
}

func (r *Runtime) noteProgress() {
	select {
	case r.progress <- struct{}{}:
	default:
	}
}

// watch checks every task for stalls a few times per StallAfter until the
// runtime closes.
func (r *Runtime) watch() {
	defer close(r.watchDone)
	every := min(max(r.opts.StallAfter/4, 20*time.Millisecond), time.Second)
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-r.stopWatch:
			return
		case now := <-ticker.C:
			r.mu.Lock()
			tasks := make([]*task, 0, len(r.tasks))
			for _, t := range r.tasks {
				tasks = append(tasks, t)
			}
			r.mu.Unlock()
			for _, t := range tasks {
				t.checkStall(now, r.opts.StallAfter)
			}
		}
	}
}

// Server is the DataPlane service serving this runtime's output streams
// and ingest sources; register it on the worker's grpc.Server.
func (r *Runtime) Server() fedstreampb.DataPlaneServer { return dpServer{r.server, r} }

// Apply makes the running tasks match desired: it starts new tasks, stops
// tasks no longer desired (or whose query definition changed) and hands
// running tasks the new placements, so that a subscription whose upstream
// replica moved switches to where it is now. A task that cannot be built
// is kept in StateFailed with the reason.
func (r *Runtime) Apply(ctx context.Context, desired []TaskSpec) {
	r.applying.Add(1)
	began := time.Now()
	// handed is the newest reconfiguration epoch of each query this
	// Apply hands its running tasks.
	var handed map[string]uint64
	defer func() {
		if handed != nil {
			done := time.Now()
			for q, e := range handed {
				r.rcApplies.note(q, e, began, done)
			}
		}
		r.applying.Add(-1)
		// A report held while the tasks were handed a plan
		// (ReconfigSettling) goes now.
		r.noteProgress()
	}()
	want := make(map[string]TaskSpec, len(desired))
	for _, s := range desired {
		want[s.TaskID] = s
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	var stop, gone []*task
	for id, t := range r.tasks {
		if s, ok := want[id]; !ok || s.QueryIndex != t.spec.QueryIndex || s.Generation != t.spec.Generation {
			stop = append(stop, t)
			delete(r.tasks, id)
			if !ok || s.Generation != t.spec.Generation {
				// This copy will never subscribe again: a new copy has
				// another generation, hence another name.
				gone = append(gone, t)
			}
		} else if snap := t.haltedRolledBack(s); snap != nil {
			// Its state is the halt snapshot's: the same copy goes on
			// from there, under the same name (see haltedRolledBack).
			stop = append(stop, t)
			delete(r.tasks, id)
			s.FromSnapshot, s.Bootstrap = snap, nil
			want[id] = s
			r.log.Warn("the old copy of a stop-and-copy move is placed again as it is (the move was rolled back): it starts again from the snapshot that halted it",
				"task", id, "generation", s.Generation)
		}
	}
	r.mu.Unlock()
	for _, t := range stop {
		t.stop()
		r.log.Info("task stopped", "task", t.spec.TaskID)
	}
	r.leaveUpstreams(ctx, gone)

	ids := make([]string, 0, len(want))
	for id := range want {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	r.bootstrap(ctx, want)
	for _, id := range ids {
		spec := want[id]
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		if t, ok := r.tasks[id]; ok {
			r.mu.Unlock()
			t.updatePlacements(spec.Placements)
			t.setSlotMaps(spec.SlotMaps)
			t.setReconfig(spec.Reconfig, spec.MarkersExpected)
			if rc := spec.Reconfig; rc != nil && rc.Latest() > 0 {
				if handed == nil {
					handed = map[string]uint64{}
				}
				handed[spec.Query] = max(handed[spec.Query], rc.Latest())
			}
			t.inMove.Store(spec.InMove)
			t.notePlaced(spec)
			continue
		}
		began := time.Now()
		t, err := newTask(r, spec)
		timed := err == nil && spec.Bootstrap != nil && spec.FromSnapshot != nil
		if timed {
			r.noteRestore(id, time.Since(began), time.Now())
		}
		if err != nil {
			r.log.Error("task cannot start", "task", id, "err", err)
			t = failedTask(r, spec, err)
		}
		t.inMove.Store(spec.InMove)
		t.notePlaced(spec)
		r.tasks[id] = t
		r.mu.Unlock()
		if err == nil {
			t.start()
			if timed {
				r.noteStarted(id, time.Now())
			}
			r.log.Info("task started", "task", id)
		}
	}
}

// bootstrap fetches, concurrently, the starting snapshot of every task of
// want that is not running here yet and names a Bootstrap source, and
// sets its FromSnapshot. A copy whose snapshot cannot be fetched starts
// without one (replay), with a warning.
func (r *Runtime) bootstrap(ctx context.Context, want map[string]TaskSpec) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	fetched := map[string]*TaskSnapshot{}
	for id, spec := range want {
		if spec.Bootstrap == nil || spec.FromSnapshot != nil || r.task(id) != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := spec.Bootstrap
			fctx, cancel := context.WithTimeout(ctx, max(r.opts.BootstrapTimeout, src.Timeout))
			defer cancel()
			start := time.Now()
			// The connection to the old copy's worker is made (a TLS
			// handshake, when this worker never talked to it) while the
			// upstreams are pinned, not after: the fetch then finds it
			// ready. A gRPC connection dials only when asked.
			if conn, err := r.pool.Conn(src.WorkerAddr); err == nil {
				conn.Connect()
			}
			if r.beforePin != nil {
				r.beforePin(spec)
			}
			// Pin what follows the snapshot's positions. A copy that keeps
			// running acknowledges past them at once. A halted one holds
			// them only while it is registered: the caller may stop it
			// (and it leaves its upstreams) before this copy has
			// subscribed, and a replica of the consumer reading the same
			// upstream would then let the upstream discard tuples this
			// copy still needs.
			unpinned := r.pinUpstreams(fctx, spec)
			pinned := time.Now()
			// The invariant of a live snapshot: every tuple after its input
			// positions stays in an upstream buffer until this copy has
			// subscribed. A copy that keeps running acknowledges past those
			// positions, so that holds only for the streams pinned above.
			// When the old copy is this task's own previous copy (a move,
			// or a copy leaving a worker declared down), it is replaced
			// anyway: halt it at the snapshot (stop-and-copy), so that it
			// acknowledges nothing after it, rather than cut a live
			// snapshot whose later input may be gone (the new copy would
			// lose it without knowing). A peer replica must run on: its
			// snapshot stays live, with the warning.
			halt := src.Halt
			if len(unpinned) > 0 {
				if src.TaskID == spec.TaskID && !halt {
					halt = true
					r.log.Warn("could not register with every upstream before the snapshot: the old copy halts at the snapshot (stop-and-copy), so nothing after its positions is acknowledged away",
						"task", id, "generation", spec.Generation, "unpinned", unpinned, "from_generation", src.Generation, "worker", src.WorkerAddr)
				} else if !halt {
					r.log.Warn("could not register with an upstream before the snapshot: tuples after the snapshot's positions may be missing",
						"task", id, "generation", spec.Generation, "unpinned", unpinned, "from", src.TaskID, "worker", src.WorkerAddr)
				}
			}
			fo := &fetchOpts{}
			if canRestoreEarly(spec) {
				fo.restore = func(in *operator.Incoming) (*earlyOp, error) { return restoreEarly(spec, in) }
				fo.restoreStream = func(br *bufio.Reader, size int) (*earlyOp, error) { return restoreStreamed(spec, br, size) }
				fo.tamper = r.tamperStream
			}
			fetch := func() (*TaskSnapshot, error) {
				conn, err := r.pool.Conn(src.WorkerAddr)
				if err != nil {
					return nil, err
				}
				return r.fetchSnapshot(fctx, conn, src.WorkerAddr, &fedstreampb.FetchSnapshotRequest{Query: spec.Query, TaskId: src.TaskID, Generation: int32(src.Generation), Halt: halt,
					PlacedIndex: spec.AssignIndex}, fo)
			}
			// A transfer that broke off is tried again (a halted copy gives
			// the same snapshot again); a refusal is final.
			snap, err := fetch()
			for try := 1; err != nil && try < 3 && retryableFetch(err) && fctx.Err() == nil; try++ {
				select {
				case <-fctx.Done():
				case <-time.After(time.Duration(try) * 100 * time.Millisecond):
				}
				snap, err = fetch()
			}
			// A DCAA peer holding tentative results refuses until it has
			// corrected them: ask again for a while (fetchTentativeWait).
			// The old copy of a move (this task's own previous copy) is
			// asked for as long as the bootstrap may take: this copy
			// replaces it, so one started without its snapshot loses its
			// state for good (its upstreams no longer hold the stream's
			// start: the results are lossy), while the old copy runs on
			// and serves its consumers until this one has started. A
			// 10-minute fedstream dev soak, loaded, lost a partition of
			// the demo's aggregate so when a copy returning home from a
			// partner org stayed tentative past the 5 s.
			until := time.Now().Add(r.tentativeWaitOr(fetchTentativeWait))
			if dl, ok := fctx.Deadline(); ok && src.TaskID == spec.TaskID {
				until = dl
			}
			for wait := 50 * time.Millisecond; status.Code(err) == codes.Aborted && time.Now().Before(until) && fctx.Err() == nil; wait = min(2*wait, 500*time.Millisecond) {
				select {
				case <-fctx.Done():
				case <-time.After(wait):
				}
				snap, err = fetch()
			}
			if err != nil {
				r.log.Warn("task starts without a snapshot: replays from its upstreams' buffers", "task", id, "generation", spec.Generation,
					"from", src.TaskID, "from_generation", src.Generation, "worker", src.WorkerAddr, "err", err)
				return
			}
			if r.afterFetch != nil {
				r.afterFetch(snap)
			}
			r.log.Info("task bootstraps from a snapshot", "task", id, "generation", spec.Generation, "from", src.TaskID,
				"from_generation", src.Generation, "worker", src.WorkerAddr, "took", time.Since(start))
			r.noteBootstrap(BootstrapTiming{Task: id, Pin: pinned.Sub(start), Fetch: time.Since(pinned),
				Began: start, Pinned: pinned, FirstByte: fo.firstByte, LastByte: fo.lastByte, Decoded: fo.decoded, Streamed: snap.early != nil, Interned: fo.interned})
			mu.Lock()
			fetched[id] = snap
			mu.Unlock()
		}()
	}
	wg.Wait()
	for id, snap := range fetched {
		r.bootstraps.Add(1)
		spec := want[id]
		spec.FromSnapshot = snap
		want[id] = spec
	}
}

// tentativeWaitOr is the tentativeWait of tests, else d.
func (r *Runtime) tentativeWaitOr(d time.Duration) time.Duration {
	if r.tentativeWait > 0 {
		return r.tentativeWait
	}
	return d
}

// States reports every task's state, sorted by task id.
func (r *Runtime) States() []TaskState {
	tasks := r.tasksByID()
	out := make([]TaskState, 0, len(tasks))
	for _, t := range tasks {
		out = append(out, t.State())
	}
	return out
}

// tasksByID is every task running here, sorted by task id (what reports
// list them by). The tasks are read outside r.mu.
func (r *Runtime) tasksByID() []*task {
	r.mu.Lock()
	tasks := make([]*task, 0, len(r.tasks))
	for _, t := range r.tasks {
		tasks = append(tasks, t)
	}
	r.mu.Unlock()
	slices.SortFunc(tasks, func(a, b *task) int { return strings.Compare(a.spec.TaskID, b.spec.TaskID) })
	return tasks
}

// Close stops every task and waits for their goroutines, or until ctx
// ends (then ctx.Err() is returned and stragglers finish on their own).
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	tasks := r.tasks
	r.tasks = map[string]*task{}
	r.mu.Unlock()
	close(r.stopWatch)
	<-r.watchDone
	r.bulkSrv.Load().close()

	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for _, t := range tasks {
			wg.Add(1)
			go func() { defer wg.Done(); t.stop() }()
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if r.ownPool {
		return r.pool.Close()
	}
	return nil
}

// task returns the running task with the given id, or nil.
func (r *Runtime) task(id string) *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tasks[id]
}

// resolver finds output streams for the DataPlane server.
type resolver struct{ r *Runtime }

func (rs resolver) ResolveStream(ref *fedstreampb.StreamRef) (*dataplane.OutputBuffer, error) {
	return rs.r.LocalStream(ref)
}

// LocalStream returns the output buffer ref names if its producer runs in
// this runtime, or an error wrapping dataplane.ErrUnknownStream. Consumers
// in the worker's own process (a co-located downstream task, a local
// reader of a sink) read it directly instead of over a connection.
func (r *Runtime) LocalStream(ref *fedstreampb.StreamRef) (*dataplane.OutputBuffer, error) {
	t := r.task(ref.TaskId)
	if t == nil || t.spec.Query != ref.Query {
		return nil, fmt.Errorf("%w: no task %q of query %q runs on this worker", dataplane.ErrUnknownStream, ref.TaskId, ref.Query)
	}
	if ref.Generation != 0 && int(ref.Generation) != t.spec.Generation {
		return nil, fmt.Errorf("%w: task %q runs here as generation %d, not %d", dataplane.ErrUnknownStream, ref.TaskId, t.spec.Generation, ref.Generation)
	}
	return t.output(ref.Consumer, int(ref.Partition))
}

// ingester routes Ingest requests to the worker's ingest source tasks.
type ingester struct{ r *Runtime }

// targets are the copies of the ingest source on this worker, by task
// id. Normally one replica per worker; if several run here each gets the
// lines and the first one answers.
func (in ingester) targets(query, source string) []*task {
	in.r.mu.Lock()
	var targets []*task
	for _, t := range in.r.tasks {
		if t.spec.Query == query && t.spec.Fragment == source && t.ingest != nil {
			targets = append(targets, t)
		}
	}
	in.r.mu.Unlock()
	slices.SortFunc(targets, func(a, b *task) int { return strings.Compare(a.spec.TaskID, b.spec.TaskID) })
	return targets
}

func (in ingester) Ingest(ctx context.Context, query, source string, firstLine uint64, lines []byte) (uint64, []*fedstreampb.LineError, error) {
	targets := in.targets(query, source)
	if len(targets) == 0 {
		return 0, nil, fmt.Errorf("%w: no ingest task of source %q of query %q runs on this worker", dataplane.ErrUnknownSource, source, query)
	}
	var (
		accepted uint64
		lineErrs []*fedstreampb.LineError
		firstErr error
	)
	for i, t := range targets {
		a, le, err := t.ingestLines(ctx, firstLine, lines)
		if i == 0 {
			accepted, lineErrs, firstErr = a, le, err
		}
	}
	return accepted, lineErrs, firstErr
}

// CloseIngest ends every ingest task of the source on this worker (see
// dataplane.IngestCloser).
func (in ingester) CloseIngest(ctx context.Context, query, source string) error {
	in.r.mu.Lock()
	var targets []*task
	for _, t := range in.r.tasks {
		if t.spec.Query == query && t.spec.Fragment == source && t.ingest != nil {
			targets = append(targets, t)
		}
	}
	in.r.mu.Unlock()
	if len(targets) == 0 {
		return fmt.Errorf("%w: no ingest task of source %q of query %q runs on this worker", dataplane.ErrUnknownSource, source, query)
	}
	var errs []error
	for _, t := range targets {
		errs = append(errs, t.closeIngest(ctx))
	}
	return errors.Join(errs...)
}

// BootstrapTiming is where the latest start of a task from a fetched
// snapshot (TaskSpec.Bootstrap) spent its time.
type BootstrapTiming struct {
	Task string
	// Pin is registering with the upstreams before a live snapshot,
	// Fetch taking, sending, receiving and decoding the snapshot, Restore
	// building the task from it (operator state installed).
	Pin, Fetch, Restore time.Duration
	// The instants of the bootstrap, in order (wall clock, comparable with
	// the serving worker's ServeTiming on one machine): the apply that
	// asked for it began, the upstreams were pinned, the first and last
	// byte of the snapshot arrived, the snapshot was decoded with its
	// operator state installed (during the transfer when Streamed), the
	// task was built from it, and started (subscribing to its upstreams).
	Began, Pinned, FirstByte, LastByte, Decoded, Restored, Started time.Time
	// Streamed: the operator state was restored while its bytes arrived
	// (operator.RestoreIncoming), not after the last one.
	Streamed bool
	// Interned: it was restored off the connection through a reused
	// buffer, one copy per distinct string, and not kept
	// (operator.RestoreStream).
	Interned bool
}

// StreamFallbacks is how many snapshot fetches found that the operator
// state restored off the connection did not restore, and fetched the
// snapshot again whole.
func (r *Runtime) StreamFallbacks() uint64 { return r.streamFallbacks.Load() }

// LastBootstrap reports the timing of the latest bootstrap (zero before
// any).
func (r *Runtime) LastBootstrap() BootstrapTiming {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	return r.lastBootstrap
}

func (r *Runtime) noteBootstrap(b BootstrapTiming) {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	r.lastBootstrap = b
}

// ServeTiming is where the latest snapshot this runtime served
// (FetchSnapshot) spent its time.
type ServeTiming struct {
	Task  string
	Bytes int
	// Bulk: sent over a connection of its own (BulkOptions).
	Bulk bool
	// Capture is the task held while its state was captured, Prepare
	// sorting and sizing the captured state, Send encoding and sending
	// it (they overlap) until the last byte was written.
	Capture, Prepare, Send time.Duration
	// The same as instants (wall clock): the call began, the state was
	// captured (the task released), prepared, the first and the last byte
	// written.
	Began, Captured, Prepared, FirstSent, LastSent time.Time
}

// LastServed reports the timing of the latest snapshot served (zero
// before any).
func (r *Runtime) LastServed() ServeTiming {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	return r.lastServed
}

func (r *Runtime) noteServed(s ServeTiming) {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	r.lastServed = s
}

func (r *Runtime) noteRestore(task string, d time.Duration, restored time.Time) {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	if r.lastBootstrap.Task == task {
		r.lastBootstrap.Restore, r.lastBootstrap.Restored = d, restored
	}
}

func (r *Runtime) noteStarted(task string, started time.Time) {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	if r.lastBootstrap.Task == task {
		r.lastBootstrap.Started = started
	}
}

// leaveTimeout bounds telling the upstreams of stopped copies that they
// are gone (leaveUpstreams).
const leaveTimeout = time.Second

// leaveUpstreams tells every upstream replica of each stopped copy in
// gone that the copy's subscriber is gone for good (dataplane.Leave), so
// that no upstream holds its output for the copy for a lease: a moved
// task's old copy would otherwise keep its upstreams' buffers filling for
// that long, and a full buffer stalls its producer for the overrun grace.
// Best effort, in parallel, bounded by leaveTimeout: an upstream that
// cannot be told forgets the copy when its lease ends.
func (r *Runtime) leaveUpstreams(ctx context.Context, gone []*task) {
	var wg sync.WaitGroup
	for _, t := range gone {
		name := t.spec.CopyID()
		for _, in := range t.inputs {
			for _, pl := range t.candidates(in.upstream, in.upPartition) {
				ref := &fedstreampb.StreamRef{Query: t.spec.Query, TaskId: pl.TaskID, Partition: int32(t.spec.Partition),
					Consumer: t.spec.Fragment, Generation: int32(pl.Generation)}
				wg.Add(1)
				go func() {
					defer wg.Done()
					r.leaveStream(ctx, ref, pl.WorkerAddr, name)
				}()
			}
		}
	}
	wg.Wait()
}
