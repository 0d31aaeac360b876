package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/slots"
	"github.com/fedstream/fedstream/worker/operator"
)

// Live rescaling of a keyed fragment F (see docs/DATAPLANE.md, "Rescaling
// a keyed fragment"). A task takes part when it routes to F (an upstream),
// runs F, or reads F (a downstream). The coordinator drives three phases
// through F's slot map (SlotMap.Next):
//
//   - prepare: each taking part stops producing and releasing where it is
//     (a hold) and reports its frontier, the highest stream time it has
//     routed, sent as a boundary or released.
//   - go, with a cut above every frontier: upstreams add the outputs of
//     added partitions and route a tuple by the new map when its stime is
//     at or above the cut, by the old one below it; downstreams add the
//     inputs of added partitions; F's tasks release exactly the tuples
//     below the cut (the cut is a release step), hand the state of the
//     slots they lose to the new owners, install the slots they gain, and
//     go on (a removed partition ends its output instead). Then every
//     hold is lifted.
//   - finish: the new map is F's map; removed partitions' tasks stop.
//
// Nothing is lost or counted twice: a slot's tuples below the cut all
// reach its old owner (every upstream routed them by the old map, having
// routed nothing at or above the cut before it knew the cut), which
// processed exactly those when it handed the slot over; those at or above
// the cut all reach the new owner, which processes them only after
// installing the slot. Both stand at the cut's watermark, as slot states
// must (operator.SlotState).

// rescaleState is a task's part in rescales. The step goroutines that
// change it are serialised by mu; progress is read by State.
type rescaleState struct {
	// maps are the latest slot maps the task was given (the step reads
	// the latest, whichever goroutine runs it).
	maps atomic.Pointer[map[string]*SlotMap]

	mu sync.Mutex
	// held is, per rescaled fragment, the epoch the task holds (or held)
	// for; gone the epoch whose go it applied.
	held, gone map[string]uint64
	// lift closes to lift a generator's hold (nil when it is not held).
	lift chan struct{}

	// stepping: a step goroutine runs; pending: a step was asked for.
	stepping, pending atomic.Bool
	// lifting: a goroutine of kickRelease runs; kicked: a kick came
	// since it last looked (see kickRelease).
	lifting, kicked atomic.Bool

	// progMu guards what follows: the progress State reports and the
	// slot states handed over at a cut, by epoch and new owner, kept
	// until the map reaches that epoch.
	progMu            sync.Mutex
	prepared, cutDone uint64
	frontier          int64
	handover          map[handoverKey][]byte
	handoverEpochs    map[uint64]bool
}

type handoverKey struct {
	epoch uint64
	to    int
}

func (rs *rescaleState) progress() (prepared uint64, frontier int64, cutDone uint64) {
	rs.progMu.Lock()
	defer rs.progMu.Unlock()
	return rs.prepared, rs.frontier, rs.cutDone
}

// handoverFor returns the slot state the task handed to partition to at
// the cut of epoch; ok is false until it reached that cut.
func (rs *rescaleState) handoverFor(epoch uint64, to int) (data []byte, ok bool) {
	rs.progMu.Lock()
	defer rs.progMu.Unlock()
	if !rs.handoverEpochs[epoch] {
		return nil, false
	}
	return rs.handover[handoverKey{epoch, to}], true
}

// ErrNotAtCut means FetchSlots asked a task for the slots it hands over
// at a rescale's cut before it reached the cut.
var ErrNotAtCut = errors.New("task has not reached the rescale's cut yet")

