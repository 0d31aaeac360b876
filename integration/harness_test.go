// Package integration runs the built fedstream binary as real processes on
// loopback and injects faults into them.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fedstream/fedstream/internal/testport"
)

var (
	buildOnce sync.Once
	binDir    string // the build's temporary directory, removed by TestMain
	binPath   string
	buildErr  error
)

// TestMain removes the directory binary built into once the package's
// tests have ended, failed ones included (each held a 52 MB binary that
// stayed in the temporary directory after every run). A test binary that
// dies in a panic (a -timeout included) exits without returning here and
// still leaves it.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		if err := os.RemoveAll(binDir); err != nil {
			fmt.Fprintf(os.Stderr, "integration: removing the build directory: %v\n", err)
		}
	}
	os.Exit(code)
}

// binary builds cmd/fedstream once per test run.
//
// It builds without profile-guided optimisation (-pgo=off). With the
// profile (cmd/fedstream/default.pgo, which go build uses by default) every
// package of the binary, the standard library and the dependencies
// included, is compiled again with it: 5m23s of CPU on a cold build cache
// (under load 25), on a 2-core machine that also runs the other packages'
// tests. Without it, go build reuses the packages go test compiled for the
// tests and only compiles main and links. The profile changes inlining and
// devirtualisation decisions, never what the program does; the benchmarks
// (fedstream bench) are where the optimised binary is measured.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fedstream-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		binPath = filepath.Join(dir, "fedstream")
		out, err := exec.Command("go", "build", "-pgo=off", "-o", binPath, "../cmd/fedstream").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is one running fedstream process whose output is kept for failure reports.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tlsDirs holds, by test name, the TLS directory of the org a test
// started (startOrg). The processes a test starts afterwards get it as
// FEDSTREAM_TLS_DIR, as if the test had set it in its own environment;
// the test process's environment is shared by every test, and the tests
// run in parallel.
var tlsDirs sync.Map

// setTLSDir gives the processes t starts from now on FEDSTREAM_TLS_DIR=dir.
func setTLSDir(t *testing.T, dir string) {
	tlsDirs.Store(t.Name(), dir)
	t.Cleanup(func() { tlsDirs.Delete(t.Name()) })
}

// testEnv is the environment of a process t starts: the test process's,
// with FEDSTREAM_TLS_DIR set by setTLSDir for t or for a test t is a
// subtest of.
func testEnv(t *testing.T) []string {
	env := os.Environ()
	for name := t.Name(); ; {
		if dir, ok := tlsDirs.Load(name); ok {
			// exec keeps the last of duplicate variables.
			return append(env, "FEDSTREAM_TLS_DIR="+dir.(string))
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return env
		}
		name = name[:i]
	}
}

// command is exec.CommandContext of the built binary, in t's environment.
func command(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = testEnv(t)
	return cmd
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = testEnv(t)
	p := &proc{name: name, cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	g := testProcs(t)
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	t.Cleanup(func() {
		// The first process cleanup of the test asks every process of the
		// test to stop, so they stop together: a coordinator takes 1-2.6 s
		// to stop (it leaves its pools), and three stopped one after the
		// other made a test's end 4 s or more.
		g.terminate()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			p.signal(syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("---- output of %s ----\n%s", name, tail(p.out.String(), 60))
		}
	})
	return p
}

// procGroup is the processes one test started.
type procGroup struct {
	mu    sync.Mutex
	procs []*proc
}

// procGroups holds each test's procGroup, by test.
var procGroups sync.Map

// testProcs returns t's procGroup, made (and forgotten at t's end) on
// first use.
func testProcs(t *testing.T) *procGroup {
	g, loaded := procGroups.LoadOrStore(t, &procGroup{})
	if !loaded {
		t.Cleanup(func() { procGroups.Delete(t) })
	}
	return g.(*procGroup)
}

// terminate sends SIGTERM once to every process of the group (a second
// one could cut a graceful stop short).
func (g *procGroup) terminate() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.procs {
		p.signal(syscall.SIGTERM)
	}
	g.procs = nil
}

