// Package dcaa is the per-task replica state machine of DCAA (delay,
// process, correct): how one replica of a partition keeps answering when
// some of its inputs fail, within its share of the query's bound X, and
// how it corrects its tentative output afterwards so that the stable
// output equals a failure-free run.
//
// The machine does no I/O and reads no clock: the caller passes every
// event (tuples delivered on an input with the upstream's advertised
// state, subscription failures, peer messages, ticks) together with the
// current logical time, and gets back the actions to carry out (subscribe
// elsewhere, checkpoint, release a merge step to the operators, restore
// and replay, ask peers for permission...). The same inputs at the same
// times always give the same actions, which is what the scripted tests
// rely on. Output and View are the output-stage helpers (SOutput, and a
// consumer's stable and current views).
package dcaa

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// State is a replica's DCAA state (also advertised per output stream).
type State uint8

const (
	// Unknown: no report yet (an upstream replica nobody heard from).
	Unknown State = 0
	// Stable: every input is live and stable; output is stable.
	Stable State = 1
	// UpFailure: some input failed (silent, its upstream in UP_FAILURE, or
	// its data tentative), or the output is tentative.
	UpFailure State = 2
	// Stabilization: the replica restored its checkpoint and is replaying
	// stable input; its output is UNDO followed by corrections.
	Stabilization State = 3
)

