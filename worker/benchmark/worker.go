package benchmark

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	goruntime "runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/runtime"
	"github.com/fedstream/fedstream/worker/tuple"
)

// finalBoundary is the stime of the BOUNDARY that ends a finite stream.
const finalBoundary = math.MaxInt64

// Bounds of the sink's result ring in a bench worker, and the backoff of
// its subscription retries (see engineSettings for production's).
const (
	sinkRingTuples = 1 << 20
	sinkRingBytes  = 128 << 20
	benchRetryMin  = time.Millisecond
	benchRetryMax  = 10 * time.Millisecond
)

// ServeWorker runs a bench worker: a task runtime behind a DataPlane gRPC
// server on 127.0.0.1, plus the raw-TCP roles of the baselines, driven by
// the JSON requests read from in (answers go to out). It returns nil when in
// ends (the parent closed it or died), after stopping everything it
// started; or ctx.Err() when ctx ends first.
func ServeWorker(ctx context.Context, in io.Reader, out io.Writer, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	w, err := startBenchWorker(logger)
	if err != nil {
		return err
	}
	defer w.close()

	// The end of in ends the session even while a request is blocked
	// (e.g. waiting for a tail): the parent is gone or gave up.
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reqs := make(chan request)
	// readErr receives the reader's error before it cancels ctx.
	readErr := make(chan error, 1)
	// The reader ends when in does; ServeWorker's caller owns in and closes
	// it (or the process exits) to stop it.
	go func() {
		dec := json.NewDecoder(in)
		for {
			var req request
			if err := dec.Decode(&req); err != nil {
				readErr <- err
				cancel()
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	inputEnded := func(err error) error {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) {
			return nil
		}
		return fmt.Errorf("bench worker: read request: %w", err)
	}
	enc := json.NewEncoder(out)
	for {
		select {
		case <-ctx.Done():
			if err := parent.Err(); err != nil {
				return err
			}
			return inputEnded(<-readErr)
		case req := <-reqs:
			resp, err := w.handle(ctx, req)
			if err != nil {
				resp = response{Error: err.Error()}
			}
			resp.CPUNanos = processCPUNanos()
			if err := enc.Encode(&resp); err != nil {
				return fmt.Errorf("bench worker: write response: %w", err)
			}
		}
	}
}

// job is a background role of a bench worker (a tail or a TCP receiver).
type job struct {
	cancel context.CancelFunc
	done   chan struct{}
	resp   response
	err    error
}

func (j *job) wait(ctx context.Context) (response, error) {
	select {
	case <-j.done:
		return j.resp, j.err
	case <-ctx.Done():
		return response{}, ctx.Err()
	}
}

// engine is one task runtime behind its own DataPlane server.
type engine struct {
	rt    *runtime.Runtime
	srv   *grpc.Server
	addr  string
	serve chan struct{} // closed when srv.Serve returns
}

// newEngine starts a runtime and its DataPlane server on a free loopback
// port. Without batching, every task-to-task message carries one tuple.
func newEngine(logger *slog.Logger, pool *dataplane.Pool, batching bool, creds *tlsutil.Credentials, hello request) (*engine, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench worker: listen: %w", err)
	}
	sopts := dataplane.ServerOptions()
	if creds != nil {
		sopts = append(sopts, creds.ServerOption(tlsutil.Peer{Roles: []string{rpc.RoleWorker}}, false))
		sopts = append(sopts, dataplane.TLSServerOptions()...)
	}
	e := &engine{
		srv:   grpc.NewServer(sopts...),
		addr:  lis.Addr().String(),
		serve: make(chan struct{}),
	}
	// Short retry backoff: a downstream task applied before its upstream
	// exists polls for it, and that delay counts in the measurement.
	//
	// The sink's result stream is a ring the tail must not fall a whole
	// ring behind: give it room for about a second of output. Buffers
	// between tasks keep the default tuple bound, which binds before the
	// larger byte bound for records this small.
	opts := runtime.Options{
		Logger: logger, Pool: pool, RetryMin: benchRetryMin, RetryMax: benchRetryMax,
		SinkBufferTuples: sinkRingTuples, SourceSpeedup: hello.SourceSpeedup, BoundaryInterval: hello.BoundaryInterval,
		Buffer: dataplane.BufferOptions{MaxBytes: sinkRingBytes, MaxTuples: dataplane.DefaultMaxTuples},
	}
	if !batching {
		opts.MaxBatchBytes = 1 // every message carries exactly one tuple
	}
	// Snapshots cross over connections of their own, as a worker's do
	// (see runtime.BulkOptions), with the same TLS as the data plane.
	bulk, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("bench worker: listen: %w", err)
	}
	opts.Bulk.Listener, opts.Bulk.Disabled = bulk, hello.StreamSnapshots
	if creds != nil {
		peer := tlsutil.Peer{Roles: []string{rpc.RoleWorker}}
		opts.Bulk.ServerTLS, opts.Bulk.ClientTLS = creds.ServerConfig(peer, false), creds.ClientConfig(peer)
	}
	e.rt = runtime.New(opts)
	fedstreampb.RegisterDataPlaneServer(e.srv, e.rt.Server())
	go func() { defer close(e.serve); _ = e.srv.Serve(lis) }()
	return e, nil
}

