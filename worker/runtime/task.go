package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/operator"
	"github.com/fedstream/fedstream/worker/source"
	"github.com/fedstream/fedstream/worker/tuple"
)

// finalBoundary is the stime of the last BOUNDARY of a finite stream:
// nothing follows it.
const finalBoundary = math.MaxInt64

// outStream is one output stream of a task: to one partition of one
// downstream node (or a sink's result stream). nextID is only touched by
// the goroutine that produces the task's output.
type outStream struct {
	consumer  string
	partition int
	// from is the lowest boundary the stream carries: a stream a rescale
	// added starts at its cut, so that every replica of the task, whatever
	// point it held at, produces the same stream, id for id.
	from int64
	// retired: the partition the stream feeds was removed by a rescale;
	// nothing is appended to it any more.
	retired atomic.Bool
	buf     *dataplane.OutputBuffer
	// w stages the output for buf: the producer flushes it after each
	// release step, when it is full (a network batch), and before waiting.
	w *dataplane.Writer
}

func newOutStream(consumer string, partition int, buf *dataplane.OutputBuffer) *outStream {
	return &outStream{consumer: consumer, partition: partition, from: math.MinInt64, buf: buf, w: buf.NewWriter()}
}

// route sends a task's data tuples to the partitions of one downstream node.
type route struct {
	parts []*outStream
	// keyIdx are the positions of the downstream's key fields in the
	// task's output schema; nil when the downstream is not keyed.
	keyIdx []int
	// samePartition: not keyed and as many partitions as this node, so
	// partition p feeds partition p.
	samePartition bool
	// down is the downstream fragment; slots holds its replicated slot
	// map when it is keyed (see partitionOf).
	down  string
	slots *routeSlots
}

// routeSlots holds the slot map a keyed route follows. The producer reads
// it for every tuple while Apply may install a new epoch, hence the
// atomic pointer; the lookup itself is one index into a flat array.
type routeSlots struct {
	m atomic.Pointer[SlotMap]
}

// partitionOf is the partition owning slot for a tuple of stream time
// stime: from the replicated slot map (during a rescale past its go, the
// new map from the cut on), or, while none has arrived (a coordinator of
// an older build), from the formula every map starts from.
func (rt *route) partitionOf(slot, n int, stime int64) int {
	if m := rt.slots.m.Load(); m != nil {
		if nx := m.Next; nx != nil && nx.Go && stime >= nx.Cut {
			return int(nx.Owner[slot])
		}
		return int(m.Owner[slot])
	}
	return queryspec.PartitionOfSlot(slot, n)
}

