package coordinator

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc/states"
)

// Worker statuses as stored in the workers table (spelled in rpc/states).
// Tasks on an unknown worker stay where they are (it may well be alive)
// but it is given no new task until it is heard from.
const (
	statusReady   = fsm.WorkerStatusReady
	statusDown    = fsm.WorkerStatusDown
	statusUnknown = fsm.WorkerStatusUnknown
)

// tasksPerCore bounds how many tasks a worker is given per core it reports.
const tasksPerCore = 16

// zoneLabel is the worker label placement spreads replicas across.
const zoneLabel = "zone"

// partitionKey identifies the replicas of one partition: no two may share a
// worker.
type partitionKey struct {
	query, fragment string
	partition       int
}

// placer is the scheduler's view of the cluster while it places a batch of
// tasks. Placement is a pure function of its inputs, so a test can replay it.
type placer struct {
	ready  []*fsm.Worker
	load   map[string]int                   // worker id -> tasks placed
	hosts  map[partitionKey]map[string]bool // partition -> workers hosting a replica
	zones  map[partitionKey]map[string]bool // partition -> zones hosting a replica
	zoneOf map[string]string
}

func newPlacer(workers []*fsm.Worker, tasks []*fsm.Task) *placer {
	p := &placer{
		load:   map[string]int{},
		hosts:  map[partitionKey]map[string]bool{},
		zones:  map[partitionKey]map[string]bool{},
		zoneOf: map[string]string{},
	}
	readySet := map[string]bool{}
	for _, w := range workers {
		// A partner org's worker record takes only the tasks moved there
		// under a contract (xorg_move.go), never an ordinary placement.
		if w.Status == statusReady && !isPartnerWorker(w) {
			p.ready = append(p.ready, w)
			readySet[w.ID] = true
			p.zoneOf[w.ID] = w.Labels[zoneLabel]
		}
	}
	sort.Slice(p.ready, func(i, j int) bool { return p.ready[i].ID < p.ready[j].ID })
	for _, t := range tasks {
		if t.WorkerID != "" && readySet[t.WorkerID] {
			p.add(t, t.WorkerID)
		}
	}
	return p
}

// reserve counts tasks placed outside the org's task table (partners'
// tasks hosted here) against their workers' capacity.
func (p *placer) reserve(perWorker map[string]int) {
	for w, n := range perWorker {
		p.load[w] += n
	}
}

func keyOf(t *fsm.Task) partitionKey { return partitionKey{t.Query, t.Fragment, t.Partition} }

func (p *placer) add(t *fsm.Task, worker string) {
	k := keyOf(t)
	if p.hosts[k] == nil {
		p.hosts[k] = map[string]bool{}
		p.zones[k] = map[string]bool{}
	}
	p.hosts[k][worker] = true
	if z := p.zoneOf[worker]; z != "" {
		p.zones[k][z] = true
	}
	p.load[worker]++
}

// pick chooses the worker for t: a ready worker with spare capacity that
// hosts no other replica of t's partition, preferring a zone that hosts none
// either, then the lowest load per core, then the lowest id. "" if none
// fits; then why says why, for the task's status message.
func (p *placer) pick(t *fsm.Task) (worker, why string) {
	k := keyOf(t)
	var best *fsm.Worker
	var bestNewZone bool
	var bestLoad float64
	hosting, full := 0, 0
	for _, w := range p.ready {
		if p.hosts[k][w.ID] {
			hosting++
			continue
		}
		cores := max(int(w.Cores), 1)
		if p.load[w.ID] >= cores*tasksPerCore {
			full++
			continue
		}
		z := p.zoneOf[w.ID]
		newZone := z == "" || !p.zones[k][z]
		load := float64(p.load[w.ID]) / float64(cores)
		better := best == nil ||
			(newZone && !bestNewZone) ||
			(newZone == bestNewZone && load < bestLoad)
		if better {
			best, bestNewZone, bestLoad = w, newZone, load
		}
	}
	if best == nil {
		return "", p.whyNot(hosting, full)
	}
	p.add(t, best.ID)
	return best.ID, ""
}

