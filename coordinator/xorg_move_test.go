package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/fsm"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	fsworker "github.com/fedstream/fedstream/worker"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// Cross-org migration tests run two in-process orgs, each one coordinator
// and two workers (mutual TLS, a federation pool, pinned CAs and a
// contract), and move a partition of a keyed aggregate between them
// while its query runs. (They import the worker package: only the real
// runtime shows that a stream survives the move.)

// xorgQuery: paced generated words into a keyed aggregate of two
// partitions; %d is the number of records (0: endless).
const xorgQuery = `
name: %s
replicas: %d
sources:
  - name: lines
    generator: {kind: words, seed: 7, limit: %d, rate: 20000}
operators:
  - name: firsts
    type: map
    input: lines
    fields: {word: "split(line, ' ')[0]", n: "len(split(line, ' '))"}
  - {name: long, type: filter, input: firsts, where: "n > 7"}
  - name: counts
    type: aggregate
    input: long
    window: {size: 20ms}
    group_by: [word]
    aggregates: {cnt: "count()", total: "sum(n)"}
    parallelism: 2
sinks:
  - {name: out, input: counts}
`

type xorgOrg struct {
	*testCluster
	workers []*fsworker.Worker
	stopW   []func()
	pool    *dataplane.Pool
	// warned records the warnings its workers logged.
	warned *warnings
}

// warnings is a slog.Handler recording the messages of warnings (and
// worse) before passing every record on to next.
type warnings struct {
	next slog.Handler
	mu   *sync.Mutex
	msgs *[]string
}

func newWarnings(next slog.Handler) *warnings {
	return &warnings{next: next, mu: &sync.Mutex{}, msgs: new([]string)}
}

func (w *warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || w.next.Enabled(ctx, l)
}

func (w *warnings) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.mu.Lock()
		*w.msgs = append(*w.msgs, r.Message)
		w.mu.Unlock()
	}
	if !w.next.Enabled(ctx, r.Level) {
		return nil
	}
	return w.next.Handle(ctx, r)
}

func (w *warnings) WithAttrs(as []slog.Attr) slog.Handler {
	c := *w
	c.next = w.next.WithAttrs(as)
	return &c
}

func (w *warnings) WithGroup(name string) slog.Handler {
	c := *w
	c.next = w.next.WithGroup(name)
	return &c
}

// count is how many warnings had message msg.
func (w *warnings) count(msg string) (n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range *w.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func newXorgOrg(t *testing.T, org string, join []string, opts ...func(*Config)) *xorgOrg {
	t.Helper()
	o := &xorgOrg{testCluster: newFedOrg(t, org, 1, join, opts...), warned: newWarnings(logging.Discard().Handler())}
	client := testCreds(t, o.ca, rpc.RoleClient, "ops")
	// Tails read a worker, or a coordinator relaying a sink at a partner.
	o.pool = dataplane.NewPool(client.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleWorker, rpc.RoleCoordinator}}), grpc.WithPerRPCCredentials(rpc.BearerToken(o.tokens[1])))
	t.Cleanup(func() { _ = o.pool.Close() })
	for i := range 2 {
		creds, err := tlsutil.New(o.ca.CertPEM)
		if err != nil {
			t.Fatal(err)
		}
		wl := slog.New(o.warned)
		if os.Getenv("FEDSTREAM_TEST_LOG") != "" { // as the coordinators' (newOrgTestCluster)
			wl = slog.New(&warnings{next: logging.Stderr("info").Handler(), mu: o.warned.mu, msgs: o.warned.msgs})
		}
		w, err := fsworker.New(fsworker.Config{Org: org, Name: fmt.Sprintf("%s-w%d", org, i+1), Coordinators: []string{o.cfgs[0].GRPCAddr}, Cores: 4,
			Logger: wl, TLS: creds, JoinToken: o.tokens[0], BoundaryInterval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(ctx) }()
		var once sync.Once
		stop := func() { once.Do(func() { cancel(); <-done }) }
		t.Cleanup(stop)
		o.workers = append(o.workers, w)
		o.stopW = append(o.stopW, stop)
	}
	waitFor(t, 30*time.Second, org+"'s workers ready", func() bool {
		ws, err := o.nodes[0].State().Workers(nil)
		if err != nil {
			return false
		}
		ready := 0
		for _, w := range ws {
			if w.Status == states.WorkerReady && !isPartnerWorker(w) {
				ready++
				// A worker of this build states its data-plane level.
				if w.DataPlaneLevel != rpc.DataPlaneLevel {
					t.Fatalf("worker %s registered with data-plane level %d, want %d", w.ID, w.DataPlaneLevel, rpc.DataPlaneLevel)
				}
			}
		}
		return ready == 2
	})
	return o
}