// task is one running task. Its processing state (operator, output ids,
// routing scratch) belongs to the single goroutine that produces output:
// the process goroutine, or for ingest sources the caller holding ingestMu.
type task struct {
	r    *Runtime
	spec TaskSpec
	log  *slog.Logger
	plan *queryspec.Plan
	node *queryspec.Node

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	outs       []*outStream
	byConsumer map[string][]*outStream // consumer -> by partition
	routes     []route
	// single is the only output stream when the task has one route to one
	// partition (a chain's usual case): emitData then skips routing.
	single *outStream

	op operator.Operator // operator tasks only
	// srcChain runs the operators fused into a source's fragment (nil when
	// none); srcOut feeds its output to emitData.
	srcChain operator.Operator
	srcOut   sourceEmitter
	gen      source.Generator // generator sources only
	ingest   *ingestState     // ingest sources only
	kafka    *kafkaSource     // kafka sources only (see kafka.go)
	kafkaOut *kafkaSink       // kafka sinks, replica 0 only: writes results
	merge    *merger          // operator and sink tasks
	inputs   []*input
	// inlineEmit is set when the task has a single input, whose goroutine
	// then processes releases itself (see processInline); set before the
	// inputs start, read through inline(). inlineOff ends inline
	// processing for good (a rescaled source added inputs: the merge
	// goroutine processes from then on).
	inlineEmit operator.Emitter
	inlineOff  atomic.Bool
	// passThrough: a sink with a single input stream, which becomes its
	// result stream as it is (see passBatch).
	passThrough bool
	// passUnordered: a pass-through sink of a query whose stream may be
	// out of stream-time order reads every passed tuple's header for
	// its frontier (notePassedBatch).
	passUnordered bool

	placeMu    sync.Mutex
	placements map[placeKey][]Placement // sorted by replica

	stateMu sync.Mutex
	state   string
	message string
	// stall is why the running task is stalled ("" when it is not);
	// overrun says which outputs are discarding tuples a subscriber that
	// is not connected has not taken. Both are set by the watchdog (see
	// checkStall).
	stall, overrun string
	// uncorrected names the results a DCAA correction could not make
	// exact (see dcaaRun.lost); it stays in the status message.
	uncorrected string
	// unc is the uncorrectable ranges put on the outputs already (see
	// dcaa_uncorrectable.go).
	unc uncorrectableSeen

	// Watchdog state, touched only by the runtime's watch goroutine: the
	// outputs' id total when it last moved and when, and what each input
	// had delivered then.
	watchOut   uint64
	watchOutAt time.Time
	watchIn    []uint64
	stallKey   string
	// busySince is when the task began processing its current release
	// (unix nanoseconds; 0 when it is not processing), and busyBlocked
	// what its outputs had blocked it (blockedNanos) then: stats counts
	// the release's busy time so far (see busyNanos).
	busySince, busyBlocked atomic.Int64
	// cost keeps the operator's calibrated per-tuple cost exact over time
	// (producer goroutine only; see spendCost).
	cost costClock
	// Figures for metrics and query stats (see stats.go), updated once
	// per release, batch or published step, never per tuple.
	counters taskCounters
	// keys samples the slots of the keys routed to keyed downstreams
	// (keysample.go).
	keys keySampler

	// outMu guards outs and byConsumer against the producer adding
	// outputs (a rescale adding partitions downstream) while other
	// goroutines read them; the producer itself reads them without it.
	outMu sync.RWMutex
	// inMu guards inputs against an input being added (a rescale adding
	// partitions upstream) while the watchdog reads them.
	inMu sync.Mutex
	// rs is the task's part in live rescales (rescale.go).
	rs rescaleState
	// rc is the task's part in live reconfigurations (reconfig.go).
	rc reconfigState
	// mayGrowInputs: an upstream is keyed, so a rescale may add input
	// streams; the task then neither processes inline nor passes its
	// input through (both assume one input for good).
	mayGrowInputs bool

	// Processing state.
	// maxSTime is the highest stime the task has routed or sent as a
	// boundary (producer only): its frontier when a rescale holds it.
	maxSTime  int64
	seq       uint64 // data tuples routed so far (spreads unkeyed tuples)
	keyBuf    []tuple.Value
	emitErr   error
	evalFails uint64
	// overBudget counts the tuples dropped for going over the expression
	// cost budget (atomic: safe to read from any goroutine).
	overBudget   atomic.Uint64
	dropReported time.Time // when dropped last updated the message

	// proc is the processing lock of operator and sink tasks (a channel,
	// so that a snapshot waiting for it can give up): held while a release
	// (or a pass-through batch) is processed, and by a snapshot, which
	// therefore sees the task between two releases.
	proc chan struct{}
	// halted: a stop-and-copy snapshot was taken; the task processes
	// nothing more (set under proc).
	halted atomic.Bool
	// haltSnap is the snapshot that halted the task (under proc): a
	// stop-and-copy snapshot asked again returns it.
	haltSnap *TaskSnapshot
	// passLast is the id of the last batch a pass-through sink adopted
	// (under proc).
	passLast uint64
	// pv is a pass-through sink's view of its input in a replicated
	// query (under proc); mv a merging sink's tentative part (nil
	// otherwise). See dcaa_sink.go.
	pv passView
	mv *mergeView
	// restored: the task starts from a snapshot (see restoreFrom).
	restored bool
	// aligned, when not nil, is closed once a copy started without state
	// has aligned its output ids with its consumers' positions; its
	// inputs take nothing before (see alignRestartedOutputs), nor, for
	// an ingest source, its requests and ticks (awaitAligned).
	aligned chan struct{}
	// replicaState is the task's DCAA replica state
	// (fedstreampb.ReplicaState; unset when the query has no replicas).
	replicaState atomic.Int32
	// silences counts the attempts failure detection cut for silence
	// (watchInputs).
	silences atomic.Uint64
	// tentative: the task's output is tentative now (DCAA machine).
	tentative atomic.Bool
	// hints are the coordinator's states of the upstream replicas
	// (dcaa_hints.go).
	hints taskHints
	// dm drives an operator task of a replicated query through its DCAA
	// machine (nil otherwise; see dcaa_run.go).
	dm *dcaaRun
	// inMove: the copy takes part in a live move (TaskSpec.InMove; set by
	// Apply, read by State).
	inMove atomic.Bool
	// supersededAt and placedAt: see superseded.go; sawMovingOut: the
	// task's assignments showed it the old copy of a move.
	supersededAt, placedAt atomic.Uint64
	sawMovingOut           atomic.Bool

	// Generator and kafka sources: genSnap carries snapshot requests to
	// the source goroutine, which serves them between two records;
	// genDone closes when that goroutine ends. genRecords counts the
	// records drawn (generator goroutine only); genRestore is where a
	// source started from a snapshot resumes.
	genSnap chan chan sourceCut
	genCtl  chan genCmd
	// rcWake (a source) wakes a generator from a pacing wait, or any
	// source held for a reconfiguration's cut (holdForCut), to install a
	// reconfiguration it was handed (setReconfig).
	rcWake chan struct{}
	// genWaiting counts the goroutines offering a request on genSnap or
	// genCtl (raised before the send, lowered after it). A generator
	// source reads it once per record and looks at the channels only
	// when it is not zero: even its two non-blocking receives cost a few
	// nanoseconds a record, 4.5 % of the sending worker's CPU in the
	// forward benchmark.
	genWaiting atomic.Int32
	genDone    chan struct{}
	genRecords int64
	// genDrawn: the generator drew (and counted) a record it has not
	// emitted yet; a snapshot taken while it holds there (a
	// reconfiguration's hold) leaves that record to the copy.
	genDrawn   bool
	genRestore *genPosition
	// gs is the generator's part in live rescales of its own fragment
	// (see srcscale.go).
	gs genScale
}

type placeKey struct {
	fragment  string
	partition int
}