// whyNot explains a task that fits on no ready worker: hosting of them
// run another replica of its partition, full are at capacity.
func (p *placer) whyNot(hosting, full int) string {
	switch {
	case len(p.ready) == 0:
		return "waiting for a ready worker: the org has none"
	case full == 0:
		return fmt.Sprintf("waiting for a ready worker: replicas of a partition run on different workers, and all %d ready workers already run one of this partition", len(p.ready))
	case hosting == 0:
		return fmt.Sprintf("waiting for capacity: all %d ready workers run %d tasks per core already", len(p.ready), tasksPerCore)
	}
	return fmt.Sprintf("waiting for a ready worker: of %d ready workers, %d run a replica of this partition and %d are at capacity (%d tasks per core)", len(p.ready), hosting, full, tasksPerCore)
}

// replace plans the placement changes for tasks that are unplaced or sit
// on a down (or removed) worker, each naming where and at which
// generation it was seen. A task that fits nowhere is unassigned from its
// down worker (so status shows it pending) with a message saying why, and
// retried on the next change. Tasks on an unknown worker stay.
//
// hosted counts, per worker, partners' tasks hosted there (they take
// capacity like the org's own). handOver says whether (and how) a task
// leaves a down worker as a live move (see handOver).
func replace(workers []*fsm.Worker, tasks []*fsm.Task, hosted map[string]int, ho handOver) []fsm.PlannedPlacement {
	keep, ready, down := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, w := range workers {
		switch w.Status {
		case statusReady, statusUnknown:
			keep[w.ID] = true
			ready[w.ID] = w.Status == statusReady
		case statusDown:
			down[w.ID] = true
		}
	}
	p := newPlacer(workers, tasks)
	p.reserve(hosted)
	var moves []fsm.PlannedPlacement
	for _, t := range tasks {
		if t.WorkerID != "" && keep[t.WorkerID] {
			continue
		}
		if t.MovingFrom != "" && ho.rollBack != nil && ho.rollBack(t) {
			// A live move's new copy on a down worker: the move is
			// rolled back to its old copy (boundMoves), which may well
			// run on; placed again from here, the next copy would
			// start without the old copy's state.
			continue
		}
		to, why := p.pick(t)
		if to == t.WorkerID && (to != "" || why == t.Message) {
			continue
		}
		pl := fsm.PlannedPlacement{TaskID: t.ID, FromWorker: t.WorkerID, FromGeneration: t.Gen(), ToWorker: to, Message: why}
		// A worker is declared down when its heartbeats stop arriving,
		// which a starved or partitioned worker shares with a dead one:
		// its copies may well run on. Without a peer replica to take a
		// snapshot from, the next copy would start without state and
		// replay from upstream buffers that no longer hold what the old
		// copy acknowledged: results lost although nothing died. So it
		// leaves as a live move: it takes the old copy's snapshot (with
		// the old copy's untaken output), consumers read the old copy
		// until it has, and a copy that is really gone fails the fetch
		// and replays, as before, naming what it lost.
		if ho.live && to != "" && down[t.WorkerID] && t.MovingFrom == "" && !t.Lossy && snapshotPeer(t, tasks, func(id string) bool { return ready[id] }) == nil {
			pl.Live, pl.CatchUp = true, ho.catchUp
		}
		moves = append(moves, pl)
	}
	return inOrder(moves, tasks, ho)
}

// streamMoves is the view of the live moves under way against which a
// live move is checked before it starts: by the scheduler (inOrder), by
// task move, and by the plan applier, which re-checks every plan against
// the latest state, so that two moves planned at once (two task move
// calls, or one racing the re-placement of a down worker's tasks) cannot
// both start.
//
// The invariant: a task's live move never ends while one of its
// consumers runs two copies that take input. A move's end switches every
// consumer of the task to the new copy at once, and the two copies of a
// moving consumer reach it at different times: the first acknowledges
// there what the other has not taken yet, the new producer copy discards
// it (it holds for each subscriber it has seen, not for a copy it has not
// heard of), and the other copy resumes after a gap: input lost, the
// results depending on it with it (a runtime test driving that order
// lost input in 4 of 8 runs). Acknowledgements are keyed by the caller's
// identity, so the producer cannot hold for a copy on another worker.
//
// A stop-and-copy move (fsm.Task.MoveHalt) keeps one copy taking input:
// the new copy's snapshot halts the old copy, which processes and
// acknowledges nothing after the snapshot's input positions, and the new
// copy pins its upstreams before the snapshot (worker/runtime
// pinUpstreams), so whichever copy of a producer it then reads holds
// every tuple after those positions. Such a consumer may switch
// producers at any time.
//
// A placement that is not live (a task placed again from a down worker
// from a peer replica's snapshot or replaying, a lossy replica replaced)
// starts a new copy of the task that its consumers reach as they reach
// a live move's new copy at its end: a consumer running two copies that
// take input loses input there the same way. Its own consumers run one
// copy: it is safe next to a moving producer, as a stop-and-copy move.
//
// Since when a move ends depends on its new copy (catch-up, the catch-up
// bound), not on the plan, the rule is enforced where moves and
// placements start: a live move or placement of task t (placed on a
// worker now) onto another worker is made only while
//   - no task t reads from is in a live move, unless t's move is
//     stop-and-copy or not live, and
//   - no task reading from t is in a live move that is not stop-and-copy.
//
// A wait for a consumer's move is bounded: a live move that leaves its
// old copy running ends, or is rolled back, within Timings.MoveStartBound
// + Timings.MoveCatchUpBound (boundMoves). Not covered: a task that has
// no copy now (unplaced, or a partition a rescale adds) placed while a
// consumer of it moves live.
type streamMoves struct {
	inputs  func(*fsm.Task) []string
	moving  map[fragmentKey][]*fsm.Task // a fragment's tasks in a live move
	reading map[fragmentKey][]*fsm.Task // tasks reading a fragment, in a live move, not stop-and-copy
}

