package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// errNoSuchNode: the query exists but has no sink (or source) of the
// name asked for. Final: a query's nodes never change.
var errNoSuchNode = errors.New("no such node")

// resolveNode fetches a query and the schema of one of its nodes.
func resolveNode(ctx context.Context, c pb.AdminServiceClient, query, node string, kind queryspec.NodeKind) (*pb.QueryInfo, *queryspec.Node, error) {
	q, err := c.GetQuery(ctx, &pb.GetQueryRequest{Name: query})
	if err != nil {
		return nil, nil, err
	}
	spec, err := queryspec.FromJSON(q.SpecJson)
	if err != nil {
		return nil, nil, fmt.Errorf("query %s: stored spec: %w", query, err)
	}
	plan, err := spec.Plan()
	if err != nil {
		return nil, nil, err
	}
	var names []string
	for _, n := range plan.Nodes {
		if n.Kind == kind {
			names = append(names, n.Name)
			if node == "" {
				node = n.Name
			}
		}
	}
	n := plan.Node(node)
	if n == nil || n.Kind != kind {
		return nil, nil, fmt.Errorf("%w: query %s has no %s named %q (it has: %s)", errNoSuchNode, query, kind, node, strings.Join(names, ", "))
	}
	return q, n, nil
}

// Why a tail ends without an error (exit 0).
var (
	// errSinkEnded: the sink's stream reached its final boundary (every
	// source of the query ended: generators with a limit, closed ingest).
	errSinkEnded = errors.New("sink ended")
	// errQueryStopped: the query was stopped.
	errQueryStopped = errors.New("query stopped")
	// errCountReached: --count results were printed.
	errCountReached = errors.New("count reached")
)

// followerGrace is how long tail retries a query that its coordinator
// does not know when that coordinator is not the leader: a query just
// submitted may not have reached a follower yet. The leader's "not found"
// is final at once.
const followerGrace = 3 * time.Second

// tailer follows a sink's result stream, moving to another replica of the
// sink when the one it reads fails; stable ids are identical across
// replicas, so it resumes after the last one it took (see batch). It ends without an error when
// the sink ends, the query is stopped, count results were printed, or no
// result came for idle.
type tailer struct {
	flags  *clientFlags
	query  string
	sink   string
	stable bool
	print  func(t *tuple.Tuple, schema *tuple.Schema, sink string) error
	// count > 0: stop after printing that many results. idle > 0: stop
	// when no result was printed for that long.
	count int
	idle  time.Duration
	// notes, when set, hears why a tail ended (stderr).
	notes io.Writer
	// lastID is the stable id of the last stable result or boundary
	// taken (see batch); printed counts the lines printed.
	lastID  uint64
	printed int
	// tentOpen: tentative results were taken (tentN of them) after lastID
	// and not taken back; recOpen: an UNDO was taken and its REC_DONE not
	// yet; fresh: the next batch is a subscription's first.
	tentOpen, recOpen, fresh bool
	tentN                    uint64
	// uncorrectable holds the ranges of the UNCORRECTABLE records
	// printed (each once: both replicas of the sink carry them, a
	// resumption resends them); at most maxTailUncorrectable, the
	// oldest forgotten first.
	uncorrectable [][2]int64
	// activity is reset on every result printed (idle only).
	activity *time.Timer
	// silence: when the replica followed sends nothing for this long,
	// tail asks the coordinators whether that copy of the sink still
	// runs there (0: tailSilence); placedElsewhere answers it (nil: ask
	// the coordinators, see copyGone).
	silence         time.Duration
	placedElsewhere func(ctx context.Context, followed *pb.TaskInfo) (string, error)
	// posFrom names the sink copy (task@generation) lastID was last
	// read from.
	posFrom string
	// lin and linSince are the lineage of the stable ids lastID follows
	// (the copy read's, as of its last batch: dataplane.OutputBuffer
	// Diverge); lastSTime is the stream time of the last stable result or
	// boundary taken (lastBoundary: a boundary), by which tail realigns;
	// atSTime counts the stable results of that stream time taken.
	lin, linSince uint64
	lastSTime     int64
	lastBoundary  bool
	atSTime       int
	// realign: the copy followed now numbers its stable results
	// otherwise than the one lastID came from (after a correction that
	// could not make every result exact, see realignIfDiverged); tail
	// resumed after resumeAt, the last stable id both share, and takes
	// stable results by stream time until it passes lastSTime. gapped:
	// the copy no longer held the result after resumeAt; dropped: some
	// result was dropped as taken already; below: one below lastSTime
	// came (what the copy sends from lastSTime on is whole); reAt
	// counts the results of lastSTime dropped.
	realign, gapped, dropped, seen, below bool
	resumeAt                              uint64
	reAt                                  int
	// carried: the ranges of the UNCORRECTABLE records the copy read
	// now put on its stream, as its subscription's first batch carried
	// them (Batch.named_ranges): a realignment names those the records
	// of which the copy no longer holds (see realignAt).
	carried [][2]int64
}

// errRealign asks follow to subscribe again after tl.resumeAt.
var errRealign = errors.New("sink copy numbers its results differently: resubscribing to realign by stream time")

// afterID is the stable id tail resumes after: its last one, or while
// realigning the last one both copies share.
func (tl *tailer) afterID() uint64 {
	if tl.realign {
		return tl.resumeAt
	}
	return tl.lastID
}

