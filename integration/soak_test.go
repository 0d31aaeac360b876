//go:build soak

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fedstream/fedstream/internal/testport"
)

// The soak tests run a query on an org of real processes for minutes while
// faults, moves or reconfigurations come at a fixed rhythm, and check that
// stable results keep coming, each once and equal to the reference computed
// from the generator, and that no process's goroutines, memory or open
// files keep growing. They are opt-in (go test -tags soak; make soak) and
// not part of make test: each runs for -soak.duration.
var (
	soakDuration = flag.Duration("soak.duration", 10*time.Minute, "how long each soak test runs its query under faults")
	soakStall    = flag.Duration("soak.stall", 60*time.Second, "the longest a soak test lets stable results stop before it calls the query stalled")
	soakEvidence = flag.String("soak.evidence", "", "directory for the soak tests' resource samples and logs (empty: the test's temporary directory)")
)

// soakWard is the ward query without an end, at 2500 vitals a second in
// windows of 100 ms; %d is its replicas.
const soakWard = `name: ward
replicas: %d
sources:
  - {name: vitals, generator: {kind: vitals, rate: 2500, seed: 11}}
operators:
  - {name: feverish, type: filter, input: vitals, where: "temperature > 37.0"}
  - {name: per_patient, type: aggregate, input: feverish, window: {size: 100ms},
     group_by: [patient], aggregates: {n: "count()", hr: "max(heart_rate)"}, parallelism: 2}
sinks:
  - {name: out, input: per_patient}
`

// soakProc is a process of a soak org with the address of its ops HTTP
// server.
type soakProc struct {
	*proc
	name, http string
}

// soakOrg is an org of processes, each serving /metrics, that can start
// workers while it runs.
type soakOrg struct {
	*org
	t     *testing.T
	mu    sync.Mutex
	procs []*soakProc
	n     int // workers started so far, for names
}

func startSoakOrg(t *testing.T, coordinators, workers int) *soakOrg {
	t.Helper()
	s := &soakOrg{org: &org{adminToken: "admin-secret"}, t: t}
	o := s.org
	o.tlsDir, _ = tlsInit(t, "acme", coordinators)
	o.gossipKeyFile = gossipKeyFile(t, o.tlsDir)
	setTLSDir(t, o.tlsDir)
	ports := testport.Loopback(t, 4*coordinators)
	for i := 0; i < coordinators; i++ {
		o.grpc = append(o.grpc, ports[4*i])
		o.raft = append(o.raft, ports[4*i+1])
		o.serf = append(o.serf, ports[4*i+2])
	}
	base := t.TempDir()
	for i := 0; i < coordinators; i++ {
		id := fmt.Sprintf("c%d", i+1)
		p := start(t, id, "coordinator",
			"--org", "acme", "--node-id", id, "--data-dir", filepath.Join(base, id),
			"--grpc-addr", o.grpc[i], "--raft-addr", o.raft[i], "--serf-addr", o.serf[i],
			"--bootstrap-expect", fmt.Sprint(coordinators), "--join", strings.Join(o.serf, ","),
			"--join-token", "join-secret", "--admin-token", o.adminToken,
			"--tls-dir", o.tlsDir, "--gossip-key-file", o.gossipKeyFile,
			"--heartbeat-ttl", "2s", "--log-level", "info", "--http-addr", ports[4*i+3])
		o.coords = append(o.coords, p)
		s.procs = append(s.procs, &soakProc{proc: p, name: id, http: ports[4*i+3]})
	}
	for i := 0; i < workers; i++ {
		s.addWorker()
	}
	return s
}

// addWorker starts one more worker process, named w1, w2, ... in order.
func (s *soakOrg) addWorker() *soakProc {
	s.t.Helper()
	s.mu.Lock()
	s.n++
	name := fmt.Sprintf("w%d", s.n)
	s.mu.Unlock()
	httpAddr := testport.Loopback(s.t, 1)[0]
	p := start(s.t, name, "worker", "--org", "acme", "--name", name,
		"--coordinators", strings.Join(s.grpc, ","), "--join-token", "join-secret", "--cores", "2",
		"--tls-ca", filepath.Join(s.tlsDir, "ca.pem"), "--log-level", "info", "--http-addr", httpAddr)
	sp := &soakProc{proc: p, name: name, http: httpAddr}
	s.mu.Lock()
	s.workers = append(s.workers, p)
	s.procs = append(s.procs, sp)
	s.mu.Unlock()
	return sp
}