func (s State) String() string {
	switch s {
	case Stable:
		return "STABLE"
	case UpFailure:
		return "UP_FAILURE"
	case Stabilization:
		return "STABILIZATION"
	case Unknown:
		return "UNKNOWN"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Config describes one replica of one partition.
type Config struct {
	// ID is this replica's number; peers are the other numbers below
	// Replicas. Ties between peers go to the lower number.
	ID, Replicas int
	// Inputs has one entry per input stream (the runtime's merge inputs,
	// in its order: by port, then upstream partition): the number of
	// replicas of that upstream partition. A live rescale may add inputs
	// later (AddInput).
	Inputs []int
	// Floors, when not nil, gives per input the lowest stream time its
	// stream can carry (math.MinInt64: none): the stream of a partition a
	// live rescale added starts at the rescale's cut. The input counts
	// as covered up to its floor without a release step there (see
	// AddInput).
	Floors []int64
	// Ranks, when not nil, gives per input its place in the release
	// order of tuples of equal stream time (lower first; equal ranks by
	// index). Without it, the input's index. The runtime ranks by (port,
	// upstream partition), so that inputs a rescale added (after those
	// the task started with) are ordered as in a copy built later with
	// all of them, and every replica releases the same order.
	Ranks []int64
	// Share is this task's share of the query's X (see SplitDelay):
	// the longest an available bucket waits for a failed input before it
	// is released tentative. Strict (or StrictMode) never releases
	// tentative.
	Share time.Duration
	// Budget is the part of X spent on the longest path from a source
	// up to and including this task (the shares of the delaying tasks on
	// it; see PlanBudgets): a bucket is never held past its stream time
	// plus the normal lag plus Budget, so that data another failure made
	// late (a backlog) is not delayed a share again (0: Share).
	Budget time.Duration
	// StrictMode blocks instead of releasing tentative results.
	StrictMode bool
	// Detect is the silence after which an input counts as failed
	// (derived from the boundary interval by the caller). Required.
	Detect time.Duration
	// DetectMax, when above Detect, lets the detection timeout stretch
	// with the lateness this replica itself observes on its live inputs,
	// up to DetectMax (see Machine.DetectLimit): on a machine short of
	// CPU every stage between an upstream's heartbeat timer and this
	// machine runs late, gaps of several boundary intervals between two
	// deliveries of a live replica become common, and a fixed timeout
	// took live replicas for failed over and over (the input moved back
	// and forth, onto a replica that had really failed too, long enough
	// for results to go tentative). 0: Detect, fixed.
	DetectMax time.Duration
	// HealthMax, when above DetectMax, lets the detection timeout
	// stretch further, up to HealthMax, while this replica's own process
	// runs late (local health; see Machine.unhealthy and
	// HealthLimitMax). 0: DetectMax.
	HealthMax time.Duration
	// StartGrace is the silence after which an input that has heard
	// nothing at all since Start counts as failed: the upstream tasks of
	// a query start at different times (on a loaded machine hundreds of
	// milliseconds apart), and an upstream that has not started yet is
	// not an upstream that failed. Default 10 x Detect.
	StartGrace time.Duration
	// PermissionTimeout is how long a request for reconciliation waits
	// for a peer's reply before that peer counts as granting (a peer
	// that does not answer is presumed down). Default 4 x Detect.
	PermissionTimeout time.Duration
	// GrantLease is how long a granted permission binds this replica
	// (it does not reconcile itself) without the peer's done notice.
	// Default 20 x Detect.
	GrantLease time.Duration
	// Retry is the wait after a refused permission before asking again.
	// Default Detect.
	Retry time.Duration
	// ReplayChunk bounds the steps replayed per event during
	// stabilization (0: the whole replay at once).
	ReplayChunk int
	// KeepLimit bounds the stable tuples kept for the replay while the
	// operators hold tentative state (0: no bound). Past it the oldest
	// are dropped (whole release steps): the replay then cannot correct
	// the results that depended on them, which the Restore action names
	// (LostFrom, LostTo); operators whose state only depends on recent
	// input (windows) produce exact results again after the lost range.
	KeepLimit int
	// Background lets a tentative input take the corrections of a
	// stabilizing replica in a background subscription and move to that
	// replica as soon as its stream is stable again (background.go).
	// Without it, the input moves only once that replica is reported
	// STABLE.
	Background bool
}

// ErrConfig is wrapped by New's errors: the configuration is unusable.
var ErrConfig = errors.New("dcaa: bad configuration")

func (c *Config) validate() error {
	if err := c.check(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

func (c *Config) check() error {
	switch {
	case c.Replicas < 1 || c.ID < 0 || c.ID >= c.Replicas:
		return fmt.Errorf("replica %d of %d", c.ID, c.Replicas)
	case c.Detect <= 0:
		return fmt.Errorf("detection timeout %v must be positive", c.Detect)
	case c.Share < 0:
		return fmt.Errorf("share of X %v is negative", c.Share)
	case len(c.Inputs) == 0:
		return fmt.Errorf("no inputs (a source task runs no merge)")
	}
	for i, k := range c.Inputs {
		if k < 1 {
			return fmt.Errorf("input %d has %d upstream replicas", i, k)
		}
	}
	if c.Floors != nil && len(c.Floors) != len(c.Inputs) {
		return fmt.Errorf("%d floors for %d inputs", len(c.Floors), len(c.Inputs))
	}
	if c.Ranks != nil && len(c.Ranks) != len(c.Inputs) {
		return fmt.Errorf("%d ranks for %d inputs", len(c.Ranks), len(c.Inputs))
	}
	if c.PermissionTimeout <= 0 {
		c.PermissionTimeout = 4 * c.Detect
	}
	if c.GrantLease <= 0 {
		c.GrantLease = 20 * c.Detect
	}
	if c.Retry <= 0 {
		c.Retry = c.Detect
	}
	if c.DetectMax < c.Detect {
		c.DetectMax = c.Detect
	}
	if c.HealthMax < c.DetectMax {
		c.HealthMax = c.DetectMax
	}
	if c.StartGrace < c.Detect {
		c.StartGrace = 10 * c.Detect
	}
	if c.Share == Strict {
		c.StrictMode = true
	}
	if c.Budget < c.Share {
		c.Budget = c.Share
	}
	return nil
}

// Event is an input to Machine.Step.
type Event interface{ isEvent() }

// Deliver is a batch received on an input from the replica it is
// subscribed to, in stream order, with the producer's in-band stream
// state at the end of the batch. An empty Tuples is a heartbeat. The
// machine keeps the tuples (their Values too): the caller must not
// reuse them.
type Deliver struct {
	Input  int
	Tuples []tuple.Tuple
	// Upstream is the producing replica's advertised state.
	Upstream State
	// TentWatermark is the producer's tentative progress (it released
	// tentatively everything below it); 0 when its output is stable.
	TentWatermark int64
	// Attempt is the Subscribe.Attempt of the subscription that received
	// the batch (0: whichever is current). A batch of an attempt the
	// machine has replaced since (it moved the input to another replica
	// while the batch was on its way) is ignored: its tuples would come
	// again from the new replica, and tentative tuples, which have no
	// stable id to drop duplicates by, would be processed twice.
	Attempt uint64
	// Owner, when set, owns Tuples' memory (and their values'), and the
	// delivery hands it to the machine: the machine keeps the stable
	// tuples where they are, without copying them, and calls
	// Owner.Release at the start of a later Step once it no longer needs
	// any of them (released stable for good, or shed). If the machine
	// keeps any of them in a way it does not count (tentative data, a
	// tuple out of stime order), or ignores the delivery, it never calls
	// Release: the memory is then left to the garbage collector. Either
	// way the caller must not use Tuples after the Step. Without an
	// owner the machine copies the tuples it keeps.
	Owner Releaser
	// Renumber: the input realigned its stream by stream time onto a
	// replica whose stable ids number other results than the ones it
	// took (after a correction upstream that could not make every
	// result exact; the runtime's lineage watch). The batch's first
	// stable tuple or boundary is new whatever its id, and the input
	// follows that replica's numbering from it on: its last stable id
	// becomes the one before (it may go down), so neither it nor what
	// follows is dropped as resent.
	Renumber bool
}

// SubscriptionFailed says the input's subscription ended with an error
// (connection refused or reset, stream closed): the machine moves the
// input to another replica. The input counts as failed only once it has
// heard nothing past the detection timeout.
type SubscriptionFailed struct {
	Input int
	// Attempt is the failed subscription's Subscribe.Attempt (0: the
	// current one); the failure of an attempt already replaced is
	// ignored.
	Attempt uint64
}

// UpstreamStates is what the coordinator reports of each replica of the
// input's upstream partition (index = replica number; Unknown: none).
// The input hears in band only the replicas it reads (its main and its
// background subscription); a report lets it prefer, when it moves, a
// replica it does not read (choose: STABLE, then UP_FAILURE, then
// STABILIZATION) and read one in STABILIZATION in the background.
type UpstreamStates struct {
	Input  int
	States []State
	// At is when the states were known (machine time; 0: now). A state
	// the input heard in band from a replica after At wins over the
	// report's for that replica: the report is older news.
	At int64
}

// ReplicaMoved says the coordinator placed upstream replica Replica of
// input Input anew (another worker, a new generation: a new copy): what
// the machine knew of the old copy, its failures included, no longer
// holds.
type ReplicaMoved struct {
	Input, Replica int
}

// PermissionRequest: peer From asks to reconcile.
type PermissionRequest struct{ From int }

// PermissionReply answers this replica's request.
type PermissionReply struct {
	From    int
	Granted bool
}

// PeerDone: peer From finished (or gave up) reconciling, or withdraws
// its request; a permission granted to it no longer binds.
type PeerDone struct{ From int }

// Tick only advances the clock (timeouts).
type Tick struct{}

func (Deliver) isEvent()            {}
func (SubscriptionFailed) isEvent() {}
func (UpstreamStates) isEvent()     {}
func (ReplicaMoved) isEvent()       {}
func (PermissionRequest) isEvent()  {}
func (PermissionReply) isEvent()    {}
func (PeerDone) isEvent()           {}
func (Tick) isEvent()               {}

// Action is an output of Machine.Step, to carry out in order.
type Action interface{ isAction() }

// Subscribe (re)subscribes Input to upstream replica Replica, resuming
// after the last stable id received on it. Attempt numbers the input's
// subscriptions (1, 2, ...): the caller passes it back with what that
// subscription delivers (Deliver.Attempt, SubscriptionFailed.Attempt).
type Subscribe struct {
	Input, Replica int
	AfterID        uint64
	Attempt        uint64
	// Promoted: the input took the stable tuples its background
	// subscription to Replica kept aside (up to AfterID) and now reads
	// that replica as its main one (see background.go): its last stable
	// id is AfterID, though no main subscription delivered it.
	Promoted bool
}

// Checkpoint: snapshot the operators' state (and the output position)
// now, before the first tentative tuple enters them.
type Checkpoint struct{ Watermark int64 }

// Release hands merge steps to the operators: for each step, its tuples
// in order, then Advance(step.Advance) and a boundary on the output.
// Tentative: the outputs it produces are tentative (Output.SetTentative).
// Replay: the steps are the stable replay after a Restore.
type Release struct {
	Tentative, Replay bool
	Steps             []Step
}

// Step is one release step: its tuples in release order, as Runs of
// consecutive tuples of one input each. The Runs are valid until the next
// Step: the caller processes a Release before it steps the machine again,
// and the machine reuses their memory (and hands delivered batches back
// to their owners, see Deliver.Owner). A stable step's runs are the
// machine's own kept input, not copies (with an Owner, the delivered
// batches themselves: the all-stable path copies no tuple); the caller
// may change those tuples (an operator passing a tuple on sets its type),
// since a stable release is never released again. A tentative step's tuples are copies, marked
// tentative: the stable input among them stays kept for the replay.
type Step struct {
	Runs    []Run
	Advance int64
}

// Run is consecutive released tuples of one input.
type Run struct {
	Input  int
	Tuples []tuple.Tuple
}

// Len is the number of tuples the step releases.
func (s Step) Len() int {
	n := 0
	for _, r := range s.Runs {
		n += len(r.Tuples)
	}
	return n
}

// Entry is a released tuple and the input it came on.
type Entry struct {
	Input int
	Tuple tuple.Tuple
}

// Restore: put the operators back to the last Checkpoint and emit UNDO
// on the output (Output.Undo); stable replay follows. When the input kept
// for the replay went over Config.KeepLimit, the stable input with stime
// in [LostFrom, LostTo) was dropped (LostTo > LostFrom): results that
// depend on it are not corrected.
type Restore struct{ LostFrom, LostTo int64 }

// RecDone: the corrections are complete (Output.RecDone).
type RecDone struct{}

// AskPermission asks every peer for permission to reconcile.
type AskPermission struct{ Peers []int }

// ReplyPermission answers peer To.
type ReplyPermission struct {
	To      int
	Granted bool
}

// NotifyDone tells peers that this replica no longer reconciles (or no
// longer asks): permissions they granted are released.
type NotifyDone struct{ Peers []int }

// StateChange reports a change of the replica's state (for the
// coordinator and for in-band advertisement).
type StateChange struct{ From, To State }

func (Subscribe) isAction()       {}
func (Checkpoint) isAction()      {}
func (Release) isAction()         {}
func (Restore) isAction()         {}
func (RecDone) isAction()         {}
func (AskPermission) isAction()   {}
func (ReplyPermission) isAction() {}
func (NotifyDone) isAction()      {}
func (StateChange) isAction()     {}

// inputState is one input stream.
type inputState struct {
	replica  int     // upstream replica subscribed to
	attempt  uint64  // the current subscription's Subscribe.Attempt
	upState  []State // advertised or reported state per upstream replica
	suspect  []int64 // when each replica last failed us (0: never)
	fails    []int   // subscriptions to each replica failed in a row (see suspicion)
	heard    int64   // last delivery
	spoke    bool    // a delivery (data or heartbeat) came since Start
	silent   bool    // failed: silent past Detect, or its subscription failed
	failedUp bool    // the replica read advertises UP_FAILURE
	// onAttempt: a delivery came on the current subscription since it
	// was made; the gap to the next one is a live replica's (gapSeen).
	onAttempt bool
	// doubtFrom is when the input was last heard before a silence past
	// the detection timeout that was doubted (see inputFailed; 0: none
	// since the last delivery): the delivery that ends it is the end of
	// a live replica's gap, measured from there.
	doubtFrom int64
	// unheardMoves counts the moves for silence in a row of
	// subscriptions that delivered nothing, since the input last
	// delivered (or since Start): each doubles the time the next
	// subscription gets before its silence counts (silenceLimit).
	unheardMoves int
	// left is the subscription the input left for silence (inputFailed),
	// until the input delivers on another: a delivery of it that comes
	// late shows that its replica lived (see lateHeard).
	left leftAttempt
	// tentData: tentative data arrived since the last UNDO/REC_DONE or
	// switch; the input's stream is not stable.
	tentData bool
	stableB  int64 // highest stable boundary (or the input's floor)
	// floored: stableB is the input's floor (Config.Floors, AddInput),
	// not a boundary its stream brought: no release step is there.
	floored bool
	tentWM  int64 // tentative coverage advertised by the producer
	// steps are the stable boundary values above the drop point.
	steps []int64
	// stable holds the stable data above the drop point (kept for replay
	// while the operators hold tentative state), mostly as slices of the
	// delivered batches themselves (see keptStore); tent the tentative
	// data not released yet. What is released or dropped leaves stable's
	// head; the memory of a batch goes back to its owner only at the
	// start of the next Step (stable steps hand out runs of it, valid
	// until then).
	stable     keptStore
	tent       []tuple.Tuple
	lastStable uint64 // id of the last stable tuple or boundary received
	late       uint64
	// quiet: the replica went silent on this input past the detection
	// timeout and has not been heard from since (its last advertised
	// state, in upState, is stale: a partitioned or paused replica keeps
	// the STABLE it said before). choose ranks it below every replica
	// heard from, so once its suspicion expires the input does not go
	// back to it from a live replica in UP_FAILURE.
	quiet []bool
	// seen is when each replica's state in upState was last heard in
	// band (0: never); a report older than that does not overwrite it.
	seen []int64
	// bg is the input's background subscription (Config.Background).
	bg background
}

func (in *inputState) coverage() int64 { return max(in.stableB, in.tentWM) }

// leftAttempt is a subscription an input left because its replica was
// silent past the detection timeout: its Subscribe.Attempt (0: none),
// its replica, and when the input last heard it.
type leftAttempt struct {
	attempt uint64
	replica int
	heard   int64
}

// stableCovers reports whether the input took stable data at or past
// stream time st (below its stable boundary, or up to its last stable
// tuple kept): a tentative tuple there stands for results it has stable.
// A replica's tentative tuples come after its own stable ones, so this
// happens only after a switch onto a replica that went tentative before
// the one read (dataplane.OutputBuffer.ResumePosition): its tentative
// tail begins below what the input took, and only its part past that
// is news (released with the other inputs' data, it counted those
// results twice).
func (in *inputState) stableCovers(st int64) bool {
	if st < in.stableB {
		return true
	}
	last, ok := in.stable.lastSTime()
	return ok && st <= last
}

// EndOfStream is the stream time of a stream's final boundary: nothing
// follows it.
const EndOfStream = math.MaxInt64

// ended: the input's final boundary came (stable: the producer ends its
// stream only once its output is stable). A finished upstream is not a
// failed one: the input is complete, never silent (its producer sends
// nothing more), never read elsewhere, and whatever state its producer
// last advertised no longer matters.
func (in *inputState) ended() bool { return in.stableB == EndOfStream }

// failed: the input is silent past the detection timeout (or its
// subscription failed), the replica it reads advertises UP_FAILURE, or
// its data is tentative, and it has not ended. Only then may a bucket
// missing its data be released without it.
func (in *inputState) failed() bool {
	return !in.ended() && (in.silent || in.failedUp || in.tentData)
}

// addStable keeps t, a copy, in stable's (stime, arrival) order: a
// tuple out of stime order (an input with allowed lateness) goes after
// the last one with the same or a lower stime, so releases find their
// range by binary search instead of scanning everything kept since the
// checkpoint.
func (in *inputState) addStable(t tuple.Tuple) { in.stable.add(t) }

// from is the index of the first stable tuple with stime >= st.
func (in *inputState) from(st int64) int { return in.stable.from(st) }

// dropKept forgets input in's first k stable tuples (released for good or
// shed): they leave stable's head, where the Step's runs may still read
// them; batches no longer needed go back to their owners at the next Step.
func (m *Machine) dropKept(in *inputState, k int) {
	m.done = in.stable.drop(k, m.done)
}

// availEntry: the furthest any input covered first reached At at clock
// Since. A bucket below At has been available since then. From is where
// the coverage stood before: when At is no stable step (a tentative
// watermark), the entry's buckets lie in (From, At] with no step known
// between them (an upstream's first tentative release carries
// everything it held while it detected the failure, in one batch), and
// the lowest of them bounds the wait (see due). Otherwise From is At.
type availEntry struct{ At, From, Since int64 }

// Machine is the DCAA state machine of one task replica.
type Machine struct {
	cfg    Config
	inputs []*inputState
	now    int64

	released int64 // watermark of the last release (R)
	// cut bounds releases (math.MaxInt64: none): nothing above it is
	// released, and while it is set nothing is released tentatively (a
	// rescale's hold and cut; see SetCut).
	cut       int64
	tentative bool  // the operators hold tentative state (checkpoint taken)
	ckpt      int64 // R at the checkpoint
	avail     []availEntry
	availMax  int64
	// lag is the least (clock - stream time) seen when the availability
	// rose (lagKnown: seen once): how soon after its stream time a bucket
	// is available without failures.
	lag      int64
	lagKnown bool
	// stepGap: the stream time between an input's last two stable
	// boundaries (0: none seen), the size of a bucket as far as this
	// task knows (see due).
	stepGap int64

	replaying  bool
	replayed   bool  // a replay chunk went out during this Step
	replayTo   int64 // stable step the replay ends with
	asking     bool
	askedAt    int64
	grants     map[int]bool
	retryAt    int64
	grantedTo  int // peer holding our permission, -1 none
	grantedAt  int64
	state      State
	tentOut    uint64 // tentative steps released (figures)
	stableOut  uint64
	replayOut  uint64
	recoveries uint64
	silences   uint64 // inputs timed out for silence (figures)
	// doubts counts silences past the detection timeout not taken for a
	// failure (see inputFailed; figures).
	doubts uint64
	// gapMax is the longest gap between two deliveries of a live
	// subscription seen at gapAt (or later gaps, once gapAt is older than
	// gapWindow): what DetectLimit stretches the detection timeout by.
	gapMax, gapAt int64
	// health is this replica's local health score at healthAt (0:
	// healthy; see unhealthy and DetectLimit), asked the deadline
	// NextDeadline last gave (math.MaxInt64: none), by which a Step shows
	// its caller ran late.
	health   int
	healthAt int64
	asked    int64
	// unhealthyCount counts the rises of health (figures).
	unhealthyCount uint64
	// lostFrom, lostTo: the stable input in [lostFrom, lostTo) was dropped
	// for KeepLimit during this failure (lostTo == lostFrom: none);
	// shed counts the tuples dropped, keptMax the most kept at once after
	// a bound (figures).
	lostFrom, lostTo int64
	// ranks are the inputs' places in the release order (Config.Ranks;
	// nil: by index), order the inputs in that order (nil: by index).
	ranks   []int64
	order   []int
	shed    uint64
	keptMax int
	// shedData counts the data tuples among shed (without the steps).
	shedData uint64
	// runs holds the runs of the current Step's releases (Step.Runs
	// alias it); scratch and tuples a tentative release's copies while
	// it sorts them and as released (tentative runs alias tuples). All
	// are reused from one Step to the next.
	runs    []Run
	scratch []Entry
	tuples  []tuple.Tuple
	// parts holds collect's ranges of kept data (slices of segments).
	parts [][]tuple.Tuple
	// done holds the owners of delivered batches no longer needed: they
	// are handed back at the start of the next Step, once the runs of the
	// Step that dropped them have been processed.
	done []Releaser
	// bgSeq numbers background subscriptions; bgStarts and promotions
	// count them and the inputs that moved to their replica (figures).
	bgSeq, bgStarts, promotions uint64
}

// New builds the machine; Start gives its first subscriptions.
func New(cfg Config) (*Machine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Machine{cfg: cfg, released: math.MinInt64, cut: math.MaxInt64, ckpt: math.MinInt64, availMax: math.MinInt64, grantedTo: -1, state: Stable, asked: math.MaxInt64}
	for i, k := range cfg.Inputs {
		floor := int64(math.MinInt64)
		if cfg.Floors != nil {
			floor = cfg.Floors[i]
		}
		m.inputs = append(m.inputs, newInputState(k, floor))
	}
	m.cfg.Inputs, m.cfg.Floors = slices.Clone(cfg.Inputs), nil
	if cfg.Ranks != nil {
		m.ranks = slices.Clone(cfg.Ranks)
		m.sortRanks()
	}
	return m, nil
}

// sortRanks computes the release order of the inputs from their ranks
// (nil: by index, when the ranks are in index order).
func (m *Machine) sortRanks() {
	order := make([]int, len(m.ranks))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(m.ranks[a], m.ranks[b]) })
	m.order = nil
	for k, i := range order {
		if k != i {
			m.order = order
			return
		}
	}
}

// at is the input at position pos of the release order.
func (m *Machine) at(pos int) int {
	if m.order == nil {
		return pos
	}
	return m.order[pos]
}

func newInputState(replicas int, floor int64) *inputState {
	return &inputState{upState: make([]State, replicas), seen: make([]int64, replicas), suspect: make([]int64, replicas), fails: make([]int, replicas), quiet: make([]bool, replicas),
		stableB: floor, floored: floor != math.MinInt64, tentWM: math.MinInt64}
}

// ErrAddInput is wrapped by AddInput's errors: the input cannot be added
// at this point of the stream.
var ErrAddInput = errors.New("dcaa: cannot add an input here")

// AddInput adds an input stream while the machine runs, at clock now: a
// live rescale gave an upstream fragment a partition, whose stream (from
// an upstream partition with k replicas) carries nothing below floor,
// the rescale's cut. rank places its tuples among those of equal stream
// time (see Config.Ranks). It returns the input's index (the next one)
// and the subscription to make.
//
// The input counts as covered up to floor, without a release step there:
// the other inputs' data below floor is released without waiting for the
// added stream's first boundary, and releases still end only at
// boundaries some stream brought, so replicas that add the input at
// different moments release the same steps. For that, nothing at or
// above floor may have been released yet (the caller holds the machine
// below it with SetCut from before the rescale's cut could be reached
// until the input is added), and the operators must hold no tentative
// state (which a hold ensures too): otherwise ErrAddInput, or
// ErrNotStable.
func (m *Machine) AddInput(now int64, k int, floor, rank int64) (int, []Action, error) {
	m.now = max(m.now, now)
	switch {
	case k < 1:
		return 0, nil, fmt.Errorf("%w: %d upstream replicas", ErrAddInput, k)
	case m.tentative || m.replaying:
		return 0, nil, fmt.Errorf("%w: %s", ErrNotStable, m.state)
	case m.released >= floor:
		return 0, nil, fmt.Errorf("%w: released up to %d, at or past the stream's floor %d", ErrAddInput, m.released, floor)
	}
	in := newInputState(k, floor)
	m.inputs = append(m.inputs, in)
	m.cfg.Inputs = append(m.cfg.Inputs, k)
	i := len(m.inputs) - 1
	if m.ranks == nil {
		for j := range i {
			m.ranks = append(m.ranks, int64(j))
		}
	}
	m.ranks = append(m.ranks, rank)
	m.sortRanks()
	in.heard = m.now
	in.replica = m.choose(i)
	in.attempt++
	return i, []Action{Subscribe{Input: i, Replica: in.replica, AfterID: in.lastStable, Attempt: in.attempt}}, nil
}

// Order returns the inputs' indexes in release order: the order of
// tuples of equal stream time (see Config.Ranks).
func (m *Machine) Order() []int {
	o := make([]int, len(m.inputs))
	for pos := range o {
		o[pos] = m.at(pos)
	}
	return o
}

// Inputs is the number of input streams.
func (m *Machine) Inputs() int { return len(m.inputs) }

// Start subscribes every input (preferring the upstream replica with this
// replica's number) at time now.
func (m *Machine) Start(now int64) []Action {
	m.now = now
	var acts []Action
	for i, in := range m.inputs {
		in.heard = now
		in.replica = m.choose(i)
		in.attempt++
		acts = append(acts, Subscribe{Input: i, Replica: in.replica, AfterID: in.lastStable, Attempt: in.attempt})
	}
	return acts
}

// State is the replica's current state.
func (m *Machine) State() State { return m.state }

// Alive tells the machine that input i's subscription heard its replica
// at clock now (a batch the machine has not taken yet, a heartbeat): it
// is not silent. It returns no action and runs no timeout, so the caller
// can vouch for several inputs before the next Step times any of them out
// (a Step per input would time out the inputs not vouched for yet). It
// does not end a failure already detected: that takes a delivery.
func (m *Machine) Alive(i int, now int64) {
	m.now = max(m.now, now)
	in := m.inputs[i]
	in.heard = max(in.heard, m.now)
}

// ErrNotStable means a cut was asked of a replica whose operators hold
// tentative state (or that is replaying its stable input), which a cut
// must not hand on. The caller waits until the replica is stable again.
var ErrNotStable = errors.New("replica is not stable")

// SetCut bounds the releases at stream time cut: no step above it is
// released, the stable release that reaches it has cut itself as its
// last step, and nothing is released tentatively while a cut is set (an
// input failing meanwhile blocks the task, as in strict mode, until the
// cut is lifted). SetCut(Released()) holds the replica where it is.
// It is refused with ErrNotStable while the operators hold tentative
// state or the replica replays (STABILIZATION), and when cut is below
// what was released. (An input merely failed is no reason: everything
// released so far is stable.)
// math.MaxInt64 lifts the cut (always allowed).
func (m *Machine) SetCut(cut int64) error {
	if cut == math.MaxInt64 {
		m.cut = cut
		return nil
	}
	if m.tentative || m.replaying {
		return fmt.Errorf("%w: %s", ErrNotStable, m.state)
	}
	if cut < m.released {
		return fmt.Errorf("dcaa: cut %d below the released watermark %d", cut, m.released)
	}
	m.cut = cut
	return nil
}

// Released is the watermark of the last release.
func (m *Machine) Released() int64 { return m.released }

// Tentative reports whether the operators hold tentative state.
func (m *Machine) Tentative() bool { return m.tentative }

// Subscribed is the upstream replica input i reads.
func (m *Machine) Subscribed(i int) int { return m.inputs[i].replica }

// Takes reports whether a Step now would take a Deliver of attempt on
// input i (see Deliver.Attempt): the attempt is the input's current
// subscription. A caller that must know what the machine took (its
// last stable id per input) asks just before that Step: the Step may
// itself move the input to another subscription.
func (m *Machine) Takes(i int, attempt uint64) bool { return m.current(i, attempt) }

// Late counts stable tuples dropped on input i for arriving below what
// was released already while not keeping state for a replay.
func (m *Machine) Late(i int) uint64 { return m.inputs[i].late }

// NextDeadline is the earliest clock at which a Tick may change
// something (a bucket's wait expiring, a silence timeout, a retry), or
// math.MaxInt64.
func (m *Machine) NextDeadline() int64 {
	next := int64(math.MaxInt64)
	// A bucket's wait only runs out while an input is failed (or the
	// operators are tentative already; see progress): a deadline for an
	// input merely behind would be in the past and wake the caller in a
	// loop for nothing.
	if !m.cfg.StrictMode && m.cut == math.MaxInt64 && (m.tentative || m.failing()) {
		// Only waits still running: one that ran out at or before the
		// last Step was weighed there already, and what held its bucket
		// back (an input behind that is not failed) changes with an
		// event, not with time; naming it would wake the caller in a
		// loop.
		for _, e := range m.avail {
			if d := m.due(e); e.At > m.released && d > m.now {
				next = min(next, d)
				break
			}
		}
	}
	for _, in := range m.inputs {
		if !in.ended() {
			next = min(next, in.heard+m.silenceLimit(in)+1) // silent past Detect
		}
	}
	if m.asking {
		next = min(next, m.askedAt+int64(m.cfg.PermissionTimeout)+1)
	} else if m.retryAt > m.now {
		next = min(next, m.retryAt)
	}
	if m.grantedTo >= 0 {
		next = min(next, m.grantedAt+int64(m.cfg.GrantLease)+1)
	}
	m.asked = next
	return next
}

// Step applies one event at clock now (never earlier than the previous
// call's) and returns the actions to carry out, in order.
func (m *Machine) Step(now int64, ev Event) []Action {
	if late := now - m.asked; m.asked != math.MaxInt64 && late > int64(m.cfg.Detect/2) {
		// The caller asked to be woken at asked and comes this late:
		// its process stood still (or was busy) meanwhile, which says
		// something of this replica, nothing of its upstreams. A point,
		// and one more per detection timeout it was late: every input
		// heard nothing for that long, and the timeout stretches past
		// it (within HealthMax), so that the stall alone fails none.
		m.unhealthyAt(max(m.now, now), 1+int(late/int64(m.cfg.Detect)))
	}
	m.asked = math.MaxInt64
	m.now = max(m.now, now)
	m.replayed = false
	m.resetScratch()
	m.handBack()
	var acts []Action
	switch ev := ev.(type) {
	case Deliver:
		if m.isBackground(ev.Input, ev.Attempt) {
			acts = m.backgroundDeliver(ev, acts)
		} else if m.current(ev.Input, ev.Attempt) {
			acts = m.deliver(ev, acts)
			acts = m.backgroundCheck(ev.Input, acts)
		} else if l := m.inputs[ev.Input].left; l.attempt != 0 && ev.Attempt == l.attempt {
			acts = m.lateHeard(ev, acts)
		}
	case SubscriptionFailed:
		if m.isBackground(ev.Input, ev.Attempt) {
			acts = m.backgroundFailed(ev.Input, acts)
		} else if m.current(ev.Input, ev.Attempt) {
			acts = m.subscriptionFailed(ev.Input, acts)
		}
	case ReplicaMoved:
		acts = m.replicaMoved(ev, acts)
	case UpstreamStates:
		if ev.Input < 0 || ev.Input >= len(m.inputs) {
			break
		}
		in := m.inputs[ev.Input]
		for r := range min(len(ev.States), len(in.upState)) {
			if ev.At != 0 && (ev.States[r] == Unknown || ev.At <= in.seen[r]) {
				continue // nothing reported, or heard in band since
			}
			if r != in.replica || ev.States[r] != Unknown {
				in.upState[r] = ev.States[r]
			}
		}
		acts = m.maybeSwitch(ev.Input, acts)
		acts = m.backgroundCheck(ev.Input, acts)
	case PermissionRequest:
		acts = m.request(ev.From, acts)
	case PermissionReply:
		acts = m.reply(ev, acts)
	case PeerDone:
		if m.grantedTo == ev.From {
			m.grantedTo = -1
		}
		// A peer no longer reconciles: ask again now rather than after
		// the retry delay (a refusal only meant that peer went first).
		m.retryAt = 0
	case Tick:
	}
	acts = m.timeouts(acts)
	acts = m.progress(acts)
	return m.updateState(acts)
}

// current reports whether attempt is input i's current subscription (0
// stands for it).
func (m *Machine) current(i int, attempt uint64) bool {
	return attempt == 0 || attempt == m.inputs[i].attempt
}

func (m *Machine) deliver(ev Deliver, acts []Action) []Action {
	in := m.inputs[ev.Input]
	if (in.onAttempt || in.doubtFrom != 0) && !in.silent && !in.ended() {
		from := in.heard
		if in.doubtFrom != 0 {
			// The silence that was doubted was this gap: it stretches
			// the timeout now, not only once a later gap is as long.
			from = in.doubtFrom
		}
		m.gapSeen(m.now - from)
	}
	in.heard, in.silent, in.spoke, in.onAttempt, in.doubtFrom, in.unheardMoves = m.now, false, true, true, 0, 0
	in.left = leftAttempt{}
	drop := m.dropPoint()
	ts := ev.Tuples
	if ev.Renumber {
		for k := range ts {
			if t := ts[k].Type; (t == tuple.Stable || t == tuple.Boundary) && ts[k].ID > 0 {
				in.lastStable = ts[k].ID - 1
				break
			}
		}
	}
	// held counts the segments of stable data kept in the batch's own
	// memory; pinned: some of it is referenced elsewhere (tentative data,
	// a tuple kept out of order), so it is never handed back.
	var (
		held   *heldBatch
		pinned bool
	)
	if ev.Owner != nil {
		held = &heldBatch{owner: ev.Owner}
	} else if len(ts) > 0 {
		ts = slices.Clone(ts) // the caller keeps its memory
	}
	defer func() {
		if held == nil {
			return
		}
		if pinned {
			held.owner = nil
		} else if held.segs == 0 {
			m.done = append(m.done, held.owner) // nothing of it kept
		}
	}()
	for k := 0; k < len(ts); k++ {
		t := ts[k]
		if t.Type == tuple.Stable {
			// The common case, a run of stable tuples in order past
			// everything kept and released, is kept as it is: a
			// segment of the delivered batch.
			j := k + 1
			for j < len(ts) && ts[j].Type == tuple.Stable {
				j++
			}
			if m.appendStable(in, ts[k:j], drop, held) {
				k = j - 1
				continue
			}
		}
		switch t.Type {
		case tuple.Stable:
			if t.ID != 0 && t.ID <= in.lastStable {
				continue // resent after a resubscription
			}
			in.lastStable = max(in.lastStable, t.ID)
			if t.STime < drop || m.lostTo > m.lostFrom && t.STime < m.lostTo {
				in.late++
				continue
			}
			in.addStable(t)
			pinned = true // its values alias the batch
		case tuple.Boundary:
			// A boundary is not dropped by its id: one resent after a
			// resubscription is at or below the stable boundary, and
			// the stream time alone tells it is not new. Ids tell only
			// while the upstream's replicas number their stable streams
			// alike, which they no longer do after a correction that
			// could not make every result exact (UNCORRECTABLE): an
			// input that read the replica with more stable results
			// resumes on another at an id that comes later there, and
			// dropped by id, that replica's boundaries, its final one
			// too, were all lost: the input never ended, nor the task
			// (bench dcaa under load, after "DCAA correction
			// incomplete"). The data up to that id is still dropped as
			// taken: such a switch skips or repeats results (the lossy
			// replica's status says so), it does not stop the query.
			in.lastStable = max(in.lastStable, t.ID)
			if t.STime > in.stableB || in.floored && t.STime == in.stableB {
				if !in.floored && in.stableB != math.MinInt64 {
					m.stepGap = t.STime - in.stableB // see due
				}
				in.stableB, in.floored = t.STime, false
				in.steps = append(in.steps, t.STime)
			}
		case tuple.Tentative:
			in.tentData = true
			if t.STime >= m.released && !in.stableCovers(t.STime) {
				in.tent = append(in.tent, t)
				pinned = true
			}
		case tuple.Undo:
			// The producer takes back its tentative tuples; corrections
			// (stable) follow. Ours, not yet released, go.
			in.tent, in.tentData, in.tentWM = nil, false, math.MinInt64
		case tuple.RecDone:
			in.tentData = false
		}
	}
	if ev.TentWatermark > 0 {
		in.tentWM = max(in.tentWM, ev.TentWatermark)
	}
	in.upState[in.replica], in.seen[in.replica] = ev.Upstream, m.now
	// The replica delivers: whatever failure made it suspected (the
	// input chose it while every replica was, or came back to it) is
	// over. Still suspected, it counted as failed recently when another
	// replica went silent (othersDoubtful), and choose ranked it below a
	// replica that had not delivered since.
	in.quiet[in.replica], in.suspect[in.replica] = false, 0
	in.fails[in.replica] = 0
	in.failedUp = ev.Upstream == UpFailure
	return m.maybeSwitch(ev.Input, acts)
}

// lateHeard: a delivery of the subscription input ev.Input left because
// its replica was silent past the detection timeout, come late (it was
// on its way: this process, or the way to it, stood still). That
// replica lived: the silence was a live replica's gap (it stretches the
// timeout, see gapSeen), and its suspicion goes. An input that has not
// heard the replica it moved to yet goes back to it: otherwise, when
// that one had failed for real (the other replica of a pair, held), it
// waited a whole detection timeout more before it moved again, its
// buckets waiting all along. The delivery's tuples are not taken (the
// next subscription resends them).
func (m *Machine) lateHeard(ev Deliver, acts []Action) []Action {
	in := m.inputs[ev.Input]
	l := in.left
	in.left = leftAttempt{}
	if in.ended() {
		return acts
	}
	m.gapSeen(m.now - l.heard)
	m.unhealthy() // a silence taken for a failure that was none
	r := l.replica
	in.suspect[r], in.fails[r], in.quiet[r] = 0, 0, false
	in.upState[r], in.seen[r] = ev.Upstream, m.now
	if r != in.replica && !in.onAttempt {
		acts = m.switchTo(ev.Input, r, acts)
	}
	return acts
}

// appendStable keeps ts, stable tuples received on in, as one segment
// of the delivered memory (held: the batch's count; nil: the machine's
// copy) when each of them would be kept as it comes (new ids,
// increasing; not below drop nor in a range lost for KeepLimit; in stime
// order from the last one kept): then it reports true. Otherwise it keeps
// nothing, and deliver takes the tuples one by one.
func (m *Machine) appendStable(in *inputState, ts []tuple.Tuple, drop int64, held *heldBatch) bool {
	id := in.lastStable
	st := int64(math.MinInt64)
	if last, ok := in.stable.lastSTime(); ok {
		st = last
	}
	lost := m.lostTo > m.lostFrom
	for k := range ts {
		t := &ts[k]
		if t.ID <= id || t.STime < st || t.STime < drop || lost && t.STime < m.lostTo {
			return false
		}
		id, st = t.ID, t.STime
	}
	in.stable.appendSeg(ts, held)
	in.lastStable = id
	return true
}

// maybeSwitch moves an input whose replica advertises UP_FAILURE (or
// STABILIZATION) to a better one the coordinator reports.
func (m *Machine) maybeSwitch(i int, acts []Action) []Action {
	in := m.inputs[i]
	cur := in.upState[in.replica]
	if in.ended() || cur != UpFailure && cur != Stabilization {
		return acts
	}
	best := m.choose(i)
	if m.rankOf(in, best) < m.rankOf(in, in.replica) && !m.suspected(in, best) {
		acts = m.switchTo(i, best, acts)
	}
	return acts
}

// subscriptionFailed: the replica input i reads refused or dropped the
// subscription (killed, not running yet, unreachable). That replica is
// suspected and the input moves to another at once, but the input itself
// is not failed: it fails only when it hears nothing past the detection
// timeout, counted from its last delivery (not from the switch). So an
// upstream replica killed while another serves costs nothing, and
// neither does an upstream task that starts a little after this one.
func (m *Machine) subscriptionFailed(i int, acts []Action) []Action {
	in := m.inputs[i]
	if in.ended() {
		return acts // complete: nothing more to read anywhere
	}
	in.suspect[in.replica] = m.now
	if in.upState[in.replica] != Unknown {
		// A replica that advertised a state and now refuses: killed,
		// its stale state ranking it high (suspicion). One never heard
		// (not started yet: at a query's start each replica refuses a
		// few times) is not backed off: its peer's suspicion, grown so,
		// kept inputs on a replica in UP_FAILURE for seconds.
		in.fails[in.replica]++
	}
	heard := in.heard
	acts = m.switchTo(i, m.choose(i), acts)
	in.heard = heard
	return acts
}

// replicaMoved forgets what input ev.Input knew of the old copy of
// upstream replica ev.Replica: its failures, its silence and its state
// (unknown until the new copy advertises one). An input that reads an
// UP_FAILURE or STABILIZATION replica may move to the new copy at once.
func (m *Machine) replicaMoved(ev ReplicaMoved, acts []Action) []Action {
	if ev.Input < 0 || ev.Input >= len(m.inputs) {
		return acts
	}
	in := m.inputs[ev.Input]
	r := ev.Replica
	if r < 0 || r >= len(in.upState) || in.ended() {
		return acts
	}
	in.suspect[r], in.fails[r], in.quiet[r] = 0, 0, false
	if r != in.replica {
		// A report from before the move is the old copy's.
		in.upState[r], in.seen[r] = Unknown, m.now
	}
	return m.maybeSwitch(ev.Input, acts)
}

// inputFailed: input i was silent past the detection timeout. It is
// failed until it delivers again, and tries another replica (the next
// try gets a full detection timeout).
//
// Unless the replica it reads delivered on this subscription and every
// other replica is doubtful (othersDoubtful): then the input keeps reading
// it, not failed, for one more detection timeout (doubted), and fails
// only if it stays silent through that too (it has not delivered since).
// A process short of CPU hears nothing for a while from any upstream; it
// took the live replica for failed and moved to the only other one,
// whose failure had been real (a held link), and stayed there until
// that silence was detected in turn: under load 40, for seconds, and
// results went tentative though a live replica was there all along. A
// real failure of the replica read costs one more detection timeout,
// and only while the others are suspected.
func (m *Machine) inputFailed(i int, acts []Action) []Action {
	in := m.inputs[i]
	if in.onAttempt && m.othersDoubtful(in) {
		in.doubtFrom = in.heard
		in.heard, in.onAttempt = m.now, false
		m.doubts++
		return acts
	}
	m.silences++
	if !in.onAttempt && in.doubtFrom == 0 {
		in.unheardMoves++ // its subscription never delivered
	}
	in.silent = true
	in.suspect[in.replica] = m.now
	in.quiet[in.replica] = true
	left := leftAttempt{attempt: in.attempt, replica: in.replica, heard: in.heard}
	acts = m.switchTo(i, m.choose(i), acts)
	in.left = left
	return acts
}

// othersDoubtful reports whether input in has other upstream replicas
// than the one it reads, each of them suspected (it failed recently),
// or, while this replica hears its live inputs in long gaps (the
// detection timeout is stretched: its process is short of CPU), quiet:
// it went silent on the input and has not been heard since. A held or
// partitioned replica stays quiet for as long as its fault lasts, long
// after its suspicion ran out; under load, moving there from a replica
// that delivered traded a live replica heard late for one that was
// silent last time, and the input waited there a whole detection
// timeout, its buckets with it. On a machine that runs normally a
// silence is taken as it is.
func (m *Machine) othersDoubtful(in *inputState) bool {
	stretched := m.DetectLimit() > m.cfg.Detect
	for r := range in.upState {
		if r != in.replica && !m.suspected(in, r) && !(stretched && in.quiet[r]) {
			return false
		}
	}
	return len(in.upState) > 1
}

// switchTo resubscribes input i to replica r after its last stable id:
// what it had received tentatively and not released is dropped (the new
// replica resends from the last stable tuple).
func (m *Machine) switchTo(i, r int, acts []Action) []Action {
	in := m.inputs[i]
	if in.bg.attempt != 0 && in.bg.replica == r {
		// What its background subscription kept aside is the input's
		// (see background.go).
		return m.promote(i, in.upState[r], acts)
	}
	acts = m.stopBackground(i, acts)
	in.replica, in.heard, in.onAttempt, in.doubtFrom, in.left = r, m.now, false, 0, leftAttempt{}
	in.tent, in.tentData, in.tentWM, in.failedUp = nil, false, math.MinInt64, false
	in.attempt++
	return append(acts, Subscribe{Input: i, Replica: r, AfterID: in.lastStable, Attempt: in.attempt})
}

// rank orders upstream replicas: STABLE, then unknown (presumed fine),
// then UP_FAILURE, then STABILIZATION.
func rank(s State) int {
	switch s {
	case Stable:
		return 0
	case Unknown:
		return 1
	case UpFailure:
		return 2
	}
	return 3
}

// rankOf is rank of upstream replica r's state as input in knows it; a
// replica that went silent on the input and has not been heard from
// since ranks last: what it advertised before is stale. (A partition
// between workers made inputs leave a live replica in UP_FAILURE for
// the partitioned one, last seen STABLE, as soon as its suspicion
// expired, over and over: the output stalled and went tentative for the
// whole partition although every upstream had a live replica.)
func (m *Machine) rankOf(in *inputState, r int) int {
	if in.quiet[r] {
		return 4
	}
	return rank(in.upState[r])
}

func (m *Machine) suspected(in *inputState, r int) bool {
	return in.suspect[r] != 0 && m.now-in.suspect[r] < m.suspicion(in, r)
}

// maxSuspicionDoublings bounds suspicion's backoff: at most 16 times
// the first suspicion (64 detection timeouts).
const maxSuspicionDoublings = 4

// suspicion is how long replica r stays suspected after it last failed
// input in: four detection timeouts, doubled for each further
// subscription to it that failed in a row, until it delivers again or
// the coordinator places it anew (ReplicaMoved). A killed replica
// refuses every subscription at once, but its last advertised state
// stays STABLE: with a fixed suspicion the input went back to it each
// time the suspicion expired while the replica it read advertised
// UP_FAILURE (maybeSwitch), every 1.6 s with 100 ms boundaries, dropping
// the tentative input it had not released each time.
func (m *Machine) suspicion(in *inputState, r int) int64 {
	return int64(Suspicion(m.cfg.Detect, in.fails[r]))
}

// Suspicion is how long an upstream replica that failed an input fails
// times in a row is not chosen again (see Machine.suspicion): four
// detection timeouts, doubled for each further failure, at most
// 2^maxSuspicionDoublings times. The machine's inputs and the runtime's
// sinks suspect alike.
func Suspicion(detect time.Duration, fails int) time.Duration {
	n := min(max(fails-1, 0), maxSuspicionDoublings)
	return 4 * detect << n
}

// choose picks the replica input i should read: not recently failed,
// best state, then the nearest number from this replica's own (so
// replica r reads upstream replica r when all is well). When every
// replica failed recently, the one that failed longest ago.
func (m *Machine) choose(i int) int {
	in := m.inputs[i]
	return Preferred(m.cfg.ID, len(in.upState), func(r int) int { return m.rankOf(in, r) },
		func(r int) (bool, int64) { return m.suspected(in, r), in.suspect[r] })
}

// Preferred is the upstream replica (of k) an input of replica self
// reads: one not suspected (suspected reports whether replica r failed
// the input recently, and when, on any clock that orders), then the best
// rank (Stable, Unknown, UpFailure, Stabilization: rank; the caller may
// rank a replica it knows to be stale last), then the nearest number
// from self (so replica r reads upstream replica r when all is well).
// When every replica failed recently, the one that failed longest ago.
// The machine's inputs and the runtime's sinks choose so.
func Preferred(self, k int, rank func(r int) int, suspected func(r int) (bool, int64)) int {
	key := func(r int) [4]int64 {
		var susp, when int64
		if s, at := suspected(r); s {
			susp, when = 1, at
		}
		return [4]int64{susp, when, int64(rank(r)), int64(((r-self)%k + k) % k)}
	}
	best := 0
	for r := 1; r < k; r++ {
		kr, kb := key(r), key(best)
		if slices.Compare(kr[:], kb[:]) < 0 {
			best = r
		}
	}
	return best
}

// Rank orders replica states for Preferred: Stable first, then Unknown,
// UpFailure, Stabilization.
func Rank(s State) int { return rank(s) }

// maxGraceDoublings bounds the start grace's backoff: at most 8 times
// StartGrace for one subscription.
const maxGraceDoublings = 3

// maxFreshDoublings bounds the backoff of a subscription that has not
// delivered yet (silenceLimit): DetectMax doubled at most this often,
// and never past 8 times StartGrace, as at the start.
const maxFreshDoublings = 8

// silenceLimit is how long input in may stay silent before it fails:
// DetectLimit; on a subscription that has not delivered yet, DetectMax
// doubled for each move for silence in a row of subscriptions that
// delivered nothing (at most 8 times StartGrace); while it has heard nothing
// since Start, StartGrace, doubled likewise (at most maxGraceDoublings
// times).
//
// A subscription just made waits for its replica's first batch or
// heartbeat: setting it up takes as long as this process is slow, and
// on a process short of CPU that is longer than any fixed timeout.
// Moving at that timeout cancelled the subscription about to deliver,
// and the next one fared no better: at load 36 on two cores (nine
// workers and a coordinator in one process) every aggregate input
// moved every second for 18 s, hearing none of its sources, and at load
// 40 an input moved between a held replica and a live one every
// 400 ms, hearing neither. Each silent move doubles the next
// subscription's time, so one gets the time its set-up takes; the
// first move from a replica that delivered gets DetectMax, and a
// replica that is down refuses the subscription, which moves the input
// at once whatever the limit. With a cap of StartGrace (1 s for a
// 100 ms detection timeout) inputs at load 24 still moved about every
// second for 12 s, each subscription silent for a second: setting one up
// took longer still. The cap is the start grace's own (8 times
// StartGrace); it is reached only after a run of subscriptions that all
// stayed silent, none of which a replica refused: every replica held, or
// this process starved, when no result waits on the move (buckets go out
// tentatively after the share whatever the input does), and a held link
// that heals resumes the subscription waiting on it.
func (m *Machine) silenceLimit(in *inputState) int64 {
	limit := m.DetectLimit()
	if m.allSilent() {
		limit = max(limit, m.cfg.HealthMax) // see allSilent
	}
	if in.spoke && !in.onAttempt && in.doubtFrom == 0 {
		fresh := int64(max(limit, m.cfg.DetectMax))
		return min(fresh<<min(in.unheardMoves, maxFreshDoublings), max(fresh, int64(m.cfg.StartGrace)<<maxGraceDoublings))
	}
	if in.spoke {
		return int64(limit)
	}
	grace := int64(m.cfg.StartGrace) << min(in.unheardMoves, maxGraceDoublings)
	if h := m.Health(); h > 0 {
		// This process runs late (local health): so does setting up
		// its subscriptions.
		grace = max(grace, min(int64(m.cfg.StartGrace)*int64(1+h), int64(m.cfg.StartGrace)<<maxGraceDoublings))
	}
	if m.allSilent() && m.noneSpoke() {
		// No input heard anything yet: the start is slow (see allSilent).
		grace = int64(m.cfg.StartGrace) << maxGraceDoublings
	}
	return max(grace, int64(m.cfg.DetectMax), int64(limit))
}

// noneSpoke reports whether no input has heard its upstream since Start.
func (m *Machine) noneSpoke() bool {
	for _, in := range m.inputs {
		if in.spoke {
			return false
		}
	}
	return true
}

// gapStretch is how many times the longest recent gap between two
// deliveries of a live subscription an input may stay silent: gaps
// spread widely under load, and the next one may well be longer.
const gapStretch = 2

// gapWindowDetects is how long, in detection timeouts, a gap stretches
// the detection timeout: a machine loaded now is likely loaded a few
// seconds later, but not for ever.
const gapWindowDetects = 20

// gapSeen notes a gap between two deliveries of a live subscription (a
// heartbeat comes every boundary interval at the latest): the longest
// one seen within the window, or the first one after it.
func (m *Machine) gapSeen(gap int64) {
	if gap >= m.gapMax || m.now-m.gapAt > gapWindowDetects*int64(m.cfg.Detect) {
		m.gapMax, m.gapAt = gap, m.now
	}
	if gapStretch*gap > int64(m.cfg.DetectMax) {
		// A live replica heard in a gap the stretch cannot cover.
		m.unhealthy()
	}
}

// Local health (after Lifeguard's local health multiplier): a replica
// whose own process runs late (short of CPU, descheduled: on two cores
// at load 16-35, nine workers in one process) hears every upstream late
// and takes live replicas for failed. A false detection costs far more
// than a late one there: the input moves, the new subscription takes
// seconds to set up under that load, buckets go tentative meanwhile, and
// the stable input kept for the correction outgrows its bound (the
// replica turns lossy; TestLossyReplicaRebootstrapsFromStablePeer lost
// its precondition in 3 of 5 runs at load 16-29, inputs moving every few
// hundred milliseconds for seconds). So the replica keeps a score of the
// evidence that it, not its upstreams, is slow, and DetectLimit waits at
// least the detection timeout times one plus the score:
//
//   - its caller stepped it more than half a detection timeout after the
//     deadline it asked for (its timer ran late): a point and one more
//     per detection timeout of lateness;
//   - a live replica was heard after a gap longer than the stretched
//     timeout can cover (gapStretch times the gap past DetectMax);
//   - a replica left for silence delivered after all (lateHeard): a
//     detection proven false.
//
// The score is at most healthMax; a point goes after every
// healthDecayDetects detection timeouts without one. A replica whose
// process runs normally scores 0, and a real failure is detected within
// Detect (or the gap stretch) as before; the score is the price of a
// loaded process only, and it is bounded (Config.HealthMax).
const (
	// healthMax bounds the score.
	healthMax = 8
	// healthDecayDetects: a point of the score goes after this many
	// detection timeouts without evidence.
	healthDecayDetects = 10
	// healthMaxDetects bounds the detection timeout local health
	// stretches to, in detection timeouts (never below DetectMax).
	healthMaxDetects = 8
)

// unhealthy adds a point of local health evidence at the machine's clock.
func (m *Machine) unhealthy() { m.unhealthyAt(m.now, 1) }

// unhealthyAt adds points of local health evidence at clock now.
func (m *Machine) unhealthyAt(now int64, points int) {
	if m.cfg.HealthMax <= m.cfg.Detect {
		return // a fixed detection timeout (Config.HealthMax, DetectMax unset)
	}
	m.health, m.healthAt = min(m.healthAt0(now)+points, healthMax), now
	m.unhealthyCount += uint64(points)
}

// healthAt0 is the local health score at clock now: the score at
// healthAt less a point per healthDecayDetects detection timeouts since.
func (m *Machine) healthAt0(now int64) int {
	if m.health == 0 {
		return 0
	}
	gone := (now - m.healthAt) / (healthDecayDetects * int64(m.cfg.Detect))
	return int(max(int64(m.health)-gone, 0))
}

// Health is the local health score now (0: healthy; see unhealthy).
func (m *Machine) Health() int { return m.healthAt0(m.now) }

// HealthLimitMax is the Config.HealthMax of a task with detection
// timeout detect and share of X share (see DetectMax): healthMaxDetects
// detection timeouts, never below DetectMax. Where half the share leaves
// room for DetectMax and one detection timeout more (so that a task still
// moves off a failed replica before a bucket's wait runs out, P1), at
// most half the share less one detection timeout: the room is kept.
// Where it does not (a small X), no timeout keeps that bound on a loaded
// machine, and false detections are what costs there.
func HealthLimitMax(detect, share time.Duration) time.Duration {
	dm := DetectMax(detect, share)
	hm := healthMaxDetects * detect
	if share > 0 && share != Strict && share/2 >= dm+detect {
		hm = min(hm, share/2-detect)
	}
	return max(dm, hm)
}

// DetectLimit is the silence after which an input that has spoken
// counts as failed now: Detect, stretched to gapStretch times the
// longest gap between two deliveries of a live subscription seen within
// the last gapWindowDetects detection timeouts, at most DetectMax. A
// replica whose own process is short of CPU hears its live upstreams in
// long gaps (each stage from the upstream's heartbeat timer to this
// machine runs late) without a single stall long enough to be told apart
// (the runtime's starvation clock); its silence then says less, and it
// waits longer before it takes a replica for failed. When this process
// runs normally the gaps are one boundary interval and a real failure is
// detected within Detect. Local health (see unhealthy) makes it at
// least Detect times one plus its score, up to Config.HealthMax.
func (m *Machine) DetectLimit() time.Duration {
	d := m.cfg.Detect
	if m.cfg.DetectMax > d && m.gapAt != 0 && m.now-m.gapAt <= gapWindowDetects*int64(m.cfg.Detect) {
		d = min(max(d, time.Duration(gapStretch*m.gapMax)), m.cfg.DetectMax)
	}
	if h := m.Health(); h > 0 {
		// Local health: this replica's own process runs late.
		d = max(d, min(m.cfg.Detect*time.Duration(1+h), m.cfg.HealthMax))
	}
	return d
}

// allSilent reports whether every input of the replica (at least two not
// ended) has been silent past the detection timeout at once, while the
// timeout may stretch (Config.HealthMax). Upstreams on different workers
// seldom fail together; a process that stands still hears none of them.
// Then an input counts as failed only past HealthMax (silenceLimit: at
// the start, before any input spoke, past the longest start grace):
// while every input is silent nothing is available for a bucket to be
// released tentative with, so the wait costs no result, whereas moving
// every input on such a stall restarted subscriptions that were slow to
// set up on a loaded machine (load 30 on two cores, nine workers in one
// process: 2-5 s to the first batch), and buckets went tentative once
// one input spoke again without the other. A worker cut off from every
// upstream is still detected, HealthMax after the silence began. (Not
// part of DetectLimit: the runtime vouches for inputs its subscriptions
// heard within DetectLimit, and stretches its own watchdog likewise.)
func (m *Machine) allSilent() bool {
	if m.cfg.HealthMax <= m.cfg.Detect {
		return false
	}
	n := 0
	for _, in := range m.inputs {
		if in.ended() {
			continue
		}
		if m.now-in.heard <= int64(m.cfg.Detect) {
			return false
		}
		n++
	}
	return n >= 2
}

// timeouts detects silent inputs and expired permissions.
func (m *Machine) timeouts(acts []Action) []Action {
	for i, in := range m.inputs {
		if !in.ended() && m.now-in.heard > m.silenceLimit(in) {
			acts = m.inputFailed(i, acts)
		}
	}
	if m.grantedTo >= 0 && m.now-m.grantedAt > int64(m.cfg.GrantLease) {
		m.grantedTo = -1
	}
	if m.asking && m.now-m.askedAt > int64(m.cfg.PermissionTimeout) {
		// Peers that did not answer are presumed down.
		for _, p := range m.peers() {
			m.grants[p] = true
		}
		acts = m.permitted(acts)
	}
	return acts
}

// kept is the number of stable tuples kept for the replay only: those
// below the release watermark, the stable steps (boundaries) among them
// counted as tuples, so that a long failure of sparse input is bounded
// too. What is not released yet is not counted: it is bounded per input
// by the runtime's flow control (WaitingOver).
func (m *Machine) kept() int {
	n := 0
	for _, in := range m.inputs {
		n += in.from(m.released) + in.stepsBelow(m.released)
	}
	return n
}

// bound keeps the stable input kept for the replay within KeepLimit:
// past it, the oldest release steps' data goes, down to half the limit,
// and the replay will not correct what depended on it.
func (m *Machine) bound() {
	n := m.kept()
	if n <= m.cfg.KeepLimit {
		m.keptMax = max(m.keptMax, n)
		return
	}
	// The first stable step above which at most half the limit is kept,
	// among those released (tentatively) already: what was not released
	// yet is never dropped.
	steps := m.stepsIn(m.ckpt, m.released)
	cut := int64(math.MinInt64)
	for _, st := range steps {
		left := 0
		for _, in := range m.inputs {
			left += in.from(m.released) - in.from(st) + in.stepsBelow(m.released) - in.stepsBelow(st)
		}
		cut = st
		if left <= m.cfg.KeepLimit/2 {
			break
		}
	}
	if cut == math.MinInt64 {
		return // no stable step yet: nothing can be dropped whole
	}
	data := m.keptData()
	if m.lostTo <= m.lostFrom {
		m.lostFrom = m.ckpt
	}
	m.lostTo = max(m.lostTo, cut)
	for _, in := range m.inputs {
		m.dropKept(in, in.from(cut))
		// The steps below the cut go too (the cut itself stays: the
		// replay releases from there).
		n := 0
		for n < len(in.steps) && in.steps[n] < cut {
			n++
		}
		in.steps = append(in.steps[:0], in.steps[n:]...)
	}
	after := m.kept()
	m.shed += uint64(n - after)
	m.shedData += uint64(data - m.keptData())
	m.keptMax = max(m.keptMax, after)
}

// keptData is the number of stable data tuples kept for the replay only
// (kept without the steps).
func (m *Machine) keptData() int {
	n := 0
	for _, in := range m.inputs {
		n += in.from(m.released)
	}
	return n
}

// failing reports whether some input is failed.
func (m *Machine) failing() bool {
	for _, in := range m.inputs {
		if in.failed() {
			return true
		}
	}
	return false
}

// dropPoint: stable data below it is no longer needed (released, and no
// checkpoint to replay from).
func (m *Machine) dropPoint() int64 {
	if m.tentative || m.replaying {
		return m.ckpt
	}
	return m.released
}

// stableWatermark is S: every input's stable boundary passed it.
func (m *Machine) stableWatermark() int64 {
	s := int64(math.MaxInt64)
	for _, in := range m.inputs {
		s = min(s, in.stableB)
	}
	return s
}

// stableTarget is where a stable release may go now: the stable
// watermark, or the cut when the watermark reached it (the cut is then a
// step). A watermark that is an input's floor (no boundary there) is no
// step: the release ends at the highest step below it, so that the steps
// are the streams' boundaries whenever an input was added (AddInput).
func (m *Machine) stableTarget() int64 {
	w := m.stableWatermark()
	if w >= m.cut {
		return m.cut
	}
	floor := false
	for _, in := range m.inputs {
		if in.floored && in.stableB == w {
			floor = true
			break
		}
	}
	if !floor || w <= m.released {
		return w
	}
	top := m.released
	for _, in := range m.inputs {
		for _, s := range in.steps {
			if s <= w && s > top {
				top = s
			}
		}
	}
	return top
}

// progress releases what can be released and drives stabilization.
func (m *Machine) progress(acts []Action) []Action {
	if m.replaying {
		acts = m.replay(acts)
		if m.replaying {
			return acts
		}
	}
	// Availability: the furthest any input covers, and since when. An
	// input that ended covers everything but brings nothing: it makes no
	// bucket available (else a failure of another input would release
	// tentatively up to the end of the stream at once).
	amax := int64(math.MinInt64)
	for _, in := range m.inputs {
		if !in.ended() {
			amax = max(amax, in.coverage())
		}
	}
	if amax > m.availMax {
		// One entry per stable step in the range that became available
		// at once (a backlog): each step's own stream time bounds its
		// wait (see due).
		from := max(m.availMax, m.released)
		for _, st := range m.stepsIn(from, amax-1) {
			m.avail = append(m.avail, availEntry{At: st, From: st, Since: m.now})
			from = st
		}
		if len(m.stepsIn(amax-1, amax)) > 0 {
			from = amax // a stable step: its own stream time bounds it
		}
		m.avail = append(m.avail, availEntry{At: amax, From: from, Since: m.now})
		m.availMax = amax
		if l := m.now - amax; !m.lagKnown || l < m.lag {
			m.lag, m.lagKnown = l, true
		}
	}
	s := m.stableTarget()
	if !m.tentative && s > m.released {
		acts = m.release(acts, s, false)
	}
	m.trimAvail()
	// Only a failure releases tentatively. An input that is alive but
	// behind (it delivers data or heartbeats, and its upstream is
	// stable) is not failed: its buckets wait for it, however long, as
	// ordinary processing latency, whatever the share (even 0). Once the
	// operators hold tentative state everything goes tentative anyway,
	// up to what the live inputs cover.
	healthy := int64(math.MaxInt64) // what the inputs not failed cover
	for _, in := range m.inputs {
		if !in.failed() {
			healthy = min(healthy, in.coverage())
		}
	}
	if !m.cfg.StrictMode && m.cut == math.MaxInt64 && (m.failing() || m.tentative) {
		// E: the furthest point whose wait ran out (see due). Every
		// bucket waits on its own: during a failure the output follows
		// its input at a lag of at most the share and never falls
		// further behind, and the buckets that came within the share
		// before the failed input is back (or, after a heal, before
		// this replica's reconciliation) still go out stable. Releasing
		// everything at once after the first expiry made them
		// tentative too: about X's worth of tentative results more per
		// failure (bench dcaa, D = 2X: 57 against a bound of 49).
		e := int64(math.MinInt64)
		for _, a := range m.avail {
			if m.due(a) <= m.now {
				e = max(e, a.At)
			}
		}
		if e > m.released {
			// Only a silent input is not waited for. An input that
			// delivers is, even one whose data is tentative: its data
			// for the bucket is on its way (its producer releases within
			// its own share), and released without it, the bucket's
			// tuples would be dropped as late when they came. (A join
			// whose two sides were both tentative got one side only,
			// and produced nothing for the whole failure.)
			alive := int64(math.MaxInt64)
			for _, in := range m.inputs {
				if !in.silent {
					alive = min(alive, in.coverage())
				}
			}
			p := min(e, alive, healthy)
			if p > m.released {
				if !m.tentative {
					m.tentative, m.ckpt = true, m.released
					acts = append(acts, Checkpoint{Watermark: m.released})
				}
				acts = m.release(acts, p, true)
				m.trimAvail()
				if m.cfg.KeepLimit > 0 {
					m.bound()
				}
			}
		}
	}
	acts = m.maybeStabilize(acts)
	if s := m.stableTarget(); !m.tentative && !m.replaying && s > m.released {
		// Reconciled just now (a replica alone in its partition needs no
		// permission): what waited goes out stable at once.
		acts = m.release(acts, s, false)
	}
	return acts
}

// due is when the wait of the buckets below a.At runs out: the share
// after some input covered them, and never later than their stream time
// plus the normal lag plus the budget of X spent up to this task. The
// second bound counts for data that comes late: a backlog that an
// earlier or another failure held back, and the first tentative data
// of an upstream that detected a failure (the detection timeout, longer
// than a share, is spent from the budget, not added to it). It has
// waited already, and delayed a share more it would come out later than
// X after a failure-free run's result. The stream time that bounds is
// the entry's lowest unreleased one (a.From, or what was released
// since), not a.At: an entry covering several buckets of tentative data
// at once held the lowest of them up to a.At - a.From past its budget
// (bench dcaa, D = 2X: 585 ms added against X = 500 ms, the buckets of
// the upstream's first tentative release waiting on the cap of the
// highest, at every stage below it). Data from an
// upstream that waited its own share is not late by this measure (the
// budget includes that share).
func (m *Machine) due(a availEntry) int64 {
	d := satAdd(a.Since, int64(m.cfg.Share))
	if m.lagKnown {
		// The lowest bucket's own step is the next boundary above what
		// was covered or released, one bucket on: tentative data
		// carries no boundaries (its watermark only), so the bucket
		// size is the stable boundaries' last spacing. Unknown, a.At.
		lo := a.At
		if from := max(a.From, m.released); m.stepGap > 0 && from != math.MinInt64 {
			lo = min(lo, satAdd(from, m.stepGap))
		}
		d = min(d, satAdd(satAdd(lo, m.lag), int64(m.cfg.Budget)))
	}
	return d
}

// satAdd is a+b, saturated at the int64 range.
func satAdd(a, b int64) int64 {
	switch s := a + b; {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	default:
		return s
	}
}

func (m *Machine) trimAvail() {
	n := 0
	for n < len(m.avail) && m.avail[n].At <= m.released {
		n++
	}
	m.avail = append(m.avail[:0], m.avail[n:]...)
}

// release releases every step in (R, to]: the stable boundary values any
// input brought in that range, and to itself. A tentative release takes
// the tentative data too and keeps the stable data (for the replay).
func (m *Machine) release(acts []Action, to int64, tentative bool) []Action {
	steps := m.stepsIn(m.released, to)
	if len(steps) == 0 || steps[len(steps)-1] != to {
		steps = append(steps, to)
	}
	rel := Release{Tentative: tentative}
	for _, s := range steps {
		rel.Steps = append(rel.Steps, m.collect(m.released, s, tentative))
		m.released = s
	}
	if tentative {
		m.tentOut += uint64(len(steps))
	} else {
		m.stableOut += uint64(len(steps))
		m.dropBelow(m.released)
	}
	return append(acts, rel)
}

// stepsIn returns the stable boundary values in (from, to], sorted, once.
func (m *Machine) stepsIn(from, to int64) []int64 {
	var steps []int64
	for _, in := range m.inputs {
		for _, s := range in.steps {
			if s > from && s <= to {
				steps = append(steps, s)
			}
		}
	}
	slices.Sort(steps)
	return slices.Compact(steps)
}

// collect gathers the data in [from, to) in release order: (stime,
// input, id). With tentative, tentative data too (removed), and every
// tuple is marked tentative: the bucket is incomplete whatever each
// tuple's own type.
//
// Each input's stable data is kept in (stime, arrival) order, and ids
// increase with arrival on a stream, so the stable ranges are already in
// release order: a k-way merge of them gives the order a sort would, in
// one pass. A stable step is the merge's runs of the kept data itself
// (no copy: this is every stable tuple's path; the runs' memory, m.runs,
// is reused from one Step to the next). Only a tentative step copies
// (its tuples are marked tentative, and the stable ones stay kept for
// the replay unchanged) and sorts (tentative data is kept in arrival
// order).
func (m *Machine) collect(from, to int64, tentative bool) Step {
	st := Step{Advance: to}
	var (
		ranges [8][][]tuple.Tuple
		rs     = ranges[:0]
		ends   [9]int
		at     = ends[:1]
	)
	if len(m.inputs) > len(ranges) {
		rs = make([][][]tuple.Tuple, 0, len(m.inputs))
		at = make([]int, 1, len(m.inputs)+1)
	}
	// Each input's range as slices of its kept segments (m.parts, reused;
	// sliced once every range is in, since appending may move it). Ranges
	// are in rank order (m.at).
	ps := len(m.parts)
	at[0] = ps
	for pos := range m.inputs {
		in := m.inputs[m.at(pos)]
		m.parts = in.stable.appendRange(m.parts, in.from(from), in.from(to))
		at = append(at, len(m.parts))
	}
	for i := range m.inputs {
		rs = append(rs, m.parts[at[i]:at[i+1]:at[i+1]])
	}
	start := len(m.runs)
	if !tentative {
		m.runs = mergeRuns(m.runs, rs)
		if m.order != nil {
			// mergeRuns numbers the runs by position in rs.
			for k := start; k < len(m.runs); k++ {
				m.runs[k].Input = m.order[m.runs[k].Input]
			}
		}
		// Full slice expression: appending to a step never overwrites
		// the next one.
		st.Runs = m.runs[start:len(m.runs):len(m.runs)]
		return st
	}
	es := len(m.scratch)
	for pos, parts := range rs {
		for _, r := range parts {
			for _, t := range r {
				m.scratch = append(m.scratch, Entry{Input: m.at(pos), Tuple: t})
			}
		}
	}
	for i, in := range m.inputs {
		keep := in.tent[:0]
		for _, t := range in.tent {
			switch {
			case t.STime < from:
			case t.STime < to:
				m.scratch = append(m.scratch, Entry{Input: i, Tuple: t})
			default:
				keep = append(keep, t)
			}
		}
		clear(in.tent[len(keep):])
		in.tent = keep
	}
	entries := m.scratch[es:]
	slices.SortStableFunc(entries, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Tuple.STime, b.Tuple.STime), cmp.Compare(a.Input, b.Input), cmp.Compare(a.Tuple.ID, b.Tuple.ID))
	})
	ts := len(m.tuples)
	for k := range entries {
		t := entries[k].Tuple
		t.Type = tuple.Tentative
		m.tuples = append(m.tuples, t)
	}
	tuples := m.tuples[ts:len(m.tuples):len(m.tuples)]
	for k := 0; k < len(entries); {
		j := k + 1
		for j < len(entries) && entries[j].Input == entries[k].Input {
			j++
		}
		m.runs = append(m.runs, Run{Input: entries[k].Input, Tuples: tuples[k:j:j]})
		k = j
	}
	st.Runs = m.runs[start:len(m.runs):len(m.runs)]
	return st
}