// realignIfDiverged is called with a subscription's first batch (the
// copy's lineage lin, since). Stable ids are the same on every replica
// of a sink only until one of them (or the replica of an upstream it
// read) made a correction that could not make every result exact: from
// the stable id it diverged after (since) on, the same id may name
// other results on the two copies, and a resumption by id would skip or
// repeat results silently. When lastID lies past the ids the copy read
// before and this one share, tail realigns: it subscribes again after
// the last shared id (errRealign) and takes the stable results by
// stream time (batch).
func (tl *tailer) realignIfDiverged(lin, since uint64, copyID string) error {
	if tl.realign || tl.lastID == 0 || dataplane.SameStableIDs(tl.lin, tl.linSince, lin, since, tl.lastID) {
		return nil
	}
	common := dataplane.SharedStableIDs(tl.lin, tl.linSince, lin, since)
	tl.realign, tl.gapped, tl.dropped, tl.seen, tl.below, tl.resumeAt, tl.reAt = true, false, false, false, false, common, 0
	tl.note("sink copy %s numbers its results differently from %s after stable id %d (a correction that could not make every result exact): tail realigns by stream time from %s and names any result it cannot vouch for", copyID, tl.posFrom, common, rangeTime(tl.lastSTime))
	return errRealign
}

// restartedCopy is called when tail subscribes to copy, a copy of the
// sink that started again without the state of the copy before it
// (rpc.StreamRestartedHeader: re-placed after its worker was lost, with
// no replica to bootstrap from). Its ids start again from 1, so resuming
// after the last id taken from another copy would skip every result it
// produces until it passes that id, for about as long as the old copy had
// run, then go on with a gap. tail says so on stderr (UNDO first, if it
// shows tentative results) and reads that copy from its first result:
// it reports whether it must subscribe again from there.
func (tl *tailer) restartedCopy(copy string, schema *tuple.Schema, sink string) (bool, error) {
	if tl.lastID == 0 || tl.posFrom == copy {
		return false, nil
	}
	tl.note("sink copy %s started again without the state of the copy before it (its worker was lost and no replica could give it a snapshot: with replicas: 1 there is none); its results are numbered from 1 again and tail prints them from its first one; windows that were open when the old copy was lost count only what the new copy replayed", copy)
	if tl.tentOpen && !tl.stable {
		if err := tl.emit(&tuple.Tuple{Type: tuple.Undo, ID: tl.lastID, STime: int64(tl.lastID)}, schema, sink); err != nil {
			return false, err
		}
	}
	tl.lastID, tl.tentOpen, tl.tentN, tl.recOpen = 0, false, 0, false
	tl.posFrom = copy
	return true, nil
}

// tailSilence is how long the sink replica tail reads may send nothing
// before tail asks whether it still runs there. A paused worker process
// (SIGSTOP) or a silently partitioned host keeps its connection open and
// sends nothing, and no-ack subscribers get no heartbeats: without the
// question, tail waited for gRPC's keepalive (about 40 s) while the
// coordinators had long placed the sink again. The question is one
// GetQuery per interval, and only while the stream is silent; a replica
// that is merely quiet (no results for a while) and still placed there
// is not left.
const tailSilence = 2 * time.Second

// errCopyGone: the sink copy tail was reading is no longer placed where
// it read it (its worker was declared down, the task was moved or placed
// again); tail moves to a copy that runs.
var errCopyGone = errors.New("sink copy placed elsewhere")

func (tl *tailer) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var idled atomic.Bool
	if tl.idle > 0 {
		tl.activity = time.AfterFunc(tl.idle, func() { idled.Store(true); cancel() })
		defer tl.activity.Stop()
	}
	defer func() {
		if idled.Load() {
			tl.note("no result for %s (--idle)", tl.idle)
		}
	}()
	backoff := retry.Policy{Initial: 200 * time.Millisecond, Max: 2 * time.Second}.New()
	var notFoundSince time.Time
	for ctx.Err() == nil {
		err := tl.once(ctx)
		switch {
		case ctx.Err() != nil: // interrupted, or --idle passed
			return nil
		case errors.Is(err, errSinkEnded), errors.Is(err, errQueryStopped), errors.Is(err, errCountReached):
			if !errors.Is(err, errCountReached) {
				tl.note("%v", err)
			}
			return nil
		case errors.Is(err, errNoSuchNode):
			return err
		}
		if code := status.Code(err); code == codes.PermissionDenied || code == codes.Unauthenticated || code == codes.InvalidArgument {
			return err
		}
		if status.Code(err) == codes.NotFound && strings.Contains(err.Error(), "no query named") {
			if notFoundSince.IsZero() {
				notFoundSince = time.Now()
			}
			if time.Since(notFoundSince) >= followerGrace || tl.askedLeader(ctx) {
				return err
			}
		} else {
			notFoundSince = time.Time{}
		}
		if backoff.Wait(ctx) != nil {
			return nil
		}
	}
	return nil
}

func (tl *tailer) note(format string, args ...any) {
	if tl.notes != nil {
		fmt.Fprintf(tl.notes, "tail: "+format+"\n", args...)
	}
}

// askedLeader reports whether the coordinator tail talks to is the
// leader (whose answers are up to date).
func (tl *tailer) askedLeader(ctx context.Context) bool {
	c, cctx, done, err := tl.flags.admin(ctx)
	if err != nil {
		return false
	}
	defer done()
	st, err := c.Status(cctx, &pb.StatusRequest{})
	return err == nil && st.NodeId != "" && st.NodeId == st.LeaderId
}