// newTask builds a task and its output buffers without starting it.
func newTask(r *Runtime, spec TaskSpec) (*task, error) {
	t := &task{r: r, spec: spec, state: StateStarting,
		log: r.log.With("task", spec.TaskID, "generation", spec.Generation), byConsumer: map[string][]*outStream{}}
	if spec.Spec == nil {
		return nil, fmt.Errorf("task %s: no query definition", spec.TaskID)
	}
	// The fused plan is the one placed and run: a fragment may chain
	// stateless operators after its head. Operators restored while the
	// snapshot arrived (earlyOp) come with the plan they were built from.
	early := spec.FromSnapshot.earlyFor(spec)
	var plan *queryspec.Plan
	var err error
	if early != nil {
		plan = early.plan
	} else if plan, err = spec.Spec.FusedPlan(); err != nil {
		return nil, fmt.Errorf("task %s: %w", spec.TaskID, err)
	}
	t.plan = plan
	t.node = plan.Node(spec.Fragment)
	if t.node == nil {
		return nil, fmt.Errorf("task %s: query %q has no fragment %q", spec.TaskID, spec.Query, spec.Fragment)
	}
	if n := spec.SlotMaps[spec.Fragment].partitions(t.node.Partitions); spec.Partition < 0 || spec.Partition >= n {
		return nil, fmt.Errorf("task %s: partition %d out of range (fragment %q has %d)", spec.TaskID, spec.Partition, spec.Fragment, n)
	}
	t.maxSTime = math.MinInt64
	t.rs.maps.Store(&spec.SlotMaps)
	t.setPlacements(spec.Placements)
	if err := t.buildOutputs(); err != nil {
		return nil, fmt.Errorf("task %s: %w", spec.TaskID, err)
	}
	switch t.node.Kind {
	case queryspec.KindSource:
		src := t.node.Source
		if len(t.node.Chain) > 0 {
			if t.srcChain, err = withChain(nil, t.node); err != nil {
				return nil, fmt.Errorf("task %s: %w", spec.TaskID, err)
			}
		}
		switch {
		case src.Gen != nil:
			if t.gen, err = source.NewGenerator(src.Gen, spec.Partition); err != nil {
				return nil, fmt.Errorf("task %s: %w", spec.TaskID, err)
			}
			t.initSourceScale()
		case src.Ingest:
			t.ingest = newIngestState(t.node)
			if t.ingestStartsAfresh() {
				// Made before the task is registered: no request takes a
				// line before the copy has aligned (awaitAligned).
				t.aligned = make(chan struct{})
				// A consumer that comes after the wait
				// (restartAlignWait) resumes after the ids it took
				// from the lost copy too: the stream is renumbered
				// after that position when it comes.
				for _, o := range t.outs {
					o.buf.RenumberOnFirstResume()
				}
			}
		case src.Kafka != nil:
			if t.kafka, err = newKafkaSource(t); err != nil {
				return nil, fmt.Errorf("task %s: %w", spec.TaskID, err)
			}
		default:
			return nil, fmt.Errorf("task %s: source %q has neither generator nor ingest", spec.TaskID, src.Name)
		}
	case queryspec.KindOperator:
		if early != nil {
			t.op = early.op
		} else if t.op, err = operatorOf(plan, t.node); err != nil {
			return nil, fmt.Errorf("task %s: %w", spec.TaskID, err)
		}
	case queryspec.KindSink:
		if t.node.Sink.Kafka != nil && spec.Replica == 0 {
			if t.kafkaOut, err = newKafkaSink(t); err != nil {
				return nil, fmt.Errorf("task %s: %w", spec.TaskID, err)
			}
		}
	default:
		return nil, fmt.Errorf("task %s: unknown node kind %q", spec.TaskID, t.node.Kind)
	}
	if t.node.Kind == queryspec.KindSource {
		t.rcWake = make(chan struct{}, 1)
	}
	if t.node.Kind != queryspec.KindSource {
		t.buildInputs()
		t.proc = make(chan struct{}, 1)
		if spec.FromSnapshot != nil {
			if rc := spec.Reconfig; rc != nil {
				// The snapshot holds the state of the versions its
				// original ran (an aggregate a plan changed: their shared
				// state).
				if err := t.loadVersions(rc); err != nil {
					return nil, fmt.Errorf("task %s: start from snapshot: %w", spec.TaskID, err)
				}
			}
			if err := t.restoreFrom(spec.FromSnapshot); err != nil {
				return nil, fmt.Errorf("task %s: start from snapshot: %w", spec.TaskID, err)
			}
			if t.kafkaOut != nil {
				t.kafkaOut.restoredAt = uint64(max(spec.FromSnapshot.SourceRecords, 0))
			}
		}
	} else if t.gen != nil || t.kafka != nil {
		t.genSnap, t.genDone = make(chan chan sourceCut), make(chan struct{})
		if t.gen != nil {
			// Rescale holds run on the generator goroutine; a kafka source
			// cannot hold for one (a rescale of what it feeds is refused).
			t.genCtl = make(chan genCmd)
		}
		if spec.FromSnapshot != nil {
			if err := t.restoreSource(spec.FromSnapshot); err != nil {
				return nil, fmt.Errorf("task %s: start from snapshot: %w", spec.TaskID, err)
			}
		}
	} else if spec.FromSnapshot != nil {
		if err := t.restoreIngest(spec.FromSnapshot); err != nil {
			return nil, fmt.Errorf("task %s: start from snapshot: %w", spec.TaskID, err)
		}
	} else if spec.Bootstrap != nil && spec.Bootstrap.Halt && !spec.Bootstrap.SourceDown {
		// The moved-from copy may be halted, and runs on otherwise: its
		// clients' offsets and untaken output are there, and the move
		// can wait for it. A copy whose worker is declared down is taken
		// for lost once its snapshot cannot be fetched: this copy starts
		// afresh (ingestStartsAfresh), as one placed again without a
		// snapshot does; refusing, it stayed failed for good and the
		// source never came back.
		return nil, fmt.Errorf("task %s: %w: the snapshot of its previous copy (a move) could not be fetched, and an ingest source does not start empty in its place", spec.TaskID, ErrNotSnapshottable)
	}
	// The context exists before the task is published to the runtime's
	// map: an ingest request may reach the task before start runs.
	// Stopping the task aborts an expression evaluation in progress, so
	// stop never waits on a slow predicate.
	t.setupDCAA()
	t.ctx, t.cancel = context.WithCancel(context.Background())
	operator.StopOn(t.op, t.ctx.Done())
	operator.StopOn(t.srcChain, t.ctx.Done())
	if rc := spec.Reconfig; rc != nil {
		// Started during or after a reconfiguration (or moved): it runs
		// the versions of every configuration still in use.
		t.rc.expected.Store(int64(spec.MarkersExpected))
		t.rc.pending.Store(rc)
		t.restoreKept(spec.ReconfigKept)
		if err := t.installReconfig(rc); err != nil {
			t.cancel()
			return nil, err
		}
		if l := t.keptLevel(spec.ReconfigKept); l > 0 {
			// An ingest source placed again goes on after its lost
			// copy's switches (reconfig_replay.go).
			t.raiseLevel(l)
			t.rc.switchedTo = max(t.rc.switchedTo, l)
		}
		if s := spec.FromSnapshot; s != nil && s.SourceLevel > 0 {
			// Its original switched early (idle): so does the copy.
			t.raiseLevel(s.SourceLevel)
			t.rc.switchedTo = max(t.rc.switchedTo, s.SourceLevel)
		}
	}
	return t, nil
}

