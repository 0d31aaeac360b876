package benchmark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker/runtime"
)

// ErrMoveBench means the move benchmark could not produce a measurement
// (the stream ended before the moves finished, a move did not happen).
var ErrMoveBench = errors.New("benchmark: move")

// DefaultMoveStateMB is `bench move`'s default state size.
const DefaultMoveStateMB = 64

// The move benchmark's query: a blob source whose records carry a
// distinct member (the record number before a 1000-byte payload) and a
// key of 16 values, counted per key by count_distinct over sliding
// windows of 2 s every 5 ms. Every member is held by each of the 400
// open windows, so the state is large (about moveStateFactor seconds of
// input bytes) while the output stays small (16 rows per 5 ms): the sink
// sees a result every slide, which is what a gap is measured against.
// The sources' boundaries come every moveSlide too (the default interval
// is 50 ms), so a window closes, and a result appears, every 5 ms: the
// output rhythm is fine enough that a pause of a few milliseconds a move
// adds shows, instead of hiding inside a 50 ms slide.
const (
	movePayload     = 1000
	moveKeys        = 16
	moveWindow      = 2 * time.Second
	moveSlide       = 5 * time.Millisecond
	moveMemberBytes = movePayload + 10 // key encoding of one member
	// moveWindows is how many windows are open at once.
	moveWindows = int(moveWindow / moveSlide)
	// moveStateFactor is Σ over the open windows of the input seconds
	// each holds: window k of n = size/slide holds k slides.
	moveStateFactor = float64(moveSlide) / float64(time.Second) * float64(moveWindows*(moveWindows+1)) / 2
	// moveReferenceSpeedup runs the unmoved reference run this many times
	// faster than real time (same stimes, same results).
	moveReferenceSpeedup = 4
)

// MoveConfig configures RunMove.
type MoveConfig struct {
	// StateMB is the aggregate's state to move, in MiB (about).
	StateMB int
	// Duration is the input's length in stream (real) time; the moves
	// happen within it. 0: long enough for the default pauses and moves
	// of several seconds.
	Duration time.Duration
	// Settle is how long the query runs undisturbed after the state is
	// built and between the two moves (default 2s).
	Settle time.Duration
	// Plaintext runs the workers' data plane, their snapshot transfers and
	// the raw loopback baseline without TLS. By default all three use
	// mutual TLS 1.3, as an org does: the move and the baseline it is
	// compared with pay the same encryption.
	Plaintext bool
	// StreamSnapshots fetches the snapshots over the FetchSnapshot stream
	// instead of a connection of their own (runtime.BulkOptions), to
	// compare the two.
	StreamSnapshots bool
	// TraceDir, when set, runs a flight recorder in every worker and
	// writes, right after the live move, each worker's execution trace
	// of the move and the seconds before it to
	// TraceDir/bench-move-worker-N.trace (go tool trace).
	TraceDir string
	Launch   Launcher
	Logger   *slog.Logger
	// Progress receives one line per step (nil: none).
	Progress io.Writer
}