// mergeRuns appends to dst the tuples of rs (rs[i] is input i's, in
// release order, as slices of its kept memory) merged in (stime, input)
// order, as runs of that memory, consuming rs: the input with the first
// head gives its tuples for as long as they precede every other input's
// head (a run never spans two of its slices).
func mergeRuns(dst []Run, rs [][][]tuple.Tuple) []Run {
	for {
		best, next := -1, -1
		for i, parts := range rs {
			if len(parts) == 0 {
				continue
			}
			// Ties on stime go to the lower input, which comes first.
			switch h := parts[0][0].STime; {
			case best < 0:
				best = i
			case h < rs[best][0][0].STime:
				best, next = i, best
			case next < 0 || h < rs[next][0][0].STime:
				next = i
			}
		}
		if best < 0 {
			return dst
		}
		r := rs[best][0]
		end := len(r)
		if next >= 0 {
			// Up to the first tuple the next input's head precedes
			// (an equal stime of a higher input goes after).
			limit := rs[next][0][0].STime
			end = 1
			for end < len(r) && (r[end].STime < limit || r[end].STime == limit && best < next) {
				end++
			}
		}
		dst = append(dst, Run{Input: best, Tuples: r[:end:end]})
		if end == len(r) {
			rs[best] = rs[best][1:]
		} else {
			rs[best][0] = r[end:]
		}
	}
}