// operatorOf builds an operator fragment's operators: its head and the
// operators chained after it.
func operatorOf(plan *queryspec.Plan, node *queryspec.Node) (operator.Operator, error) {
	schemas := make([]*tuple.Schema, len(node.Inputs))
	for i, in := range node.Inputs {
		schemas[i] = plan.Node(in).Schema
	}
	head, err := operator.New(node.Op, schemas)
	if err != nil {
		return nil, err
	}
	return withChain(head, node)
}

// withChain builds the operators fused after a fragment's head and chains
// them behind head (nil for a source, whose tuples enter the first of them).
func withChain(head operator.Operator, node *queryspec.Node) (operator.Operator, error) {
	var ops []operator.Operator
	if head != nil {
		ops = append(ops, head)
	}
	for i, def := range node.Chain {
		op, err := operator.New(def, []*tuple.Schema{node.ChainInputs[i]})
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	return operator.Chain(ops...), nil
}

// failedTask records a task that could not be built.
func failedTask(r *Runtime, spec TaskSpec, err error) *task {
	return &task{r: r, spec: spec, log: r.log.With("task", spec.TaskID), state: StateFailed, message: err.Error()}
}

// buildOutputs creates one buffer per downstream node partition, or the
// result ring buffer of a sink.
func (t *task) buildOutputs() error {
	if t.node.Kind == queryspec.KindSink {
		buf := t.kafkaSinkBuffer()
		if buf == nil {
			buf = dataplane.NewOutputBuffer(dataplane.BufferOptions{
				Ring: true, MaxTuples: t.r.opts.SinkBufferTuples, MaxBytes: t.r.opts.Buffer.MaxBytes,
				// A later copy without a snapshot replays from its
				// upstreams' buffers and numbers its results from 1
				// again: tails must not resume in it by the old
				// copy's ids.
				Restarted: t.spec.Generation > 1 && t.spec.FromSnapshot == nil,
			})
		}
		out := newOutStream("", t.spec.Partition, buf)
		t.outs = []*outStream{out}
		t.byConsumer[""] = make([]*outStream, t.spec.Partition+1)
		t.byConsumer[""][t.spec.Partition] = out
		t.routes = []route{{parts: []*outStream{out}}}
		t.single = out
		return nil
	}
	for _, name := range t.node.Outputs {
		down := t.plan.Node(name)
		if down == nil {
			return fmt.Errorf("downstream %q missing from the plan", name)
		}
		rt := route{samePartition: down.KeyFields == nil && down.Partitions == t.node.Partitions, down: name}
		if down.KeyFields != nil {
			rt.slots = &routeSlots{}
		}
		for _, f := range down.KeyFields {
			i := t.node.Schema.Index(f)
			if i < 0 {
				return fmt.Errorf("downstream %q is keyed by %q, which output schema of %q lacks", name, f, t.node.Name)
			}
			rt.keyIdx = append(rt.keyIdx, i)
		}
		parts := max(1, down.Partitions)
		if down.KeyFields != nil {
			parts = max(1, t.spec.SlotMaps[name].streams(down.Partitions))
		}
		for p := 0; p < parts; p++ {
			out := t.newOutput(name, p)
			rt.parts = append(rt.parts, out)
			t.outs = append(t.outs, out)
		}
		t.byConsumer[name] = rt.parts
		t.routes = append(t.routes, rt)
	}
	if len(t.routes) == 1 && len(t.routes[0].parts) == 1 && t.routes[0].slots == nil {
		// One output for good (a keyed downstream may be rescaled).
		t.single = t.routes[0].parts[0]
	}
	t.installRoutes(t.spec.SlotMaps)
	return nil
}

// newOutput creates the output buffer of one downstream partition.
func (t *task) newOutput(consumer string, p int) *outStream {
	opts := t.r.opts.Buffer
	opts.Ring = false
	opts.ExpectedSubscribers = max(1, t.plan.Query.Replicas)
	// Without replicas, a consumer that is away (not yet subscribed,
	// reconnecting, paused) has nowhere else to get what an overrun
	// would discard: the producer waits for it, up to its lease.
	opts.Unreplicated = t.plan.Query.Replicas <= 1
	opts.Logger = t.log.With("consumer", consumer, "partition", p)
	return newOutStream(consumer, p, dataplane.NewOutputBuffer(opts))
}

// setSlotMaps installs the slot map of every keyed downstream and takes
// the task's part in any rescale under way (see rescale.go). A map that
// does not fit the downstream (wrong size, or a partition the plan does
// not have) is refused with an error in the log, and the route keeps what
// it had; a map whose rescale has passed its go is installed by the
// rescale step, which adds the outputs it needs first.
func (t *task) setSlotMaps(maps map[string]*SlotMap) {
	if t.node != nil {
		t.rs.maps.Store(&maps)
		t.rescaleStep()
	}
	t.installRoutes(maps)
}

// installRoutes installs the maps that fit the routes' outputs.
func (t *task) installRoutes(maps map[string]*SlotMap) {
	for i := range t.routes {
		rt := &t.routes[i]
		if rt.slots == nil {
			continue
		}
		m := maps[rt.down]
		if m == nil {
			continue
		}
		t.outMu.RLock()
		parts := len(rt.parts)
		t.outMu.RUnlock()
		if m.Next != nil && m.Next.Go && m.Next.Partitions > parts {
			continue // the rescale step adds the outputs, then installs it
		}
		if err := m.check(parts); err != nil {
			t.log.Error("slot map refused; routing keeps the previous one", "consumer", rt.down, "epoch", m.Epoch, "err", err)
			continue
		}
		if old := rt.slots.m.Swap(m); old == nil || old.Epoch != m.Epoch {
			t.log.Debug("slot map installed", "consumer", rt.down, "epoch", m.Epoch)
		}
	}
}

// output resolves a stream this task produces.
func (t *task) output(consumer string, partition int) (*dataplane.OutputBuffer, error) {
	t.outMu.RLock()
	parts := t.byConsumer[consumer]
	t.outMu.RUnlock()
	if partition < 0 || partition >= len(parts) || parts[partition] == nil {
		return nil, fmt.Errorf("%w: task %q has no output to consumer %q partition %d", dataplane.ErrUnknownStream, t.spec.TaskID, consumer, partition)
	}
	return parts[partition].buf, nil
}

func (t *task) start() {
	if t.kafkaOut != nil {
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.runKafkaSink() }()
	}
	switch {
	case t.gen != nil:
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.runGenerator() }()
	case t.kafka != nil:
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.runKafka() }()
	case t.merge != nil && t.restored && t.merge.released == finalBoundary:
		// Restored from a snapshot taken after its final boundary: there
		// is nothing left to read or process.
		t.endReconfig()
		t.setState(StateRunning, "input exhausted")
		return
	case t.dm != nil:
		for _, in := range t.inputs {
			t.wg.Add(1)
			go func() { defer t.wg.Done(); in.runMachine(t.ctx, t.dm) }()
		}
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.dm.run(t.ctx) }()
		t.startRelays()
	case t.merge != nil:
		// A task restored from a snapshot may hold a release ready before
		// any input delivers (the snapshot caught it between the arrival of
		// a boundary and its release): the merge goroutine processes it at
		// once, so such a task never processes inline.
		if t.startsWithoutState() {
			t.aligned = make(chan struct{})
			t.wg.Add(1)
			go func() { defer t.wg.Done(); t.alignRestartedOutputs(t.ctx) }()
		}
		if len(t.inputs) == 1 && !t.restored && !t.mayGrowInputs {
			// The only input's goroutine processes what it delivers.
			ctx := t.ctx
			t.inlineEmit = operator.EmitFunc(func(tp *tuple.Tuple) { t.emitData(ctx, tp) })
		}
		for _, in := range t.inputs {
			t.wg.Add(1)
			go func() { defer t.wg.Done(); in.run(t.ctx) }()
		}
		t.startRelays()
		if t.inlineEmit == nil {
			t.wg.Add(1)
			go func() { defer t.wg.Done(); t.runMerge() }()
		}
		if t.dcaaOn() {
			t.wg.Add(1)
			go func() { defer t.wg.Done(); t.watchInputs(t.ctx) }()
		}
		if t.restored {
			select {
			case t.merge.wake <- struct{}{}:
			default:
			}
		}
	}
	if t.ingest != nil {
		if t.aligned != nil {
			t.wg.Add(1)
			go func() { defer t.wg.Done(); t.alignRestartedOutputs(t.ctx) }()
		}
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.idleTicks(t.ctx) }()
	}
	t.setState(StateRunning, "")
	t.rescaleStep()
}