// MoveResult is what `bench move --json` prints. Times are milliseconds.
type MoveResult struct {
	// StateMB is the encoded size of the snapshot the live move fetched,
	// in MiB.
	StateMB       float64 `json:"state_mb"`
	TargetStateMB int     `json:"target_state_mb"`
	// LoopbackMBs is raw loopback TCP bandwidth (MiB/s) between two of the
	// run's worker processes, sending as many bytes as the state, over a
	// TLS connection made like the data plane's unless TLS is false.
	LoopbackMBs float64 `json:"loopback_mb_s"`
	// TLS says whether the data plane, the snapshot transfers and the
	// loopback baseline ran over mutual TLS (the default) or plaintext.
	TLS bool `json:"tls"`
	// LiveGapMs and StopCopyGapMs are the longest intervals without a
	// result at the sink around each move (from the move's request until
	// every consumer reads the new copy, and the first result after).
	LiveGapMs     float64 `json:"live_gap_ms"`
	StopCopyGapMs float64 `json:"stopcopy_gap_ms"`
	GapRatio      float64 `json:"gap_ratio"`
	// NormalGapMs is the longest interval without a result in the second
	// before the first move: the rhythm of the output (the window slide).
	NormalGapMs float64 `json:"normal_gap_ms"`
	// LiveMoveMs is from the move's request to the old copy stopped;
	// StopCopyMoveMs the same for the stop-and-copy move.
	LiveMoveMs     float64 `json:"live_move_ms"`
	StopCopyMoveMs float64 `json:"stopcopy_move_ms"`
	// TransferBoundMs is the live snapshot's bytes over LoopbackMBs;
	// MoveRatio is LiveMoveMs over it.
	TransferBoundMs float64 `json:"transfer_bound_ms"`
	MoveRatio       float64 `json:"move_ratio"`
	// Where each move's time went on the new copy's worker: registering
	// with the upstreams (live only), fetching the snapshot (taking,
	// encoding, sending, receiving, decoding), restoring the task from
	// it. The rest of a move's time is applying placements and stopping
	// the old copy.
	// LiveStartMs is from the live move's request until the new copy
	// runs from its snapshot (pin, fetch, restore and start), LiveCatchUpMs
	// from then until it has produced what the old copy has, LiveSwitchMs
	// from then until the old copy stopped (consumers told, old copy
	// stopped): the three add up to LiveMoveMs.
	LiveStartMs       float64 `json:"live_start_ms"`
	LiveCatchUpMs     float64 `json:"live_catchup_ms"`
	LiveSwitchMs      float64 `json:"live_switch_ms"`
	LivePinMs         float64 `json:"live_pin_ms"`
	LiveFetchMs       float64 `json:"live_fetch_ms"`
	LiveRestoreMs     float64 `json:"live_restore_ms"`
	StopCopyFetchMs   float64 `json:"stopcopy_fetch_ms"`
	StopCopyRestoreMs float64 `json:"stopcopy_restore_ms"`
	// The serving side of each fetch (the old copy's worker): the task
	// held while its state was captured, sorting and sizing the captured
	// state, then encoding and sending it (overlapped) until the last
	// byte was written; Bulk says whether the bytes crossed over a
	// connection of their own (runtime.BulkOptions) rather than the
	// FetchSnapshot stream.
	LiveCaptureMs     float64 `json:"live_capture_ms"`
	LivePrepareMs     float64 `json:"live_prepare_ms"`
	LiveSendMs        float64 `json:"live_send_ms"`
	LiveBulk          bool    `json:"live_bulk"`
	StopCopyCaptureMs float64 `json:"stopcopy_capture_ms"`
	StopCopySendMs    float64 `json:"stopcopy_send_ms"`
	// LivePhasesMs splits the live move into consecutive phases, from the
	// request to the old copy stopped (they add up to LiveMoveMs), from
	// the instants the two workers recorded (one machine, one clock).
	LivePhasesMs *MovePhases `json:"live_phases_ms,omitempty"`
	// LiveStreamed says whether the new copy restored the operator state
	// while its bytes arrived (runtime: restoring while the snapshot
	// arrives) rather than after the last one.
	LiveStreamed bool `json:"live_streamed"`
	// LiveInterned says whether it restored it off the connection through
	// a reused buffer, one copy per distinct string, without keeping the
	// snapshot's bytes (runtime: restoring from the connection).
	LiveInterned bool `json:"live_interned"`
	// Lost and Duplicated compare the moved run's result rows with an
	// unmoved reference run's, as multisets.
	// NormalGapCauses and LiveGapCauses say what each process (worker 0,
	// 1, 2 and the bench itself) showed during the normal gap and the
	// live move's longest gap: its longest late wake-up and its GC
	// pauses overlapping the gap (see stallSampler).
	NormalGapCauses []StallCause `json:"normal_gap_causes,omitempty"`
	LiveGapCauses   []StallCause `json:"live_gap_causes,omitempty"`
	// LiveMoveCauses is the same over the whole live move, from its
	// request until the consumers switched.
	LiveMoveCauses []StallCause `json:"live_move_causes,omitempty"`
	Lost           int          `json:"lost"`
	Duplicated     int          `json:"duplicated"`
	ResultRows     int          `json:"result_rows"`
	// Rate is the source's records per second; Records its input.
	Rate    int   `json:"rate"`
	Records int64 `json:"records"`
}

