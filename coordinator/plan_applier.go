package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/fedstream/fedstream/fsm"
)

// The plan applier is the single writer of placements and slot maps.
//
// Managers (query submit, the re-placement loop, and later moves,
// rescales and the health, load and reconfiguration managers) compute a
// plan from the state they read and submit it with submitPlan. One
// goroutine, owned by the leader's duties and stopped with them, takes the
// plans one at a time, re-checks each against the current state, and
// proposes the valid part as one ApplyPlan entry; the refused part comes
// back with reasons, is logged, and is stored as the pending reason of
// any refused task that waits unplaced. Because plans are serialised and
// each placement names where and at which generation its planner saw the
// task, two managers racing on one task cannot both win: the second finds
// the task moved and is refused as stale. The FSM checks the deterministic
// invariants once more when it applies the entry.

// ErrNoPlanApplier is returned by submitPlan when this coordinator runs no
// plan applier: it is not the leader, or its leader duties have not
// started yet or have stopped.
var ErrNoPlanApplier = errors.New("no plan applier: this coordinator is not the active leader")

// planOutcome is what became of a submitted plan.
type planOutcome struct {
	// Index is the log index at which the plan committed; 0 when nothing
	// was left to propose.
	Index uint64
	// Result lists what was placed and every refusal, the applier's and
	// the FSM's, with its reason.
	Result *fsm.PlanResult
}

type planReply struct {
	out *planOutcome
	err error
}

type planRequest struct {
	plan fsm.ApplyPlanRequest
	// step, when set, runs in the applier's turn instead of a plan: a
	// placement the plan format does not carry (a partner's task hosted
	// here, xorg_move.go), serialised with every plan.
	step  func(ctx context.Context) error
	reply chan planReply // buffered: the applier never blocks on it
}

type planApplier struct {
	s     *Server
	queue chan planRequest
	done  chan struct{} // closed when run returns
}

// startPlanApplier installs this node's plan applier and returns the
// function that serves it until ctx ends (leadership lost or the server
// shutting down). The leader's duties call it before starting the loops
// that submit plans, so that none of them finds no applier, and run the
// returned function on a goroutine they own.
func (s *Server) startPlanApplier() func(ctx context.Context) {
	pa := &planApplier{s: s, queue: make(chan planRequest), done: make(chan struct{})}
	s.applier.Store(pa)
	return pa.run
}

// run serves plans one at a time until ctx ends, then uninstalls the
// applier; plans still waiting get ErrNoPlanApplier.
func (pa *planApplier) run(ctx context.Context) {
	defer func() {
		pa.s.applier.CompareAndSwap(pa, nil)
		close(pa.done)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case req := <-pa.queue:
			if req.step != nil {
				req.reply <- planReply{nil, req.step(ctx)}
				continue
			}
			out, err := pa.apply(ctx, req.plan)
			req.reply <- planReply{out, err}
		}
	}
}