// live is the org's processes that have not exited.
func (s *soakOrg) live() []*soakProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*soakProc
	for _, p := range s.procs {
		select {
		case <-p.done:
		default:
			out = append(out, p)
		}
	}
	return out
}

// workerProc is the process of the worker with this id (its log names the
// id it registered with).
func (s *soakOrg) workerProc(id string) *soakProc {
	for _, p := range s.live() {
		if strings.HasPrefix(p.name, "w") && strings.Contains(p.out.String(), "worker="+id) {
			return p
		}
	}
	return nil
}

// run is a client command against coordinator 0, with a generous timeout
// (the machine is loaded and the soak has time).
func (s *soakOrg) run(ctx context.Context, out any, args ...string) error {
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return cli(cctx, s.t, out, append(args, "--addr", s.grpc[0], "--token", s.adminToken)...)
}

// evidence is the soak test's directory for samples and logs.
func evidence(t *testing.T) string {
	dir := *soakEvidence
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// resourceSample is what one scrape of a process's /metrics says.
type resourceSample struct {
	at                         time.Duration
	goroutines, rss, fds, heap float64
}

// watchResources scrapes every live process's /metrics every period into
// dir/resources.tsv until ctx ends, and returns each process's samples.
func (s *soakOrg) watchResources(ctx context.Context, dir string, period time.Duration) func() map[string][]resourceSample {
	f, err := os.Create(filepath.Join(dir, "resources.tsv"))
	if err != nil {
		s.t.Fatal(err)
	}
	fmt.Fprintln(f, "seconds\tprocess\tgoroutines\trss_mb\topen_fds\theap_inuse_mb")
	var mu sync.Mutex
	samples := map[string][]resourceSample{}
	done := make(chan struct{})
	begin := time.Now()
	go func() {
		defer close(done)
		defer f.Close()
		tick := time.NewTicker(period)
		defer tick.Stop()
		client := &http.Client{Timeout: 5 * time.Second}
		for {
			for _, p := range s.live() {
				smp, err := scrapeResources(ctx, client, p.http)
				if err != nil {
					continue
				}
				smp.at = time.Since(begin)
				mu.Lock()
				samples[p.name] = append(samples[p.name], smp)
				mu.Unlock()
				fmt.Fprintf(f, "%.0f\t%s\t%.0f\t%.1f\t%.0f\t%.1f\n", smp.at.Seconds(), p.name, smp.goroutines, smp.rss/1e6, smp.fds, smp.heap/1e6)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() map[string][]resourceSample {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return samples
	}
}

func scrapeResources(ctx context.Context, client *http.Client, addr string) (resourceSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return resourceSample{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return resourceSample{}, err
	}
	defer resp.Body.Close()
	var smp resourceSample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		switch name {
		case "go_goroutines":
			smp.goroutines = v
		case "process_resident_memory_bytes":
			smp.rss = v
		case "process_open_fds":
			smp.fds = v
		case "go_memstats_heap_inuse_bytes":
			smp.heap = v
		}
	}
	return smp, sc.Err()
}

// reportGrowth logs, for each process sampled through the whole soak, its
// figures a third of the way in (past the start-up) and at the end, and
// fails the test when goroutines or open files kept growing by more than
// a fixed margin: a leak of one per fault or move shows as tens over a
// soak, while a steady process's figures move by a few.
func reportGrowth(t *testing.T, samples map[string][]resourceSample) {
	t.Helper()
	names := make([]string, 0, len(samples))
	for n := range samples {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ss := samples[n]
		if len(ss) < 6 {
			continue
		}
		// The lowest of the second third against the highest of the last
		// sixth: a process busy at one sample is not a leak.
		mid := ss[len(ss)/3 : 2*len(ss)/3]
		last := ss[len(ss)*5/6:]
		lo, hi := mid[0], last[0]
		for _, s := range mid {
			lo.goroutines, lo.fds, lo.rss, lo.heap = min(lo.goroutines, s.goroutines), min(lo.fds, s.fds), min(lo.rss, s.rss), min(lo.heap, s.heap)
		}
		for _, s := range last {
			hi.goroutines, hi.fds, hi.rss, hi.heap = max(hi.goroutines, s.goroutines), max(hi.fds, s.fds), max(hi.rss, s.rss), max(hi.heap, s.heap)
		}
		t.Logf("%s: goroutines %.0f -> %.0f, open fds %.0f -> %.0f, RSS %.0f MB -> %.0f MB, heap in use %.0f MB -> %.0f MB (%d samples)",
			n, lo.goroutines, hi.goroutines, lo.fds, hi.fds, lo.rss/1e6, hi.rss/1e6, lo.heap/1e6, hi.heap/1e6, len(ss))
		if hi.goroutines > lo.goroutines*1.5+50 {
			t.Errorf("%s: goroutines grew from %.0f to %.0f over the soak", n, lo.goroutines, hi.goroutines)
		}
		if hi.fds > lo.fds*1.5+20 {
			t.Errorf("%s: open files grew from %.0f to %.0f over the soak", n, lo.fds, hi.fds)
		}
	}
}

// soakResults reads `fedstream tail ward --json --stable` and checks each
// result as it comes: equal to the reference, never twice. It records when
// the last new result came, for the stall check.
type soakResults struct {
	mu       sync.Mutex
	got      map[string]string
	last     time.Time
	maxGap   time.Duration
	gapAt    time.Time
	newest   time.Time // the newest window end printed
	problems []string
	done     chan struct{}
	stderr   *lockedBuffer
}

func tailStable(ctx context.Context, t *testing.T, s *soakOrg, want map[string]string, log *os.File) *soakResults {
	t.Helper()
	cmd := command(ctx, t, "tail", "ward", "--json", "--stable", "--addr", s.grpc[0], "--token", s.adminToken)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &soakResults{got: map[string]string{}, last: time.Now(), done: make(chan struct{}), stderr: &lockedBuffer{}}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var res struct {
				Type   string         `json:"type"`
				Values map[string]any `json:"values"`
			}
			if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
				r.problem(fmt.Sprintf("not JSON: %q", sc.Text()))
				continue
			}
			if res.Type != "STABLE" {
				r.problem(fmt.Sprintf("tail --stable printed a %s result: %s", res.Type, sc.Text()))
				continue
			}
			end := fmt.Sprint(res.Values["window_end"])
			key := fmt.Sprintf("%s@%s", res.Values["patient"], end)
			val := fmt.Sprintf("n=%v hr=%v", res.Values["n"], res.Values["hr"])
			now := time.Now()
			r.mu.Lock()
			if old, dup := r.got[key]; dup {
				r.problems = append(r.problems, fmt.Sprintf("%s: result %s printed twice (%s, then %s)", now.Format(time.TimeOnly), key, old, val))
			} else if want[key] != val {
				r.problems = append(r.problems, fmt.Sprintf("%s: result %s is %s, want %q", now.Format(time.TimeOnly), key, val, want[key]))
			}
			r.got[key] = val
			if gap := now.Sub(r.last); gap > r.maxGap {
				r.maxGap, r.gapAt = gap, now
			}
			r.last = now
			if ts, err := time.Parse(time.RFC3339Nano, end); err == nil && ts.After(r.newest) {
				r.newest = ts
			}
			r.mu.Unlock()
			fmt.Fprintln(log, now.Format(time.StampMilli), key, val)
		}
		_ = cmd.Wait()
	}()
	return r
}