// MovePhases are the consecutive phases of a live move, in milliseconds.
type MovePhases struct {
	// Apply: the request reached the new copy's worker; Pin: it
	// registered with the upstreams; Snapshot: the fetch reached the old
	// copy, which was held while its state was captured; Prepare: the
	// captured state was sorted and sized; Connect: the transfer was
	// offered and its connection made, until the first byte was written;
	// Transfer: until the last byte arrived; Decode: until the snapshot
	// was decoded with its operator state installed (restored while the
	// bytes arrived, or after them); Restore: the task built from it;
	// Start: the task started (its inputs subscribe); CatchUp: the new
	// copy produced what the old copy has; Switch: every consumer told
	// to read the new copy; Stop: the old copy stopped.
	Apply    float64 `json:"apply"`
	Pin      float64 `json:"pin"`
	Snapshot float64 `json:"snapshot"`
	Prepare  float64 `json:"prepare"`
	Connect  float64 `json:"connect"`
	Transfer float64 `json:"transfer"`
	Decode   float64 `json:"decode"`
	Restore  float64 `json:"restore"`
	Start    float64 `json:"start"`
	CatchUp  float64 `json:"catch_up"`
	Switch   float64 `json:"switch"`
	Stop     float64 `json:"stop"`
}

// livePhases splits a move into MovePhases from its instants, the new
// copy's bootstrap and the old copy's serving; nil when an instant is
// missing (a worker that recorded none).
func livePhases(mv moveTimes, b runtime.BootstrapTiming, sv runtime.ServeTiming) *MovePhases {
	at := []time.Time{mv.start, b.Began, b.Pinned, sv.Captured, sv.Prepared, sv.FirstSent, b.LastByte, b.Decoded, b.Restored, b.Started, mv.caughtUp, mv.switched, mv.stopped}
	for _, t := range at {
		if t.IsZero() {
			return nil
		}
	}
	d := func(i int) float64 { return ms(at[i+1].Sub(at[i])) }
	return &MovePhases{Apply: d(0), Pin: d(1), Snapshot: d(2), Prepare: d(3), Connect: d(4), Transfer: d(5), Decode: d(6),
		Restore: d(7), Start: d(8), CatchUp: d(9), Switch: d(10), Stop: d(11)}
}

// moveBench is one run's three worker processes: w0 runs the source and
// the sink, the aggregate starts on w1, moves live to w2 and back by
// stop-and-copy.
type moveBench struct {
	cfg        MoveConfig
	w          [3]*workerClient
	q          *queryspec.Query
	placements []runtime.Placement
	specs      map[string]runtime.TaskSpec
	aggID      string
}

func (m *moveBench) progress(format string, args ...any) {
	if m.cfg.Progress != nil {
		fmt.Fprintf(m.cfg.Progress, "bench move: "+format+"\n", args...)
	}
}