// xorgPair starts alpha and beta (each configured by opts), pins each in
// the other and makes a contract letting alpha's tasks run at beta; it
// returns its id.
func xorgPair(t *testing.T, opts ...func(*Config)) (alpha, beta *xorgOrg, contract string) {
	alpha = newXorgOrg(t, "alpha", nil, opts...)
	beta = newXorgOrg(t, "beta", fedAddr(alpha.testCluster), opts...)
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, o := range []*xorgOrg{alpha, beta} {
			for _, stop := range o.stopW {
				wg.Add(1)
				go func() { defer wg.Done(); stop() }()
			}
		}
		wg.Wait()
		for _, o := range []*xorgOrg{alpha, beta} {
			wg.Add(1)
			go func() { defer wg.Done(); o.stop(0) }()
		}
		wg.Wait()
	})
	alpha.pin(beta.testCluster)
	beta.pin(alpha.testCluster)
	waitFor(t, 30*time.Second, "beta alive in alpha's pool", func() bool { return alpha.nodes[0].pool.Known("beta") })
	resp, err := alpha.fedClient(0).ProposeContract(ctxT(t, 20*time.Second), &pb.ProposeContractRequest{To: "beta", PriceMin: 1, PriceMax: 2, MaxLoad: 100, ValidForMs: 3600_000, Direction: "out"})
	if err != nil {
		t.Fatalf("propose: %v", err)
	}
	var d federation.ContractDoc
	if err := json.Unmarshal(resp.ContractJson, &d); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the proposal at beta", func() bool {
		_, err := beta.nodes[0].fed.Contract(d.Terms.ID)
		return err == nil
	})
	if _, err := beta.fedClient(0).AnswerContract(ctxT(t, 20*time.Second), &pb.AnswerContractRequest{Id: d.Terms.ID, Accept: true}); err != nil {
		t.Fatalf("accept: %v", err)
	}
	waitFor(t, 10*time.Second, "the contract active at alpha", func() bool {
		_, err := alpha.nodes[0].activeContractWith("beta", time.Now())
		return err == nil
	})
	return alpha, beta, d.Terms.ID
}

func (o *xorgOrg) submit(t *testing.T, name string, replicas, limit int) {
	t.Helper()
	if _, err := o.admin(0).SubmitQuery(ctxT(t, 20*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(fmt.Sprintf(xorgQuery, name, replicas, limit)), Filename: name + ".yaml"}); err != nil {
		t.Fatal(err)
	}
}

func (o *xorgOrg) task(t *testing.T, id string) *fsm.Task {
	t.Helper()
	tk, err := o.nodes[0].State().Task(nil, id)
	if err != nil || tk == nil {
		t.Fatalf("task %s: %v %v", id, tk, err)
	}
	return tk
}

// results tails the sink (replica 0) to its final boundary: results by
// window and word; seen is called with the count after each batch. A
// window emitted twice fails.
func (o *xorgOrg) results(t *testing.T, query string, seen func(n int)) map[string]string {
	t.Helper()
	return o.resultsOf(t, query, fmt.Sprintf(xorgQuery, query, 1, 1), seen)
}

// resultsOf is results for a query whose YAML is yaml (its sink has the
// fields word, cnt, total and window_end).
func (o *xorgOrg) resultsOf(t *testing.T, query, yaml string, seen func(n int)) map[string]string {
	t.Helper()
	got, _ := o.taggedResultsOf(t, query, yaml, seen)
	return got
}

