package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
)

// IngestCopy is where one copy (replica) of an ingest source runs.
type IngestCopy struct {
	TaskID, Addr string
}

// IngestClientConfig configures an IngestClient.
type IngestClientConfig struct {
	Query, Source string
	// Producer names the client's session; lines are numbered from 1
	// over the session. Reusing a producer id with the same input
	// resends it safely: the lines a copy already took are skipped.
	Producer string
	// Resolve says where the source's copies run now (the coordinator's
	// query status). It is asked at the start and whenever a copy's
	// stream ends or fails.
	Resolve func(ctx context.Context) ([]IngestCopy, error)
	// Conn gives a connection to a worker's data plane.
	Conn func(addr string) (grpc.ClientConnInterface, error)
	// RetryFor is how long a copy may stay unreachable before the client
	// gives up (default 2 minutes): a move takes the source away for the
	// time its new copy needs to start.
	RetryFor time.Duration
	// Note, if set, is told why the client reconnects. Copies are fed
	// at once, so it may be called from several goroutines together.
	Note func(msg string)
}

// IngestResult is what the source took from the client.
type IngestResult struct {
	// Accepted is the number of lines the first copy (by task id)
	// accepted over the whole session, from its state: exact across
	// reconnects and moves.
	Accepted uint64
	// Errors are the first copy's refusals of lines, as received (a
	// refusal whose answer was lost in a reconnect is not repeated).
	Errors []*fedstreampb.LineError
	// Copies is the number of source copies fed; Closed: every copy
	// confirmed the close.
	Copies int
	Closed bool
}

// IngestClient feeds an ingest source through IngestSession: each batch
// goes to every copy of the source and is kept until every copy
// acknowledged it. A copy whose stream ends or fails (it moved, its worker
// restarted) is looked up again and the batch resent from its
// acknowledged offset, so no line is lost or taken twice. Batches are sent
// one at a time (each waits for every copy's acknowledgement). Not safe
// for concurrent use.
type IngestClient struct {
	cfg    IngestClientConfig
	ctx    context.Context // the streams' context
	cancel context.CancelFunc
	copies []*ingestConn // by task id
	next   uint64        // offset of the next line
}

// ingestConn is the client's stream to one copy.
type ingestConn struct {
	taskID   string
	addr     string
	stream   fedstreampb.DataPlane_IngestSessionClient
	cancel   context.CancelFunc
	acked    uint64
	accepted uint64
	errs     []*fedstreampb.LineError
	closed   bool
}

// NewIngestClient resolves the source's copies. ctx bounds the streams.
func NewIngestClient(ctx context.Context, cfg IngestClientConfig) (*IngestClient, error) {
	if cfg.Query == "" || cfg.Source == "" || cfg.Producer == "" || cfg.Resolve == nil || cfg.Conn == nil {
		return nil, errors.New("ingest client: query, source, producer, Resolve and Conn are required")
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 2 * time.Minute
	}
	copies, err := cfg.Resolve(ctx)
	if err != nil {
		return nil, err
	}
	if len(copies) == 0 {
		return nil, fmt.Errorf("source %s of query %s is not running on any worker yet", cfg.Source, cfg.Query)
	}
	c := &IngestClient{cfg: cfg, next: 1}
	c.ctx, c.cancel = context.WithCancel(ctx)
	for _, cp := range copies {
		c.copies = append(c.copies, &ingestConn{taskID: cp.TaskID, addr: cp.Addr})
	}
	slices.SortFunc(c.copies, func(a, b *ingestConn) int { return strings.Compare(a.taskID, b.taskID) })
	return c, nil
}

// Send delivers lines (newline-terminated, numbered after the previous
// batch's) to every copy and returns once each acknowledged them.
func (c *IngestClient) Send(ctx context.Context, lines []byte) error {
	n := countRequestLines(lines)
	if n == 0 {
		return nil
	}
	first := c.next
	c.next += n
	return c.deliver(ctx, &fedstreampb.IngestRequest{Lines: lines, FirstLine: first}, first+n-1, false)
}

// CloseSource ends the source (IngestRequest.close) on every copy.
func (c *IngestClient) CloseSource(ctx context.Context) error {
	return c.deliver(ctx, &fedstreampb.IngestRequest{Close: true}, c.next-1, true)
}

// Result reports what the source took (see IngestResult).
func (c *IngestClient) Result() IngestResult {
	r := IngestResult{Copies: len(c.copies), Closed: true}
	for i, cc := range c.copies {
		if i == 0 {
			r.Accepted, r.Errors = cc.accepted, cc.errs
		}
		r.Closed = r.Closed && cc.closed
	}
	return r
}

// Close ends the client's streams.
func (c *IngestClient) Close() {
	for _, cc := range c.copies {
		if cc.stream != nil {
			_ = cc.stream.CloseSend()
		}
		cc.drop()
	}
	c.cancel()
}

