package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// What a newcomer reads on a busy machine. `fedstream dev` logs at
// "error" by default, and on a loaded machine the hashicorp libraries
// inside its coordinators log errors that are not problems of their own:
// memberlist's probes and raft's RPCs between nodes of the one process
// time out while the process waits for a CPU (a 5-minute run at load 20-26
// printed 1,366 such lines, none of them a fault). quietLibraries
// lowers those to warnings, and demoWatch says in plain words what they
// meant: the process was stalled, or an org has no leader.

// libraryComponents are the "component" values of the loggers the
// coordinators give the hashicorp libraries (config/logging HCLog and
// StdLogger) whose errors are about the network between members:
// memberlist and serf entirely, raft's transport, and raft's failed RPCs
// to a peer (libraryRaftRPC). Raft's other errors (its log, snapshots)
// stay errors.
//
// In a run of the old dev clocks at load 20-26 every one of its 1,366
// error lines was of these.
var libraryComponents = map[string]bool{
	"memberlist": true, "serf": true, "fed-memberlist": true, "fed-serf": true, "raft-net": true,
}

// libraryRaftRPC are the prefixes of raft's error messages about an RPC
// to a peer that failed or timed out, and about a leader that learns from
// a peer that a newer term began (an election it missed while stalled).
var libraryRaftRPC = []string{"failed to make requestVote RPC", "failed to appendEntries to", "failed to heartbeat to",
	"peer has newer term, stopping replication"}

// quietLibraries is a slog.Handler that logs the network errors of the
// libraries (libraryComponents, libraryRaftRPC) at WARN instead of ERROR;
// every other record passes unchanged.
type quietLibraries struct {
	h slog.Handler
	// component is the "component" attribute the logger carries ("":
	// none).
	component string
}

func (q quietLibraries) demote(r slog.Record) bool {
	if r.Level != slog.LevelError {
		return false
	}
	if libraryComponents[q.component] {
		return true
	}
	if q.component == "raft" {
		for _, p := range libraryRaftRPC {
			if strings.HasPrefix(r.Message, p) {
				return true
			}
		}
	}
	return false
}

func (q quietLibraries) Enabled(ctx context.Context, l slog.Level) bool {
	// A library's error may go out as a warning: ask for the lower level
	// (Handle asks again with the level it logs at).
	if l == slog.LevelError && q.component != "" {
		return q.h.Enabled(ctx, slog.LevelWarn) || q.h.Enabled(ctx, l)
	}
	return q.h.Enabled(ctx, l)
}

func (q quietLibraries) Handle(ctx context.Context, r slog.Record) error {
	if q.demote(r) {
		r = r.Clone()
		r.Level = slog.LevelWarn
	}
	if !q.h.Enabled(ctx, r.Level) {
		return nil
	}
	return q.h.Handle(ctx, r)
}

func (q quietLibraries) WithAttrs(as []slog.Attr) slog.Handler {
	c := q.component
	for _, a := range as {
		if a.Key == "component" {
			c = a.Value.String()
		}
	}
	return quietLibraries{h: q.h.WithAttrs(as), component: c}
}

func (q quietLibraries) WithGroup(name string) slog.Handler {
	return quietLibraries{h: q.h.WithGroup(name), component: q.component}
}

// demoWatch decides the plain notices of a dev run from the times its
// ticker fires and which orgs have a leader: a stall of the process (a
// tick that came stallMin or more late) and an org without a leader for
// noLeader. Not safe for concurrent use: one goroutine ticks it.
type demoWatch struct {
	every    time.Duration // the ticker's period
	stallMin time.Duration // lateness that counts as a stall
	quiet    time.Duration // at most one stall notice per quiet
	noLeader time.Duration // an org without a leader this long is told

	last       time.Time // the previous tick (zero: none yet)
	lastNotice time.Time // the last stall notice (zero: none yet)
	// stalls and longest since the last stall notice.
	stalls  int
	longest time.Duration
	// since: when each org was first seen without a leader; told: the
	// orgs whose lack of a leader was told.
	since map[string]time.Time
	told  map[string]bool
}

func newDemoWatch() *demoWatch {
	return &demoWatch{every: 250 * time.Millisecond, stallMin: 2 * time.Second, quiet: time.Minute, noLeader: 30 * time.Second,
		since: map[string]time.Time{}, told: map[string]bool{}}
}

// tick takes a tick at now, with leaders saying which orgs have a leader
// (all of them, every tick), and returns the notices to print; load
// tells the machine's load for a stall notice ("" when unknown).
func (w *demoWatch) tick(now time.Time, leaders map[string]bool, load func() string) []string {
	var out []string
	if !w.last.IsZero() {
		if late := now.Sub(w.last) - w.every; late >= w.stallMin {
			w.stalls++
			w.longest = max(w.longest, late)
		}
	}
	w.last = now
	if w.stalls > 0 && (w.lastNotice.IsZero() || now.Sub(w.lastNotice) >= w.quiet) {
		what := fmt.Sprintf("did not run for %.1f s", w.longest.Seconds())
		if w.stalls > 1 {
			what = fmt.Sprintf("did not run for up to %.1f s, %d times", w.longest.Seconds(), w.stalls)
		}
		if !w.lastNotice.IsZero() {
			what += fmt.Sprintf(" in the last %s", now.Sub(w.lastNotice).Round(time.Second))
		}
		busy := "the machine is busy"
		if l := load(); l != "" {
			busy += " (" + l + ")"
		}
		out = append(out, fmt.Sprintf("note: %s: this process %s. Results come late, some TENTATIVE until corrected.", busy, what))
		w.lastNotice, w.stalls, w.longest = now, 0, 0
	}
	orgs := make([]string, 0, len(leaders))
	for org := range leaders {
		orgs = append(orgs, org)
	}
	slices.Sort(orgs)
	for _, org := range orgs {
		if leaders[org] {
			if w.told[org] {
				out = append(out, fmt.Sprintf("org %s has a leader again, after %s without one", org, now.Sub(w.since[org]).Round(time.Second)))
			}
			delete(w.since, org)
			delete(w.told, org)
			continue
		}
		s, ok := w.since[org]
		if !ok {
			w.since[org] = now
			continue
		}
		if !w.told[org] && now.Sub(s) >= w.noLeader {
			w.told[org] = true
			out = append(out, fmt.Sprintf("org %s has had no Raft leader for %s: its coordinators cannot agree on one (a machine this busy delays their votes); it takes no writes until they do", org, now.Sub(s).Round(time.Second)))
		}
	}
	return out
}

// watchDemo prints the notices of a demoWatch on w until ctx ends.
func watchDemo(ctx context.Context, w io.Writer, orgs []*devFederation) {
	dw := newDemoWatch()
	t := time.NewTicker(dw.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A ticker drops the ticks a stalled receiver misses: the
			// time between two receives is how long the process (or
			// this goroutine's turn to run) was held up.
		}
		leaders := map[string]bool{}
		for _, d := range orgs {
			has := false
			for _, c := range d.coords {
				has = has || c.IsLeader()
			}
			leaders[d.org] = has
		}
		for _, n := range dw.tick(time.Now(), leaders, loadText) {
			fmt.Fprintln(w, n)
		}
	}
}

// loadText is the machine's 1-minute load average and core count, as
// "load average 28.1 on 2 cores" ("" where /proc/loadavg is not there).
func loadText() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return fmt.Sprintf("load average %s on %s", f[0], plural(runtime.NumCPU(), "core", "cores"))
}
