package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fedstream/fedstream/config/logging"
)

// stallChildEnv, set in a test process's environment, makes
// TestDemoOrgRidesOutAProcessStall run its child's side.
const stallChildEnv = "FEDSTREAM_TEST_STALL_CHILD"

// demoStall is how long the test stops the whole process of a demo org:
// the kind of pause a loaded machine gives a process (at load 24-28 on
// two cores, Raft vote requests between coordinators of one process
// timed out after seconds), and longer than devTimings' Raft heartbeat
// timeout (1 s), so every follower's timer is overdue when it resumes.
const demoStall = 2 * time.Second

// demoStalls is how many stalls the test makes: after one, the leader's
// heartbeat may reach a follower before the follower's overdue timer
// is handled (then that stall passes even with 1 s clocks: 1 run in 3).
const demoStalls = 3

// A whole process of a dev org stopped for demoStall (SIGSTOP, as the
// scheduler of a loaded machine deschedules it, every coordinator at
// once) and resumed keeps its leader: with the dev command's clocks no
// follower starts an election and the leader does not step down when the
// clocks catch up with the pause. The org runs in a child process (this
// test binary again) that reports every Raft state change of its
// coordinators once its leader is known.
func TestDemoOrgRidesOutAProcessStall(t *testing.T) {
	if os.Getenv(stallChildEnv) != "" {
		stallChild(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDemoOrgRidesOutAProcessStall$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), stallChildEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedText
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer func() {
		resume()
		_ = stdin.Close() // the child stops when its input ends
		if err := cmd.Wait(); err != nil && !t.Failed() {
			t.Errorf("child: %v\n%s", err, stderr.String())
		}
	}()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// next returns the child's next line starting with one of prefixes,
	// collecting the Raft state changes it reports on the way.
	var changes []string
	next := func(prefixes ...string) string {
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the child ended before a line %q\n%s", prefixes, stderr.String())
				}
				if strings.HasPrefix(l, "state ") {
					changes = append(changes, l)
					continue
				}
				for _, p := range prefixes {
					if strings.HasPrefix(l, p) {
						return l
					}
				}
			case <-ctx.Done():
				t.Fatalf("no line %q from the child: %v\n%s", prefixes, ctx.Err(), stderr.String())
			}
		}
	}
	start := next("ready")
	t.Logf("child: %s", start)
	changes = nil
	for i := 1; i <= demoStalls; i++ {
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		resumed = false
		// The stall itself: the child is stopped for its length (a fault
		// the test injects, not a wait for anything).
		time.Sleep(demoStall)
		resume()
		// The child answers once it has committed a write through its
		// leader and heard from it on every follower since the check
		// came: the timers that fell due during the stall fired before.
		if _, err := fmt.Fprintln(stdin, "check"); err != nil {
			t.Fatal(err)
		}
		done := next("checked", "failed")
		if strings.HasPrefix(done, "failed") {
			t.Fatalf("child after stall %d: %s\n%s", i, done, stderr.String())
		}
		if len(changes) > 0 {
			t.Fatalf("stall %d of %v of the process changed its coordinators' Raft states (an election, or a leader stepping down):\n%s",
				i, demoStall, strings.Join(changes, "\n"))
		}
		t.Logf("child after stall %d: %s", i, done)
	}
}

// stallChild runs the child's side: one org of three coordinators with
// the dev command's clocks. It prints "ready LEADER" once every node
// follows one leader, then "state NODE STATE" for every Raft state change
// of a node, and answers each "check" on its input with "checked LEADER"
// (or "failed WHY").
func stallChild(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	timings := demoTimings()
	d, err := startDev(ctx, devOptions{org: "stall", coordinators: 3, dataDir: t.TempDir(), noHTTP: true,
		logger: logging.Discard(), timings: &timings})
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	leader := func() (*raft.Raft, string) {
		var lead *raft.Raft
		var id string
		for _, c := range d.coords {
			if c.Raft().State() == raft.Leader {
				lead, id = c.Raft(), c.NodeID()
			}
		}
		if lead == nil {
			return nil, ""
		}
		_, leadID := lead.LeaderWithID()
		for _, c := range d.coords {
			if _, l := c.Raft().LeaderWithID(); l != leadID {
				return nil, ""
			}
		}
		return lead, id
	}
	// Generous deadlines: at load 50 on two cores an org of this process
	// once took a minute to elect.
	waitFor := func(what string, cond func() bool) error {
		deadline := time.Now().Add(2 * time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: not within 2 minutes", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	}
	if err := waitFor("a leader every node follows", func() bool { r, _ := leader(); return r != nil }); err != nil {
		t.Fatal(err)
	}
	// Raft state changes from here on (an election makes a node a
	// candidate; a leader that steps down becomes a follower).
	obs := make(chan raft.Observation, 64)
	for _, c := range d.coords {
		c.Raft().RegisterObserver(raft.NewObserver(obs, false, func(o *raft.Observation) bool {
			_, ok := o.Data.(raft.RaftState)
			return ok
		}))
	}
	var obsDone sync.WaitGroup
	obsDone.Add(1)
	go func() {
		defer obsDone.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case o := <-obs:
				id := "?"
				for _, c := range d.coords {
					if c.Raft() == o.Raft {
						id = c.NodeID()
					}
				}
				say("state %s %v", id, o.Data)
			}
		}
	}()
	defer obsDone.Wait()
	defer cancel()
	_, id := leader()
	say("ready %s", id)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "check" {
			continue
		}
		asked := time.Now()
		var lead *raft.Raft
		err := waitFor("a leader every node follows", func() bool { lead, id = leader(); return lead != nil })
		if err == nil {
			err = lead.Barrier(time.Minute).Error()
		}
		if err == nil {
			err = waitFor("every follower hearing from the leader", func() bool {
				for _, c := range d.coords {
					r := c.Raft()
					if r != lead && r.LastContact().Before(asked) {
						return false
					}
				}
				return true
			})
		}
		if err != nil {
			say("failed %v", err)
			continue
		}
		say("checked %s", id)
	}
	if err := in.Err(); err != nil && err != io.EOF {
		t.Error(err)
	}
}

// lockedText is an io.Writer that keeps what is written, safe for
// concurrent use.
type lockedText struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedText) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedText) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