// deliver sends req to every copy at once and waits for all.
func (c *IngestClient) deliver(ctx context.Context, req *fedstreampb.IngestRequest, last uint64, closeSrc bool) error {
	errs := make([]error, len(c.copies))
	var wg sync.WaitGroup
	for i, cc := range c.copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.deliverTo(ctx, cc, req, last, closeSrc)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// deliverTo sends req to one copy until the copy acknowledged last,
// reconnecting (to wherever the copy runs now) after a stream failure.
func (c *IngestClient) deliverTo(ctx context.Context, cc *ingestConn, req *fedstreampb.IngestRequest, last uint64, closeSrc bool) error {
	b := retry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}.New()
	var failingSince time.Time
	for {
		err := c.try(ctx, cc, req, last, closeSrc)
		if err == nil {
			return nil
		}
		cc.drop()
		if permanentIngestError(err) || ctx.Err() != nil {
			return fmt.Errorf("ingest into %s at %s: %w", cc.taskID, cc.addr, err)
		}
		if failingSince.IsZero() {
			failingSince = time.Now()
		} else if time.Since(failingSince) > c.cfg.RetryFor {
			return fmt.Errorf("ingest into %s: no copy reachable for %s: %w", cc.taskID, c.cfg.RetryFor, err)
		}
		if c.cfg.Note != nil {
			c.cfg.Note(fmt.Sprintf("ingest into %s at %s: %v; resending from line %d to where it runs now", cc.taskID, cc.addr, err, cc.acked+1))
		}
		if err := b.Wait(ctx); err != nil {
			return fmt.Errorf("ingest into %s: %w", cc.taskID, err)
		}
	}
}

// try makes one attempt: connect if needed (the handshake tells how far
// the copy is), then send req unless the copy already has it.
func (c *IngestClient) try(ctx context.Context, cc *ingestConn, req *fedstreampb.IngestRequest, last uint64, closeSrc bool) error {
	if cc.stream == nil {
		if err := c.connect(ctx, cc); err != nil {
			return err
		}
	}
	if cc.acked >= last && !closeSrc {
		return nil // taken before the answer was lost
	}
	if len(req.Lines) > 0 && cc.acked+1 < req.FirstLine {
		return fmt.Errorf("%w: source copy %s has this producer's lines up to %d only, the client has no longer lines %d to %d (the copy restarted without its state)",
			ErrIngestGap, cc.taskID, cc.acked, cc.acked+1, req.FirstLine-1)
	}
	if err := cc.stream.Send(req); err != nil {
		return err // the cause comes from Recv
	}
	resp, err := cc.recv(ctx)
	if err != nil {
		return err
	}
	cc.errs = append(cc.errs, resp.Errors...)
	if resp.Acked < last {
		return status.Errorf(codes.Internal, "source copy %s acknowledged line %d, want %d", cc.taskID, resp.Acked, last)
	}
	if closeSrc {
		if !resp.Closed {
			return status.Error(codes.Unimplemented, "the worker did not close the source")
		}
		cc.closed = true
	}
	return nil
}

// connect opens a session with the copy where it runs now.
func (c *IngestClient) connect(ctx context.Context, cc *ingestConn) error {
	copies, err := c.cfg.Resolve(ctx)
	if err != nil {
		return fmt.Errorf("ask where the source runs: %w", err)
	}
	cc.addr = ""
	for _, cp := range copies {
		if cp.TaskID == cc.taskID {
			cc.addr = cp.Addr
		}
	}
	if cc.addr == "" {
		return status.Errorf(codes.Unavailable, "source copy %s is not placed on a worker now", cc.taskID)
	}
	conn, err := c.cfg.Conn(cc.addr)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(c.ctx)
	stream, err := fedstreampb.NewDataPlaneClient(conn).IngestSession(sctx)
	if err != nil {
		cancel()
		return err
	}
	cc.stream, cc.cancel = stream, cancel
	if err := stream.Send(&fedstreampb.IngestRequest{Query: c.cfg.Query, Source: c.cfg.Source, Producer: c.cfg.Producer}); err != nil {
		_, rerr := cc.recv(ctx)
		return errors.Join(err, rerr)
	}
	_, err = cc.recv(ctx)
	return err
}

// recv reads the copy's next answer and notes its acknowledged offset.
func (cc *ingestConn) recv(ctx context.Context) (*fedstreampb.IngestResponse, error) {
	resp, err := cc.stream.Recv()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, io.EOF) {
			return nil, status.Error(codes.Unavailable, "the worker ended the stream")
		}
		return nil, err
	}
	cc.acked = max(cc.acked, resp.Acked)
	cc.accepted = max(cc.accepted, resp.ProducerAccepted)
	return resp, nil
}

// drop forgets the copy's stream (it is reopened on the next attempt).
func (cc *ingestConn) drop() {
	if cc.cancel != nil {
		cc.cancel()
	}
	cc.stream, cc.cancel = nil, nil
}

// permanentIngestError reports whether resending cannot help.
func permanentIngestError(err error) bool {
	if errors.Is(err, ErrIngestGap) {
		return true
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition, codes.PermissionDenied,
		codes.Unauthenticated, codes.Unimplemented, codes.ResourceExhausted:
		return true
	}
	return false
}

// countRequestLines is how many lines a request's bytes hold: one per
// newline, plus an unterminated last line (as the worker counts them).
func countRequestLines(lines []byte) uint64 {
	var n uint64
	for _, b := range lines {
		if b == '\n' {
			n++
		}
	}
	if len(lines) > 0 && lines[len(lines)-1] != '\n' {
		n++
	}
	return n
}