// taggedResultsOf is resultsOf, with each result's reconfiguration
// version tag by the same key.
func (o *xorgOrg) taggedResultsOf(t *testing.T, query, yaml string, seen func(n int)) (map[string]string, map[string]uint64) {
	t.Helper()
	spec, err := queryspec.Parse("q.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := spec.Plan()
	if err != nil {
		t.Fatal(err)
	}
	schema := plan.Node("out").Schema
	word, cnt, total, end := schema.Index("word"), schema.Index("cnt"), schema.Index("total"), schema.Index("window_end")
	sink := query + "/out/p0/r0"
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	got, tags := map[string]string{}, map[string]uint64{}
	sub := dataplane.NewSubscriber(&pb.StreamRef{Query: query, TaskId: sink}, "", true, 0)
	for {
		tk := o.task(t, sink)
		w, _ := o.nodes[0].State().Worker(nil, tk.WorkerID)
		if w == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		conn, err := o.pool.Conn(w.Addr)
		if err != nil {
			t.Fatal(err)
		}
		err = sub.Run(ctx, conn, func(ctx context.Context, b *dataplane.Batch) error {
			for _, tp := range b.Tuples {
				if tp.Type == tuple.Boundary && tp.STime == math.MaxInt64 {
					return dataplane.ErrStopSubscription
				}
				if !tp.Type.IsData() {
					continue
				}
				k := fmt.Sprintf("%d/%s", tp.Values[end].I, tp.Values[word].S)
				if _, dup := got[k]; dup {
					return fmt.Errorf("window %s emitted twice", k)
				}
				got[k] = fmt.Sprintf("cnt=%d total=%d", tp.Values[cnt].I, tp.Values[total].I)
				tags[k] = tp.Version
			}
			if seen != nil {
				seen(len(got))
			}
			return nil
		})
		if err == nil {
			return got, tags
		}
		if ctx.Err() != nil {
			t.Fatalf("tail %s: %v", sink, err)
		}
		time.Sleep(20 * time.Millisecond) // the sink is not running yet: retry
	}
}

func sameResults(t *testing.T, got, want map[string]string) {
	t.Helper()
	if len(want) == 0 {
		t.Fatal("the reference run has no results: the test would prove nothing")
	}
	missing, wrong := 0, 0
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing++
		case g != v:
			wrong++
			if wrong < 5 {
				t.Errorf("window/word %s: got %s, want %s", k, g, v)
			}
		}
	}
	if missing > 0 || wrong > 0 || len(got) != len(want) {
		t.Fatalf("%d results, want %d: %d missing, %d differ", len(got), len(want), missing, wrong)
	}
}

// copies counts the running copies of task over every worker of orgs.
func copies(task string, orgs ...*xorgOrg) (n int, where []string) {
	for _, o := range orgs {
		for _, w := range o.workers {
			for _, st := range w.Runtime().States() {
				if st.TaskID == task {
					n++
					where = append(where, fmt.Sprintf("%s@g%d(%s)", w.ID(), st.Generation, st.State))
				}
			}
		}
	}
	return n, where
}

// calmFailureDetection is for a test that kills nothing and whose query
// has no replicas: a 2 s heartbeat TTL, a 3 s partner timeout and the
// pool's 200 ms probe timeout declare live workers and orgs dead on a
// loaded 2-core machine, and a copy re-placed without a peer's snapshot
// replays from upstream buffers that no longer hold what the lost copy
// had acknowledged: results are lost (reported, as promised without
// replicas), and the test, which is not about failure detection, fails.
func calmFailureDetection(c *Config) {
	c.Timings.HeartbeatTTL = 6 * time.Second
	c.Timings.PartnerTimeout = 6 * time.Second
	c.Timings.GossipInterval = 300 * time.Millisecond
}

// moveOut is MigrateTaskOut, tried again after a rollback until ctx
// ends. On a loaded machine a move rolls back when a heartbeat or a sync
// misses its deadline (the partner marks its worker down and reports the
// new copy lost, or this org declares the partner dead): the task then
// runs at home on its old copy, as promised. The tests that call it need
// the task at the partner to test what follows, not a move that never
// rolls back (TestCrossOrgMovePartitioned tests the rollback), so they
// move it again once it runs at home (a moving task cannot move).
func (o *xorgOrg) moveOut(ctx context.Context, t *testing.T, task, partner, contract string) error {
	_, err := o.whileRolledBack(ctx, t, task, partner, func(ctx context.Context) error {
		return o.nodes[0].MigrateTaskOut(ctx, task, partner, contract)
	})
	return err
}