type fragmentKey struct{ query, name string }

// newStreamMoves indexes the live moves of tasks. inputs gives the
// fragments a task reads (nil: not known; nothing is blocked).
func newStreamMoves(tasks []*fsm.Task, inputs func(*fsm.Task) []string) *streamMoves {
	m := &streamMoves{inputs: inputs, moving: map[fragmentKey][]*fsm.Task{}, reading: map[fragmentKey][]*fsm.Task{}}
	for _, t := range tasks {
		if t.MovingFrom != "" {
			m.add(t, true)
		}
	}
	return m
}

// add records t as in a live move (stop-and-copy if t.MoveHalt); reads
// says whether it counts as a moving consumer of its inputs too.
func (m *streamMoves) add(t *fsm.Task, reads bool) {
	if m.inputs == nil {
		return
	}
	k := fragmentKey{t.Query, t.Fragment}
	m.moving[k] = append(m.moving[k], t)
	if !reads || t.MoveHalt {
		return
	}
	for _, in := range m.inputs(t) {
		k := fragmentKey{t.Query, in}
		m.reading[k] = append(m.reading[k], t)
	}
}

// blocking returns the live moves under way that keep a live move of t
// (halt: stop-and-copy) from starting now: up, of tasks t reads from
// (none for a stop-and-copy move), and down, of tasks reading from t.
func (m *streamMoves) blocking(t *fsm.Task, halt bool) (up, down []*fsm.Task) {
	if m.inputs == nil {
		return nil, nil
	}
	for _, d := range m.reading[fragmentKey{t.Query, t.Fragment}] {
		if d.ID != t.ID {
			down = append(down, d)
		}
	}
	if halt {
		return nil, down
	}
	for _, in := range m.inputs(t) {
		for _, u := range m.moving[fragmentKey{t.Query, in}] {
			if u.ID != t.ID {
				up = append(up, u)
			}
		}
	}
	return up, down
}

// neighbourMoveText says why a live move of t cannot start now (up and
// down as blocking returns them), naming the first moving neighbour.
func neighbourMoveText(t *fsm.Task, up, down []*fsm.Task) string {
	var n *fsm.Task
	var how string
	if len(up) > 0 {
		n, how = up[0], fmt.Sprintf("task %s reads from task %s, which", t.ID, up[0].ID)
	} else {
		n, how = down[0], fmt.Sprintf("task %s, which reads from task %s,", down[0].ID, t.ID)
	}
	more := ""
	if k := len(up) + len(down) - 1; k > 0 {
		more = fmt.Sprintf(" (and %d more task(s) next to it in the stream)", k)
	}
	if n.MovingFrom == "" {
		// Placed again, not live, earlier in the same plan.
		return fmt.Sprintf("%s is placed again on %s in this plan%s: a task does not move live while a task it reads from gets a new copy; wait until it has",
			how, whereOf(n.WorkerID), more)
	}
	return fmt.Sprintf("%s is in a live move from %s to %s%s: a producer and its consumer never move live at once, nor is a producer placed again while its consumer moves live; wait until that move has ended",
		how, whereOf(n.MovingFrom), whereOf(n.WorkerID), more)
}