// dropBelow forgets stable data and steps below w (no replay needs them).
func (m *Machine) dropBelow(w int64) {
	for _, in := range m.inputs {
		m.dropKept(in, in.from(w))
		n := 0
		for n < len(in.steps) && in.steps[n] <= w {
			n++
		}
		in.steps = append(in.steps[:0], in.steps[n:]...)
	}
}

func (m *Machine) peers() []int {
	var p []int
	for r := range m.cfg.Replicas {
		if r != m.cfg.ID {
			p = append(p, r)
		}
	}
	return p
}

// readyToReconcile: the operators hold tentative state, every input is
// live and stable, and stable input covers everything released.
func (m *Machine) readyToReconcile() bool {
	if !m.tentative || m.replaying {
		return false
	}
	for _, in := range m.inputs {
		if !in.ended() && (in.silent || in.tentData) {
			return false
		}
	}
	return m.stableWatermark() >= m.released
}

func (m *Machine) maybeStabilize(acts []Action) []Action {
	if !m.readyToReconcile() || m.asking || m.now < m.retryAt {
		return acts
	}
	if m.grantedTo >= 0 {
		return acts // a peer reconciles: keep serving
	}
	peers := m.peers()
	if len(peers) == 0 {
		return m.startReplay(acts)
	}
	m.asking, m.askedAt, m.grants = true, m.now, map[int]bool{}
	return append(acts, AskPermission{Peers: peers})
}

