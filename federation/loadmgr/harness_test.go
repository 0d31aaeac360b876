package loadmgr

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	"github.com/fedstream/fedstream/fsm"
)

// fsmStore applies commands straight to an org's state machine, as its
// Raft leader would (one org, one voter, no network).
type fsmStore struct {
	mu    sync.Mutex
	f     *fsm.FSM
	index uint64
}

func (s *fsmStore) State() *fsm.StateStore { return s.f.State() }

func (s *fsmStore) Apply(_ context.Context, t fsm.MessageType, body any) (any, error) {
	data, err := fsm.Encode(t, body)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.index++
	res := s.f.Apply(&raft.Log{Index: s.index, Term: 1, Type: raft.LogCommand, Data: data}).(*fsm.ApplyResult)
	return res.Value, res.Err
}

// inproc carries messages between orgs through JSON, as over a wire.
type inproc struct {
	mu   sync.Mutex
	orgs map[string]*federation.Org
	// cut: orgs that cannot be reached.
	cut map[string]bool
	// lose, when set, picks messages whose answer is lost after the
	// receiver acted on them.
	lose func(to string, m federation.Message) bool
}

func (n *inproc) Known(org string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.orgs[org]
	return ok
}

func (n *inproc) Call(ctx context.Context, to string, m federation.Message) (federation.Message, error) {
	n.mu.Lock()
	o, ok := n.orgs[to]
	cut, lose := n.cut[to], n.lose
	n.mu.Unlock()
	if !ok || cut {
		return federation.Message{}, fmt.Errorf("no route to %s", to)
	}
	data, err := json.Marshal(m)
	if err != nil {
		return federation.Message{}, err
	}
	var wire federation.Message
	if err := json.Unmarshal(data, &wire); err != nil {
		return federation.Message{}, err
	}
	ans, err := o.Receive(ctx, wire)
	if err != nil {
		return ans, err
	}
	if lose != nil && lose(to, m) {
		return federation.Message{}, fmt.Errorf("connection to %s reset before the answer", to)
	}
	data, _ = json.Marshal(ans)
	var back federation.Message
	return back, json.Unmarshal(data, &back)
}

// world is where every org's tasks run: the samplers read it and the
// fake movers change it.
type world struct {
	mu    sync.Mutex
	cores map[string]float64
	// at: task -> org running it; owner: task -> org owning it.
	at, owner map[string]string
	load      map[string]float64
	class     map[string]string
	// noise multiplies every task's load in a sample (1: none).
	noise map[string]float64
}

func newWorld() *world {
	return &world{cores: map[string]float64{}, at: map[string]string{}, owner: map[string]string{}, load: map[string]float64{},
		class: map[string]string{}, noise: map[string]float64{}}
}

// addTasks gives org n tasks of load each, named org/t<i>.
func (w *world) addTasks(org string, n int, load float64, class string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	base := len(w.ownedLocked(org))
	for i := range n {
		id := fmt.Sprintf("%s/t%02d", org, base+i)
		w.at[id], w.owner[id], w.load[id], w.class[id] = org, org, load, class
	}
}

func (w *world) ownedLocked(org string) []string {
	var out []string
	for id, o := range w.owner {
		if o == org {
			out = append(out, id)
		}
	}
	return out
}

// setLoad sets the load of every task org owns.
func (w *world) setLoad(org string, load float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range w.ownedLocked(org) {
		w.load[id] = load
	}
}

func (w *world) sampler(org string) Sampler {
	return func() Sample {
		w.mu.Lock()
		defer w.mu.Unlock()
		s := Sample{Cores: w.cores[org]}
		f := w.noise[org]
		if f == 0 {
			f = 1
		}
		ids := slices.Sorted(maps.Keys(w.at))
		for _, id := range ids {
			if w.at[id] == org {
				s.Tasks = append(s.Tasks, TaskLoad{ID: id, Class: w.class[id], Load: w.load[id] * f})
			}
		}
		return s
	}
}

func (w *world) running(org string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	sum := 0.0
	for id, o := range w.at {
		if o == org {
			sum += w.load[id]
		}
	}
	return sum
}

// fakeMover moves tasks in the world and records what it did.
type fakeMover struct {
	org string
	w   *world
	mu  sync.Mutex
	// log lists "move TASK PARTNER CONTRACT" and "return TASK".
	log  []string
	fail error
	// after runs after each move the mover made.
	after func()
}