// startRelays starts the ack relays of a replicated query's task: every
// replica of each upstream partition hears how far this task got (see
// input.relay), until the task stops: after the input's end too, so that
// a replica behind the one read from still learns that everything was
// taken.
func (t *task) startRelays() {
	replicas := t.plan.Query.Replicas
	if replicas <= 1 {
		return
	}
	for _, in := range t.inputs {
		log := t.log.With("upstream", in.upstream, "upstream_partition", in.upPartition)
		for r := range replicas {
			t.wg.Add(1)
			go func() { defer t.wg.Done(); in.relay(t.ctx, r, log) }()
		}
	}
}

// stop cancels the task, closes its buffers (which ends the subscriptions
// served from them and unblocks producers) and waits for its goroutines.
func (t *task) stop() {
	if t.cancel != nil {
		t.cancel()
	}
	t.outMu.RLock()
	outs := t.outs
	t.outMu.RUnlock()
	for _, o := range outs {
		o.buf.Close()
	}
	t.wg.Wait()
	t.setState(StateStopped, "")
}

func (t *task) setState(state, msg string) {
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	if t.state == StateFailed && state != StateStopped {
		return // keep the first failure
	}
	t.state, t.message = state, msg
}

// noteWhileRunning sets the message of a running task, leaving any other
// state (and its message: a failure, a stall) as it is.
func (t *task) noteWhileRunning(msg string) {
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	if t.state == StateRunning {
		t.message = msg
	}
}

func (t *task) fail(err error) {
	t.log.Error("task failed", "err", err)
	t.setState(StateFailed, err.Error())
}

// restartedBehind says, for an operator or sink copy that started again
// without the state of the copy before it (placed again with no live
// replica to bootstrap from, or a failed fetch), when a consumer resumed
// after more results than this copy has produced: its ids start again
// from 1, so that consumer gets nothing from it until it passes the lost
// copy's position, which may take as long as the lost copy had run (the
// copy replays only what its upstreams still buffer). "" otherwise.
// Generator sources catch up without pacing (runGenerator) and say
// nothing here. outMu must not be held.
func (t *task) restartedBehind() string {
	if t.spec.Generation <= 1 || t.spec.FromSnapshot != nil || t.genSnap != nil || t.ingest != nil {
		return ""
	}
	if a := t.aligned; a != nil {
		select {
		case <-a:
		default:
			return "" // about to continue after its consumers' positions
		}
	}
	t.outMu.RLock()
	defer t.outMu.RUnlock()
	for _, o := range t.outs {
		if held, last := o.buf.Wanted(), o.buf.Stats().LastID; held > last {
			return behindNote(o.consumer, o.partition, held, last)
		}
	}
	return ""
}

// behindNote is restartedBehind's message for one output.
func behindNote(consumer string, partition int, held, produced uint64) string {
	return fmt.Sprintf("started again without its state (no live replica to start from): consumer %s[%d] holds %d results of the lost copy and gets none of this copy's until it has produced more (%d so far, replaying what its upstreams still buffer)",
		consumer, partition, held, produced)
}

