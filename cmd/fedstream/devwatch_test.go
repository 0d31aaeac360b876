package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fedstream/fedstream/config/logging"
)

// At the dev command's default level (error) the libraries' network
// errors are not printed and every other error is; at warn they are
// printed as warnings.
func TestQuietLibrariesLevels(t *testing.T) {
	cases := []struct {
		name      string
		component string // "" : the coordinator's own logger
		msg       string
		at        string // the dev command's --log-level
		want      string // the level printed ("": nothing)
	}{
		{"memberlist probe", "memberlist", "memberlist: Failed fallback TCP ping: timeout 800ms", "error", ""},
		{"federation memberlist", "fed-memberlist", "memberlist: Failed to send ack", "error", ""},
		{"serf", "serf", "serf: failed to send", "error", ""},
		{"raft transport", "raft-net", "failed to decode incoming command", "error", ""},
		{"raft vote RPC", "raft", "failed to make requestVote RPC", "error", ""},
		{"raft append RPC", "raft", "failed to appendEntries to", "error", ""},
		{"raft heartbeat RPC", "raft", "failed to heartbeat to", "error", ""},
		{"raft newer term", "raft", "peer has newer term, stopping replication", "error", ""},
		{"raft's own error", "raft", "failed to take snapshot", "error", "ERROR"},
		{"snapshot store", "snapshots", "failed to open snapshot", "error", "ERROR"},
		{"own error", "", "worker stopped", "error", "ERROR"},
		{"memberlist at warn", "memberlist", "memberlist: Failed fallback TCP ping", "warn", "WARN"},
		{"raft RPC at warn", "raft", "failed to appendEntries to", "warn", "WARN"},
		{"own error at warn", "", "marking a dead partner down", "warn", "ERROR"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			l := slog.New(quietLibraries{h: logging.New(&buf, c.at, false).Handler()}).With("org", "alpha", "node", "c1")
			if c.component != "" {
				l = l.With("component", c.component)
			}
			l.Error(c.msg, "err", "i/o timeout")
			got := buf.String()
			switch {
			case c.want == "" && got != "":
				t.Fatalf("printed %q, want nothing", got)
			case c.want != "" && !strings.Contains(got, "level="+c.want+" "):
				t.Fatalf("printed %q, want it at %s", got, c.want)
			case c.want != "" && !strings.Contains(got, c.msg):
				t.Fatalf("printed %q, want the message %q", got, c.msg)
			}
		})
	}
}

// The same through the hashicorp adapters: memberlist's "[ERR]" lines and
// raft's hclog errors.
func TestQuietLibrariesThroughAdapters(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(quietLibraries{h: logging.New(&buf, "error", false).Handler()})
	logging.StdLogger(l, "memberlist").Printf("[ERR] memberlist: Failed fallback TCP ping: timeout 1s")
	logging.HCLog(l, "raft").Error("failed to make requestVote RPC", "target", "c2", "error", "i/o timeout")
	if buf.Len() != 0 {
		t.Fatalf("printed %q, want nothing at level error", buf.String())
	}
	logging.HCLog(l, "raft").Error("failed to get log", "index", 7)
	if !strings.Contains(buf.String(), "level=ERROR") {
		t.Fatalf("printed %q, want raft's own error", buf.String())
	}
}

// demoWatch tells a stall of the process once per quiet period (with
// how many and the longest since), and an org without a leader for
// noLeader once, then when it has one again.
func TestDemoWatchNotices(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	load := func() string { return "load average 28.1 on 2 cores" }
	all := map[string]bool{"alpha": true, "beta": true}
	noBeta := map[string]bool{"alpha": true, "beta": false}
	w := newDemoWatch()
	var got []string
	tickAt := func(s float64, leaders map[string]bool) {
		for _, n := range w.tick(t0.Add(time.Duration(s*float64(time.Second))), leaders, load) {
			got = append(got, fmt.Sprintf("%.2f %s", s, n))
		}
	}
	// ticks ticks on time (every 250 ms) from from to to.
	ticks := func(from, to float64, leaders map[string]bool) {
		for s := from; s <= to+1e-9; s += 0.25 {
			tickAt(s, leaders)
		}
	}
	ticks(0, 1.75, all)
	tickAt(3.25, all) // 1.25 s late: under stallMin
	tickAt(5.6, all)  // 2.1 s late: told
	ticks(5.85, 8, all)
	tickAt(11.25, all) // 3 s late: within a minute of the last notice
	ticks(11.5, 20, all)
	tickAt(24.05, all) // 3.8 s late
	ticks(24.3, 66, all)
	ticks(66.25, 96.5, noBeta)
	tickAt(100, all) // 3.25 s late: within a minute of the last notice
	want := []string{
		"5.60 note: the machine is busy (load average 28.1 on 2 cores): this process did not run for 2.1 s.",
		"65.80 note: the machine is busy (load average 28.1 on 2 cores): this process did not run for up to 3.8 s, 2 times in the last 1m0s.",
		"96.25 org beta has had no Raft leader for 30s",
		"100.00 org beta has a leader again, after 34s without one",
	}
	if len(got) != len(want) {
		t.Fatalf("notices:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Fatalf("notice %d: %q, want it to start %q", i, got[i], want[i])
		}
	}
}