// close stops the tasks and the server, and waits for them.
func (e *engine) close(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.rt.Close(ctx); err != nil {
		log.Warn("bench worker: runtime close", "err", err)
	}
	e.srv.Stop()
	<-e.serve
}

type benchWorker struct {
	log  *slog.Logger
	pool *dataplane.Pool
	// batched is the engine as configured in production; unbatched sends
	// one tuple per task-to-task message. A query runs on one of them.
	batched, unbatched *engine
	// active is the engine of the tasks last applied.
	active *engine
	// specs are the tasks last applied, by task id (the tail reads the
	// sink's schema from them).
	specs map[string]runtime.TaskSpec
	// jobs holds the running background job of each kind ("tail", "tcp",
	// "wc"); only the request loop touches it.
	jobs map[string]*job
	wg   sync.WaitGroup
	// tlsServer and tlsClient wrap the raw TCP baselines' connections
	// when the bench runs with TLS (nil: plaintext).
	tlsServer, tlsClient *tls.Config
	// faults cuts the engines' outgoing data-plane links (hello with
	// Faults; nil: no fault injection hook).
	faults *dataplane.Faults
	// profile is the CPU profile opProfileStart began (nil: none); only
	// the request loop touches it.
	profile *os.File
	// stalls samples this process's stalls from hello on (opStalls;
	// nil unless hello asked for it); stopStalls ends it.
	stalls     *stallSampler
	stopStalls context.CancelFunc
	// recorder is the flight recorder hello started (nil: none).
	recorder *trace.FlightRecorder
}

func startBenchWorker(logger *slog.Logger) (*benchWorker, error) {
	return &benchWorker{
		log:   logger,
		specs: map[string]runtime.TaskSpec{},
		jobs:  map[string]*job{},
	}, nil
}

// hello starts the engines, with mutual TLS when hello.TLS is set.
func (w *benchWorker) hello(hello request) error {
	m := hello.TLS
	if w.batched != nil {
		return errors.New("hello: the engines are already started")
	}
	var creds *tlsutil.Credentials
	var dial []grpc.DialOption
	if m != nil {
		var err error
		if creds, err = tlsutil.New(m.CA); err == nil {
			err = creds.SetCertificate(m.Cert, m.Key)
		}
		if err != nil {
			return fmt.Errorf("hello: TLS: %w", err)
		}
		peer := tlsutil.Peer{Roles: []string{rpc.RoleWorker}}
		dial = append(dial, creds.DialOption(peer))
		dial = append(dial, dataplane.TLSDialOptions()...)
		w.tlsServer, w.tlsClient = creds.ServerConfig(peer, false), creds.ClientConfig(peer)
	}
	if hello.Faults {
		w.faults = dataplane.NewFaults()
		dial = append(dial, w.faults.DialOption())
	}
	w.pool = dataplane.NewPool(dial...)
	var err error
	if w.batched, err = newEngine(w.log, w.pool, true, creds, hello); err != nil {
		return err
	}
	if w.unbatched, err = newEngine(w.log, w.pool, false, creds, hello); err != nil {
		return err
	}
	w.active = w.batched
	if hello.Stalls {
		var ctx context.Context
		ctx, w.stopStalls = context.WithCancel(context.Background())
		w.stalls = startStallSampler(ctx)
	}
	if hello.FlightRecorder {
		if w.recorder, err = startFlightRecorder(); err != nil {
			return err
		}
	}
	return nil
}