func (tl *tailer) once(ctx context.Context) error {
	c, cctx, done, err := tl.flags.admin(ctx)
	if err != nil {
		return err
	}
	q, node, err := resolveNode(cctx, c, tl.query, tl.sink, queryspec.KindSink)
	done()
	if err != nil {
		return err
	}
	if q.Status == states.QueryStopped {
		return fmt.Errorf("%w: query %s is stopped", errQueryStopped, tl.query)
	}
	var lastErr error = fmt.Errorf("no running replica of sink %s yet", node.Name)
	for _, t := range q.Tasks {
		if t.Fragment != node.Name || t.WorkerAddr == "" || t.State == states.TaskLost {
			continue
		}
		lastErr = tl.follow(ctx, t, node.Schema, node.Name)
		if ctx.Err() != nil || errors.Is(lastErr, errSinkEnded) || errors.Is(lastErr, errCountReached) {
			return lastErr
		}
	}
	return lastErr
}

func (tl *tailer) follow(ctx context.Context, t *pb.TaskInfo, schema *tuple.Schema, sink string) error {
	roles := []string{rpc.RoleWorker}
	if t.Org != "" {
		// A sink at a partner org: a coordinator of this org relays it.
		roles = append(roles, rpc.RoleCoordinator)
	}
	opts, err := tl.flags.tls.dialOption(roles...)
	if err != nil {
		return err
	}
	conn, err := rpc.Dial(t.WorkerAddr, tl.flags.token, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The watchdog ends with follow: it asks about the copy while the
	// stream is silent and cancels the stream once the copy is gone.
	var lastRecv atomic.Int64
	lastRecv.Store(time.Now().UnixNano())
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		tl.watchSilence(ctx, t, &lastRecv, cancel)
	}()
	defer watch.Wait()
	defer cancel(nil)
	subscribe := func() (pb.DataPlane_SubscribeClient, context.CancelFunc, error) {
		sctx, scancel := context.WithCancel(ctx)
		stream, err := pb.NewDataPlaneClient(conn).Subscribe(sctx)
		if err == nil {
			err = stream.Send(&pb.SubscribeRequest{
				Stream:     &pb.StreamRef{Query: tl.query, TaskId: t.TaskId},
				AfterId:    tl.afterID(),
				Subscriber: fmt.Sprintf("tail-%d", os.Getpid()),
				NoAck:      true,
				// tail prints UNCORRECTABLE records: it takes every type.
				DataplaneLevel: rpc.DataPlaneLevel,
				// By stable id: a copy that went tentative before it has
				// as many stable results sends its tentative results from
				// their start (see batch).
				ResumeStable: !tl.realign,
			})
		}
		if err != nil {
			scancel()
			return nil, nil, err
		}
		return stream, scancel, nil
	}
	stream, scancel, err := subscribe()
	if err != nil {
		return gone(ctx, err)
	}
	defer func() { scancel() }()
	copyID := fmt.Sprintf("%s@g%d", t.TaskId, max(t.Generation, 1))
	// A copy that started again without its state sends the header at
	// once; any other sends it with its first batch, which Recv below
	// waits for anyway (a silent copy: until the watchdog cancels).
	if md, err := stream.Header(); err == nil && len(md.Get(rpc.StreamRestartedHeader)) > 0 {
		restart, err := tl.restartedCopy(copyID, schema, sink)
		if err != nil {
			return err
		}
		if restart {
			scancel()
			if stream, scancel, err = subscribe(); err != nil {
				return gone(ctx, err)
			}
		}
	}
	var tup tuple.Tuple
	reader := tuple.NewBatchReader(nil, 0)
	tl.fresh = true
	var ts []tuple.Tuple
	for {
		b, err := stream.Recv()
		if err != nil {
			return gone(ctx, err)
		}
		lastRecv.Store(time.Now().UnixNano())
		// Ids are consecutive in a batch, which names its last one.
		if b.Count == 0 || b.LastId < uint64(b.Count) {
			return fmt.Errorf("results from %s: a batch of %d tuples ending with id %d", t.WorkerAddr, b.Count, b.LastId)
		}
		reader.Reset(b.Data, b.LastId-uint64(b.Count)+1)
		ts = ts[:0]
		for reader.Next(&tup) {
			ts = append(ts, *tup.Clone())
		}
		if err := reader.Err(); err != nil {
			return fmt.Errorf("decode results from %s: %w", t.WorkerAddr, err)
		}
		if tl.fresh {
			tl.carried = dataplane.RangePairs(b.NamedRanges)
			if err := tl.realignIfDiverged(b.Lineage, b.LineageSince, copyID); errors.Is(err, errRealign) {
				scancel()
				if stream, scancel, err = subscribe(); err != nil {
					return gone(ctx, err)
				}
				continue
			}
		}
		tl.posFrom = copyID
		tl.lin, tl.linSince = b.Lineage, b.LineageSince
		if err := tl.batch(ts, b.LastId, b.PositionOffset, schema, sink); err != nil {
			if errors.Is(err, dataplane.ErrProtocol) {
				err = fmt.Errorf("results from %s: %w", t.WorkerAddr, err)
			}
			return err
		}
	}
}

// gone is err, or, when the watchdog cancelled the stream because the
// copy was placed elsewhere, that reason.
func gone(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errCopyGone) {
		return cause
	}
	return err
}