// request answers a peer that asks to reconcile: no while this replica
// reconciles, while it asks itself and has the lower number, or while
// another peer holds its permission.
func (m *Machine) request(from int, acts []Action) []Action {
	deny := m.replaying || (m.asking && m.cfg.ID < from) || (m.grantedTo >= 0 && m.grantedTo != from)
	if deny {
		return append(acts, ReplyPermission{To: from, Granted: false})
	}
	m.grantedTo, m.grantedAt = from, m.now
	if m.asking {
		// Withdraw: the lower-numbered peer goes first. Release what
		// other peers granted us.
		m.asking, m.retryAt = false, m.now+int64(m.cfg.Retry)
		acts = append(acts, NotifyDone{Peers: m.peers()})
	}
	return append(acts, ReplyPermission{To: from, Granted: true})
}

func (m *Machine) reply(ev PermissionReply, acts []Action) []Action {
	if !m.asking {
		return acts
	}
	if !ev.Granted {
		m.asking, m.retryAt = false, m.now+int64(m.cfg.Retry)
		return append(acts, NotifyDone{Peers: m.peers()})
	}
	m.grants[ev.From] = true
	return m.permitted(acts)
}

// permitted starts reconciling once every peer granted, if still ready.
func (m *Machine) permitted(acts []Action) []Action {
	for _, p := range m.peers() {
		if !m.grants[p] {
			return acts
		}
	}
	m.asking = false
	if !m.readyToReconcile() {
		m.retryAt = m.now + int64(m.cfg.Retry)
		return append(acts, NotifyDone{Peers: m.peers()})
	}
	return m.startReplay(acts)
}

