package runtime

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
)

// Moving an ingest source (issue 9 item 3).
//
// An ingest source's input positions are its producers' offsets: each
// producer (a `fedstream ingest` run, IngestRequest.producer) numbers its
// lines 1, 2, ... over its whole session, and the source copy records the
// last offset it took from each (ingestProducer.acked) in its state. A
// move's snapshot halts the copy: under the ingest lock it captures the
// outputs, the fused operators, newest/boundary/closed and the producers'
// offsets, and from then on the copy refuses every line and close
// (dataplane.ErrSourceMoved). So nothing is accepted after the snapshot by
// the old copy, and the new copy, started from the snapshot, continues
// with the same output ids. The producer, whose stream to the old copy
// fails, asks where the source runs now and resends from its last
// acknowledged offset; the new copy skips the lines it already has (taken
// by the old copy before the snapshot, acknowledgement not yet received).

// maxIngestProducers bounds the producers a source copy remembers: the
// least recently used is forgotten first (a producer that comes back after
// that many others starts over, its resent lines taken again).
const maxIngestProducers = 4096

// ingestProducer is what one producer has given a source copy.
type ingestProducer struct {
	// acked is the offset of the last line taken (accepted or refused as
	// bad); accepted counts the lines accepted.
	acked, accepted uint64
	lastUse         uint64
}

// IngestPosition is an ingest source's position in a TaskSnapshot.
type IngestPosition struct {
	// Newest, Boundary and Closed are ingestState's newest, boundary and
	// closed (allowed_lateness and --close state).
	Newest, Boundary int64
	Closed           bool
	Producers        []IngestProducer
}

// IngestProducer is one producer's offsets in an IngestPosition.
type IngestProducer struct {
	ID              string
	Acked, Accepted uint64
}

// ingestSectionTag starts the optional trailing section of an encoded
// TaskSnapshot that holds its IngestPosition.
const ingestSectionTag = 'I'

func appendIngestPosition(b []byte, p *IngestPosition) []byte {
	if p == nil {
		return b
	}
	b = append(b, ingestSectionTag)
	b = binary.AppendVarint(b, p.Newest)
	b = binary.AppendVarint(b, p.Boundary)
	closed := byte(0)
	if p.Closed {
		closed = 1
	}
	b = append(b, closed)
	b = binary.AppendUvarint(b, uint64(len(p.Producers)))
	for _, pr := range p.Producers {
		b = binary.AppendUvarint(b, uint64(len(pr.ID)))
		b = append(b, pr.ID...)
		b = binary.AppendUvarint(b, pr.Acked)
		b = binary.AppendUvarint(b, pr.Accepted)
	}
	return b
}

// ingestPosition decodes the trailing ingest section.
func (r *snapReader) ingestPosition() *IngestPosition {
	if r.b[0] != ingestSectionTag {
		r.fail("ingest section tag")
		return nil
	}
	r.b = r.b[1:]
	p := &IngestPosition{Newest: r.iv("ingest newest"), Boundary: r.iv("ingest boundary")}
	switch r.count("ingest closed") {
	case 0:
	case 1:
		p.Closed = true
	default:
		r.fail("ingest closed")
	}
	n := r.count("producer count")
	for range n {
		if r.err != nil {
			break
		}
		p.Producers = append(p.Producers, IngestProducer{ID: r.str("producer"), Acked: r.uv("producer offset"), Accepted: r.uv("producer accepted")})
	}
	return p
}

// movedErr is the refusal of a copy a move snapshotted.
func (t *task) movedErr() error {
	return fmt.Errorf("%w: source task %s (generation %d) was snapshotted to move and takes no more lines: send to where it runs now (fedstream query status)",
		dataplane.ErrSourceMoved, t.spec.TaskID, max(t.spec.Generation, 1))
}