// submitPlan hands a plan to the leader's plan applier and waits for its
// outcome. Errors: ErrNoPlanApplier, ctx's error, or the commit's error
// (then the plan may or may not have committed).
func (s *Server) submitPlan(ctx context.Context, plan fsm.ApplyPlanRequest) (*planOutcome, error) {
	pa := s.applier.Load()
	if pa == nil {
		return nil, ErrNoPlanApplier
	}
	req := planRequest{plan: plan, reply: make(chan planReply, 1)}
	select {
	case pa.queue <- req:
	case <-pa.done:
		return nil, ErrNoPlanApplier
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r.out, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// inApplier runs step in the plan applier's turn, so that what it reads
// and commits cannot interleave with a plan. Errors: ErrNoPlanApplier,
// ctx's error, or step's.
func (s *Server) inApplier(ctx context.Context, step func(ctx context.Context) error) error {
	pa := s.applier.Load()
	if pa == nil {
		return ErrNoPlanApplier
	}
	req := planRequest{step: step, reply: make(chan planReply, 1)}
	select {
	case pa.queue <- req:
	case <-pa.done:
		return ErrNoPlanApplier
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// apply re-checks one plan against the current state and commits its
// valid part.
func (pa *planApplier) apply(ctx context.Context, plan fsm.ApplyPlanRequest) (*planOutcome, error) {
	s := pa.s
	st := s.State()
	workers, err := st.Workers(nil)
	if err != nil {
		return nil, fmt.Errorf("plan from %s: read workers: %w", plan.Source, err)
	}
	tasks, err := st.Tasks(nil)
	if err != nil {
		return nil, fmt.Errorf("plan from %s: read tasks: %w", plan.Source, err)
	}
	if need := plan.Protocol(); need > 3 {
		// An older coordinator would ignore the plan's newer fields and
		// apply it differently: propose it only once every one knows them.
		if err := s.checkProtocol(need, fmt.Sprintf("a %s plan with live moves or rescale steps", plan.Source)); err != nil {
			return nil, err
		}
	}
	check := newPlanCheck(workers, tasks, tasksPerCore)
	// Live moves next to one another in a stream: re-checked here, on the
	// latest state, where plans are serialised (see streamMoves).
	check.moves = newStreamMoves(tasks, s.taskInputs())
	// Partners' tasks hosted here take capacity too.
	for w, n := range s.hostedLoad() {
		check.load[w] += n
	}
	valid := fsm.ApplyPlanRequest{Source: plan.Source, StateIndex: plan.StateIndex, TasksPerCore: tasksPerCore, ZoneLabel: zoneLabel,
		NewTasks: plan.NewTasks, RemoveTasks: plan.RemoveTasks}
	for _, nt := range plan.NewTasks {
		id := fsm.TaskID(nt.Query, nt.Fragment, nt.Partition, nt.Replica)
		if check.tasks[id] == nil {
			check.tasks[id] = &fsm.Task{ID: id, Query: nt.Query, Fragment: nt.Fragment, Partition: nt.Partition, Replica: nt.Replica,
				Generation: max(int(nt.ScaleEpoch), 1), ScaleEpoch: nt.ScaleEpoch}
		}
	}
	var refused []fsm.PlanRefusal
	for _, p := range plan.Placements {
		if why := check.check(p); why != "" {
			refused = append(refused, fsm.PlanRefusal{TaskID: p.TaskID, Reason: why})
			// A refused task that waits unplaced shows why.
			if t := check.tasks[p.TaskID]; t != nil && t.WorkerID == "" && t.Message != why {
				valid.Placements = append(valid.Placements, fsm.PlannedPlacement{TaskID: t.ID, FromGeneration: t.Gen(), Message: why})
			}
			continue
		}
		check.commit(p)
		valid.Placements = append(valid.Placements, p)
	}
	maps, mapRefusals := pa.slotMaps(plan.SlotMaps)
	valid.SlotMaps = maps
	refused = append(refused, mapRefusals...)

	out := &planOutcome{Result: &fsm.PlanResult{}}
	if len(valid.Placements) > 0 || len(valid.SlotMaps) > 0 || len(valid.NewTasks) > 0 || len(valid.RemoveTasks) > 0 {
		res, err := s.apply(ctx, fsm.ApplyPlanType, valid)
		if err != nil {
			s.logger.Error("committing plan failed", "source", plan.Source, "err", err)
			return nil, err
		}
		if res.Err != nil {
			s.logger.Error("plan rejected by the state machine", "source", plan.Source, "err", res.Err)
			return nil, res.Err
		}
		out.Index = res.Index
		if r, ok := res.Value.(*fsm.PlanResult); ok {
			out.Result = r
		}
	}
	out.Result.Refused = append(refused, out.Result.Refused...)
	pa.s.metrics.plans.WithLabelValues(plan.Source).Inc()
	pa.s.metrics.placed.Add(float64(len(out.Result.Placed)))
	for _, r := range out.Result.Refused {
		pa.s.metrics.refused.WithLabelValues(refusalReason(r)).Inc()
	}
	if len(out.Result.Placed) > 0 || len(out.Result.SlotMaps) > 0 {
		s.logger.Info("plan applied", "source", plan.Source, "computed_at", plan.StateIndex, "index", out.Index,
			"placed", len(out.Result.Placed), "slot_maps", out.Result.SlotMaps)
	}
	if len(out.Result.Refused) > 0 {
		s.logger.Warn("plan partly refused", "source", plan.Source, "computed_at", plan.StateIndex,
			"refused", len(out.Result.Refused), "reasons", out.Result.RefusedText())
	}
	return out, nil
}

// slotMaps re-checks the plan's slot map updates and adds the initial map
// of every keyed fragment of a running query that has none yet for its
// current definition (see missingSlotMaps). Creating them here, inside the
// one applier, means no two plans ever race to create the same map.
func (pa *planApplier) slotMaps(updates []fsm.SlotMapUpdate) ([]fsm.SlotMapUpdate, []fsm.PlanRefusal) {
	st := pa.s.State()
	var out []fsm.SlotMapUpdate
	var refused []fsm.PlanRefusal
	planned := map[[2]string]bool{}
	for _, u := range updates {
		why := ""
		q, err := st.Query(nil, u.Query)
		switch {
		case err != nil:
			why = fmt.Sprintf("read query: %v", err)
		case q == nil || q.Status != fsm.QueryStatusRunning:
			why = fmt.Sprintf("query %s is not running", u.Query)
		case q.CreateIndex != u.QueryIndex:
			why = fmt.Sprintf("the slot map is for definition %d of query %s, which now runs definition %d", u.QueryIndex, u.Query, q.CreateIndex)
		default:
			why = fsm.CheckSlotRanges(u.Ranges, u.Partitions)
			if why == "" {
				if plan := pa.s.plans.plan(q); plan == nil || !rescalable(plan.Node(u.Fragment)) {
					why = fmt.Sprintf("query %s has no keyed fragment or generator source %s", u.Query, u.Fragment)
				}
			}
			if why == "" {
				epoch := uint64(0)
				m, _ := st.SlotMap(nil, u.Query, u.Fragment)
				if m != nil && m.QueryIndex != q.CreateIndex {
					m = nil
				}
				if m != nil {
					epoch = m.Epoch
				}
				if epoch != u.ExpectedEpoch {
					why = fmt.Sprintf("stale plan: the slot map of %s is at epoch %d, the plan expected epoch %d (another plan changed it first)", u.Fragment, epoch, u.ExpectedEpoch)
				} else {
					why = fsm.RescalePhaseCheck(m, &u)
				}
			}
		}
		if why != "" {
			refused = append(refused, fsm.PlanRefusal{Query: u.Query, Fragment: u.Fragment, Reason: why})
			continue
		}
		planned[[2]string{u.Query, u.Fragment}] = true
		out = append(out, u)
	}
	for _, u := range pa.s.missingSlotMaps() {
		if !planned[[2]string{u.Query, u.Fragment}] {
			out = append(out, u)
		}
	}
	return out, refused
}

// missingSlotMaps returns the initial slot map of every keyed fragment of
// a running query that has no map for its current definition: slot s of P
// partitions to partition s*P/NumSlots, as the data plane routed before
// the maps were replicated. Queries submitted before slot maps existed get
// theirs this way too.
func (s *Server) missingSlotMaps() []fsm.SlotMapUpdate {
	st := s.State()
	queries, err := st.Queries(nil)
	if err != nil {
		s.logger.Error("cannot list queries for their slot maps", "err", err)
		return nil
	}
	var out []fsm.SlotMapUpdate
	for _, q := range queries {
		if q.Status != fsm.QueryStatusRunning {
			continue
		}
		plan := s.plans.plan(q)
		if plan == nil {
			s.logger.Error("query definition cannot be planned: its keyed fragments get no slot map", "query", q.Name)
			continue
		}
		for _, n := range plan.Nodes {
			if n.KeyFields == nil {
				continue
			}
			if m, _ := st.SlotMap(nil, q.Name, n.Name); m != nil && m.QueryIndex == q.CreateIndex {
				continue
			}
			out = append(out, fsm.SlotMapUpdate{Query: q.Name, Fragment: n.Name, QueryIndex: q.CreateIndex,
				Partitions: max(n.Partitions, 1), Ranges: fsm.ContiguousSlotMap(n.Partitions)})
		}
	}
	return out
}

// planCheck is the applier's view of the cluster while it checks one
// plan: every check sees the placements accepted before it in the same
// plan. It is a pure function of the workers and tasks it starts from, so
// tests can drive it directly.
type planCheck struct {
	workers      map[string]*fsm.Worker
	ready        []*fsm.Worker // sorted by id
	tasks        map[string]*fsm.Task
	load         map[string]int                   // worker -> tasks on it
	hosts        map[partitionKey]map[string]bool // partition -> workers running a replica
	tasksPerCore int
	// moves, when set, refuses a live move next to another in its stream
	// (see streamMoves); it sees the live moves accepted before it in the
	// same plan.
	moves *streamMoves
}

func newPlanCheck(workers []*fsm.Worker, tasks []*fsm.Task, perCore int) *planCheck {
	c := &planCheck{workers: map[string]*fsm.Worker{}, tasks: map[string]*fsm.Task{}, load: map[string]int{},
		hosts: map[partitionKey]map[string]bool{}, tasksPerCore: perCore}
	for _, w := range workers {
		c.workers[w.ID] = w
		if w.Status == statusReady {
			c.ready = append(c.ready, w)
		}
	}
	sort.Slice(c.ready, func(i, j int) bool { return c.ready[i].ID < c.ready[j].ID })
	for _, t := range tasks {
		cp := *t
		c.tasks[t.ID] = &cp
		if t.WorkerID != "" {
			c.place(&cp, t.WorkerID)
		}
	}
	return c
}

func (c *planCheck) place(t *fsm.Task, worker string) {
	k := keyOf(t)
	if c.hosts[k] == nil {
		c.hosts[k] = map[string]bool{}
	}
	c.hosts[k][worker] = true
	c.load[worker]++
}

func (c *planCheck) unplace(t *fsm.Task) {
	if t.WorkerID == "" {
		return
	}
	delete(c.hosts[keyOf(t)], t.WorkerID)
	c.load[t.WorkerID]--
}

func (c *planCheck) hasRoom(w *fsm.Worker) bool {
	return c.tasksPerCore <= 0 || c.load[w.ID] < max(int(w.Cores), 1)*c.tasksPerCore
}

// check returns why p cannot be applied now, "" if it can.
func (c *planCheck) check(p fsm.PlannedPlacement) string {
	t := c.tasks[p.TaskID]
	if t == nil {
		return fmt.Sprintf("task %s does not exist (its query was stopped or resubmitted)", p.TaskID)
	}
	if p.FromGeneration < 1 {
		return "the plan does not say which generation of the task it expects"
	}
	if t.WorkerID != p.FromWorker || t.Gen() != p.FromGeneration {
		return fmt.Sprintf("stale plan: the task is %s at generation %d, the plan expected it %s at generation %d (another plan changed it first)",
			whereText(t.WorkerID), t.Gen(), whereText(p.FromWorker), p.FromGeneration)
	}
	if p.Live && t.Lossy && p.ToWorker != "" && p.ToWorker != t.WorkerID {
		// Its new copy would start from its inexact state, and would not
		// know it (the note is not part of a snapshot): lossy silently.
		return "the task is a lossy DCAA replica (a correction could not make its results exact): a live move would copy its state; it is replaced from a STABLE peer replica instead (see query status)"
	}
	if p.ToWorker == "" || p.ToWorker == t.WorkerID {
		return ""
	}
	if t.WorkerID != "" && c.moves != nil {
		// A placement that is not live starts a copy that no consumer
		// reads twice, like a stop-and-copy move's (see streamMoves).
		if up, down := c.moves.blocking(t, p.Halt || !p.Live); len(up)+len(down) > 0 {
			return neighbourMoveText(t, up, down)
		}
	}
	w := c.workers[p.ToWorker]
	if w == nil {
		return fmt.Sprintf("worker %s is not registered", p.ToWorker)
	}
	if w.Status != statusReady {
		return fmt.Sprintf("worker %s is %s, not %s", w.ID, w.Status, statusReady)
	}
	k := keyOf(t)
	if c.hosts[k][w.ID] {
		return fmt.Sprintf("worker %s already runs a replica of partition %d of %s (replicas of a partition run on different workers)", w.ID, t.Partition, t.Fragment)
	}
	if !c.hasRoom(w) {
		return fmt.Sprintf("worker %s is at capacity: %d tasks on %d cores (%d tasks per core)", w.ID, c.load[w.ID], max(int(w.Cores), 1), c.tasksPerCore)
	}
	// Zone spread, when labels allow: a replica goes to a zone that runs
	// none of its partition yet if some ready worker with room there could
	// take it.
	z := w.Labels[zoneLabel]
	if z == "" {
		return ""
	}
	taken := map[string]bool{}
	for host := range c.hosts[k] {
		if host == t.WorkerID {
			continue // it moves away from there
		}
		if hw := c.workers[host]; hw != nil && hw.Labels[zoneLabel] != "" {
			taken[hw.Labels[zoneLabel]] = true
		}
	}
	if !taken[z] {
		return ""
	}
	for _, alt := range c.ready {
		az := alt.Labels[zoneLabel]
		if az != "" && !taken[az] && !c.hosts[k][alt.ID] && c.hasRoom(alt) {
			return fmt.Sprintf("zone spread: zone %s already runs a replica of partition %d of %s, while worker %s in zone %s could run it", z, t.Partition, t.Fragment, alt.ID, az)
		}
	}
	return ""
}

// commit updates the view with an accepted placement.
func (c *planCheck) commit(p fsm.PlannedPlacement) {
	t := c.tasks[p.TaskID]
	if p.ToWorker == t.WorkerID {
		return
	}
	c.unplace(t)
	from := t.WorkerID
	if t.WorkerID != "" {
		t.Generation = t.Gen() + 1
	}
	t.WorkerID = p.ToWorker
	t.MovingFrom, t.MoveHalt = "", false
	if p.ToWorker != "" {
		c.place(t, p.ToWorker)
		switch {
		case p.Live && from != "":
			t.MovingFrom, t.MoveHalt = from, p.Halt
			if c.moves != nil {
				c.moves.add(t, true)
			}
		case from != "" && c.moves != nil:
			// Its new copy holds back the live moves of its consumers
			// later in the plan (see streamMoves).
			c.moves.add(t, false)
		}
	}
}

func whereText(worker string) string {
	if worker == "" {
		return "unplaced"
	}
	return "on worker " + worker
}

// placeAndLog submits a plan and logs what is refused; used by callers
// that cannot return the refusals to anyone (the scheduler).
func (s *Server) placeAndLog(ctx context.Context, plan fsm.ApplyPlanRequest) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := s.submitPlan(ctx, plan)
	switch {
	case err == nil, ctx.Err() != nil:
	case errors.Is(err, ErrNoPlanApplier):
		// Leader duties have not started (or just stopped): the next
		// leader's scheduler places what is unplaced.
		s.logger.Warn("placement plan not applied: no plan applier running; the scheduler places the tasks when leader duties run",
			"source", plan.Source, "tasks", len(plan.Placements))
	default:
		s.logger.Error("placement plan failed", "source", plan.Source, "tasks", len(plan.Placements), "err", err)
	}
}