// watchSilence runs while tail follows copy t: whenever the stream has
// been silent for the silence interval, it asks whether t still runs
// where tail reads it, and cancels the stream (cause errCopyGone, noted
// on stderr) when it does not.
func (tl *tailer) watchSilence(ctx context.Context, t *pb.TaskInfo, lastRecv *atomic.Int64, cancel context.CancelCauseFunc) {
	silence := tl.silence
	if silence <= 0 {
		silence = tailSilence
	}
	ask := tl.placedElsewhere
	if ask == nil {
		ask = tl.copyGone
	}
	timer := time.NewTimer(silence)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		quiet := time.Since(time.Unix(0, lastRecv.Load()))
		if quiet < silence {
			timer.Reset(silence - quiet)
			continue
		}
		why, err := ask(ctx, t)
		if err == nil && why != "" {
			err := fmt.Errorf("%w: %s at %s sent nothing for %s and %s", errCopyGone, t.TaskId, t.WorkerAddr, quiet.Round(time.Second), why)
			tl.note("%v; moving to a copy that runs", err)
			cancel(err)
			return
		}
		timer.Reset(silence)
	}
}

// copyGone asks the coordinators whether copy t of the sink still runs
// where tail reads it; it returns why not, or "" while it does (or while
// the coordinators cannot say: tail keeps waiting).
func (tl *tailer) copyGone(ctx context.Context, t *pb.TaskInfo) (string, error) {
	c, cctx, done, err := tl.flags.admin(ctx)
	if err != nil {
		return "", err
	}
	defer done()
	q, err := c.GetQuery(cctx, &pb.GetQueryRequest{Name: tl.query})
	if err != nil {
		return "", err
	}
	return placedElsewhere(q, t), nil
}

// placedElsewhere says why copy t (as tail found it) no longer runs
// where tail reads it according to q, or "" while it does. A task
// whose state is unknown (a new leader not yet heard from its worker)
// counts as still there.
func placedElsewhere(q *pb.QueryInfo, t *pb.TaskInfo) string {
	if q.Status == states.QueryStopped {
		return "the query was stopped"
	}
	for _, now := range q.Tasks {
		if now.TaskId != t.TaskId {
			continue
		}
		switch {
		case now.WorkerAddr != t.WorkerAddr || now.Generation != t.Generation || now.Org != t.Org:
			return fmt.Sprintf("the coordinators placed it again (generation %d at %s)", max(now.Generation, 1), orNone(now.WorkerAddr))
		case now.State == states.TaskLost || now.State == states.TaskPending || now.State == states.TaskFailed || now.State == states.TaskStopped:
			return fmt.Sprintf("the coordinators report it %s", now.State)
		}
		return ""
	}
	return "the coordinators no longer list it"
}

// batch prints one batch of a sink's result stream (ts, ending at
// position last, with the stream's position offset there).
//
// Replicas of a sink have the same stable view (stable results and
// boundaries, in order) but, after a correction, not the same positions:
// tentative results, UNDO and REC_DONE take positions on one replica
// only. tail therefore numbers what it prints by stable id, the count of
// stable results and boundaries up to each (its position less the
// positions outside the stable view, which every batch carries), the same
// on every replica and the id a failure-free run gives the same result;
// it resumes after the last stable id it took, by stable id
// (SubscribeRequest.resume_stable: after that result's position on the
// copy, or, on a copy with fewer stable results, from the start of its
// tentative results, whose results past the last stable one taken it
// prints; an older worker takes the id as a position), and skips what it
// took already.
// Tentative results are numbered after the last stable id, an UNDO says
// which stable id it goes back to (undo_to), REC_DONE carries the last
// stable id. When it moves to another replica while tentative results
// are shown, it prints an UNDO itself: what the next replica holds
// replaces them.
func (tl *tailer) batch(ts []tuple.Tuple, last, offset uint64, schema *tuple.Schema, sink string) error {
	if offset > last {
		return fmt.Errorf("%w: position offset %d beyond the last id %d", dataplane.ErrProtocol, offset, last)
	}
	n := uint64(0)
	for k := range ts {
		if tp := ts[k].Type; tp == tuple.Stable || tp == tuple.Boundary {
			n++
		}
	}
	if n > last-offset {
		return fmt.Errorf("%w: %d stable results in a batch whose stable id ends at %d", dataplane.ErrProtocol, n, last-offset)
	}
	sid := last - offset - n
	undo := func() error {
		tl.tentOpen, tl.recOpen = false, true
		if tl.stable {
			return nil
		}
		return tl.emit(&tuple.Tuple{Type: tuple.Undo, ID: tl.lastID, STime: int64(tl.lastID)}, schema, sink)
	}
	if tl.fresh {
		tl.fresh = false
		if tl.tentOpen {
			if err := undo(); err != nil {
				return err
			}
		}
	}
	for k := range ts {
		tp := &ts[k]
		if tl.realign && tp.Type != tuple.Stable && tp.Type != tuple.Boundary && tp.Type != tuple.Uncorrectable {
			continue // tentative output before the realigned point
		}
		switch tp.Type {
		case tuple.Stable, tuple.Boundary:
			sid++
			if tl.realign {
				take, err := tl.realignAt(sid, tp, schema, sink)
				if err != nil {
					return err
				}
				if !take {
					continue
				}
			} else if sid <= tl.lastID {
				continue // taken already
			}
			if tl.tentOpen {
				if err := undo(); err != nil {
					return err
				}
			}
			tl.lastID = sid
			if tp.STime != tl.lastSTime {
				tl.atSTime = 0
			}
			if tp.Type == tuple.Stable {
				tl.atSTime++
			}
			tl.lastSTime, tl.lastBoundary = tp.STime, tp.Type == tuple.Boundary
			if tp.Type == tuple.Boundary {
				if tp.STime == math.MaxInt64 {
					// The final boundary: nothing follows it.
					return fmt.Errorf("%w: sink %s of query %s ended (its sources ended)", errSinkEnded, sink, tl.query)
				}
				continue
			}
			tp.ID = sid
		case tuple.Tentative:
			if sid < tl.lastID && !tl.realign && dataplane.CoveredByStable(tp.STime, tl.lastSTime, tl.lastBoundary) {
				// The copy went tentative before it had the stable
				// results tail took from another (it resumed by stable
				// id into its tentative results): this one stands for
				// some of them.
				continue
			}
			if !tl.tentOpen {
				tl.tentN = 0
			}
			tl.tentOpen = true
			tl.tentN++
			tp.ID = tl.lastID + tl.tentN
			if tl.stable {
				continue
			}
		case tuple.Undo:
			if tl.tentOpen {
				if err := undo(); err != nil {
					return err
				}
			}
			continue
		case tuple.Uncorrectable:
			if tl.realign {
				// Before the realigned point: it concerns only what tail
				// takes from here (see clipped).
				from, to, ok := tuple.UncorrectableRange(tp)
				if r, keep := tl.clipped([2]int64{from, to}); ok && keep {
					*tp = tuple.UncorrectableMarker(r[0], r[1])
				} else {
					continue
				}
			}
			// Printed with --stable-only too: it is about final results.
			if !tl.newUncorrectable(tp) {
				continue
			}
			tp.ID = tl.lastID
		case tuple.RecDone:
			if !tl.recOpen || tl.tentOpen {
				continue
			}
			tl.recOpen = false
			tp.ID = tl.lastID
			if tl.stable {
				continue
			}
		default:
			continue
		}
		if err := tl.emit(tp, schema, sink); err != nil {
			return err
		}
	}
	return nil
}