// snapshotIngest takes a move's snapshot of an ingest source and halts it
// (see the comment at the top of this file). Only a halting snapshot is
// taken: a live peer's snapshot would miss the lines the peer takes after
// it, which its producers may no longer have.
func (t *task) snapshotIngest(ctx context.Context, opts SnapshotOptions) (*TaskSnapshot, error) {
	if !opts.Halt || opts.Aligned {
		return nil, fmt.Errorf("%w: an ingest source is snapshotted only to move, halting it (%s)", ErrNotSnapshottable, t.spec.TaskID)
	}
	// Its outputs' positions are the ones its consumers resume at.
	if err := t.awaitAligned(ctx); err != nil {
		return nil, err
	}
	st := t.ingest
	// An Ingest call in progress holds the lock while its lines go out;
	// it ends with the client or the task, or, held for a
	// reconfiguration's cut, as this snapshot waits (holdForCut).
	st.snapWaits.Store(true)
	select {
	case t.rcWake <- struct{}{}:
	default:
	}
	st.mu.Lock()
	st.snapWaits.Store(false)
	defer st.mu.Unlock()
	if st.movedOut != nil {
		return st.movedOut, nil // the same cut, asked again
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("task %s: snapshot: %w", t.spec.TaskID, err)
	}
	if s := t.State(); s.State == StateFailed || s.State == StateStopped {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotSnapshottable, t.spec.TaskID, s.State)
	}
	s := &TaskSnapshot{TaskID: t.spec.TaskID, Query: t.spec.Query, Fragment: t.spec.Fragment,
		Partition: t.spec.Partition, Replica: t.spec.Replica, Seq: t.seq, Released: st.boundary,
		Ingest: &IngestPosition{Newest: st.newest, Boundary: st.boundary, Closed: st.closed}, SourceLevel: t.rc.earlyLevel(st.boundary)}
	t.snapshotCut(s)
	for id, p := range st.producers {
		s.Ingest.Producers = append(s.Ingest.Producers, IngestProducer{ID: id, Acked: p.acked, Accepted: p.accepted})
	}
	if t.srcChain != nil {
		op, err := t.srcChain.Snapshot()
		if err != nil {
			return nil, fmt.Errorf("task %s: operator snapshot: %w", t.spec.TaskID, err)
		}
		s.Operator = op
	}
	t.outMu.RLock()
	outs := t.outs
	t.outMu.RUnlock()
	for _, o := range outs {
		if o.w.Staged() > 0 {
			// Every accepted line is flushed before the lock is let go.
			return nil, fmt.Errorf("%w: %s: output to %q partition %d has unflushed tuples", ErrNotSnapshottable, t.spec.TaskID, o.consumer, o.partition)
		}
		pos := OutputPosition{Consumer: o.consumer, Partition: o.partition, LastID: o.w.LastID()}
		if err := captureTail(o.buf, &pos); err != nil {
			return nil, fmt.Errorf("task %s: %w", t.spec.TaskID, err)
		}
		s.Outputs = append(s.Outputs, pos)
	}
	st.movedOut = s
	t.halted.Store(true)
	t.noteWhileRunning("snapshotted to move: takes no more lines, serves its output until stopped")
	return s, nil
}

// restoreIngest makes an ingest source built by newTask continue from a
// move's snapshot of its previous copy.
func (t *task) restoreIngest(s *TaskSnapshot) error {
	if s.Query != t.spec.Query || s.Fragment != t.spec.Fragment || s.Partition != t.spec.Partition {
		return fmt.Errorf("%w: snapshot of %s/%s/p%d, task %s", ErrSnapshotMismatch, s.Query, s.Fragment, s.Partition, t.spec.TaskID)
	}
	if s.Ingest == nil || len(s.Inputs) != 0 {
		return fmt.Errorf("%w: not an ingest source's snapshot", ErrSnapshotMismatch)
	}
	if (t.srcChain == nil) != (s.Operator == nil) {
		return fmt.Errorf("%w: operator state present %v, task has operators %v", ErrSnapshotMismatch, s.Operator != nil, t.srcChain != nil)
	}
	if t.srcChain != nil {
		if err := t.srcChain.Restore(s.Operator); err != nil {
			return fmt.Errorf("%w: %w", ErrSnapshotMismatch, err)
		}
	}
	if err := t.resumeOutputs(s); err != nil {
		return err
	}
	st := t.ingest
	st.newest, st.boundary, st.closed = s.Ingest.Newest, s.Ingest.Boundary, s.Ingest.Closed
	st.producers = make(map[string]*ingestProducer, len(s.Ingest.Producers))
	for _, p := range s.Ingest.Producers {
		st.uses++
		st.producers[p.ID] = &ingestProducer{acked: p.Acked, accepted: p.Accepted, lastUse: st.uses}
	}
	t.restoreCut(s)
	t.seq = s.Seq
	t.restored = true
	return nil
}