func (r *soakResults) problem(p string) {
	r.mu.Lock()
	r.problems = append(r.problems, p)
	r.mu.Unlock()
}

// silence is how long no new stable result came.
func (r *soakResults) silence() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Since(r.last)
}

// soakReference is the reference of soakWard over more stream time than a
// soak of d can produce.
func soakReference(t *testing.T, d time.Duration) map[string]string {
	t.Helper()
	limit := int64(2500 * (d + 5*time.Minute).Seconds())
	q := strings.Replace(fmt.Sprintf(soakWard, 1), "seed: 11}", fmt.Sprintf("seed: 11, limit: %d}", limit), 1)
	return wardReference(t, q, 100*time.Millisecond)
}

// soak submits soakWard with replicas, tails its stable results and calls
// act every period until the soak's duration has passed, failing the test
// on a stall (no new stable result for -soak.stall), a wrong or duplicate
// result, a result missing before the newest printed, or a process whose
// goroutines or files kept growing.
func soak(t *testing.T, s *soakOrg, replicas int, period time.Duration, act func(ctx context.Context, round int, logf func(string, ...any))) {
	soakThen(t, s, replicas, period, act, nil)
}

// soakThen is soak with a check of the query's state once the faults have
// stopped, before the processes stop.
func soakThen(t *testing.T, s *soakOrg, replicas int, period time.Duration, act func(ctx context.Context, round int, logf func(string, ...any)), after func(ctx context.Context)) {
	want := soakReference(t, *soakDuration)
	dir := evidence(t)
	t.Logf("evidence in %s", dir)
	ctx, cancel := context.WithTimeout(context.Background(), *soakDuration+5*time.Minute)
	defer cancel()
	s.waitReady(t, len(s.workers))
	file := filepath.Join(dir, "ward.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(soakWard, replicas)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.run(ctx, &struct{}{}, "query", "submit", file); err != nil {
		t.Fatal(err)
	}
	events, err := os.Create(filepath.Join(dir, "events.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	var evMu sync.Mutex
	logf := func(format string, args ...any) {
		evMu.Lock()
		defer evMu.Unlock()
		fmt.Fprintf(events, "%s %s\n", time.Now().Format(time.StampMilli), fmt.Sprintf(format, args...))
	}
	results, err := os.Create(filepath.Join(dir, "results.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer results.Close()
	watchCtx, stopWatch := context.WithCancel(ctx)
	samples := s.watchResources(watchCtx, dir, 10*time.Second)
	r := tailStable(ctx, t, s, want, results)
	waitFor(t, 60*time.Second, "the first stable results", func() bool { return r.silence() < time.Second && len(r.snapshot()) > 0 })

	end := time.Now().Add(*soakDuration)
	next := time.Now().Add(period)
	round := 0
	stalled := ""
	for time.Now().Before(end) && stalled == "" {
		select {
		case <-r.done:
			t.Fatalf("tail ended: %s", r.stderr.String())
		default:
		}
		if gap := r.silence(); gap > *soakStall {
			stalled = fmt.Sprintf("no new stable result for %v (round %d)", gap.Round(time.Second), round)
			logf("STALL: %s", stalled)
			break
		}
		if time.Now().After(next) {
			round++
			act(ctx, round, logf)
			next = time.Now().Add(period)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The faults stop; what was printed so far must be complete once the
	// query has had time to settle.
	settle := time.Now()
	waitFor(t, *soakStall, "stable results after the last fault", func() bool { return r.silence() < time.Second && time.Since(settle) > 10*time.Second })
	stopWatch()
	if after != nil {
		after(ctx)
	}
	got := r.snapshot()
	r.mu.Lock()
	newest, maxGap, gapAt, problems := r.newest, r.maxGap, r.gapAt, append([]string(nil), r.problems...)
	r.mu.Unlock()
	// Every reference window that ended a second before the newest printed
	// one must have been printed.
	cut := newest.Add(-time.Second)
	var missing []string
	for k := range want {
		_, wend, _ := strings.Cut(k, "@")
		if ts, err := time.Parse(time.RFC3339Nano, wend); err == nil && ts.Before(cut) && got[k] == "" {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	t.Logf("%d stable results, newest window %s, longest silence %v (at %s), %d rounds", len(got), newest, maxGap.Round(time.Millisecond), gapAt.Format(time.TimeOnly), round)
	reportGrowth(t, samples())
	if stalled != "" {
		t.Errorf("stalled: %s", stalled)
	}
	if len(missing) > 0 {
		t.Errorf("%d results missing before %s, first %v", len(missing), cut, missing[:min(5, len(missing))])
	}
	for i, p := range problems {
		if i == 10 {
			t.Errorf("... %d more", len(problems)-10)
			break
		}
		t.Error(p)
	}
	if t.Failed() {
		for _, p := range s.live() {
			_ = os.WriteFile(filepath.Join(dir, p.name+".log"), []byte(p.out.String()), 0o644)
		}
	}
}

func (r *soakResults) snapshot() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.got))
	for k, v := range r.got {
		out[k] = v
	}
	return out
}

type soakTask struct {
	ID         string `json:"id"`
	Worker     string `json:"worker"`
	State      string `json:"state"`
	MovingFrom string `json:"moving_from"`
}

func (s *soakOrg) tasks(ctx context.Context) ([]soakTask, error) {
	var q struct {
		Tasks []soakTask `json:"tasks"`
	}
	err := s.run(ctx, &q, "query", "status", "ward")
	return q.Tasks, err
}

// TestSoakReplicatedFaults: a replicated (DCAA) query for the soak's
// duration while, every minute, a worker running one of its tasks is
// paused for 20 s (SIGSTOP, then SIGCONT) or killed (SIGKILL, and a new
// worker started in its place), in turn.
func TestSoakReplicatedFaults(t *testing.T) {
	t.Parallel()
	s := startSoakOrg(t, 3, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	soak(t, s, 2, time.Minute, func(ctx context.Context, round int, logf func(string, ...any)) {
		ts, err := s.tasks(ctx)
		if err != nil || len(ts) == 0 {
			logf("round %d: no task list: %v", round, err)
			return
		}
		tk := ts[rng.IntN(len(ts))]
		p := s.workerProc(tk.Worker)
		if p == nil {
			logf("round %d: no process for worker %s of %s", round, tk.Worker, tk.ID)
			return
		}
		if round%2 == 1 {
			logf("round %d: SIGSTOP %s (worker %s, runs %s)", round, p.name, tk.Worker, tk.ID)
			p.signal(syscall.SIGSTOP)
			select {
			case <-time.After(20 * time.Second):
			case <-ctx.Done():
			}
			p.signal(syscall.SIGCONT)
			logf("round %d: SIGCONT %s", round, p.name)
			return
		}
		logf("round %d: SIGKILL %s (worker %s, runs %s)", round, p.name, tk.Worker, tk.ID)
		p.kill()
		np := s.addWorker()
		logf("round %d: started %s", round, np.name)
	})
}

// TestSoakMoves: an unreplicated query for the soak's duration while,
// every 20 s, one of its tasks (sources, operators and the sink alike)
// moves live to another worker.
func TestSoakMoves(t *testing.T) {
	t.Parallel()
	s := startSoakOrg(t, 1, 3)
	rng := rand.New(rand.NewPCG(3, 4))
	soak(t, s, 1, 20*time.Second, func(ctx context.Context, round int, logf func(string, ...any)) {
		ts, err := s.tasks(ctx)
		if err != nil || len(ts) == 0 {
			logf("round %d: no task list: %v", round, err)
			return
		}
		var ws []workerJSON
		if err := s.run(ctx, &ws, "workers"); err != nil {
			logf("round %d: no worker list: %v", round, err)
			return
		}
		tk := ts[rng.IntN(len(ts))]
		var to []string
		for _, w := range ws {
			if w.ID != tk.Worker && w.Status == "ready" {
				to = append(to, w.ID)
			}
		}
		if len(to) == 0 {
			logf("round %d: nowhere to move %s", round, tk.ID)
			return
		}
		dst := to[rng.IntN(len(to))]
		began := time.Now()
		err = s.run(ctx, &struct{}{}, "task", "move", tk.ID, "--to", dst)
		logf("round %d: move %s from %s to %s: %v after %v", round, tk.ID, tk.Worker, dst, err, time.Since(began).Round(time.Millisecond))
	})
}

// TestSoakReconfiguration: a replicated query for the soak's duration
// while, every 15 s, a live reconfiguration plan gives its filter a new
// version (written in turn two ways that keep the same tuples, so the
// results stay the reference's).
func TestSoakReconfiguration(t *testing.T) {
	t.Parallel()
	s := startSoakOrg(t, 1, 3)
	dir := t.TempDir()
	soakThen(t, s, 2, 15*time.Second, func(ctx context.Context, round int, logf func(string, ...any)) {
		q := fmt.Sprintf(soakWard, 2)
		if round%2 == 1 {
			q = strings.Replace(q, `where: "temperature > 37.0"`, `where: "37.0 < temperature"`, 1)
		}
		file := filepath.Join(dir, fmt.Sprintf("ward-%d.yaml", round))
		if err := os.WriteFile(file, []byte(q), 0o644); err != nil {
			logf("round %d: %v", round, err)
			return
		}
		began := time.Now()
		var out any
		err := s.run(ctx, &out, "query", "update", file)
		logf("round %d: update: %v after %v: %v", round, err, time.Since(began).Round(time.Millisecond), out)
	}, func(ctx context.Context) {
		// Every plan completes and leaves one active version of each
		// operator (query versions lists every version the query had):
		// old versions that stayed active would hold tasks and state
		// forever.
		var v struct {
			Operators []struct {
				Operator string `json:"operator"`
				Versions []struct {
					Version int  `json:"version"`
					Active  bool `json:"active"`
				} `json:"versions"`
			} `json:"operators"`
			Plans []struct {
				Epoch uint64 `json:"epoch"`
				Phase string `json:"phase"`
			} `json:"plans"`
		}
		var last string
		deadline := time.Now().Add(*soakStall)
		for {
			if err := s.run(ctx, &v, "query", "versions", "ward"); err == nil {
				done := true
				for _, o := range v.Operators {
					active := 0
					for _, ver := range o.Versions {
						if ver.Active {
							active++
						}
					}
					done = done && active == 1
				}
				for _, p := range v.Plans {
					done = done && p.Phase == "complete"
				}
				if done {
					return
				}
				b, _ := json.Marshal(v)
				last = string(b)
			}
			if time.Now().After(deadline) {
				t.Errorf("the reconfiguration plans did not all complete with one active version per operator within %v: %s", *soakStall, last)
				return
			}
			time.Sleep(time.Second)
		}
	})
}
