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
	return inOrder(moves, tasks, ho.inputs, ho.hold)
}

// inOrder drops from moves the live moves that must wait for another
// move to end first, so that a producer and its consumer leaving one
// worker declared down move one after the other, the producer first.
//
// The invariant: a task's live move never ends while one of its
// consumers runs two copies (is in a live move itself). A move's end
// switches every consumer of the task to the new copy at once, and the
// two copies of a moving consumer reach it at different times: the
// first acknowledges there what the other has not taken yet, the new
// producer copy discards it (it holds for each subscriber it has seen,
// not for a copy it has not heard of), and the other copy resumes after
// a gap: input lost, the results depending on it with it (a runtime
// test driving that order lost input in 4 of 8 runs). One at a time,
// a consumer has one copy when its upstream switches, and its new copy
// registers with the new upstream copy before its snapshot (see
// worker/runtime pinUpstreams).
//
// So a live move is left for a later plan while a task it reads from
// is in a live move (or starts one in this plan), and while a task that
// reads from it is in a live move. The scheduler plans again when a move
// ends (the task table changes). inputs gives the fragments a task reads
// (nil: not known; nothing waits). hold says whether the move of a task
// may still wait (nil: always), told whether every move it waits for has
// its new copy running (such a move ends within the catch-up bound): a
// move that never ends (its new copy never runs) must not keep its
// neighbours on a down worker for ever.
func inOrder(moves []fsm.PlannedPlacement, tasks []*fsm.Task, inputs func(*fsm.Task) []string, hold func(id string, running bool) bool) []fsm.PlannedPlacement {
	if inputs == nil {
		return moves
	}
	type fragment struct{ query, name string }
	byID := make(map[string]*fsm.Task, len(tasks))
	// A fragment's moves: whether one is under way (or starts here), and
	// whether every one under way has its new copy running.
	type under struct{ any, running bool }
	moving := map[fragment]under{}     // moves of its tasks
	readMoving := map[fragment]under{} // moves of the tasks reading it
	add := func(m map[fragment]under, f fragment, running bool) {
		cur, seen := m[f]
		m[f] = under{any: true, running: running && (!seen || cur.running)}
	}
	for _, t := range tasks {
		byID[t.ID] = t
		if t.MovingFrom != "" {
			running := t.State == states.TaskRunning || t.State == states.TaskStalled
			add(moving, fragment{t.Query, t.Fragment}, running)
			for _, in := range inputs(t) {
				add(readMoving, fragment{t.Query, in}, running)
			}
		}
	}
	for _, m := range moves {
		if t := byID[m.TaskID]; m.Live && t != nil {
			add(moving, fragment{t.Query, t.Fragment}, false)
		}
	}
	kept := moves[:0]
	for _, m := range moves {
		t := byID[m.TaskID]
		if m.Live && t != nil {
			wait := readMoving[fragment{t.Query, t.Fragment}]
			for _, in := range inputs(t) {
				if up := moving[fragment{t.Query, in}]; up.any {
					wait = under{any: true, running: up.running && (!wait.any || wait.running)}
				}
			}
			if wait.any && (hold == nil || hold(m.TaskID, wait.running)) {
				continue
			}
		}
		kept = append(kept, m)
	}
	return kept
}

// handOver is how replace moves tasks off down workers: live (a live
// move from the old copy, when no peer replica can give the new copy
// its state), and catchUp (consumers switch once the new copy has caught
// up with the old). Each needs every coordinator to know it (live
// placements: protocol 4, catch-up: protocol 5).
//
// inputs gives the fragments a task reads, by which live moves of a
// producer and its consumer are made one after the other (inOrder); nil:
// not known.
type handOver struct {
	live, catchUp bool
	inputs        func(*fsm.Task) []string
	hold          func(id string, running bool) bool
}

// moveOrderWait bounds how long inOrder holds a live move back while a
// move it waits for has no running new copy: a live copy fetches its
// snapshot and starts within seconds, and one that does not (it never
// runs) must not keep its neighbours on a down worker. Once the new
// copies run, their moves end within the catch-up bound
// (boundMoveCatchUps), which the wait gets on top. Past it the move goes
// ahead, with a warning: the producer's and its consumer's moves may
// then overlap as before session 19.
const moveOrderWait = 10 * time.Second

// moveOrder remembers, on the leader, since when each live move inOrder
// held back has waited.
type moveOrder struct {
	mu    sync.Mutex
	since map[string]time.Time // task id -> first held back
}

// hold reports whether the live move of task id may wait longer (up to
// moveOrderWait, plus catchUp when the moves it waits for have their new
// copies running), and records the wait's start the first time.
func (o *moveOrder) hold(log *slog.Logger, id string, running bool, catchUp time.Duration, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since == nil {
		o.since = map[string]time.Time{}
	}
	for k, at := range o.since {
		if now.Sub(at) > 10*(moveOrderWait+catchUp) {
			delete(o.since, k) // long moved
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
	if now.Sub(first) < limit {
		return true
	}
	log.Warn("moving a task live although a task it reads from, or one reading from it, is still moving: input may be lost at the producer's switch",
		"task", id, "waited", now.Sub(first).Round(time.Millisecond))
	return false
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
		inputs: s.taskInputs(), hold: func(id string, running bool) bool {
			return s.moveOrder.hold(s.logger, id, running, s.cfg.Timings.MoveCatchUpBound, time.Now())
		}}
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