// producer returns the producer's record, made if new (forgetting the
// least recently used one beyond maxIngestProducers).
func (st *ingestState) producer(id string) *ingestProducer {
	st.uses++
	if p := st.producers[id]; p != nil {
		p.lastUse = st.uses
		return p
	}
	if st.producers == nil {
		st.producers = map[string]*ingestProducer{}
	}
	if len(st.producers) >= maxIngestProducers {
		oldest, at := "", uint64(0)
		for pid, p := range st.producers {
			if oldest == "" || p.lastUse < at {
				oldest, at = pid, p.lastUse
			}
		}
		delete(st.producers, oldest)
	}
	p := &ingestProducer{lastUse: st.uses}
	st.producers[id] = p
	return p
}

// countLines is how many lines lines holds: one per newline, plus an
// unterminated last line.
func countLines(lines []byte) uint64 {
	n := uint64(bytes.Count(lines, []byte{'\n'}))
	if len(lines) > 0 && lines[len(lines)-1] != '\n' {
		n++
	}
	return n
}

// skipLines drops the first n lines.
func skipLines(lines []byte, n uint64) []byte {
	for ; n > 0 && len(lines) > 0; n-- {
		i := bytes.IndexByte(lines, '\n')
		if i < 0 {
			return nil
		}
		lines = lines[i+1:]
	}
	return lines
}

// ingestFrom is one IngestSession request for this copy (see
// dataplane.SessionIngestHandler).
func (t *task) ingestFrom(ctx context.Context, producer string, firstLine uint64, lines []byte, closeSrc bool) (*fedstreampb.IngestResponse, error) {
	if err := t.awaitAligned(ctx); err != nil {
		return nil, err
	}
	st := t.ingest
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.movedOut != nil {
		return nil, t.movedErr()
	}
	p := st.producer(producer)
	resp := &fedstreampb.IngestResponse{TaskId: t.spec.TaskID, Generation: int32(max(t.spec.Generation, 1))}
	if n := countLines(lines); n > 0 {
		if firstLine == 0 {
			return nil, status.Error(codes.InvalidArgument, "a session's lines are numbered from 1 (first_line 0)")
		}
		if firstLine > p.acked+1 {
			return nil, fmt.Errorf("%w: producer %q sent lines from offset %d, source task %s has taken its lines up to %d only",
				dataplane.ErrIngestGap, producer, firstLine, t.spec.TaskID, p.acked)
		}
		if dup := p.acked + 1 - firstLine; dup < n {
			acc, errs, last, err := t.ingestLocked(ctx, p.acked+1, skipLines(lines, dup))
			p.accepted += acc
			if err != nil {
				p.acked = max(p.acked, last)
				return nil, err
			}
			// Every line of the request is taken, an empty last one too.
			p.acked = firstLine + n - 1
			resp.Accepted, resp.Errors = acc, errs
		}
	}
	if closeSrc {
		if err := t.closeLocked(ctx); err != nil {
			return nil, err
		}
		resp.Closed = true
	}
	resp.Acked, resp.ProducerAccepted = p.acked, p.accepted
	return resp, nil
}

// IngestFrom routes one IngestSession request to the source's copies on
// this worker (see dataplane.SessionIngestHandler); the first answers.
func (in ingester) IngestFrom(ctx context.Context, query, source, producer string, firstLine uint64, lines []byte, closeSrc bool) (*fedstreampb.IngestResponse, error) {
	targets := in.targets(query, source)
	if len(targets) == 0 {
		return nil, fmt.Errorf("%w: no ingest task of source %q of query %q runs on this worker", dataplane.ErrUnknownSource, source, query)
	}
	var (
		first    *fedstreampb.IngestResponse
		firstErr error
	)
	for i, t := range targets {
		resp, err := t.ingestFrom(ctx, producer, firstLine, lines, closeSrc)
		if i == 0 {
			first, firstErr = resp, err
		}
	}
	return first, firstErr
}