func (p *proc) signal(sig syscall.Signal) {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cli runs a client command and decodes its --json output into out.
func cli(ctx context.Context, t *testing.T, out any, args ...string) error {
	t.Helper()
	cmd := command(ctx, t, append(args, "--json", "--timeout", "3s")...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return json.Unmarshal(stdout.Bytes(), out)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	startT := time.Now()
	deadline := startT.Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(startT)
}

// org is a coordinator cluster and its workers as separate processes.
type org struct {
	coords     []*proc
	grpc       []string
	raft, serf []string
	workers    []*proc
	adminToken string
	// tlsDir holds the org's CA and certificates (fedstream tls init).
	tlsDir string
	// gossipKeyFile holds the org's serf key (fedstream keygen).
	gossipKeyFile string
}

// gossipKeyFile writes a key from fedstream keygen into dir.
func gossipKeyFile(t *testing.T, dir string) string {
	t.Helper()
	out, err := command(context.Background(), t, "keygen").Output()
	if err != nil {
		t.Fatalf("keygen: %v", err)
	}
	p := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(p, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// tlsInit runs fedstream tls init for org into a new directory and
// returns the directory and the files it reported.
func tlsInit(t *testing.T, org string, coordinators int) (string, []tlsFile) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tls-"+org)
	var ids []string
	for i := 0; i < coordinators; i++ {
		ids = append(ids, fmt.Sprintf("c%d", i+1))
	}
	out, err := command(context.Background(), t, "tls", "init", "--org", org, "--out", dir, "--coordinators", strings.Join(ids, ","), "--json").Output()
	if err != nil {
		t.Fatalf("tls init: %v", err)
	}
	var res struct {
		Files []tlsFile `json:"files"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("tls init --json: %v: %s", err, out)
	}
	return dir, res.Files
}

type tlsFile struct {
	Path     string `json:"path"`
	Kind     string `json:"kind"`
	Identity string `json:"identity"`
}

func startOrg(t *testing.T, coordinators, workers int, extraWorkerArgs ...string) *org {
	t.Helper()
	o := &org{adminToken: "admin-secret"}
	o.tlsDir, _ = tlsInit(t, "acme", coordinators)
	o.gossipKeyFile = gossipKeyFile(t, o.tlsDir)
	// Every client command of the test finds the org's CA and the admin
	// client certificate here.
	setTLSDir(t, o.tlsDir)
	type addrs struct{ grpc, raft, serf string }
	var all []addrs
	ports := testport.Loopback(t, 3*coordinators)
	for i := 0; i < coordinators; i++ {
		all = append(all, addrs{ports[3*i], ports[3*i+1], ports[3*i+2]})
	}
	var serf []string
	for _, a := range all {
		serf = append(serf, a.serf)
		o.grpc = append(o.grpc, a.grpc)
		o.raft = append(o.raft, a.raft)
	}
	o.serf = serf
	base := t.TempDir()
	for i, a := range all {
		id := fmt.Sprintf("c%d", i+1)
		o.coords = append(o.coords, start(t, id, "coordinator",
			"--org", "acme", "--node-id", id, "--data-dir", filepath.Join(base, id),
			"--grpc-addr", a.grpc, "--raft-addr", a.raft, "--serf-addr", a.serf,
			"--bootstrap-expect", fmt.Sprint(coordinators), "--join", strings.Join(serf, ","),
			"--join-token", "join-secret", "--admin-token", o.adminToken,
			"--tls-dir", o.tlsDir, "--gossip-key-file", o.gossipKeyFile,
			"--heartbeat-ttl", "2s", "--log-level", "debug"))
	}
	for i := 0; i < workers; i++ {
		name := fmt.Sprintf("w%d", i+1)
		args := append([]string{"worker", "--org", "acme", "--name", name,
			"--coordinators", strings.Join(o.grpc, ","), "--join-token", "join-secret", "--cores", "2",
			"--tls-ca", filepath.Join(o.tlsDir, "ca.pem")}, extraWorkerArgs...)
		o.workers = append(o.workers, start(t, name, args...))
	}
	return o
}

type statusJSON struct {
	Org        string `json:"org"`
	NodeID     string `json:"node_id"`
	LeaderID   string `json:"leader_id"`
	LeaderAddr string `json:"leader_addr"`
	Peers      []struct {
		ID string `json:"id"`
	} `json:"peers"`
	LastIndex uint64 `json:"last_index"`
}

type workerJSON struct {
	ID     string   `json:"id"`
	Addr   string   `json:"addr"`
	Status string   `json:"status"`
	Tasks  []string `json:"tasks"`
}

func (o *org) status(t *testing.T, i int) (statusJSON, error) {
	var st statusJSON
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := cli(ctx, t, &st, "status", "--addr", o.grpc[i], "--token", o.adminToken)
	return st, err
}

func (o *org) workerList(t *testing.T, i int) ([]workerJSON, error) {
	var ws []workerJSON
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := cli(ctx, t, &ws, "workers", "--addr", o.grpc[i], "--token", o.adminToken)
	return ws, err
}

// workerListNow is workerList of coordinator 0 for a test that needs the
// answer: a failed call is tried again, for up to 30 s. One CLI process
// that did not answer within workerList's 5 s (load 30 on two cores:
// "context deadline exceeded") failed the test that asked.
func (o *org) workerListNow(t *testing.T) []workerJSON {
	t.Helper()
	var ws []workerJSON
	waitFor(t, 30*time.Second, "the coordinator's worker list", func() bool {
		var err error
		ws, err = o.workerList(t, 0)
		return err == nil
	})
	return ws
}

// waitReady waits until coordinator 0 lists n workers, all ready.
func (o *org) waitReady(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d ready workers", n), func() bool {
		ws, err := o.workerList(t, 0)
		if err != nil || len(ws) != n {
			return false
		}
		for _, w := range ws {
			if w.Status != "ready" {
				return false
			}
		}
		return true
	})
}