// startReplay restores the checkpoint and replays the stable input up to
// the first stable step at or after the last tentative release.
func (m *Machine) startReplay(acts []Action) []Action {
	m.replayTo = m.released
	if steps := m.stepsIn(m.released-1, math.MaxInt64); len(steps) > 0 {
		m.replayTo = steps[0]
	}
	m.replaying, m.tentative = true, false
	m.released = m.ckpt
	for _, in := range m.inputs {
		in.tent = nil
	}
	m.recoveries++
	acts = append(acts, Restore{LostFrom: m.lostFrom, LostTo: m.lostTo})
	return m.replay(acts)
}

// replay releases up to ReplayChunk stable steps of the replay; at its
// end, REC_DONE and back to normal processing.
func (m *Machine) replay(acts []Action) []Action {
	if m.replayed {
		return acts // one chunk per event
	}
	m.replayed = true
	steps := m.stepsIn(m.released, m.replayTo)
	if n := m.cfg.ReplayChunk; n > 0 && len(steps) > n {
		steps = steps[:n]
	}
	if len(steps) > 0 {
		rel := Release{Replay: true}
		for _, s := range steps {
			rel.Steps = append(rel.Steps, m.collect(m.released, s, false))
			m.released = s
		}
		m.replayOut += uint64(len(steps))
		acts = append(acts, rel)
	}
	if m.released < m.replayTo {
		return acts
	}
	m.replaying = false
	m.lostFrom, m.lostTo = 0, 0
	m.dropBelow(m.released)
	acts = append(acts, RecDone{})
	if len(m.peers()) > 0 {
		acts = append(acts, NotifyDone{Peers: m.peers()})
	}
	return acts
}