// whileRolledBack makes move again while it answers that the move rolled
// back (ErrMigrationRolledBack, or its text in a status of the admin
// API), each time once the task runs at home again; see moveOut. It
// returns how many attempts rolled back.
func (o *xorgOrg) whileRolledBack(ctx context.Context, t *testing.T, task, partner string, move func(ctx context.Context) error) (rollbacks int, err error) {
	for {
		err := move(ctx)
		if !errors.Is(err, ErrMigrationRolledBack) && !(status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), ErrMigrationRolledBack.Error())) {
			return rollbacks, err
		}
		rollbacks++
		t.Logf("moving %s to %s again: %v", task, partner, err)
		for {
			tk, _ := o.nodes[0].State().Task(nil, task)
			if tk != nil && tk.MovingFrom == "" && tk.WorkerID != "" && tk.WorkerID != partnerWorkerID(partner) && tk.State == states.TaskRunning {
				break
			}
			if ctx.Err() != nil {
				return rollbacks, fmt.Errorf("%w; the task did not run at home again: %w", err, ctx.Err())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// moreResults waits until the tail has counted n results more than at
// the call (seen), the tail has ended (ended is closed: on a loaded
// machine a test's moves can outlast its query's records) or ctx ends.
func moreResults(ctx context.Context, seen *atomic.Int64, ended <-chan struct{}, n int64) {
	at := seen.Load()
	for seen.Load() < at+n {
		select {
		case <-ctx.Done():
			return
		case <-ended:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A partition of a keyed aggregate moves to the partner org mid-stream
// and, later in the same run, comes home; then it moves out again and
// comes home by itself when the contract is terminated. The sink's
// results equal, window by window and word by word, those of the same
// query left alone. The
// partner's copy starts from the snapshot of alpha's running copy
// (fetched across orgs) and both directions switch consumers across the
// orgs' data ports.
func TestCrossOrgMoveAndReturnMidStream(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, contract := xorgPair(t, calmFailureDetection)
	const limit = 100000
	want := xorgReference(t, limit)
	// Another query of alpha, which beta hosts nothing of (the route
	// check below); short, it is never read.
	alpha.submit(t, "ref", 1, 1000)

	const moving = "xm/counts/p0/r0"
	alpha.submit(t, "xm", 1, limit)
	var started bool
	var seen, rollbacks atomic.Int64
	done, ended := make(chan error, 1), make(chan struct{})
	got := alpha.results(t, "xm", func(n int) {
		seen.Store(int64(n))
		if n < 100 || started {
			return
		}
		started = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// Through the admin API, as fedstream task move --to-org does;
			// made again after a rollback (a false death on a loaded
			// machine, see moveOut). A rollback takes the task back to
			// its old generation, so the move that completes makes
			// generation 2 all the same.
			var resp *pb.MigrateTaskResponse
			n, err := alpha.whileRolledBack(ctx, t, moving, "beta", func(ctx context.Context) (err error) {
				resp, err = alpha.admin(0).MigrateTask(ctx, &pb.MigrateTaskRequest{TaskId: moving, ToOrg: "beta", Contract: contract})
				return err
			})
			rollbacks.Add(int64(n))
			if err != nil || resp.Generation != 2 {
				done <- fmt.Errorf("migrate: %v %v", resp, err)
				return
			}
			// Made again (a client whose answer was lost): the same
			// answer, no second move.
			if again, err := alpha.admin(0).MigrateTask(ctx, &pb.MigrateTaskRequest{TaskId: moving, ToOrg: "beta", Contract: contract}); err != nil || again.Generation != 2 || again.Org != "beta" {
				done <- fmt.Errorf("the move made again: %v %v", again, err)
				return
			}
			if at := alpha.nodes[0].TasksAtPartners(); at[moving] != "beta" {
				done <- fmt.Errorf("tasks at partners %v", at)
				return
			}
			q, err := alpha.admin(0).GetQuery(ctx, &pb.GetQueryRequest{Name: "xm"})
			if err != nil {
				done <- err
				return
			}
			for _, ti := range q.Tasks {
				if want := map[bool]string{true: "beta", false: ""}[ti.TaskId == moving]; ti.Org != want || (want != "" && ti.OrgPhase != fsm.HostedRunning) {
					done <- fmt.Errorf("query status shows %s at org %q (%s), want %q", ti.TaskId, ti.Org, ti.OrgPhase, want)
					return
				}
			}
			if n, where := copies(moving, beta); n != 1 {
				done <- fmt.Errorf("beta runs %d copies: %v", n, where)
				return
			}
			// What alpha's data port lets beta read: the upstreams of the
			// query it hosts a task of, not another query's streams; and
			// nothing for an org that hosts nothing.
			if _, _, _, err := alpha.nodes[0].route("beta", "xm", "xm/lines/p0/r0", 0); err != nil {
				done <- fmt.Errorf("beta reading the upstream of its hosted task: %v", err)
				return
			}
			if _, _, _, err := alpha.nodes[0].route("beta", "ref", "ref/lines/p0/r0", 0); status.Code(err) != codes.PermissionDenied {
				done <- fmt.Errorf("beta reading a query it hosts nothing of: %v", err)
				return
			}
			if _, _, _, err := alpha.nodes[0].route("gamma", "xm", "xm/lines/p0/r0", 0); status.Code(err) != codes.PermissionDenied {
				done <- fmt.Errorf("gamma reading a query it hosts nothing of: %v", err)
				return
			}
			if _, partner, _, err := alpha.nodes[0].route("", "xm", moving, 2); err != nil || partner != "beta" {
				done <- fmt.Errorf("alpha's workers reading the moved task: %q %v", partner, err)
				return
			}
			// A rescale would not reach the copy at beta: refused.
			if _, err := alpha.admin(0).ScaleQuery(ctx, &pb.ScaleQueryRequest{Query: "xm", Operator: "counts", Parallelism: 3}); status.Code(err) != codes.FailedPrecondition {
				done <- fmt.Errorf("rescaling a query with a task at a partner: %v", err)
				return
			}
			// Results keep coming while the partition runs at beta.
			moreResults(ctx, &seen, ended, 200)
			// Rolling upgrades: beta's syncs say the data-plane level of
			// the worker running the copy (a quiescent plan needs it).
			for {
				if l, ok := alpha.nodes[0].xorg.hostedLevel(moving); ok && l == rpc.DataPlaneLevel {
					break
				}
				if ctx.Err() != nil {
					done <- fmt.Errorf("alpha never learnt the data-plane level of beta's worker running %s", moving)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := alpha.admin(0).ReturnTask(ctx, &pb.ReturnTaskRequest{TaskId: moving}); err != nil {
				done <- fmt.Errorf("return: %w", err)
				return
			}
			// Out again, then the contract ends: the task comes home by
			// itself.
			n, err = alpha.whileRolledBack(ctx, t, moving, "beta", func(ctx context.Context) error {
				return alpha.nodes[0].MigrateTaskOut(ctx, moving, "beta", contract)
			})
			rollbacks.Add(int64(n))
			if err != nil {
				done <- fmt.Errorf("second move: %w", err)
				return
			}
			if _, err := alpha.fedClient(0).TerminateContract(ctx, &pb.TerminateContractRequest{Id: contract, Reason: "test"}); err != nil {
				done <- fmt.Errorf("terminate: %w", err)
				return
			}
			// New connections from here on: the data ports admit the orgs
			// for the task still to come home, without a contract.
			for _, o := range []*xorgOrg{alpha, beta} {
				p := o.nodes[0].pool
				p.mu.Lock()
				for k, c := range p.conns {
					_ = c.Close()
					delete(p.conns, k)
				}
				p.mu.Unlock()
			}
			for ctx.Err() == nil {
				if tk, err := alpha.nodes[0].State().Task(nil, moving); err == nil && tk.Gen() == 5 && tk.MovingFrom == "" && tk.WorkerID != partnerWorkerID("beta") {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			done <- ctx.Err()
		}()
	})
	close(ended)
	if !started {
		t.Fatal("the query ended before the move: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
	// Each new copy started from its predecessor's snapshot, fetched
	// across the orgs.
	served := func(o *xorgOrg) (n uint64) {
		for _, w := range o.workers {
			n += w.Runtime().SnapshotsServed()
		}
		return n
	}
	// A move that rolled back may have had its snapshot served before it
	// did: then at least as many, not exactly.
	if a, b := served(alpha), served(beta); a < 2 || b != 2 || (rollbacks.Load() == 0 && a != 2) {
		t.Fatalf("snapshots served: alpha %d, beta %d (%d moves rolled back and made again); want 2 each (out, back, out, back)", a, b, rollbacks.Load())
	}
	tk := alpha.task(t, moving)
	if tk.Gen() != 5 || tk.WorkerID == partnerWorkerID("beta") || tk.MovingFrom != "" {
		t.Fatalf("after a move out and back the task is %+v, want generation 3 at home", tk)
	}
	waitFor(t, 20*time.Second, "beta drops its copy", func() bool {
		n, _ := copies(moving, beta)
		hs, _ := beta.nodes[0].State().HostedTasks(nil)
		return n == 0 && len(hs) == 0 && len(alpha.nodes[0].TasksAtPartners()) == 0
	})
}

// partition cuts every cross-org connection of o (its control and data
// ports stop; its org and gossip keep working), as a network partition
// between the orgs would.
func (o *xorgOrg) partition() {
	o.nodes[0].pool.server.Stop()
	o.nodes[0].pool.dataServer.Stop()
}

// A partition between the orgs right after beta agreed to host a task,
// before its copy took over: the move rolls back (the old copy never
// stopped, consumers never left it), beta drops its copy once alpha has
// been silent for the partner timeout, and the task runs exactly once,
// at alpha, with the results of a run left alone.
func TestCrossOrgMovePartitioned(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, contract := xorgPair(t)
	const limit = 60000
	want := xorgReference(t, limit)

	const moving = "xp/counts/p0/r0"
	alpha.submit(t, "xp", 1, limit)
	var started bool
	done := make(chan error, 1)
	got := alpha.results(t, "xp", func(n int) {
		if n < 100 || started {
			return
		}
		started = true
		from := alpha.task(t, moving).WorkerID
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			done <- alpha.nodes[0].MigrateTaskOut(ctx, moving, "beta", contract)
		}()
		// Cut the orgs apart as soon as beta records the task.
		waitFor(t, 20*time.Second, "beta hosts the task", func() bool {
			h, err := beta.nodes[0].State().HostedTask(nil, "alpha", moving)
			return err == nil && h != nil
		})
		beta.partition()
		alpha.partition()
		go func() {
			err := <-done
			if err == nil {
				done <- fmt.Errorf("the move completed across a partition")
				return
			}
			if tk := alpha.task(t, moving); tk.WorkerID != from || tk.Gen() != 1 || tk.MovingFrom != "" {
				done <- fmt.Errorf("after the rollback the task is %+v, want on %s at generation 1", tk, from)
				return
			}
			done <- nil
		}()
	})
	if !started {
		t.Fatal("the query ended before the move: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
	waitFor(t, 30*time.Second, "beta drops its copy; one copy runs, at alpha", func() bool {
		hs, _ := beta.nodes[0].State().HostedTasks(nil)
		nb, _ := copies(moving, beta)
		return len(hs) == 0 && nb == 0 && len(alpha.nodes[0].TasksAtPartners()) == 0
	})
}

// A partner's worker that dies with a task of alpha running there: the
// partner reports the task lost and alpha places it at home again. Then
// a partner that dies with a task of alpha running there: alpha declares
// it dead (failed in the pool, or unreachable past the partner timeout),
// its partner worker goes down and the task is placed at home again,
// from a snapshot of its live peer replica; the results equal a run left
// alone.
func TestCrossOrgDeadPartnerTasksComeHome(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, contract := xorgPair(t)
	const limit = 200000
	want := xorgReference(t, limit)

	const moving = "xd/counts/p0/r0"
	alpha.submit(t, "xd", 2, limit)
	var started bool
	var seen atomic.Int64
	done, ended := make(chan error, 1), make(chan struct{})
	got := alpha.results(t, "xd", func(n int) {
		seen.Store(int64(n))
		if n < 100 || started {
			return
		}
		started = true
		go func() {
			// Two moves and a worker's death, each bounded on its own:
			// this bounds only a run that hangs (a loaded 2-core machine
			// took over 60 s).
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := alpha.moveOut(ctx, t, moving, "beta", contract); err != nil {
				done <- err
				return
			}
			moreResults(ctx, &seen, ended, 100)
			// First the beta worker running the task dies: beta lives
			// on and reports the task lost; alpha places it at home.
			for i, w := range beta.workers {
				for _, st := range w.Runtime().States() {
					if st.TaskID == moving {
						beta.stopW[i]()
					}
				}
			}
			for ctx.Err() == nil {
				tk, err := alpha.nodes[0].State().Task(nil, moving)
				if err == nil && tk.Gen() >= 3 && tk.WorkerID != partnerWorkerID("beta") && tk.State == states.TaskRunning {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if ctx.Err() != nil {
				done <- fmt.Errorf("waiting for the task back at alpha, running, after its beta worker died: %w", ctx.Err())
				return
			}
			if err := alpha.moveOut(ctx, t, moving, "beta", contract); err != nil {
				done <- fmt.Errorf("second move, to beta's other worker: %w", err)
				return
			}
			moreResults(ctx, &seen, ended, 100)
			// Then beta dies: workers and coordinator, without leaving the pool.
			for _, stop := range beta.stopW {
				stop()
			}
			_ = beta.nodes[0].pool.serf.Shutdown()
			beta.stop(0)
			done <- nil
		}()
	})
	close(ended)
	if !started {
		t.Fatal("the query ended before the move: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Generation 5 (out, lost, out, dead) or later: a loaded machine's
	// missed heartbeat at alpha may have placed it once more.
	waitFor(t, 30*time.Second, "the task back at alpha, running", func() bool {
		tk := alpha.task(t, moving)
		n, _ := copies(moving, alpha)
		return tk.Gen() >= 5 && tk.WorkerID != partnerWorkerID("beta") && tk.State == states.TaskRunning && n == 1 && len(alpha.nodes[0].TasksAtPartners()) == 0
	})
	sameResults(t, got, want)
}

// Partners' tasks hosted on a worker take its capacity: the placer does
// not fill a worker the hosted tasks already fill, and never places on
// the record standing for a partner org.
func TestPlacerCountsHostedTasksAndSkipsPartners(t *testing.T) {
	t.Parallel()
	workers := []*fsm.Worker{
		{ID: "w1", Cores: 1, Status: statusReady},
		{ID: partnerWorkerID("beta"), Cores: 1 << 16, Status: statusReady, Labels: map[string]string{partnerLabel: "beta"}},
	}
	task := &fsm.Task{ID: "q/f/p0/r0", Query: "q", Fragment: "f"}
	if w, _ := newPlacer(workers, nil).pick(task); w != "w1" {
		t.Fatalf("an empty w1 was not picked: %q", w)
	}
	p := newPlacer(workers, nil)
	p.reserve(map[string]int{"w1": tasksPerCore})
	if w, why := p.pick(task); w != "" {
		t.Fatalf("picked %q, full with hosted tasks (and the partner record is never a choice)", w)
	} else if why == "" {
		t.Fatal("no reason given")
	}
}

// The sink moves to the partner mid-stream: its results are read (as
// fedstream tail does, with a reader's token and no acknowledgements)
// through this org's coordinator, which relays them from the partner;
// they equal a run left alone.
func TestCrossOrgSinkAtPartnerIsTailed(t *testing.T) {
	// Not parallel: it runs real workers (see parallelTests).
	alpha, beta, contract := xorgPair(t, calmFailureDetection)
	const limit = 60000
	want := xorgReference(t, limit)

	const moving = "xs/out/p0/r0"
	alpha.submit(t, "xs", 1, limit)
	var started bool
	done := make(chan error, 1)
	got := alpha.results(t, "xs", func(n int) {
		if n < 100 || started {
			return
		}
		started = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := alpha.moveOut(ctx, t, moving, "beta", contract); err != nil {
				done <- err
				return
			}
			// The move ended: beta's copy reported running and caught
			// up, so it runs there now. Checked now, not once the tail
			// ends: by then a loaded machine may have had alpha declare
			// beta dead (a sync past the partner timeout) and the sink
			// placed at home again, as promised. Beta drops its copy
			// before alpha learns of it, hence the wait.
			for {
				n, where := copies(moving, beta)
				tk, _ := alpha.nodes[0].State().Task(nil, moving)
				switch {
				case n > 1:
					done <- fmt.Errorf("beta runs %d copies of the sink: %v", n, where)
				case n == 1:
					done <- nil
				case tk == nil || tk.WorkerID != partnerWorkerID("beta"):
					t.Log("the sink came home before beta's copies were counted")
					done <- nil
				case ctx.Err() != nil:
					done <- fmt.Errorf("beta runs no copy of the sink alpha places there: %w", ctx.Err())
				default:
					time.Sleep(20 * time.Millisecond)
					continue
				}
				return
			}
		}()
	})
	if !started {
		t.Fatal("the query ended before the move: the test would prove nothing")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sameResults(t, got, want)
	// Beta's worker fetched the sink's snapshot through the relays, over
	// the stream: it was not offered a connection of its own to alpha's
	// worker, which it could not have made.
	if n := beta.warned.count("fast snapshot transfer failed: fetching over the data plane stream"); n != 0 {
		t.Fatalf("beta's workers tried %d fast snapshot transfers across the orgs", n)
	}
}