func (f *fakeMover) MigrateTaskOut(_ context.Context, taskID, partnerOrg, contractID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if f.w.owner[taskID] != f.org || f.w.at[taskID] != f.org {
		return fmt.Errorf("fake mover: %s is not %s's task at home", taskID, f.org)
	}
	f.w.at[taskID] = partnerOrg
	f.log = append(f.log, fmt.Sprintf("move %s %s %s", taskID, partnerOrg, contractID))
	if f.after != nil {
		f.after()
	}
	return nil
}

func (f *fakeMover) ReturnTaskHome(_ context.Context, taskID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if f.w.owner[taskID] != f.org || f.w.at[taskID] == f.org {
		return fmt.Errorf("fake mover: %s is not %s's task away", taskID, f.org)
	}
	f.w.at[taskID] = f.org
	f.log = append(f.log, "return "+taskID)
	return nil
}

func (f *fakeMover) TasksAtPartners() map[string]string {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	out := map[string]string{}
	for id, o := range f.w.owner {
		if o == f.org && f.w.at[id] != f.org {
			out[id] = f.w.at[id]
		}
	}
	return out
}

func (f *fakeMover) moves() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

// fed is a federation of orgs in one process with one clock.
type fed struct {
	t      *testing.T
	net    *inproc
	w      *world
	orgs   map[string]*federation.Org
	mgrs   map[string]*Manager
	movers map[string]*fakeMover
	mu     sync.Mutex
	now    time.Time
}

func (f *fed) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fed) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// newFed starts orgs with the given cores each; a nil now uses the real
// clock.
func newFed(t *testing.T, realClock bool, cfg Config, cores map[string]float64) *fed {
	t.Helper()
	f := &fed{t: t, net: &inproc{orgs: map[string]*federation.Org{}, cut: map[string]bool{}}, w: newWorld(),
		orgs: map[string]*federation.Org{}, mgrs: map[string]*Manager{}, movers: map[string]*fakeMover{},
		now: time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)}
	clock := f.clock
	if realClock {
		clock = nil
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, name := range slices.Sorted(maps.Keys(cores)) {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		machine, err := fsm.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		o := federation.NewOrg(name, key, &fsmStore{f: machine}, f.net, clock)
		if err := o.EnsureIdentity(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.net.orgs[name] = o
		f.orgs[name] = o
		f.w.cores[name] = cores[name]
		mv := &fakeMover{org: name, w: f.w}
		f.movers[name] = mv
		// The wiring point: the fake stands where the coordinator passes
		// its Server.
		m, err := New(cfg, o, f.w.sampler(name), mv, log)
		if err != nil {
			t.Fatal(err)
		}
		o.SetLoadHandler(m)
		f.mgrs[name] = m
	}
	return f
}

// contract makes an active contract proposed by a to b and returns its id.
func (f *fed) contract(a, b string, req federation.ProposeRequest) string {
	f.t.Helper()
	ctx := context.Background()
	for _, p := range [][2]string{{a, b}, {b, a}} {
		if err := f.orgs[p[0]].Pin(ctx, p[1], f.orgs[p[1]].PublicKey()); err != nil {
			f.t.Fatal(err)
		}
	}
	req.To = b
	doc, err := f.orgs[a].Propose(ctx, req)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.orgs[b].Accept(ctx, doc.Terms.ID); err != nil {
		f.t.Fatal(err)
	}
	return doc.Terms.ID
}

// step runs one load period on every org (in name order) and advances
// the clock by d.
func (f *fed) step(d time.Duration) {
	for _, n := range slices.Sorted(maps.Keys(f.mgrs)) {
		f.mgrs[n].Step(context.Background())
	}
	f.advance(d)
}

// ledgerKinds returns the kinds of an org's ledger records of kind in kinds.
func (f *fed) records(org, kind string) []ledger.Record {
	f.t.Helper()
	es, err := f.orgs[org].Entries()
	if err != nil {
		f.t.Fatal(err)
	}
	var out []ledger.Record
	for _, e := range es {
		if e.Record.Kind == kind {
			out = append(out, e.Record)
		}
	}
	return out
}

func (f *fed) keys() ledger.Keyring {
	k := ledger.Keyring{}
	for n, o := range f.orgs {
		k[n] = o.PublicKey()
	}
	return k
}