// updateState recomputes the replica's state and reports a change.
func (m *Machine) updateState(acts []Action) []Action {
	s := Stable
	switch {
	case m.replaying:
		s = Stabilization
	case m.tentative:
		s = UpFailure
	default:
		for _, in := range m.inputs {
			if in.failed() {
				s = UpFailure
			}
		}
	}
	if s != m.state {
		acts = append(acts, StateChange{From: m.state, To: s})
		m.state = s
	}
	return acts
}

// resetScratch reuses the memory of the previous Step's releases (see
// Step): the runs, and a tentative release's copies. They are cleared,
// so that released values are not kept alive by them; copies made large
// by a long tentative release go.
func (m *Machine) resetScratch() {
	const keep = 1 << 17 // entries
	clear(m.runs)
	m.runs = m.runs[:0]
	clear(m.parts)
	m.parts = m.parts[:0]
	if cap(m.scratch) > keep || cap(m.tuples) > keep {
		m.scratch, m.tuples = nil, nil
		return
	}
	clear(m.scratch)
	m.scratch = m.scratch[:0]
	clear(m.tuples)
	m.tuples = m.tuples[:0]
}

// handBack returns the memory of the batches the previous Step stopped
// needing to their owners (see Deliver.Owner).
func (m *Machine) handBack() {
	for _, o := range m.done {
		o.Release()
	}
	clear(m.done)
	m.done = m.done[:0]
}

