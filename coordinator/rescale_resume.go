package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/go-memdb"

	"github.com/fedstream/fedstream/fsm"
)

// Rescales left under way, and the finish's judgement of progress.
//
// A rescale past its go only goes forward: its finish waits until every
// task of the fragment passed the cut. Under a backlog the old partitions
// first work through what is queued in front of them at their old pace,
// which may take longer than any fixed limit, so the finish does not give
// up after a wall-clock time but once the rescale has stalled: for
// rescaleStall no further task passed the cut and none of those still
// waited for processed any input (their one-second sensor windows; only
// the rescaled operator's own tasks count: a downstream task takes input
// from other partitions also while a removed one never delivers). A
// finish that stalls (or whose caller's node stopped leading) leaves the
// rescale under way; the leader's resumer (resumeRescalesLoop) takes it
// up again, every resumeEvery and with a backoff per rescale, without
// waiting for a change of leader. A rescale the resumer finds still
// prepared while no rescale runs on this node lost the call that
// prepared it: it is aborted.

const (
	// rescaleStall is how long a rescale's finish waits without progress.
	rescaleStall = 2 * time.Minute
	// resumeEvery is how often the leader looks for rescales left under
	// way; resumeMaxBackoff bounds the wait before one whose finish
	// stalled is tried again (doubling from resumeEvery).
	resumeEvery      = 30 * time.Second
	resumeMaxBackoff = 10 * time.Minute
)

// ErrRescaleStalled means a rescale's finish saw no progress for the
// stall time: no task passed the cut and none of those still waited for
// processed any input. The rescale stays under way; the leader's resumer
// tries again later.
var ErrRescaleStalled = errors.New("the rescale made no progress")

// errNotLeading ends a finish on a node that stopped leading: only the
// leader can install the new map, and the next leader resumes it.
var errNotLeading = errors.New("this coordinator is no longer the leader")

func (s *Server) rescaleStallTime() time.Duration {
	if s.cfg.hooks.rescaleStall > 0 {
		return s.cfg.hooks.rescaleStall
	}
	return rescaleStall
}

func (s *Server) resumeInterval() time.Duration {
	if s.cfg.hooks.resumeEvery > 0 {
		return s.cfg.hooks.resumeEvery
	}
	return resumeEvery
}

// resumeBackoff remembers, per rescale left under way (query, fragment,
// epoch), the failed attempts to finish it and when to try again. Only
// the resumer's goroutine uses it.
type resumeBackoff struct {
	base, max time.Duration
	byKey     map[string]resumeAttempt
}

type resumeAttempt struct {
	fails int
	next  time.Time
}

func resumeKey(m *fsm.SlotMap) string {
	return fmt.Sprintf("%s\x00%s\x00%d", m.Query, m.Fragment, m.Next.Epoch)
}

// due reports whether the rescale of m may be tried at now.
func (b *resumeBackoff) due(m *fsm.SlotMap, now time.Time) bool {
	if b == nil {
		return true
	}
	return !now.Before(b.byKey[resumeKey(m)].next)
}

// failed pushes the next attempt on the rescale of m back: base, 2 base,
// 4 base... up to max.
func (b *resumeBackoff) failed(m *fsm.SlotMap, now time.Time) time.Duration {
	if b == nil {
		return 0
	}
	a := b.byKey[resumeKey(m)]
	a.fails++
	d := b.base
	for i := 1; i < a.fails && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	a.next = now.Add(d)
	b.byKey[resumeKey(m)] = a
	return d
}

// keep forgets the rescales no longer under way.
func (b *resumeBackoff) keep(live map[string]bool) {
	if b == nil {
		return
	}
	for k := range b.byKey {
		if !live[k] {
			delete(b.byKey, k)
		}
	}
}

// resumeRescalesLoop resumes the rescales left under way when this node
// becomes leader and then every resumeInterval until ctx ends (leadership
// lost), so that a finish that stalled, or a prepare whose abort failed,
// does not wait for the next change of leader.
func (s *Server) resumeRescalesLoop(ctx context.Context) {
	every := s.resumeInterval()
	b := &resumeBackoff{base: every, max: max(every, resumeMaxBackoff), byKey: map[string]resumeAttempt{}}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.resumeRescales(ctx, b)
		t.Reset(every)
	}
}

// waitProgress blocks, as waitTasks, until ok holds for every task of
// query that match selects, re-checking on every state change. It fails
// with ErrRescaleStalled once stall passes without progress: no further
// task satisfied ok, and worked (asked about the tasks still waited for)
// saw none of them work. It fails too once this node stops leading or ctx
// ends. The error says which task it still waits for.
func (s *Server) waitProgress(ctx context.Context, query string, match func(*fsm.Task) bool, ok func(*fsm.Task) (bool, string),
	stall time.Duration, worked func(waiting map[string]bool) bool) error {
	st := s.State()
	tick := min(max(stall/8, 10*time.Millisecond), 5*time.Second)
	done, last := -1, time.Now()
	for {
		ws := memdb.NewWatchSet()
		tasks, err := st.TasksByQuery(ws, query)
		if err != nil {
			return err
		}
		sort.Slice(tasks, func(i, j int) bool { return tasks[i].ID < tasks[j].ID })
		n, why, waiting := 0, "", map[string]bool{}
		for _, t := range tasks {
			if !match(t) {
				continue
			}
			if good, w := ok(t); good {
				n++
			} else {
				if why == "" {
					why = w
				}
				waiting[t.ID] = true
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		now := time.Now()
		if n > done || worked(waiting) {
			done, last = max(done, n), now
		}
		if !s.IsLeader() {
			return fmt.Errorf("%s: %w", why, errNotLeading)
		}
		if now.Sub(last) >= stall {
			return fmt.Errorf("%s: %w for %s", why, ErrRescaleStalled, stall)
		}
		wctx, cancel := context.WithTimeout(ctx, tick)
		_ = ws.WatchCtx(wctx)
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", why, ctx.Err())
		}
	}
}

// workedSince returns a progress test for waitProgress: whether any of
// the tasks waited for that count (nil: all) reported a sensor window,
// newer than the previous test (the first: newer than now), in which it
// took input.
func (s *Server) workedSince(count func(id string) bool) func(waiting map[string]bool) bool {
	after := time.Now().UnixMilli()
	return func(waiting map[string]bool) bool {
		if count != nil {
			w := map[string]bool{}
			for id := range waiting {
				if count(id) {
					w[id] = true
				}
			}
			waiting = w
		}
		newest, worked := s.liveStats.workedAfter(waiting, after)
		after = max(after, newest)
		return worked
	}
}

// workedAfter reports whether a window of one of ids reported after
// afterMs (Unix ms) took input, and the newest such window's time.
func (l *liveStats) workedAfter(ids map[string]bool, afterMs int64) (newestMs int64, worked bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ws := range l.byWorker {
		for id, hist := range ws.hist {
			if !ids[id] {
				continue
			}
			for _, w := range hist {
				if w.ReportedAtMs > afterMs && w.InTps > 0 {
					worked = true
					newestMs = max(newestMs, w.ReportedAtMs)
				}
			}
		}
	}
	return newestMs, worked
}