// realignAt decides, while realigning, whether the stable result or
// boundary tp (stable id sid on the copy followed) is new: one with a
// stream time below the last one taken was taken already from the other
// copy (stable results come in stream-time order, and outside the range
// a correction could not make exact both copies hold the same results,
// in the same order, with the same boundaries among them); so were, at
// that stream time, as many results as tail took there (atSTime), the
// boundaries before and among them, and the boundary after them when
// the last taken was a boundary (an aggregate puts a window's results at
// its end and its boundary there after them: taken as new, they were
// printed twice, unnamed, before session 19). The first new one ends the
// realignment: tail takes the copy's numbering from there, and names
// with an UNCORRECTABLE record the stream times it cannot vouch for:
// [lastSTime, tp's] when the copy no longer held the results after the
// shared id and sent none below lastSTime (results in between may be
// missing). Past the named range tail's output is exact again.
func (tl *tailer) realignAt(sid uint64, tp *tuple.Tuple, schema *tuple.Schema, sink string) (bool, error) {
	if !tl.dropped && !tl.seen {
		// The first stable id the copy sent: past the shared one's
		// successor, the copy no longer holds what came between.
		tl.gapped = sid > tl.resumeAt+1
	}
	tl.seen = true
	if tp.STime < tl.lastSTime {
		tl.dropped, tl.below = true, true
		return false, nil
	}
	if tp.STime == tl.lastSTime && (!tl.gapped || tl.below) {
		if tl.reAt < tl.atSTime {
			if tp.Type == tuple.Stable {
				tl.reAt++
			}
			tl.dropped = true
			return false, nil
		}
		if tl.lastBoundary && tp.Type == tuple.Boundary {
			tl.dropped = true
			return false, nil
		}
	}
	tl.realign = false
	from, to := tl.lastSTime, int64(0)
	if tl.gapped && !tl.below {
		// Nothing before lastSTime came: results up to tp's stream
		// time may be missing.
		to = tp.STime
		if to < math.MaxInt64 {
			to++
		}
	}
	if to != 0 {
		mk := tuple.UncorrectableMarker(from, to)
		tl.note("results of sink %s with stream time from %s to %s may be missing or repeated: the copies of the sink numbered them differently", sink, rangeTime(from), rangeTime(to))
		if tl.newUncorrectable(&mk) {
			mk.ID = tl.lastID
			if err := tl.emit(&mk, schema, sink); err != nil {
				return false, err
			}
		}
	}
	// The copy's records, even those it no longer holds (its ring
	// dropped them, or they lay before the shared id): they concern what
	// tail takes from here.
	for _, c := range tl.carried {
		r, keep := tl.clipped(c)
		if !keep {
			continue
		}
		mk := tuple.UncorrectableMarker(r[0], r[1])
		if tl.newUncorrectable(&mk) {
			mk.ID = tl.lastID
			if err := tl.emit(&mk, schema, sink); err != nil {
				return false, err
			}
		}
	}
	return true, nil
}

// clipped is the part of an UNCORRECTABLE range of the copy tail
// realigns onto that concerns what it takes from there: from the last
// stream time it took on (it took the results below from the other
// copy, as exact as that copy said); keep is false when the range ends
// at or before it.
func (tl *tailer) clipped(r [2]int64) ([2]int64, bool) {
	if r[1] <= tl.lastSTime {
		return r, false
	}
	return [2]int64{max(r[0], tl.lastSTime), r[1]}, true
}

// maxTailUncorrectable bounds the UNCORRECTABLE ranges a tail remembers.
const maxTailUncorrectable = 16