// startProfile starts a CPU profile of this process into the file path.
func (w *benchWorker) startProfile(path string) error {
	if w.profile != nil {
		return fmt.Errorf("profile_start %s: already profiling into %s", path, w.profile.Name())
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("profile_start %s: %w", path, err)
	}
	w.profile = f
	return nil
}

// stopProfile ends the profile startProfile began (none: nothing).
func (w *benchWorker) stopProfile() error {
	if w.profile == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := w.profile.Close()
	w.profile = nil
	return err
}

// close stops the jobs, the engines and the pool, and waits for them.
func (w *benchWorker) close() {
	_ = w.stopProfile()
	for _, j := range w.jobs {
		j.cancel()
	}
	w.wg.Wait()
	for _, e := range []*engine{w.batched, w.unbatched} {
		if e != nil {
			e.close(w.log)
		}
	}
	if w.pool != nil {
		_ = w.pool.Close()
	}
	if w.stalls != nil {
		w.stopStalls()
		<-w.stalls.done
	}
	if w.recorder != nil {
		w.recorder.Stop()
	}
}

func (w *benchWorker) handle(ctx context.Context, req request) (response, error) {
	if req.Op != opHello && w.batched == nil {
		return response{}, fmt.Errorf("%s before hello", req.Op)
	}
	switch req.Op {
	case opHello:
		if err := w.hello(req); err != nil {
			return response{}, err
		}
		return response{Addr: w.batched.addr, UnbatchedAddr: w.unbatched.addr}, nil
	case opCPU:
		return response{GCCycles: gcCycles()}, nil
	case opOutputPos:
		buf, err := w.batched.rt.LocalStream(&fedstreampb.StreamRef{Query: req.Query, TaskId: req.Task, Consumer: req.Consumer})
		if err != nil {
			return response{}, err
		}
		return response{LastID: buf.Stats().LastID}, nil
	case opTaskStats:
		in := map[string]uint64{}
		for _, st := range w.active.rt.Stats() {
			in[st.TaskID] = st.InTuples
		}
		unstable := 0
		for _, st := range w.active.rt.States() {
			if st.Tentative || (st.Replica != fedstreampb.ReplicaState_REPLICA_STATE_UNSPECIFIED && st.Replica != fedstreampb.ReplicaState_REPLICA_STABLE) {
				unstable++
			}
		}
		return response{TaskIn: in, GCCycles: gcCycles(), Unstable: unstable}, nil
	case opGC:
		goruntime.GC()
		return response{GCCycles: gcCycles()}, nil
	case opStats:
		b, sv := w.batched.rt.LastBootstrap(), w.batched.rt.LastServed()
		return response{SnapshotBytes: w.batched.rt.SnapshotBytesServed(), Bootstrap: &b, Served: &sv}, nil
	case opStalls:
		if w.stalls == nil {
			return response{}, errors.New("stalls: the worker was started without a stall sampler (hello stalls)")
		}
		return response{Stalls: w.stalls.events()}, nil
	case opTraceWrite:
		return response{}, writeFlightRecording(w.recorder, req.Spec)
	case opApply:
		w.specs = make(map[string]runtime.TaskSpec, len(req.Tasks))
		for _, s := range req.Tasks {
			w.specs[s.TaskID] = s
		}
		// The other engine's tasks (the previous query's) stop.
		run, idle := w.batched, w.unbatched
		if req.Unbatched {
			run, idle = idle, run
		}
		idle.rt.Apply(ctx, nil)
		w.active = run
		start := time.Now()
		run.rt.Apply(ctx, req.Tasks)
		for _, st := range run.rt.States() {
			if st.State == runtime.StateFailed {
				return response{}, fmt.Errorf("task %s failed: %s", st.TaskID, st.Message)
			}
		}
		return response{StartNanos: start.UnixNano(), EndNanos: time.Now().UnixNano()}, nil
	case opTailStart:
		spec, ok := w.specs[req.Task]
		if !ok {
			return response{}, fmt.Errorf("tail: no task %q was applied here", req.Task)
		}
		return response{}, w.startJob("tail", func(ctx context.Context) (response, error) {
			return w.tail(ctx, w.active, spec, req.Collect, req.Rows)
		})
	case opTCPListen:
		return w.listenJob("tcp", func(ctx context.Context, lis net.Listener) (response, error) {
			return receiveRecords(ctx, lis, req.RecordBytes, req.Records)
		})
	case opWCListen:
		return w.listenJob("wc", func(ctx context.Context, lis net.Listener) (response, error) {
			return receiveWordCount(ctx, lis, req.Partitions)
		})
	case opEventsStart:
		spec, ok := w.specs[req.Task]
		if !ok {
			return response{}, fmt.Errorf("events: no task %q was applied here", req.Task)
		}
		return response{}, w.startJob("tail", func(ctx context.Context) (response, error) {
			return w.events(ctx, w.active, spec)
		})
	case opProfileStart:
		return response{}, w.startProfile(req.Spec)
	case opProfileStop:
		return response{}, w.stopProfile()
	case opFaults:
		if w.faults == nil {
			return response{}, errors.New("faults: the worker was started without fault injection (hello faults)")
		}
		return response{}, w.faults.Set(req.Spec)
	case opTailWait:
		return w.waitJob(ctx, "tail")
	case opTCPWait:
		return w.waitJob(ctx, "tcp")
	case opWCWait:
		return w.waitJob(ctx, "wc")
	case opTCPSend:
		return sendRecords(ctx, req.Addr, req.Records, req.RecordBytes, w.tlsClient)
	case opWCSend:
		return sendWordCount(ctx, req.Addr, req.Records, req.Seed, req.Partitions, w.tlsClient)
	}
	return response{}, fmt.Errorf("unknown operation %q", req.Op)
}