// rescaleStep takes the task's part in any rescale its latest slot maps
// show, on a goroutine the task owns (holding may wait for a release in
// progress). Steps run one at a time; a step always works from the
// latest maps, so a step asked for while one runs is run once after it.
func (t *task) rescaleStep() {
	if t.ctx == nil || t.ctx.Err() != nil {
		return
	}
	t.rs.pending.Store(true)
	if !t.rs.stepping.CompareAndSwap(false, true) {
		return
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for {
			for t.rs.pending.Swap(false) {
				t.applyRescale(t.ctx)
			}
			t.rs.stepping.Store(false)
			// A request that came after the last Swap and found stepping
			// set is ours to run.
			if !t.rs.pending.Load() || !t.rs.stepping.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// roles says how the task takes part in a rescale of fragment f.
func (t *task) roles(f string) (upstream, own, downstream bool) {
	for i := range t.routes {
		if t.routes[i].down == f {
			upstream = true
		}
	}
	own = t.spec.Fragment == f
	downstream = slices.Contains(t.node.Inputs, f)
	return
}

func (t *task) applyRescale(ctx context.Context) {
	mp := t.rs.maps.Load()
	if mp == nil {
		return
	}
	maps := *mp
	frags := make([]string, 0, len(maps))
	for f := range maps {
		frags = append(frags, f)
	}
	sort.Strings(frags)
	t.rs.mu.Lock()
	defer t.rs.mu.Unlock()
	if t.rs.held == nil {
		t.rs.held, t.rs.gone = map[string]uint64{}, map[string]uint64{}
	}
	for _, f := range frags {
		m := maps[f]
		up, own, down := t.roles(f)
		if m == nil || !(up || own || down) {
			continue
		}
		n := m.Next
		switch {
		case n != nil && t.rs.held[f] < n.Epoch && !n.Go:
			if !t.hold(ctx, f, n.Epoch) {
				return
			}
		case n != nil && n.Go && t.rs.gone[f] < n.Epoch:
			if t.rs.held[f] < n.Epoch {
				// Never held for it (this copy started after the prepare):
				// it can only follow if it has not passed the cut.
				if !t.hold(ctx, f, n.Epoch) {
					return
				}
				if _, fr, _ := t.rs.progress(); fr >= n.Cut {
					t.fail(fmt.Errorf("rescale of %s to epoch %d: this copy is at stream time %d, past the cut %d it never held for", f, n.Epoch, fr, n.Cut))
					return
				}
			}
			if !t.goRescale(ctx, f, m, up, own, down) {
				return
			}
			t.rs.gone[f] = n.Epoch
		case n == nil && t.rs.held[f] > m.Epoch && t.rs.gone[f] < t.rs.held[f]:
			// Aborted before its go: lift the hold.
			t.log.Info("rescale aborted; hold lifted", "fragment", f, "epoch", t.rs.held[f])
			t.rs.held[f] = m.Epoch
			t.liftHold()
		case n == nil:
			t.installRoutes(maps)
			if up {
				t.retireRemoved(f, m.Partitions)
			}
			t.rs.progMu.Lock()
			for e := range t.rs.handoverEpochs {
				if e <= m.Epoch {
					delete(t.rs.handoverEpochs, e)
					for k := range t.rs.handover {
						if k.epoch == e {
							delete(t.rs.handover, k)
						}
					}
				}
			}
			t.rs.progMu.Unlock()
		}
	}
}

// retireRemoved stops appending to the task's streams to partitions of
// fragment f at or above partitions (removed by a finished rescale): they
// would only collect boundaries nobody reads.
func (t *task) retireRemoved(f string, partitions int) {
	if partitions <= 0 {
		return
	}
	t.outMu.RLock()
	defer t.outMu.RUnlock()
	for _, o := range t.byConsumer[f] {
		if o.partition >= partitions && !o.retired.Swap(true) {
			t.log.Info("rescale: output to a removed partition retired", "consumer", f, "partition", o.partition)
		}
	}
}

// hold stops the task where it is and records its frontier for epoch.
func (t *task) hold(ctx context.Context, f string, epoch uint64) bool {
	var frontier int64
	switch {
	case t.dm != nil:
		// A DCAA operator task: its machine releases, not the merger. A
		// reader of f holds as one of f's tasks does: nothing at or
		// above the cut may be released before the go gives its machine
		// the inputs of added partitions (addMachineInputs).
		released, ok := t.dm.holdForRescale(ctx, f, epoch)
		if !ok {
			return false
		}
		frontier = released
	case t.merge != nil && t.proc != nil:
		if err := t.lockProc(ctx); err != nil {
			return false
		}
		released := t.merge.hold()
		frontier = max(released, t.maxSTime)
		t.unlockProc()
	case t.gen != nil:
		lift := make(chan struct{})
		ok := t.onGenerator(ctx, func() {
			if err := t.flush(ctx); err != nil {
				t.log.Warn("flush before a rescale's hold failed", "err", err)
			}
			frontier = t.maxSTime
		}, lift)
		if !ok {
			close(lift)
			// The generator ended: it produces nothing more, its frontier
			// is where it stopped.
			frontier = math.MaxInt64 - 1
		} else {
			t.rs.lift = lift
		}
	default:
		t.log.Error("rescale: this task cannot hold (an ingest source); the rescale will not go ahead", "fragment", f, "epoch", epoch)
		return false
	}
	t.rs.held[f] = epoch
	t.rs.progMu.Lock()
	t.rs.prepared, t.rs.frontier = epoch, frontier
	t.rs.progMu.Unlock()
	t.log.Info("holding for a rescale", "fragment", f, "epoch", epoch, "frontier", frontier)
	return true
}

// liftHold lets a held task go on.
func (t *task) liftHold() {
	switch {
	case t.dm != nil:
		if t.lockProc(t.ctx) == nil {
			_ = t.dm.setCut(math.MaxInt64) // lifting is never refused
			t.unlockProc()
		}
	case t.merge != nil:
		t.merge.liftCut()
		t.kickRelease()
	}
	if t.rs.lift != nil {
		close(t.rs.lift)
		t.rs.lift = nil
	}
}

// goRescale applies the go of the rescale of fragment f (map m) in each
// of the task's roles, then lifts its hold.
func (t *task) goRescale(ctx context.Context, f string, m *SlotMap, up, own, down bool) bool {
	n := m.Next
	if own && t.gen != nil {
		return t.goSourceRescale(ctx, f, m) // a generator source's own fragment
	}
	if up {
		grow := func() {
			for i := range t.routes {
				rt := &t.routes[i]
				if rt.down != f {
					continue
				}
				t.outMu.Lock()
				for p := len(rt.parts); p < n.Partitions; p++ {
					out := t.newOutput(f, p)
					out.from = n.Cut
					rt.parts = append(rt.parts, out)
					t.outs = append(t.outs, out)
				}
				t.byConsumer[f] = rt.parts
				t.outMu.Unlock()
				t.single = nil
				if err := m.check(len(rt.parts)); err != nil {
					t.fail(fmt.Errorf("rescale of %s: %w", f, err))
					continue
				}
				rt.slots.m.Store(m)
			}
		}
		switch {
		case t.gen != nil:
			if !t.onGenerator(ctx, grow, nil) && ctx.Err() != nil {
				return false
			}
		case t.proc != nil:
			if err := t.lockProc(ctx); err != nil {
				return false
			}
			grow()
			t.unlockProc()
		default:
			grow() // an ingest source cannot take part; see hold
		}
	}
	if down && t.merge != nil {
		if err := t.lockProc(ctx); err != nil {
			return false
		}
		var added []*input
		have := map[int]int{} // port -> partitions of f read on it
		for _, in := range t.inputs {
			if in.upstream == f {
				have[in.port] = max(have[in.port], in.upPartition+1)
			}
		}
		for port, up := range t.node.Inputs {
			if up != f {
				continue
			}
			for p := have[port]; p < n.Partitions; p++ {
				added = append(added, t.newInput(port, f, p))
			}
		}
		for _, in := range added {
			// The added partition carries nothing below the cut: the
			// merge must not wait for its first boundary to release
			// the other partitions' output below it (see setFloor).
			in.floor = n.Cut
			t.merge.setFloor(in.idx, n.Cut)
			if t.op == nil {
				in.sub.KeepValuesPacked()
			}
			if t.dcaaOn() {
				in.watch() // as the inputs the task started with
			}
		}
		if t.dm != nil {
			if err := t.dm.addInputs(added, n.Cut); err != nil {
				t.unlockProc()
				t.fail(fmt.Errorf("rescale of %s to epoch %d: %w", f, n.Epoch, err))
				return false
			}
		}
		t.inMu.Lock()
		t.inputs = append(t.inputs, added...)
		t.inMu.Unlock()
		if t.mv != nil {
			t.mv.grow(len(t.inputs))
		}
		if len(added) > 0 {
			t.stopInline() // one input of a rescaled source became several
		}
		t.unlockProc()
		for _, in := range added {
			t.wg.Add(1)
			if d := t.dm; d != nil {
				go func() { defer t.wg.Done(); in.runMachine(t.ctx, d) }()
			} else {
				go func() { defer t.wg.Done(); in.run(t.ctx) }()
			}
			if replicas := t.plan.Query.Replicas; replicas > 1 {
				log := t.log.With("upstream", in.upstream, "upstream_partition", in.upPartition)
				for r := range replicas {
					t.wg.Add(1)
					go func() { defer t.wg.Done(); in.relay(t.ctx, r, log) }()
				}
			}
		}
		if len(added) > 0 {
			t.log.Info("rescale: reading added partitions", "fragment", f, "partitions", n.Partitions)
		}
		// The downstream has passed the cut once every removed
		// partition's stream ended here (its final boundary, which the
		// removed task emits right after the cut): from then on it needs
		// nothing more of them, and the rescale may finish (stop them).
		// Reaching the cut is not enough: a removed task stopped before
		// its final boundary arrived left the input waiting for a stream
		// that never ends, the merge stalled at it, and a snapshot of the
		// task held an input its copy no longer has.
		var removed []*input
		t.inMu.Lock()
		for _, in := range t.inputs {
			if in.upstream == f && in.upPartition >= n.Partitions {
				removed = append(removed, in)
			}
		}
		t.inMu.Unlock()
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for _, in := range removed {
				for !t.inputEnded(in) {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
				}
			}
			t.rs.progMu.Lock()
			t.rs.cutDone = n.Epoch
			t.rs.progMu.Unlock()
		}()
	}
	if own && t.merge != nil {
		// The cut replaces the hold; the handover lifts it.
		if t.dm != nil {
			if err := t.lockProc(ctx); err != nil {
				return false
			}
			err := t.dm.setCut(n.Cut)
			t.unlockProc()
			if err != nil {
				// Held since the prepare, it released nothing tentative.
				t.fail(fmt.Errorf("rescale of %s to epoch %d: cut at %d: %w", f, n.Epoch, n.Cut, err))
				return false
			}
		} else {
			t.merge.setRescaleCut(n.Cut)
		}
		if t.rs.lift != nil {
			close(t.rs.lift)
			t.rs.lift = nil
		}
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.handOver(ctx, f, m) }()
		return true
	}
	t.liftHold()
	return true
}

// handOver waits until the task has released exactly the tuples below the
// cut of the rescale in m, hands the state of the slots its partition
// loses to their new owners, installs the slots it gains from their old
// owners, and goes on (a partition the rescale removes ends its output).
func (t *task) handOver(ctx context.Context, f string, m *SlotMap) {
	if t.passCut(ctx, f, m) {
		t.kickRelease()
	}
}

// passCut is handOver up to lifting the cut (under proc); lifted reports
// that the task goes on from the cut, with releases to process.
func (t *task) passCut(ctx context.Context, f string, m *SlotMap) (lifted bool) {
	n := m.Next
	p := t.spec.Partition
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := t.lockProc(ctx); err != nil {
			return false
		}
		if t.releasedAt() >= n.Cut {
			break // proc held
		}
		t.unlockProc()
		t.kickRelease()
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	defer t.unlockProc()
	if t.releasedAt() != n.Cut {
		t.fail(fmt.Errorf("rescale of %s to epoch %d: released up to %d, past the cut %d", f, n.Epoch, t.releasedAt(), n.Cut))
		return false
	}
	ss, ok := operator.SlotStateOf(t.op)
	if !ok {
		t.fail(fmt.Errorf("rescale of %s: %w", f, operator.ErrNotKeyed))
		return false
	}
	// Lost slots, by new owner.
	lost := map[int]slots.Set{}
	gained := map[int]slots.Set{}
	var lostAll slots.Set
	for s := range m.Owner {
		from, to := int(m.Owner[s]), int(n.Owner[s])
		switch {
		case from == p && to != p:
			set := lost[to]
			set.Add(s)
			lost[to] = set
			lostAll.Add(s)
		case to == p && from != p:
			set := gained[from]
			set.Add(s)
			gained[from] = set
		}
	}
	handed := map[handoverKey][]byte{}
	for to, set := range lost {
		data, err := ss.SnapshotSlots(set)
		if err != nil {
			t.fail(fmt.Errorf("rescale of %s: snapshot of slots for partition %d: %w", f, to, err))
			return false
		}
		handed[handoverKey{n.Epoch, to}] = data
	}
	t.rs.progMu.Lock()
	if t.rs.handover == nil {
		t.rs.handover, t.rs.handoverEpochs = map[handoverKey][]byte{}, map[uint64]bool{}
	}
	for k, v := range handed {
		t.rs.handover[k] = v
	}
	t.rs.handoverEpochs[n.Epoch] = true
	t.rs.progMu.Unlock()
	ss.DropSlots(lostAll)
	froms := make([]int, 0, len(gained))
	for from := range gained {
		froms = append(froms, from)
	}
	sort.Ints(froms)
	for _, from := range froms {
		data, err := t.fetchSlots(ctx, f, from, n.Epoch)
		if err != nil {
			if ctx.Err() == nil {
				t.fail(fmt.Errorf("rescale of %s: slots from partition %d: %w", f, from, err))
			}
			return false
		}
		if err := ss.RestoreSlots(data); err != nil {
			t.fail(fmt.Errorf("rescale of %s: install slots from partition %d: %w", f, from, err))
			return false
		}
	}
	t.log.Info("rescale cut passed", "fragment", f, "epoch", n.Epoch, "cut", n.Cut, "slots_lost", lostAll.Len(), "from_partitions", froms)
	if p >= n.Partitions {
		// Removed: every slot is handed over; the output ends here and
		// the task releases nothing more until it is stopped (the
		// rescale's finish waits until its downstreams received that).
		err := t.emitBoundary(ctx, finalBoundary)
		if err == nil {
			err = t.flush(ctx)
		}
		if err != nil {
			t.endWith(err)
			return false
		}
		t.noteWhileRunning("handed every slot over in a rescale; stops when the rescale finishes")
	} else if t.dm != nil {
		_ = t.dm.setCut(math.MaxInt64) // proc held; lifting is never refused
	} else {
		t.merge.liftCut()
		lifted = true
	}
	t.rs.progMu.Lock()
	t.rs.cutDone = n.Epoch
	t.rs.progMu.Unlock()
	return lifted
}

// fetchSlots gets, from a copy of partition from of fragment f (this
// task's replica first), the slots it hands this task's partition at the
// cut of epoch, waiting until it has reached the cut.
func (t *task) fetchSlots(ctx context.Context, f string, from int, epoch uint64) ([]byte, error) {
	backoff := 2 * time.Millisecond
	warned := time.Now()
	for attempt := 0; ; attempt++ {
		cands := t.candidates(f, from)
		var err error
		if len(cands) == 0 {
			err = fmt.Errorf("no placement known for partition %d", from)
		} else {
			pl := cands[attempt%len(cands)]
			var data []byte
			data, err = t.r.fetchSlotsFrom(ctx, pl, &fedstreampb.FetchSlotsRequest{Query: t.spec.Query, TaskId: pl.TaskID,
				Generation: int32(pl.Generation), Epoch: epoch, ToPartition: int32(t.spec.Partition)})
			if err == nil {
				return data, nil
			}
		}
		if time.Since(warned) > 10*time.Second {
			t.log.Warn("rescale: still waiting for slots", "from_partition", from, "epoch", epoch, "err", err)
			warned = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// fetchSlotsFrom asks the copy pl for handed-over slots: directly when it
// runs here, else over the data plane.
func (r *Runtime) fetchSlotsFrom(ctx context.Context, pl Placement, req *fedstreampb.FetchSlotsRequest) ([]byte, error) {
	if t := r.task(pl.TaskID); t != nil && t.spec.Generation == pl.Generation {
		return t.slotsFor(req)
	}
	conn, err := r.pool.Conn(pl.WorkerAddr)
	if err != nil {
		return nil, err
	}
	return FetchSlots(ctx, conn, req)
}

// slotsFor answers a FetchSlots request for this task.
func (t *task) slotsFor(req *fedstreampb.FetchSlotsRequest) ([]byte, error) {
	data, ok := t.rs.handoverFor(req.Epoch, int(req.ToPartition))
	if !ok {
		return nil, fmt.Errorf("%w: %s, epoch %d", ErrNotAtCut, t.spec.TaskID, req.Epoch)
	}
	return data, nil
}

// FetchSlots implements DataPlane.FetchSlots.
func (s dpServer) FetchSlots(req *fedstreampb.FetchSlotsRequest, stream fedstreampb.DataPlane_FetchSlotsServer) error {
	t := s.r.task(req.TaskId)
	if t == nil || t.spec.Query != req.Query || (req.Generation != 0 && int(req.Generation) != t.spec.Generation) {
		return status.Errorf(codes.NotFound, "fetch slots: task %s (generation %d) of query %s does not run here", req.TaskId, req.Generation, req.Query)
	}
	data, err := t.slotsFor(req)
	if err != nil {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	chunk := s.r.opts.SnapshotChunkBytes
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(data))
		msg := &fedstreampb.SnapshotChunk{Data: data[off:end]}
		if off == 0 {
			msg.TotalBytes = uint64(len(data))
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		if end == len(data) {
			return nil
		}
	}
}

// FetchSlots asks a worker for the slots a task hands over at a rescale's
// cut (DataPlane.FetchSlots).
func FetchSlots(ctx context.Context, conn grpc.ClientConnInterface, req *fedstreampb.FetchSlotsRequest) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := fedstreampb.NewDataPlaneClient(conn).FetchSlots(ctx, req)
	if err != nil {
		return nil, err
	}
	var data []byte
	for first := true; ; first = false {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return data, nil
			}
			return nil, err
		}
		if first {
			data = make([]byte, 0, min(msg.TotalBytes, 1<<30))
		}
		data = append(data, msg.Data...)
	}
}

// inputEnded reports whether the task took in's stream to its end (the
// final boundary): its DCAA machine, or its merger.
func (t *task) inputEnded(in *input) bool {
	if t.dm != nil {
		return in.endTaken.Load()
	}
	return t.merge.inputBoundary(in.idx) >= finalBoundary
}

// releasedAt is the watermark of the task's last release: its DCAA
// machine's, or its merger's. The caller holds proc for a DCAA task.
func (t *task) releasedAt() int64 {
	if t.dm != nil {
		return t.dm.m.Released()
	}
	return t.merge.releasedAt()
}

// pokeRelease wakes whatever releases the task's input.
func (t *task) pokeRelease() {
	if t.dm != nil {
		t.dm.poke()
		return
	}
	t.merge.poke()
}

// kickRelease makes the task release what its merger holds ready after a
// hold or cut changed, and returns once that is done or handed on. The
// caller must not hold proc.
//
// A task with a single input processes inline: only a delivery makes it
// release (nobody reads the merger's wake channel). A hold that comes
// once the input has delivered the end of its stream keeps the rest
// unreleased, and when the hold is lifted or becomes a cut no delivery
// follows: the stream is complete. So once the input has delivered the
// final boundary, the lifter processes the releases itself (under proc,
// as a delivery would; no more input comes, so that work is bounded).
// Before it, a delivery still comes, and the input processes (a delivery
// that added the final boundary before the caller changed the hold is
// seen here, by the merger's lock order). When the releases reach the
// final boundary, the input's subscription, which would wait forever on
// a stream that has ended, is ended too.
//
// Before the end, a delivery is not certain to come either: under flow
// control the upstream may be blocked on another of its consumers that
// waits, through the readers, for this task's output (a partition a
// rescale added, lifted at the cut with its input's tuples above the cut
// queued, while the upstream waits for room at an old partition whose
// reader waits for the added partition's boundaries). So the releases are
// processed here too, on a goroutine of the task: they may wait for room
// downstream, and the caller may be a rescale step.
func (t *task) kickRelease() {
	if t.inline() == nil || t.dm != nil {
		t.pokeRelease()
		return
	}
	if t.merge.inputBoundary(0) != finalBoundary {
		// One goroutine at a time: passCut kicks every 2 ms while the
		// task works through a backlog below the cut, and a goroutine per
		// kick, each waiting for proc, piled up for as long as a release
		// took (blocked on a full output: without end). A kick that comes
		// while one runs makes it look again before it ends.
		t.rs.kicked.Store(true)
		if !t.rs.lifting.CompareAndSwap(false, true) {
			return
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			for {
				for t.rs.kicked.Swap(false) {
					t.processLifted()
				}
				t.rs.lifting.Store(false)
				// A kick after the last Swap that found lifting set is
				// ours to run.
				if !t.rs.kicked.Load() || !t.rs.lifting.CompareAndSwap(false, true) {
					return
				}
			}
		}()
		return
	}
	t.processLifted()
}

// processLifted processes, for kickRelease, the releases ready after a
// hold or cut was lifted.
func (t *task) processLifted() {
	if t.ctx.Err() != nil {
		return
	}
	em := t.inline()
	if em == nil {
		// Switched to its merge goroutine meanwhile: that one releases.
		t.pokeRelease()
		return
	}
	done, err := t.processReleases(t.ctx, em)
	if err != nil {
		t.endWith(err)
		return
	}
	if done {
		t.setState(StateRunning, "input exhausted")
		for _, in := range t.inputs {
			in.stopAttempt()
		}
	}
}

// inlineDone reports that the task processes inline and released its
// final boundary: its only input has nothing more to read.
func (t *task) inlineDone() bool {
	return t.inline() != nil && t.merge != nil && t.merge.releasedAt() == finalBoundary
}