func whereOf(worker string) string {
	if worker == "" {
		return "nowhere"
	}
	return "worker " + worker
}

// inOrder drops from moves the live moves that must wait for another
// move to end first (see streamMoves), so that a producer and its
// consumer leaving one worker declared down move one after the other,
// the producer first: a live move waits while a task it reads from is in
// a live move (or starts one, or is placed again, in this plan), and
// while a task that reads from it is in a live move. A placement that is
// not live waits while a task that reads from it is in a live move, for
// as long as it lasts (it ends or is rolled back within its bounds, see
// boundMoves). The scheduler plans again when a move ends (the task
// table changes).
//
// ho.hold says whether the move of a task may still wait (nil: always),
// told whether every move it waits for has its new copy running (such a
// move ends within the catch-up bound). A move that never ends (its new
// copy never runs) must not keep a consumer on a down worker for ever,
// and must not make it move live next to it either: past the wait, a
// move that waits only for producers goes ahead stop-and-copy (ho.halt:
// every coordinator applies it), which is safe next to them. One that
// waits for a consumer's move keeps waiting: no hand-over of a producer
// is safe while its consumer runs two copies, and that move ends by
// itself once its new copy runs (catch-up or its bound) or stalls.
func inOrder(moves []fsm.PlannedPlacement, tasks []*fsm.Task, ho handOver) []fsm.PlannedPlacement {
	if ho.inputs == nil {
		return moves
	}
	sm := newStreamMoves(tasks, ho.inputs)
	byID := make(map[string]*fsm.Task, len(tasks))
	for _, t := range tasks {
		byID[t.ID] = t
	}
	// The plan's own live moves and placements hold back their consumers
	// (not their producers: those go first), as moves whose new copy does
	// not run.
	for _, m := range moves {
		t := byID[m.TaskID]
		switch {
		case t == nil:
		case m.Live:
			planned := *t
			planned.State, planned.MovingFrom = "", m.FromWorker
			sm.add(&planned, false)
		case replaces(m):
			planned := *t
			planned.State, planned.MovingFrom, planned.WorkerID = "", "", m.ToWorker
			sm.add(&planned, false)
		}
	}
	kept := moves[:0]
	for _, m := range moves {
		t := byID[m.TaskID]
		if t != nil && !m.Live && replaces(m) {
			// Waits while a consumer of it moves live (see streamMoves):
			// that move ends or is rolled back within its bounds.
			if _, down := sm.blocking(t, true); len(down) > 0 {
				ho.note(m.TaskID, "a placement held back while a consumer of the task is in a live move: placing it now could lose that consumer's input",
					"task", m.TaskID, "reason", neighbourMoveText(t, nil, down))
				continue
			}
		}
		if !m.Live || t == nil {
			kept = append(kept, m)
			continue
		}
		up, down := sm.blocking(t, m.Halt)
		if len(up)+len(down) == 0 {
			kept = append(kept, m)
			continue
		}
		running := true
		for _, n := range append(up, down...) {
			running = running && (n.State == states.TaskRunning || n.State == states.TaskStalled)
		}
		if ho.hold == nil || ho.hold(m.TaskID, running) {
			continue
		}
		if len(down) == 0 && ho.halt {
			ho.note(m.TaskID, "a live move held back for its producer's move goes ahead stop-and-copy: that move has not ended within the wait",
				"task", m.TaskID, "producer", up[0].ID, "producer_state", up[0].State)
			m.Halt = true
			kept = append(kept, m)
			continue
		}
		why := "a consumer of it is in a live move"
		if len(down) == 0 {
			why = "stop-and-copy moves need every coordinator at protocol " + fmt.Sprint(fsm.HaltMoveProtocol)
		}
		ho.note(m.TaskID, "a live move held back for a neighbour's move keeps waiting past the wait: "+why+"; moving now could lose input",
			"task", m.TaskID, "reason", neighbourMoveText(t, up, down))
	}
	return kept
}

// replaces reports whether placement m starts a new copy of a task that
// has one now, on another worker.
func replaces(m fsm.PlannedPlacement) bool {
	return m.FromWorker != "" && m.ToWorker != "" && m.ToWorker != m.FromWorker
}