// startJob runs fn in the background as the job of the given kind.
func (w *benchWorker) startJob(kind string, fn func(ctx context.Context) (response, error)) error {
	if old, ok := w.jobs[kind]; ok {
		old.cancel()
		<-old.done
	}
	ctx, cancel := context.WithCancel(context.Background())
	j := &job{cancel: cancel, done: make(chan struct{})}
	w.jobs[kind] = j
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(j.done)
		j.resp, j.err = fn(ctx)
	}()
	return nil
}

// listenJob listens on a free loopback port and runs fn on it in the
// background; the response carries the address.
func (w *benchWorker) listenJob(kind string, fn func(ctx context.Context, lis net.Listener) (response, error)) (response, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return response{}, fmt.Errorf("listen: %w", err)
	}
	if w.tlsServer != nil {
		lis = tlsListener{Listener: lis, cfg: w.tlsServer}
	}
	err = w.startJob(kind, func(ctx context.Context) (response, error) {
		defer lis.Close()
		// Closing the listener unblocks Accept when the job is cancelled.
		defer context.AfterFunc(ctx, func() { _ = lis.Close() })()
		return fn(ctx, lis)
	})
	return response{Addr: lis.Addr().String()}, err
}

func (w *benchWorker) waitJob(ctx context.Context, kind string) (response, error) {
	j, ok := w.jobs[kind]
	if !ok {
		return response{}, fmt.Errorf("no %s job was started", kind)
	}
	resp, err := j.wait(ctx)
	if err == nil || !errors.Is(err, ctx.Err()) {
		delete(w.jobs, kind)
		j.cancel()
	}
	return resp, err
}