// RunMove measures a live move and a stop-and-copy move of a keyed
// aggregate holding about StateMB MiB (see MoveResult).
func RunMove(ctx context.Context, cfg MoveConfig) (*MoveResult, error) {
	if cfg.StateMB <= 0 {
		return nil, fmt.Errorf("%w: state of %d MB: want at least 1", ErrMoveBench, cfg.StateMB)
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * time.Second
	}
	if cfg.Duration <= 0 {
		cfg.Duration = moveWindow + 3*cfg.Settle + 20*time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Launch == nil {
		l, err := DefaultLauncher()
		if err != nil {
			return nil, err
		}
		cfg.Launch = l
	}
	rate := max(20, int(float64(cfg.StateMB<<20)/(moveMemberBytes*moveStateFactor)))
	records := int64(rate) * int64(cfg.Duration/time.Millisecond) / 1000
	res := &MoveResult{TargetStateMB: cfg.StateMB, Rate: rate, Records: records, TLS: !cfg.Plaintext}
	m := &moveBench{cfg: cfg}

	// The reference: the same input, unmoved, on a worker of its own,
	// faster than real time.
	m.progress("reference run: %d records at %d/s, %dx speed", records, rate, moveReferenceSpeedup)
	ref, err := m.referenceRun(ctx, rate, records)
	if err != nil {
		return nil, err
	}

	var ca *tlsutil.CA
	if !cfg.Plaintext {
		if ca, err = tlsutil.NewCA("bench"); err != nil {
			return nil, err
		}
	}
	for i := range m.w {
		name := fmt.Sprintf("bench-move-worker-%d", i)
		p, err := cfg.Launch(ctx, name)
		if err != nil {
			m.stop()
			return nil, err
		}
		m.w[i] = newWorkerClient(name, p)
		hello := request{Op: opHello, BoundaryInterval: moveSlide, StreamSnapshots: cfg.StreamSnapshots, Stalls: true, FlightRecorder: cfg.TraceDir != ""}
		if ca != nil {
			cert, key, err := ca.Issue(rpc.Identity{Org: "bench", Role: rpc.RoleWorker, Name: name}, []string{"127.0.0.1"}, 24*time.Hour)
			if err != nil {
				m.stop()
				return nil, err
			}
			hello.TLS = &tlsMaterial{CA: ca.CertPEM, Cert: cert, Key: key}
		}
		resp, err := m.w[i].call(ctx, hello)
		if err != nil {
			m.stop()
			return nil, err
		}
		m.w[i].addr = resp.Addr
	}
	defer m.stop()
	sctx, stopStalls := context.WithCancel(ctx)
	stalls := startStallSampler(sctx)
	defer func() { stopStalls(); <-stalls.done }()

	if res.LoopbackMBs, err = m.loopback(ctx, cfg.StateMB<<20); err != nil {
		return nil, err
	}
	m.progress("loopback TCP (%s): %.0f MB/s", map[bool]string{true: "mutual TLS", false: "plaintext"}[res.TLS], res.LoopbackMBs)

	if m.q, err = moveQuery("move", rate, records); err != nil {
		return nil, err
	}
	if err := m.place(); err != nil {
		return nil, err
	}
	sink := queryspec.TaskID(m.q.Name, "out", 0, 0)
	if _, err := m.w[1].call(ctx, request{Op: opApply, Tasks: m.on(m.w[1].addr)}); err != nil {
		return nil, err
	}
	if _, err := m.w[0].call(ctx, request{Op: opApply, Tasks: m.on(m.w[0].addr)}); err != nil {
		return nil, err
	}
	if _, err := m.w[0].call(ctx, request{Op: opTailStart, Query: m.q.Name, Task: sink, Rows: true}); err != nil {
		return nil, err
	}
	began := time.Now()
	m.progress("building %d MB of state (%s of input)", cfg.StateMB, moveWindow+cfg.Settle)
	if err := sleepCtx(ctx, moveWindow+cfg.Settle); err != nil {
		return nil, err
	}

	m.progress("live move %s: worker 1 -> worker 2", m.aggID)
	live, err := m.move(ctx, 1, 2, false)
	if err != nil {
		return nil, err
	}
	m.progress("live move done in %s (consumers switched after %s)", live.stopped.Sub(live.start), live.switched.Sub(live.start))
	if cfg.TraceDir != "" {
		for i, w := range m.w {
			path := filepath.Join(cfg.TraceDir, fmt.Sprintf("bench-move-worker-%d.trace", i))
			if _, err := w.call(ctx, request{Op: opTraceWrite, Spec: path}); err != nil {
				return nil, err
			}
			m.progress("execution trace of worker %d (the live move and the %s before it): %s", i, flightRecorderAge, path)
		}
	}
	boot, err := m.w[2].call(ctx, request{Op: opStats})
	if err != nil {
		return nil, err
	}
	var liveBoot runtime.BootstrapTiming
	if b := boot.Bootstrap; b != nil {
		liveBoot = *b
		res.LivePinMs, res.LiveFetchMs, res.LiveRestoreMs, res.LiveStreamed, res.LiveInterned = ms(b.Pin), ms(b.Fetch), ms(b.Restore), b.Streamed, b.Interned
	}
	if err := sleepCtx(ctx, cfg.Settle); err != nil {
		return nil, err
	}
	m.progress("stop-and-copy move %s: worker 2 -> worker 1", m.aggID)
	stopCopy, err := m.move(ctx, 2, 1, true)
	if err != nil {
		return nil, err
	}
	m.progress("stop-and-copy move done in %s", stopCopy.stopped.Sub(stopCopy.start))
	m.progress("waiting for the end of the input (%s after the start)", cfg.Duration)
	tail, err := m.w[0].call(ctx, request{Op: opTailWait})
	if err != nil {
		return nil, err
	}
	if n := len(tail.RowNanos); n == 0 || time.Unix(0, tail.RowNanos[n-1]).Before(stopCopy.switched.Add(moveSlide*4)) {
		return nil, fmt.Errorf("%w: the input ended (after %s) before the moves finished: raise the duration", ErrMoveBench, time.Since(began).Round(time.Second))
	}
	st, err := m.w[1].call(ctx, request{Op: opStats})
	if err != nil {
		return nil, err
	}
	if b := st.Bootstrap; b != nil {
		res.StopCopyFetchMs, res.StopCopyRestoreMs = ms(b.Fetch), ms(b.Restore)
	}
	if sv := st.Served; sv != nil {
		res.LiveCaptureMs, res.LivePrepareMs, res.LiveSendMs, res.LiveBulk = ms(sv.Capture), ms(sv.Prepare), ms(sv.Send), sv.Bulk
		res.LivePhasesMs = livePhases(live, liveBoot, *sv)
	}
	st2, err := m.w[2].call(ctx, request{Op: opStats})
	if err != nil {
		return nil, err
	}
	if sv := st2.Served; sv != nil {
		res.StopCopyCaptureMs, res.StopCopySendMs = ms(sv.Capture), ms(sv.Send)
	}
	if st.SnapshotBytes == 0 {
		return nil, fmt.Errorf("%w: worker 1 served no snapshot: the live move did not transfer state", ErrMoveBench)
	}

	res.StateMB = float64(st.SnapshotBytes) / (1 << 20)
	res.LiveGapMs = ms(longestGap(tail.RowNanos, live.start, live.switched))
	res.StopCopyGapMs = ms(longestGap(tail.RowNanos, stopCopy.start, stopCopy.switched))
	res.NormalGapMs = ms(longestGap(tail.RowNanos, live.start.Add(-time.Second), live.start.Add(-moveSlide)))
	res.GapRatio = safeRatio(res.LiveGapMs, res.StopCopyGapMs)
	if err := m.gapCauses(ctx, res, tail.RowNanos, live.start, live.switched, stalls); err != nil {
		return nil, err
	}
	for _, mv := range []struct {
		name string
		t    moveTimes
	}{{"live", live}, {"stop-and-copy", stopCopy}} {
		gap, at := longestGapAt(tail.RowNanos, mv.t.start, mv.t.switched)
		m.progress("%s move: longest gap %s, from %s after the request (new copy started at %s, consumers switched at %s, old copy stopped at %s)",
			mv.name, gap.Round(time.Millisecond), at.Round(time.Millisecond), mv.t.started.Sub(mv.t.start).Round(time.Millisecond),
			mv.t.switched.Sub(mv.t.start).Round(time.Millisecond), mv.t.stopped.Sub(mv.t.start).Round(time.Millisecond))
	}
	res.LiveMoveMs = ms(live.stopped.Sub(live.start))
	res.LiveStartMs = ms(live.started.Sub(live.start))
	res.LiveCatchUpMs = ms(live.caughtUp.Sub(live.started))
	res.LiveSwitchMs = ms(live.stopped.Sub(live.caughtUp))
	res.StopCopyMoveMs = ms(stopCopy.stopped.Sub(stopCopy.start))
	res.TransferBoundMs = res.StateMB / res.LoopbackMBs * 1000
	res.MoveRatio = safeRatio(res.LiveMoveMs, res.TransferBoundMs)
	res.ResultRows = len(tail.Rows)
	res.Lost, res.Duplicated = compareRows(ref, tail.Rows)
	return res, nil
}

// gapCauses fills res's NormalGapCauses and LiveGapCauses from every
// process's stall events.
func (m *moveBench) gapCauses(ctx context.Context, res *MoveResult, rows []int64, start, switched time.Time, own *stallSampler) error {
	procs := []string{"worker 0", "worker 1", "worker 2", "bench"}
	events := make([][]stallEvent, 0, len(procs))
	for _, w := range m.w {
		r, err := w.call(ctx, request{Op: opStalls})
		if err != nil {
			return err
		}
		events = append(events, r.Stalls)
	}
	events = append(events, own.events())
	for _, g := range []struct {
		name     string
		from, to time.Time
		out      *[]StallCause
	}{{"normal", start.Add(-time.Second), start.Add(-moveSlide), &res.NormalGapCauses}, {"live", start, switched, &res.LiveGapCauses}} {
		gap, at := longestGapAt(rows, g.from, g.to)
		a := g.from.Add(at).UnixNano()
		*g.out = stallCauses(a, a+int64(gap), procs, events)
		m.progress("%s gap %s: %s", g.name, gap.Round(100*time.Microsecond), describeCauses(*g.out))
	}
	// The whole live move, not only its gap: the GC pauses of the new
	// copy's worker while it restored.
	res.LiveMoveCauses = stallCauses(start.UnixNano(), switched.UnixNano(), procs, events)
	m.progress("during the live move: %s", describeCauses(res.LiveMoveCauses))
	return nil
}

// referenceRun runs the query unmoved, every task on one worker, and
// returns its result rows.
func (m *moveBench) referenceRun(ctx context.Context, rate int, records int64) ([]string, error) {
	p, err := m.cfg.Launch(ctx, "bench-move-reference")
	if err != nil {
		return nil, err
	}
	w := newWorkerClient("bench-move-reference", p)
	defer func() { _ = p.Stop() }()
	resp, err := w.call(ctx, request{Op: opHello, SourceSpeedup: moveReferenceSpeedup, BoundaryInterval: moveSlide})
	if err != nil {
		return nil, err
	}
	q, err := moveQuery("moveref", rate, records)
	if err != nil {
		return nil, err
	}
	specs, err := placeQuery(q, func(string) int { return 0 }, [2]string{resp.Addr, resp.Addr})
	if err != nil {
		return nil, err
	}
	if _, err := w.call(ctx, request{Op: opApply, Tasks: specs[0]}); err != nil {
		return nil, err
	}
	if _, err := w.call(ctx, request{Op: opTailStart, Query: q.Name, Task: queryspec.TaskID(q.Name, "out", 0, 0), Rows: true}); err != nil {
		return nil, err
	}
	tail, err := w.call(ctx, request{Op: opTailWait})
	if err != nil {
		return nil, err
	}
	if len(tail.Rows) == 0 {
		return nil, fmt.Errorf("%w: the reference run produced no results", ErrMoveBench)
	}
	return tail.Rows, nil
}

// place puts the source and the sink on w0 and the aggregate on w1.
func (m *moveBench) place() error {
	plan, err := m.q.FusedPlan()
	if err != nil {
		return err
	}
	m.specs = map[string]runtime.TaskSpec{}
	m.placements = nil
	for _, node := range plan.Nodes {
		addr := m.w[0].addr
		if node.Name == "agg" {
			addr = m.w[1].addr
			m.aggID = queryspec.TaskID(m.q.Name, node.Name, 0, 0)
		}
		id := queryspec.TaskID(m.q.Name, node.Name, 0, 0)
		m.placements = append(m.placements, runtime.Placement{TaskID: id, Fragment: node.Name, Generation: 1, WorkerAddr: addr})
		m.specs[id] = runtime.TaskSpec{TaskID: id, Query: m.q.Name, Fragment: node.Name, QueryIndex: 1, Spec: m.q, Generation: 1}
	}
	if m.aggID == "" {
		return fmt.Errorf("%w: the query has no aggregate fragment", ErrMoveBench)
	}
	return nil
}

// on returns the specs of the tasks placed on addr, with the current
// placements.
func (m *moveBench) on(addr string) []runtime.TaskSpec {
	var out []runtime.TaskSpec
	for _, pl := range m.placements {
		if pl.WorkerAddr == addr {
			s := m.specs[pl.TaskID]
			s.Placements = slices.Clone(m.placements)
			out = append(out, s)
		}
	}
	return out
}

// moveTimes are the instants of one move.
type moveTimes struct {
	start    time.Time // requested
	started  time.Time // the new copy runs from its snapshot (its worker answered the apply)
	caughtUp time.Time // the new copy has produced what the old copy has
	switched time.Time // the new copy caught up, every consumer was told to read it
	stopped  time.Time // then the old copy stopped
}

// move moves the aggregate from worker from to worker to (see runtime
// TaskSpec.Bootstrap): the next generation is started on the target with
// the old copy as its bootstrap source (halt: stop-and-copy); once it has
// caught up with the old copy the consumers are given the new placement,
// then the old copy is stopped.
func (m *moveBench) move(ctx context.Context, from, to int, halt bool) (moveTimes, error) {
	var t moveTimes
	i := slices.IndexFunc(m.placements, func(pl runtime.Placement) bool { return pl.TaskID == m.aggID })
	old := m.placements[i]
	if old.WorkerAddr != m.w[from].addr {
		return t, fmt.Errorf("%w: %s is not on worker %d", ErrMoveBench, m.aggID, from)
	}
	spec := m.specs[m.aggID]
	spec.Placements = slices.Clone(m.placements)
	spec.Generation = old.Generation + 1
	spec.Bootstrap = &runtime.SnapshotSource{WorkerAddr: old.WorkerAddr, TaskID: m.aggID, Generation: old.Generation, Halt: halt}
	t.start = time.Now()
	ap, err := m.w[to].call(ctx, request{Op: opApply, Tasks: []runtime.TaskSpec{spec}})
	if err != nil {
		return t, err
	}
	t.started = time.Now()
	m.progress("new copy applied: request to apply %s, apply %s, answer %s", time.Unix(0, ap.StartNanos).Sub(t.start).Round(time.Millisecond),
		time.Duration(ap.EndNanos-ap.StartNanos).Round(time.Millisecond), t.started.Sub(time.Unix(0, ap.EndNanos)).Round(time.Millisecond))
	// The new copy catches up: consumers switch once it has produced
	// what the old copy has.
	if err := m.caughtUp(ctx, from, to); err != nil {
		return t, err
	}
	t.caughtUp = time.Now()
	spec.Bootstrap = nil
	m.specs[m.aggID] = spec
	m.placements[i].WorkerAddr, m.placements[i].Generation = m.w[to].addr, spec.Generation
	for _, w := range []int{0, to} {
		if _, err := m.w[w].call(ctx, request{Op: opApply, Tasks: m.on(m.w[w].addr)}); err != nil {
			return t, err
		}
	}
	t.switched = time.Now()
	if _, err := m.w[from].call(ctx, request{Op: opApply, Tasks: m.on(m.w[from].addr)}); err != nil {
		return t, err
	}
	t.stopped = time.Now()
	return t, nil
}

// caughtUp waits until the aggregate's copy on worker to has appended as
// much output as its copy on worker from (polled every millisecond).
func (m *moveBench) caughtUp(ctx context.Context, from, to int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pos := func(w int) (uint64, error) {
		r, err := m.w[w].call(ctx, request{Op: opOutputPos, Query: m.q.Name, Task: m.aggID, Consumer: "out"})
		return r.LastID, err
	}
	began := time.Now()
	var first uint64
	var trace []string
	for {
		old, err := pos(from)
		if err != nil {
			return err
		}
		cur, err := pos(to)
		if err != nil {
			return err
		}
		if first == 0 {
			first = cur
		}
		if len(trace) == 0 || cur != first && len(trace) < 12 {
			trace = append(trace, fmt.Sprintf("%s:%d/%d", time.Since(began).Round(time.Millisecond), cur, old))
			first = cur
		}
		if cur >= old {
			m.progress("catch-up: %v", trace)
			return nil
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("%w: the new copy of %s did not catch up (%d of %d): %w", ErrMoveBench, m.aggID, cur, old, err)
		}
	}
}

// loopback measures raw TCP bandwidth from w1 to w0 over bytes bytes, the
// median of three transfers, in MiB/s.
func (m *moveBench) loopback(ctx context.Context, bytes int) (float64, error) {
	const record = 64 << 10
	n := int64(max(1, bytes/record))
	var rates []float64
	for range 3 {
		l, err := m.w[0].call(ctx, request{Op: opTCPListen, RecordBytes: record, Records: n})
		if err != nil {
			return 0, err
		}
		s, err := m.w[1].call(ctx, request{Op: opTCPSend, Addr: l.Addr, Records: n, RecordBytes: record})
		if err != nil {
			return 0, err
		}
		r, err := m.w[0].call(ctx, request{Op: opTCPWait})
		if err != nil {
			return 0, err
		}
		d := elapsed(s.StartNanos, r.EndNanos)
		if d <= 0 {
			return 0, fmt.Errorf("%w: loopback transfer took no time", ErrMoveBench)
		}
		rates = append(rates, float64(n*record)/(1<<20)/d.Seconds())
	}
	return median(rates), nil
}

func (m *moveBench) stop() {
	for _, w := range m.w {
		if w != nil {
			if err := w.proc.Stop(); err != nil {
				m.cfg.Logger.Warn("bench worker stop", "worker", w.name, "err", err)
			}
		}
	}
}

// moveQuery is the benchmark's query (see movePayload).
func moveQuery(name string, rate int, records int64) (*queryspec.Query, error) {
	return queryspec.Parse(name+".yaml", fmt.Appendf(nil, `
name: %s
replicas: 1
sources:
  - name: records
    generator: {kind: blob, seed: %d, limit: %d, size: %d, rate: %d}
operators:
  - {name: keyed, type: map, input: records, fields: {k: "seq %% %d", member: "string(seq) + payload"}}
  - name: agg
    type: aggregate
    input: keyed
    window: {size: %s, slide: %s}
    group_by: [k]
    aggregates: {n: "count()", distinct: "count_distinct(member)"}
sinks:
  - {name: out, input: agg}
`, name, benchSeed, records, movePayload, rate, moveKeys, moveWindow, moveSlide))
}

// longestGap is the longest interval between two consecutive result
// times (sorted) that overlaps [from, to]; the interval from the last
// result before from to the first after to when none falls inside.
func longestGap(times []int64, from, to time.Time) time.Duration {
	d, _ := longestGapAt(times, from, to)
	return d
}

// longestGapAt is longestGap and when that interval began, relative to
// from.
func longestGapAt(times []int64, from, to time.Time) (gap, at time.Duration) {
	a, b := from.UnixNano(), to.UnixNano()
	var longest, began int64
	for i := 1; i < len(times); i++ {
		if times[i] < a || times[i-1] > b {
			continue
		}
		if d := times[i] - times[i-1]; d > longest {
			longest, began = d, times[i-1]
		}
	}
	return time.Duration(longest), time.Duration(began - a)
}

// compareRows counts the rows of got missing from want (lost) and beyond
// want's count (duplicated), as multisets.
func compareRows(want, got []string) (lost, duplicated int) {
	n := make(map[string]int, len(want))
	for _, r := range want {
		n[r]++
	}
	for _, r := range got {
		n[r]--
	}
	for _, c := range n {
		if c > 0 {
			lost += c
		} else {
			duplicated -= c
		}
	}
	return lost, duplicated
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e4) / 100 }

func safeRatio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return math.Round(a/b*1000) / 1000
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