// State reports the task's state, with its DCAA replica state.
func (t *task) State() TaskState {
	st := t.state0()
	st.Replica = fedstreampb.ReplicaState(t.replicaState.Load())
	st.Tentative = t.tentative.Load()
	return st
}

func (t *task) state0() TaskState {
	var pos uint64
	var blocked bool
	inMove := t.inMove.Load()
	if inMove {
		// Before stateMu: outMu is never taken under it.
		t.outMu.RLock()
		for _, o := range t.outs {
			st := o.buf.Stats()
			pos += st.LastID
			blocked = blocked || !st.BlockedSince.IsZero()
		}
		t.outMu.RUnlock()
	}
	behind := t.restartedBehind()
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	st := TaskState{TaskID: t.spec.TaskID, Generation: t.spec.Generation, State: t.state, Message: t.message}
	st.Prepared, st.Frontier, st.CutDone = t.rs.progress()
	st.InMove, st.Position, st.Blocked = inMove, pos, blocked
	t.reconfigProgress(&st)
	switch {
	case t.state == StateRunning && t.stall != "":
		st.State, st.Message = StateStalled, t.stall
	case t.state == StateRunning && t.overrun != "":
		if st.Message != "" {
			st.Message += "; "
		}
		st.Message += t.overrun
	}
	if behind != "" && t.dm != nil && t.uncorrected != "" {
		// A DCAA copy that named the results it lost (lostBeforeStart, or
		// a record relayed) gave its outputs a lineage of their own: its
		// consumers realign on it by stream time instead of waiting for
		// its ids to pass theirs, and a consumer whose input diverged
		// relays an acknowledgement of everything (input.taken), which
		// is no position.
		behind = ""
	}
	if behind != "" && t.state == StateRunning {
		if st.Message != "" {
			st.Message += "; "
		}
		st.Message += behind
	}
	if t.uncorrected != "" {
		st.Lossy = true
		if st.Message != "" {
			st.Message += "; "
		}
		st.Message += t.uncorrected
	}
	return st
}

// checkStall decides whether the task is stalled: an output's Append has
// been blocked for after, or its outputs have not moved for after (two
// boundary intervals if longer) while one input delivered data and
// another nothing. A source with nothing to send, and a task whose inputs
// bring nothing, are not stalled. Each change is logged once.
func (t *task) checkStall(now time.Time, after time.Duration) {
	if t.halted.Load() {
		return // it is meant to stand still until it is stopped
	}
	t.stateMu.Lock()
	running := t.state == StateRunning
	t.stateMu.Unlock()
	if !running {
		return
	}
	var out uint64
	key, reason := "", ""
	var overrun []string
	t.outMu.RLock()
	outs := t.outs
	t.outMu.RUnlock()
	for _, o := range outs {
		st := o.buf.Stats()
		out += st.LastID
		if st.Overrunning {
			overrun = append(overrun, fmt.Sprintf("consumer %s partition %d", o.consumer, o.partition))
		}
		if key != "" || st.BlockedSince.IsZero() || now.Sub(st.BlockedSince) < after {
			continue
		}
		key = fmt.Sprintf("blocked %s %d %s %d %d", o.consumer, o.partition, st.Laggard, st.LaggardAck, st.Missing)
		reason = fmt.Sprintf("output blocked %s on consumer %s partition %d: %s",
			roughly(now.Sub(st.BlockedSince)), o.consumer, o.partition, holdingBack(st))
	}
	if busy := t.busySince.Load(); key == "" && busy != 0 && now.Sub(time.Unix(0, busy)) >= after {
		key = "processing"
		reason = fmt.Sprintf("processing one release has not finished for %s", roughly(now.Sub(time.Unix(0, busy))))
	}
	t.inMu.Lock()
	inputs := t.inputs
	t.inMu.Unlock()
	in := make([]uint64, len(inputs))
	for i, inp := range inputs {
		in[i] = inp.sub.LastID()
	}
	if out != t.watchOut || t.watchOutAt.IsZero() {
		t.watchOut, t.watchOutAt, t.watchIn = out, now, in
	} else if key == "" && now.Sub(t.watchOutAt) >= max(after, 2*t.r.opts.BoundaryInterval) && t.mergeFed() {
		// Some input has brought data to release, another nothing at
		// all since the output last moved: the merge waits for it. An
		// idle upstream sends one boundary per boundary interval and
		// nothing between: only two intervals of silence (or after,
		// when longer) say it is stuck, not idle.
		var idle []string
		for _, i := range t.merge.waiting() {
			if i < len(in) && i < len(t.watchIn) && in[i] == t.watchIn[i] {
				idle = append(idle, fmt.Sprintf("%s partition %d", inputs[i].upstream, inputs[i].upPartition))
			}
		}
		if len(idle) > 0 {
			key = "waiting " + strings.Join(idle, ",")
			reason = fmt.Sprintf("no output for %s while input has data: waiting for input from %s, which sent nothing since",
				roughly(now.Sub(t.watchOutAt)), strings.Join(idle, ", "))
		}
	}
	t.noteOverrun(overrun)
	if key == t.stallKey {
		return // unchanged: keep the reason as first reported
	}
	t.stallKey = key
	t.stateMu.Lock()
	was := t.stall
	t.stall = reason
	t.stateMu.Unlock()
	switch {
	case reason != "":
		t.log.Warn("task stalled", "reason", reason)
	case was != "":
		t.log.Info("task moves again", "was", was)
	}
}

// mergeFed reports whether the task's inputs go through task.merge. A
// DCAA operator task's machine merges them instead (dcaaRun): its
// task.merge is fed nothing, but a copy restored from a snapshot had the
// snapshot's input positions installed there (restoreFrom; start reads
// its release for a snapshot taken after the end), where they stay as
// they were. Read as the task's merge, they said a re-placed aggregate
// copy waited for an input for good once its output stood still at the
// end of its input: a false stall.
func (t *task) mergeFed() bool { return t.merge != nil && t.dm == nil }