// tail subscribes, without acknowledging, to the result stream of a sink
// task on this worker and counts its data tuples until the final boundary.
// The result stream is a ring: a tail that fell behind would miss tuples,
// which the id check reports instead of under-counting.
func (w *benchWorker) tail(ctx context.Context, e *engine, spec runtime.TaskSpec, collect, rows bool) (response, error) {
	plan, err := spec.Spec.FusedPlan()
	if err != nil {
		return response{}, err
	}
	node := plan.Node(spec.Fragment)
	if node == nil || node.Kind != queryspec.KindSink {
		return response{}, fmt.Errorf("tail: task %s is not a sink", spec.TaskID)
	}
	var counter resultCounter
	counter.rows = rows
	if collect {
		if err := counter.collectWords(node.Schema); err != nil {
			return response{}, fmt.Errorf("tail %s: %w", spec.TaskID, err)
		}
	}
	// The sink task reports its input exhausted once it has appended the
	// final boundary: that is the end of the pipeline's work, whatever the
	// tail's own lag. Poll for it alongside the tail.
	exhausted := make(chan int64, 1)
	pollCtx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		pollExhausted(pollCtx, e.rt, spec.TaskID, exhausted)
	}()
	// The results are read in this process, as a consumer co-located with
	// the sink reads them: the raw TCP baseline also ends at the receiving
	// process, without a further hop.
	ref := &fedstreampb.StreamRef{Query: spec.Query, TaskId: spec.TaskID, Partition: int32(spec.Partition), Consumer: ""}
	for {
		buf, err := e.rt.LocalStream(ref)
		if err == nil {
			err = counter.run(ctx, buf)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, dataplane.ErrUnknownStream) || ctx.Err() != nil {
			return response{}, fmt.Errorf("tail %s: %w", spec.TaskID, err)
		}
		// The sink is not there yet: poll.
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return response{}, ctx.Err()
		}
	}
	stopPoll()
	select {
	case end := <-exhausted:
		counter.resp.EndNanos = min(counter.resp.EndNanos, end)
	default:
	}
	return counter.resp, nil
}

// sinkExhausted is the message of a sink task (runtime.TaskState) that
// has processed its final boundary.
const sinkExhausted = "input exhausted"