// Figures are counters for status and tests.
type Figures struct {
	StableSteps, TentativeSteps, ReplayedSteps, Recoveries uint64
	// Shed counts stable tuples dropped for KeepLimit (the stable steps
	// among them counted as tuples, as KeepLimit counts them); ShedData
	// the data tuples alone among them (released tentatively, never
	// replayed); KeptMax is the most stable tuples kept at once for a
	// replay after a bound.
	Shed     uint64
	ShedData uint64
	KeptMax  int
	// Silences counts the inputs taken for failed because they were
	// silent past the detection timeout.
	Silences uint64
	// Doubts counts silences past the detection timeout not taken for a
	// failure: the replica read had delivered on its subscription and
	// every other replica had failed recently (or, while the timeout was
	// stretched, had gone silent and not been heard since).
	Doubts uint64
	// BackgroundStarts counts the background subscriptions asked for,
	// Promotions the inputs that took their corrections and moved to
	// their replica (Config.Background).
	BackgroundStarts, Promotions uint64
	// Unhealthy counts the points of local health evidence (see
	// Machine.unhealthy): this replica's own process ran late.
	Unhealthy uint64
}

// Figures returns the machine's counters.
func (m *Machine) Figures() Figures {
	return Figures{StableSteps: m.stableOut, TentativeSteps: m.tentOut, ReplayedSteps: m.replayOut, Recoveries: m.recoveries,
		Shed: m.shed, ShedData: m.shedData, KeptMax: m.keptMax, Silences: m.silences, Doubts: m.doubts,
		BackgroundStarts: m.bgStarts, Promotions: m.promotions, Unhealthy: m.unhealthyCount}
}