// handOver is how replace moves tasks off down workers: live (a live
// move from the old copy, when no peer replica can give the new copy
// its state), catchUp (consumers switch once the new copy has caught
// up with the old) and halt (stop-and-copy moves, see inOrder). Each
// needs every coordinator to know it (live placements: protocol 4,
// catch-up: protocol 5, stop-and-copy: protocol 12).
//
// inputs gives the fragments a task reads, by which live moves of a
// producer and its consumer are made one after the other (inOrder); nil:
// not known. hold and log serve inOrder (either may be nil). rollBack
// says whether a live move whose new copy's worker is down is rolled
// back (Server.rollsBack) rather than placed again (nil: never).
type handOver struct {
	live, catchUp, halt bool
	inputs              func(*fsm.Task) []string
	hold                func(id string, running bool) bool
	log                 func(id, msg string, args ...any)
	rollBack            func(*fsm.Task) bool
}

func (ho handOver) note(id, msg string, args ...any) {
	if ho.log != nil {
		ho.log(id, msg, args...)
	}
}

// moveOrderWait bounds how long inOrder holds a live move back while a
// move it waits for has no running new copy: a live copy fetches its
// snapshot and starts within seconds, and one that does not (it never
// runs) must not keep its neighbours on a down worker. Once the new
// copies run, their moves end within the catch-up bound
// (boundMoves), which the wait gets on top. Past it a move that
// waits only for producers goes ahead stop-and-copy (see inOrder).
const moveOrderWait = 10 * time.Second

// moveOrder remembers, on the leader, since when each live move inOrder
// held back has waited, and what it logged of it.
type moveOrder struct {
	mu     sync.Mutex
	since  map[string]time.Time // task id -> first held back
	logged map[string]string    // task id -> the last message logged
}

// hold reports whether the live move of task id may wait longer (up to
// moveOrderWait, plus catchUp when the moves it waits for have their new
// copies running), and records the wait's start the first time.
func (o *moveOrder) hold(id string, running bool, catchUp time.Duration, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since == nil {
		o.since = map[string]time.Time{}
	}
	for k, at := range o.since {
		if now.Sub(at) > 10*(moveOrderWait+catchUp) {
			delete(o.since, k) // long moved
			delete(o.logged, k)
		}
	}
	first, ok := o.since[id]
	if !ok {
		o.since[id] = now
		return true
	}
	limit := moveOrderWait
	if running {
		limit += catchUp
	}
	return now.Sub(first) < limit
}

// logOnce logs msg for task id at warning level unless it was the last
// message logged for it (the scheduler plans again at every change).
func (o *moveOrder) logOnce(log *slog.Logger, id, msg string, args ...any) {
	o.mu.Lock()
	if o.logged == nil {
		o.logged = map[string]string{}
	}
	same := o.logged[id] == msg
	o.logged[id] = msg
	o.mu.Unlock()
	if !same {
		log.Warn(msg, args...)
	}
}

// next is when the first held move stops waiting (zero: none waits).
func (o *moveOrder) next(now time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	var at time.Time
	for _, first := range o.since {
		if end := first.Add(moveOrderWait); end.After(now) && (at.IsZero() || end.Before(at)) {
			at = end
		}
	}
	return at
}

// handOverNow is the handOver every coordinator of the org can apply.
func (s *Server) handOverNow() handOver {
	return handOver{live: s.checkProtocol(4, "a live placement") == nil, catchUp: s.checkProtocol(catchUpProtocol, "a live move that waits for catch-up") == nil,
		halt:   s.checkProtocol(fsm.HaltMoveProtocol, "a stop-and-copy move") == nil,
		inputs: s.taskInputs(), hold: func(id string, running bool) bool {
			return s.moveOrder.hold(id, running, s.cfg.Timings.MoveCatchUpBound, time.Now())
		},
		log:      func(id, msg string, args ...any) { s.moveOrder.logOnce(s.logger, id, msg, args...) },
		rollBack: s.rollsBack}
}

// taskInputs returns a function giving the fragments a task reads, from
// its query's plan (nil when the query or its plan is not known: a task
// reading nothing known waits for no move).
func (s *Server) taskInputs() func(*fsm.Task) []string {
	st := s.State()
	return func(t *fsm.Task) []string {
		q, err := st.Query(nil, t.Query)
		if err != nil || q == nil {
			return nil
		}
		if plan := s.plans.plan(q); plan != nil {
			if n := plan.Node(t.Fragment); n != nil {
				return n.Inputs
			}
		}
		return nil
	}
}