// noteOverrun makes the task's status say which outputs are discarding
// tuples that a subscriber which is not connected has not taken (the
// buffer's log names it), while they do.
func (t *task) noteOverrun(outs []string) {
	note := ""
	if len(outs) > 0 {
		note = "output to " + strings.Join(outs, ", ") + " overruns: discarding tuples a disconnected or missing downstream replica has not taken (see the worker log)"
	}
	t.stateMu.Lock()
	defer t.stateMu.Unlock()
	t.overrun = note
}

// roughly rounds a duration for a message: to 100ms below 10s, to
// seconds above.
func roughly(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// holdingBack says who keeps a full output buffer from taking more.
func holdingBack(st dataplane.BufferStats) string {
	var parts []string
	if st.Laggard != "" {
		conn := "connected"
		if !st.LaggardConnected {
			conn = "not connected"
		}
		parts = append(parts, fmt.Sprintf("subscriber %s (%s) has not acknowledged since id %d", st.Laggard, conn, st.LaggardAck))
	}
	if st.Missing > 0 {
		parts = append(parts, fmt.Sprintf("%d downstream replica(s) have not subscribed yet", st.Missing))
	}
	if len(parts) == 0 {
		return "no subscriber"
	}
	return strings.Join(parts, "; ")
}

// setPlacements indexes placements by (fragment, partition).
func (t *task) setPlacements(pls []Placement) {
	m := make(map[placeKey][]Placement)
	for _, p := range pls {
		k := placeKey{p.Fragment, p.Partition}
		m[k] = append(m[k], p)
	}
	for _, list := range m {
		slices.SortFunc(list, func(a, b Placement) int { return a.Replica - b.Replica })
	}
	t.placeMu.Lock()
	t.placements = m
	t.placeMu.Unlock()
}

// updatePlacements installs new placements and makes every input whose
// current upstream moved or vanished resubscribe.
func (t *task) updatePlacements(pls []Placement) {
	t.placeMu.Lock()
	old := t.placements
	t.placeMu.Unlock()
	t.setPlacements(pls)
	for _, in := range t.inputsNow() {
		in.placementsChanged()
	}
	if d := t.dm; d != nil {
		d.replicasMoved(old)
	}
}

// inputsNow returns the task's inputs for a goroutine other than the
// one that adds them (a rescale appends under inMu; reading t.inputs
// unguarded meanwhile could see the new length before the new element,
// a nil input).
func (t *task) inputsNow() []*input {
	t.inMu.Lock()
	defer t.inMu.Unlock()
	return t.inputs
}

// candidates lists the replicas of an upstream partition in the order they
// are tried: the replica with this task's replica index first, then the
// others by ascending replica index.
func (t *task) candidates(fragment string, partition int) []Placement {
	t.placeMu.Lock()
	list := t.placements[placeKey{fragment, partition}]
	t.placeMu.Unlock()
	out := make([]Placement, 0, len(list))
	for _, p := range list {
		if p.Replica == t.spec.Replica {
			out = append(out, p)
		}
	}
	for _, p := range list {
		if p.Replica != t.spec.Replica {
			out = append(out, p)
		}
	}
	return out
}

// replicaPlacement returns the current placement of replica r of an
// upstream partition.
func (t *task) replicaPlacement(fragment string, partition, r int) (Placement, bool) {
	t.placeMu.Lock()
	defer t.placeMu.Unlock()
	for _, p := range t.placements[placeKey{fragment, partition}] {
		if p.Replica == r {
			return p, true
		}
	}
	return Placement{}, false
}

// placementOf returns the current placement of an upstream task.
func (t *task) placementOf(fragment string, partition int, taskID string) (Placement, bool) {
	t.placeMu.Lock()
	defer t.placeMu.Unlock()
	for _, p := range t.placements[placeKey{fragment, partition}] {
		if p.TaskID == taskID {
			return p, true
		}
	}
	return Placement{}, false
}

// sourceEmitter hands a source chain's output to emitData.
type sourceEmitter struct {
	t   *task
	ctx context.Context
}

func (e *sourceEmitter) Emit(tp *tuple.Tuple) { e.t.emitData(e.ctx, tp) }

// emitSource sends a tuple a source produced through the operators fused
// into its fragment, then to the outputs. An expression that fails at run
// time drops the tuple, as in an operator task (the same way on every
// replica); any other operator error is kept in t.emitErr.
func (t *task) emitSource(ctx context.Context, tp *tuple.Tuple) {
	t.tagSource(tp)
	if t.srcChain == nil {
		t.emitData(ctx, tp)
		return
	}
	t.srcOut = sourceEmitter{t: t, ctx: ctx}
	err := t.srcChain.Process(0, tp, &t.srcOut)
	if err == nil {
		return
	}
	if !errors.Is(err, operator.ErrEval) {
		if t.emitErr == nil {
			t.emitErr = fmt.Errorf("operator in %s: %w", t.node.Name, err)
		}
		return
	}
	t.dropped(err)
}

// dropped counts a tuple dropped because an expression failed on it (the
// same way on every replica) and logs the first drop and every 10 000th.
// Drops over the expression cost budget are also counted in overBudget.
//
// The task's status message says so too (query status, workers --json),
// refreshed at most every dropReportEvery so that a stream of drops does
// not become a stream of state reports.
func (t *task) dropped(err error) {
	t.evalFails++
	if errors.Is(err, queryspec.ErrCostBudget) {
		t.overBudget.Add(1)
	}
	if t.evalFails == 1 || t.evalFails%10000 == 0 {
		t.log.Warn("tuples dropped: expression failed", "err", err, "dropped", t.evalFails, "over_cost_budget", t.overBudget.Load())
	}
	if now := time.Now(); now.Sub(t.dropReported) >= dropReportEvery {
		t.dropReported = now
		t.noteWhileRunning(fmt.Sprintf("tuples dropped because an expression failed on them: %d (%d over the per-tuple cost budget); last: %v",
			t.evalFails, t.overBudget.Load(), err))
	}
}

// dropReportEvery bounds how often dropped tuples update a task's message.
const dropReportEvery = 10 * time.Second

// emitData routes one data tuple to the partition of every downstream
// node that should see it, assigning each stream's next id. Errors (the
// task stopping) are kept in t.emitErr: operator.Emitter cannot return one.
func (t *task) emitData(ctx context.Context, tp *tuple.Tuple) {
	if t.emitErr != nil {
		return
	}
	if tp.Type == 0 {
		tp.Type = tuple.Stable
	}
	if t.rc.on {
		t.tagOut(tp)
	}
	if tp.STime > t.maxSTime {
		t.maxSTime = tp.STime
	}
	t.seq++
	if t.seq&(keySampleEvery-1) == 0 && t.single == nil {
		t.sampleKeys(tp)
	}
	if t.single != nil {
		if err := t.appendTo(ctx, t.single, tp); err != nil {
			t.emitErr = err
		}
		return
	}
	for i := range t.routes {
		rt := &t.routes[i]
		p := 0
		n := len(rt.parts)
		switch {
		case n == 1:
		case len(rt.keyIdx) == 1 && rt.keyIdx[0] < len(tp.Values):
			// One key field: hashed where it is, not copied first.
			k := rt.keyIdx[0]
			p = rt.partitionOf(queryspec.Slot(tp.Values[k:k+1]), n, tp.STime)
		case rt.keyIdx != nil:
			t.keyBuf = t.keyBuf[:0]
			for _, k := range rt.keyIdx {
				if k < len(tp.Values) {
					t.keyBuf = append(t.keyBuf, tp.Values[k])
				}
			}
			p = rt.partitionOf(queryspec.Slot(t.keyBuf), n, tp.STime)
		case rt.samePartition:
			p = t.spec.Partition
		default:
			p = int(mix64(t.seq) % uint64(n))
		}
		if err := t.appendTo(ctx, rt.parts[p], tp); err != nil {
			t.emitErr = err
			return
		}
	}
}

// emitBoundary sends a BOUNDARY with the given stime to every output.
func (t *task) emitBoundary(ctx context.Context, stime int64) error {
	t.publishCounts()
	b := tuple.Tuple{Type: tuple.Boundary, STime: stime, Version: t.boundaryLevel(stime)}
	if stime != finalBoundary && stime > t.maxSTime {
		t.maxSTime = stime
	}
	for _, o := range t.outs {
		if stime < o.from || o.retired.Load() {
			continue
		}
		if stime == finalBoundary {
			// Before it can be sent: a consumer resuming past it is
			// told so (dataplane.ErrEndedBefore).
			o.buf.SetEnd(o.w.LastID() + 1)
		}
		if err := t.appendTo(ctx, o, &b); err != nil {
			return err
		}
	}
	return nil
}

// appendTo stages tp as o's next tuple (setting its id) and flushes a full
// network batch.
func (t *task) appendTo(ctx context.Context, o *outStream, tp *tuple.Tuple) error {
	if o.w.Next(tp) {
		if err := t.flushOut(ctx, o); err != nil {
			return fmt.Errorf("output to %q partition %d: %w", o.consumer, o.partition, err)
		}
	}
	return nil
}

// flushOut appends o's staged tuples to its buffer, waiting for room.
//
// While it waits, what the task staged for its other outputs goes out as
// far as their buffers have room, as the wait begins and then every
// dataplane.WaitIdleEvery: those tuples (a boundary among them) may be
// what a consumer of another output needs to go on, and that consumer may
// be what, through the consumers downstream, makes room at o. A live
// rescale built exactly that cycle: a source blocked on the full buffer of
// the splitter partition working through its backlog kept the boundary at
// the cut staged for partitions the rescale added; the counters, which
// merge every splitter partition, waited at the cut for those, and the old
// partition, whose output the counters no longer took, stopped taking the
// source's. Each stream keeps its order; only when its tuples leave the
// task changes.
//
// An ingest source is left out: it appends line by line and, when a
// request fails, discards what is staged, so that a line is in every
// output or in none.
func (t *task) flushOut(ctx context.Context, o *outStream) error {
	if t.ingest != nil || len(t.outs) < 2 {
		return o.w.Flush(ctx)
	}
	return o.w.FlushIdle(ctx, func() { t.flushOthers(o) })
}

// flushOthers appends, without waiting, what the task staged for its
// outputs other than o, as far as their buffers have room. What does not
// fit stays staged, and an error (a closed buffer: the task is stopping)
// is met again when that output is flushed in turn.
func (t *task) flushOthers(o *outStream) {
	for _, other := range t.outs {
		if other != o && other.w.Staged() > 0 {
			_ = other.w.Flush(noWait)
		}
	}
}

// noWait is a context that has ended: a Flush under it appends what fits
// and never waits (what does not fit stays staged).
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// discardStaged drops what the outputs staged and did not append (after a
// failed flush), so the next tuple reuses the first unappended id.
func (t *task) discardStaged() {
	for _, o := range t.outs {
		o.w.Discard()
	}
}

// flush appends every output's staged tuples to its buffer.
func (t *task) flush(ctx context.Context) error {
	t.publishCounts()
	for _, o := range t.outs {
		if err := t.flushOut(ctx, o); err != nil {
			return fmt.Errorf("output to %q partition %d: %w", o.consumer, o.partition, err)
		}
	}
	return nil
}

// mix64 is the splitmix64 finaliser: spreads consecutive sequence numbers
// evenly over partitions.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// stopping reports whether err only says the task is being stopped.
func (t *task) stopping(err error) bool {
	return t.ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, dataplane.ErrClosed))
}