// newUncorrectable reports whether tp, an UNCORRECTABLE record, names a
// range not printed yet (and records it). A record without a readable
// range is printed.
func (tl *tailer) newUncorrectable(tp *tuple.Tuple) bool {
	from, to, ok := tuple.UncorrectableRange(tp)
	if !ok {
		return true
	}
	for _, r := range tl.uncorrectable {
		if r[0] <= from && to <= r[1] {
			return false
		}
	}
	if len(tl.uncorrectable) == maxTailUncorrectable {
		tl.uncorrectable = tl.uncorrectable[1:]
	}
	tl.uncorrectable = append(tl.uncorrectable, [2]int64{from, to})
	return true
}

// rangeTime renders one end of an UNCORRECTABLE range.
func rangeTime(ns int64) string {
	if ns == math.MinInt64 {
		return "start"
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
}

// emit prints one line and counts it.
func (tl *tailer) emit(tp *tuple.Tuple, schema *tuple.Schema, sink string) error {
	if err := tl.print(tp, schema, sink); err != nil {
		return err
	}
	tl.printed++
	if tl.activity != nil {
		tl.activity.Reset(tl.idle)
	}
	if tl.count > 0 && tl.printed >= tl.count {
		return errCountReached
	}
	return nil
}

// valueJSON renders a value for JSON output.
func valueJSON(v tuple.Value) any {
	switch v.Kind {
	case tuple.KindInt:
		return v.I
	case tuple.KindFloat:
		if math.IsNaN(v.F) || math.IsInf(v.F, 0) {
			return strconv.FormatFloat(v.F, 'g', -1, 64)
		}
		return v.F
	case tuple.KindBool:
		return v.I != 0
	case tuple.KindTimestamp:
		return time.Unix(0, v.I).UTC().Format(time.RFC3339Nano)
	default:
		return v.S
	}
}

func valueText(v tuple.Value) string {
	switch v.Kind {
	case tuple.KindInt:
		return strconv.FormatInt(v.I, 10)
	case tuple.KindFloat:
		return strconv.FormatFloat(v.F, 'g', 6, 64)
	case tuple.KindBool:
		return strconv.FormatBool(v.I != 0)
	case tuple.KindTimestamp:
		return time.Unix(0, v.I).UTC().Format("15:04:05.000")
	default:
		return v.S
	}
}

// resultPrinter prints result tuples as JSON lines or readable text. A
// JSON line is an envelope whose values sit under their own key, so a
// field named like an envelope key (id, sink, type, stime) is never
// overwritten:
//
//	{"sink":"alerts","id":41,"type":"STABLE","stime":"...Z","values":{"src":"10.0.0.1",...}}
//
// Keys come in that order, values in schema order. docs/QUERY.md
// ("Reading results") documents the format.
func resultPrinter(w io.Writer, asJSON bool) func(t *tuple.Tuple, schema *tuple.Schema, sink string) error {
	bw := bufio.NewWriter(w)
	return func(t *tuple.Tuple, schema *tuple.Schema, sink string) error {
		if asJSON {
			line, err := resultJSON(t, schema, sink)
			if err != nil {
				return err
			}
			if _, err := bw.Write(append(line, '\n')); err != nil {
				return err
			}
		} else {
			var sb strings.Builder
			fmt.Fprintf(&sb, "%-9s #%-6d", t.Type, t.ID)
			if t.Type == tuple.Undo {
				fmt.Fprintf(&sb, " takes back every result after #%d", uint64(t.STime))
			}
			if from, to, ok := tuple.UncorrectableRange(t); ok {
				fmt.Fprintf(&sb, " !!! results with stream time from %s to %s could not be corrected (a failure outlasted the replay bound); later results are exact\n", rangeTime(from), rangeTime(to))
				if _, err := bw.WriteString(sb.String()); err != nil {
					return err
				}
				return bw.Flush()
			}
			for i, v := range t.Values {
				fmt.Fprintf(&sb, " %s=%s", fieldName(schema, i), valueText(v))
			}
			sb.WriteByte('\n')
			if _, err := bw.WriteString(sb.String()); err != nil {
				return err
			}
		}
		return bw.Flush()
	}
}

// fieldName is the name of a result's i-th value (f<i> beyond the schema).
func fieldName(schema *tuple.Schema, i int) string {
	if schema != nil && i < schema.Len() {
		return schema.Fields[i].Name
	}
	return fmt.Sprintf("f%d", i)
}

// resultJSON is one result as a JSON object: the envelope (sink, id,
// type, stime) and the values, in schema order, under "values".
func resultJSON(t *tuple.Tuple, schema *tuple.Schema, sink string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	add := func(key string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(key)
		if err != nil {
			return err
		}
		val, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(val)
		return nil
	}
	stime := time.Unix(0, t.STime).UTC().Format(time.RFC3339Nano)
	kvs := []struct {
		k string
		v any
	}{{"sink", sink}, {"id", t.ID}, {"type", t.Type.String()}, {"stime", stime}}
	if t.Type == tuple.Undo {
		// An UNDO takes back every result after id undo_to (DCAA); its
		// STime carries that id.
		kvs[3].k, kvs[3].v = "undo_to", uint64(t.STime)
	}
	if from, to, ok := tuple.UncorrectableRange(t); ok {
		// The results with stream time in [from, to) could not be
		// corrected (DCAA); the record has no values of the schema.
		kvs = append(kvs[:3], struct {
			k string
			v any
		}{"from", rangeTime(from)}, struct {
			k string
			v any
		}{"to", rangeTime(to)})
		for _, kv := range kvs {
			if err := add(kv.k, kv.v); err != nil {
				return nil, err
			}
		}
		b.WriteString(`,"values":{}}`)
		return b.Bytes(), nil
	}
	for _, kv := range kvs {
		if err := add(kv.k, kv.v); err != nil {
			return nil, err
		}
	}
	if t.Version != 0 {
		// The configuration (epoch) whose versions produced the result
		// (live reconfiguration); absent while the query has none.
		if err := add("version", t.Version); err != nil {
			return nil, err
		}
	}
	b.WriteString(`,"values":{`)
	for i, v := range t.Values {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(fieldName(schema, i))
		if err != nil {
			return nil, err
		}
		val, err := json.Marshal(valueJSON(v))
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(val)
	}
	b.WriteString("}}")
	return b.Bytes(), nil
}

func newTailCmd() *cobra.Command {
	var (
		f      clientFlags
		sink   string
		stable bool
		count  int
		idle   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tail QUERY",
		Short: "Stream a query's results as they arrive",
		Args:  cobra.ExactArgs(1),
		Long: `Prints a query's results as they arrive, first what the sink still holds
(its newest 65,536 results and boundaries at most), then each new one, moving
to another replica of the sink if the one it reads fails.

Exits 0 when the sink ends (every source of the query ended: a generator's
limit, fedstream ingest --close), when the query is stopped, after --count
results, or after --idle without a result. An unknown query or sink is an
error (exit 1). --json prints one object per result, documented in
docs/QUERY.md ("Reading results"):
  {"sink":"...","id":12,"type":"STABLE","stime":"...","values":{...}}`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 0 || idle < 0 {
				return fmt.Errorf("--count and --idle must not be negative")
			}
			tl := &tailer{flags: &f, query: args[0], sink: sink, stable: stable, count: count, idle: idle, notes: cmd.ErrOrStderr()}
			tl.print = resultPrinter(cmd.OutOrStdout(), f.json)
			return tl.run(cmd.Context())
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&sink, "sink", "", "sink to follow (default: the query's first sink)")
	cmd.Flags().BoolVar(&stable, "stable", false, "print only stable results (no tentative results or corrections)")
	cmd.Flags().BoolVar(&stable, "stable-only", false, "same as --stable: only final results, in order")
	cmd.Flags().IntVar(&count, "count", 0, "exit 0 after printing this many results (0: no limit)")
	cmd.Flags().DurationVar(&idle, "idle", 0, "exit 0 when no result arrived for this long (0: wait forever)")
	return cmd
}

func newIngestCmd() *cobra.Command {
	var (
		f         clientFlags
		batchSize int
		closeSrc  bool
		producer  string
		retryFor  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "ingest QUERY SOURCE < file.jsonl",
		Short: "Feed JSON lines from stdin into an ingest source of a query",
		Long: `Reads one JSON object per line from standard input and sends them to every
replica of the named ingest source. Each line is checked against the source's
schema and its lateness policy (allowed_lateness); a bad line is refused with
its line number and field, and the good lines are still accepted. Exits 2
when any line was refused.

--close ends the source after the input (give </dev/null to close without
sending lines): every remaining window is emitted, the sinks end (fedstream
tail then exits 0), and later ingest into the source is refused. Closing a
closed source is fine, so a failed close can be retried.

Lines are numbered over the run (the producer's offsets) and every replica
acknowledges each batch; a replica whose stream ends or fails (the source
task moved: fedstream task move, or its worker restarted) is looked up
again and sent the lines after the last it acknowledged, so none is lost
or taken twice (--retry-for bounds the wait). Running again with the same
--producer and the same input skips the lines the source already took.

--json prints {"query", "source", "lines", "accepted", "refused": [{"line",
"error"}], "replicas", "closed"} on stdout instead of text.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if batchSize < 1 {
				return fmt.Errorf("--batch must be at least 1")
			}
			if retryFor <= 0 {
				return fmt.Errorf("--retry-for must be positive")
			}
			return ingest(cmd.Context(), &f, ingestArgs{query: args[0], source: args[1], batch: batchSize, close: closeSrc, producer: producer, retryFor: retryFor},
				cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&batchSize, "batch", 1000, "lines per message (lateness does not depend on it)")
	cmd.Flags().BoolVar(&closeSrc, "close", false, "end the source after the input: emit every remaining window and end the sinks")
	cmd.Flags().StringVar(&producer, "producer", "", "session id for the source's offsets (default: random); the same id and input resend safely")
	cmd.Flags().DurationVar(&retryFor, "retry-for", 2*time.Minute, "how long to keep trying a source copy that cannot be reached (a move, a worker restart)")
	return cmd
}

type ingestArgs struct {
	query, source string
	batch         int
	close         bool
	// producer names the session (random when empty); retryFor bounds
	// how long a source copy may stay unreachable (a move).
	producer string
	retryFor time.Duration
}

// ingestReport is what ingest prints with --json.
type ingestReport struct {
	Query    string        `json:"query"`
	Source   string        `json:"source"`
	Lines    uint64        `json:"lines"`
	Accepted uint64        `json:"accepted"`
	Refused  []refusedLine `json:"refused"`
	Replicas int           `json:"replicas"`
	Closed   bool          `json:"closed"`
}

type refusedLine struct {
	Line  uint64 `json:"line"`
	Error string `json:"error"`
}

func ingest(ctx context.Context, f *clientFlags, a ingestArgs, in io.Reader, out, errOut io.Writer) error {
	query, source := a.query, a.source
	c, cctx, done, err := f.admin(ctx)
	if err != nil {
		return err
	}
	_, node, err := resolveNode(cctx, c, query, source, queryspec.KindSource)
	done()
	if err != nil {
		return err
	}
	if node.Source == nil || !node.Source.Ingest {
		return fmt.Errorf("source %s of query %s is a generator, not an ingest source", source, query)
	}
	resolve := func(ctx context.Context) ([]dataplane.IngestCopy, error) {
		c, cctx, done, err := f.admin(ctx)
		if err != nil {
			return nil, err
		}
		defer done()
		q, err := c.GetQuery(cctx, &pb.GetQueryRequest{Name: query})
		if err != nil {
			return nil, err
		}
		var copies []dataplane.IngestCopy
		for _, t := range q.Tasks {
			if t.Fragment == node.Name && t.WorkerAddr != "" {
				copies = append(copies, dataplane.IngestCopy{TaskID: t.TaskId, Addr: t.WorkerAddr})
			}
		}
		return copies, nil
	}
	conns := map[string]*grpc.ClientConn{}
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	dial := func(addr string) (grpc.ClientConnInterface, error) {
		if conn := conns[addr]; conn != nil {
			return conn, nil
		}
		opts, err := f.tls.dialOption(rpc.RoleWorker)
		if err != nil {
			return nil, err
		}
		conn, err := rpc.Dial(addr, f.token, opts...)
		if err != nil {
			return nil, err
		}
		conns[addr] = conn
		return conn, nil
	}
	var notes sync.Mutex // the replicas' notes come from several goroutines
	producer := a.producer
	if producer == "" {
		producer = rand.Text()
	}
	cl, err := dataplane.NewIngestClient(ctx, dataplane.IngestClientConfig{Query: query, Source: source, Producer: producer,
		Resolve: resolve, Conn: dial, RetryFor: a.retryFor,
		Note: func(msg string) { notes.Lock(); defer notes.Unlock(); fmt.Fprintln(errOut, msg) }})
	if err != nil {
		return err
	}
	defer cl.Close()
	lr := newLineReader(in, ingestMaxLine)
	var (
		buf      []byte
		lines    int
		lineNo   uint64
		refused  []refusedLine // lines refused here, before sending
		sendErrs error
	)
	// A request carries consecutive lines; a line refused here is sent
	// as an empty line so the worker's numbering (the producer's
	// offsets) stays the file's.
	flush := func() error {
		if lines == 0 {
			return nil
		}
		err := cl.Send(ctx, buf)
		buf, lines = buf[:0:0], 0
		return err
	}
	for {
		line, size, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read stdin at line %d: %w", lineNo+1, err)
		}
		if len(buf)+len(line)+1 > ingestBatchBytes {
			if sendErrs = flush(); sendErrs != nil {
				break
			}
		}
		lineNo++
		if line == nil && size > 0 {
			refused = append(refused, refusedLine{Line: lineNo, Error: tooLongLine(lineNo, size)})
		}
		buf = append(buf, line...)
		buf = append(buf, '\n')
		lines++
		if lines >= a.batch {
			if sendErrs = flush(); sendErrs != nil {
				break
			}
		}
	}
	if sendErrs == nil {
		sendErrs = flush()
	}
	if sendErrs == nil && a.close {
		sendErrs = cl.CloseSource(ctx)
	}
	sendErrs = explainIngestError(sendErrs)
	res := cl.Result()
	if sendErrs != nil && res.Accepted == 0 && len(res.Errors) == 0 {
		return sendErrs // nothing was taken: no report, only why
	}
	closed := a.close && res.Closed && sendErrs == nil
	for _, le := range res.Errors {
		if le.Error == "" || strings.Contains(le.Error, "empty line") && isRefusedHere(refused, le.Line) {
			continue // the placeholder of a line refused here
		}
		refused = append(refused, refusedLine{Line: le.Line, Error: le.Error}) // the worker names the line and field
	}
	sort.SliceStable(refused, func(i, j int) bool { return refused[i].Line < refused[j].Line })
	if f.json {
		rep := ingestReport{Query: query, Source: source, Lines: lineNo, Accepted: res.Accepted,
			Refused: refused, Replicas: res.Copies, Closed: closed}
		if rep.Refused == nil {
			rep.Refused = []refusedLine{}
		}
		if err := printJSON(out, rep); err != nil {
			return err
		}
	} else {
		for _, r := range refused {
			fmt.Fprintln(errOut, r.Error)
		}
		fmt.Fprintf(out, "ingested %d of %s into %s/%s (%s)\n", res.Accepted, plural(int(lineNo), "line", "lines"), query, source, plural(int(res.Copies), "replica", "replicas"))
		if closed {
			fmt.Fprintf(out, "closed %s/%s: its remaining windows are emitted and its sinks end\n", query, source)
		}
	}
	if sendErrs != nil {
		return sendErrs
	}
	if n := len(refused); n > 0 {
		return &exitError{code: 2, err: fmt.Errorf("%s refused", plural(n, "line", "lines"))}
	}
	return nil
}

// isRefusedHere reports whether line was refused by the CLI.
func isRefusedHere(refused []refusedLine, line uint64) bool {
	for _, r := range refused {
		if r.Line == line {
			return true
		}
	}
	return false
}

// explainIngestError adds what to do to a worker's refusal of a message
// over its size limit (the CLI keeps under it; an older or differently
// built worker may have a smaller one).
func explainIngestError(err error) error {
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "larger than max") {
		return fmt.Errorf("%w (the worker's gRPC receive limit for one message: send fewer lines per message with --batch, and split records larger than the limit)", err)
	}
	if status.Code(err) == codes.Unimplemented {
		return fmt.Errorf("%w (a worker of an older build has no resumable ingest (IngestSession) or ignores --close; upgrade it)", err)
	}
	return err
}