// pollExhausted sends the wall time at which task first reports its input
// exhausted, polling every 500µs until then or until ctx ends.
func pollExhausted(ctx context.Context, rt *runtime.Runtime, task string, out chan<- int64) {
	tick := time.NewTicker(500 * time.Microsecond)
	defer tick.Stop()
	for {
		for _, st := range rt.States() {
			if st.TaskID == task && st.Message == sinkExhausted {
				out <- time.Now().UnixNano()
				return
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// errTailGap means the tail of a result stream missed tuples.
var errTailGap = errors.New("result stream tail missed tuples (ring buffer overran)")

// resultCounter counts what a sink delivers.
type resultCounter struct {
	resp   response
	lastID uint64
	// Field positions of the word and its count when collecting counts.
	wordIdx, countIdx int
	collect           bool
	// rows: keep every data tuple, formatted (response.Rows).
	rows bool
}

// wordField and countField are the result fields of the word count query.
const (
	wordField  = "word"
	countField = "count"
)

func (c *resultCounter) collectWords(s *tuple.Schema) error {
	c.wordIdx, c.countIdx = s.Index(wordField), s.Index(countField)
	if c.wordIdx < 0 || c.countIdx < 0 {
		return fmt.Errorf("result schema lacks %s or %s", wordField, countField)
	}
	c.collect = true
	c.resp.Counts = map[string]int64{}
	return nil
}

// tailReadBytes bounds one read of the result ring.
const tailReadBytes = 1 << 20

// run reads the result ring buf without acknowledging (the ring never
// waits for its readers) until the final boundary. It reads the ring's
// index (first id and offsets) and each tuple's type, as the raw TCP
// receiver checks each record's marker; it decodes boundaries' headers,
// and collected word counts.
func (c *resultCounter) run(ctx context.Context, buf *dataplane.OutputBuffer) error {
	var tp tuple.Tuple
	for {
		data, offs, base, first, gap, wait, err := buf.ReadIndexed(c.lastID, tailReadBytes)
		if err != nil {
			return err
		}
		if gap {
			return fmt.Errorf("%w: after id %d", errTailGap, c.lastID)
		}
		if len(offs) == 0 {
			select {
			case <-wait:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		// A read's ids are consecutive: the first tells whether any were
		// missed since the last one counted.
		if first != c.lastID+1 {
			return fmt.Errorf("%w: ids from %d after %d", errTailGap, first, c.lastID)
		}
		if c.resp.Records == 0 {
			c.resp.FirstNanos = time.Now().UnixNano()
		}
		// Data bytes: the whole read less the other tuples, which are
		// rare (boundaries), so data tuples cost a type check each.
		c.resp.Bytes += int64(len(data))
		now := time.Now().UnixNano()
		for i := range offs {
			at := offs[i] - base
			switch typ := tuple.PeekType(data[at:]); {
			case typ.IsData():
				c.resp.Records++
				if c.rows {
					if _, err := tuple.DecodeTuple(data[at:], &tp); err != nil {
						return err
					}
					c.resp.Rows = append(c.resp.Rows, formatRow(&tp))
					c.resp.RowNanos = append(c.resp.RowNanos, now)
				}
				if c.collect {
					if err := c.collectCount(data[at:], &tp); err != nil {
						return err
					}
				}
			default:
				end := len(data)
				if i+1 < len(offs) {
					end = offs[i+1] - base
				}
				c.resp.Bytes -= int64(end - at)
				if typ != tuple.Boundary {
					break
				}
				if _, err := tuple.DecodeHeader(data[at:], &tp); err != nil {
					return err
				}
				if tp.STime == finalBoundary {
					// Nothing follows the final boundary in the stream.
					c.lastID = first + uint64(i)
					c.resp.EndNanos = time.Now().UnixNano()
					return nil
				}
			}
		}
		c.lastID = first + uint64(len(offs)) - 1
	}
}

// collectCount adds the word count encoded at the start of enc.
func (c *resultCounter) collectCount(enc []byte, tp *tuple.Tuple) error {
	if _, err := tuple.DecodeTuple(enc, tp); err != nil {
		return err
	}
	// Strings alias the ring: the map key must be a copy.
	c.resp.Counts[strings.Clone(tp.Values[c.wordIdx].S)] += asInt(tp.Values[c.countIdx])
	return nil
}

// formatRow renders a result tuple's stime and values: two rows are the
// same result exactly when they format the same.
func formatRow(tp *tuple.Tuple) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d", tp.STime)
	for _, v := range tp.Values {
		switch v.Kind {
		case tuple.KindFloat:
			fmt.Fprintf(&sb, "|%g", v.F)
		case tuple.KindString, tuple.KindBytes:
			fmt.Fprintf(&sb, "|%q", v.S)
		default:
			fmt.Fprintf(&sb, "|%d", v.I)
		}
	}
	return sb.String()
}

func asInt(v tuple.Value) int64 {
	if v.Kind == tuple.KindFloat {
		return int64(math.Round(v.F))
	}
	return v.I
}

// tlsListener accepts server-side TLS connections made by tlsutil.Server,
// the data plane's kind.
type tlsListener struct {
	net.Listener
	cfg *tls.Config
}

func (l tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tlsutil.Server(c, l.cfg), nil
}

// gcCycles is the garbage collections this process has completed.
func gcCycles() uint64 {
	gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(gc)
	return gc[0].Value.Uint64()
}
