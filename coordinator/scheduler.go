package coordinator

import (
	"fmt"
	"sort"

	"github.com/fedstream/fedstream/fsm"
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
// capacity like the org's own).
func replace(workers []*fsm.Worker, tasks []*fsm.Task, hosted map[string]int) []fsm.PlannedPlacement {
	keep := map[string]bool{}
	for _, w := range workers {
		if w.Status == statusReady || w.Status == statusUnknown {
			keep[w.ID] = true
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
		moves = append(moves, fsm.PlannedPlacement{TaskID: t.ID, FromWorker: t.WorkerID, FromGeneration: t.Gen(), ToWorker: to, Message: why})
	}
	return moves
}
