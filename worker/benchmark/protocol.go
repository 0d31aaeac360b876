package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/fedstream/fedstream/worker/runtime"
)

// ErrWorker means a bench worker answered a request with an error, or its
// pipes failed (it died).
var ErrWorker = errors.New("benchmark: bench worker failed")

// Operations of the bench-worker control protocol. The parent writes one
// JSON request per line on the worker's stdin and reads exactly one JSON
// response per request on its stdout, in order. Operations named *_start
// or *_listen return at once and leave a job running; the matching *_wait
// blocks until that job ends.
const (
	// opHello starts the worker's two engines, with mutual TLS when TLS is
	// set (the data plane and the raw TCP baselines alike), and returns
	// their DataPlane addresses: Addr batches as in production,
	// UnbatchedAddr sends one tuple per task-to-task message. It is the
	// first request, and the only one that may be sent once.
	opHello = "hello"
	// opCPU reports the worker's CPU time (every response carries it)
	// and its garbage collections so far (GCCycles).
	opCPU = "cpu"
	// opApply makes the batched engine (the unbatched one with Unbatched)
	// run exactly Tasks, and the other engine none. The response carries
	// StartNanos, taken just before Apply.
	opApply = "apply"
	// opTailStart subscribes (no ack) to the result stream of sink task
	// Task of Query, counting data tuples until the final boundary;
	// opTailWait returns the count, their encoded bytes, the wall time of
	// the final boundary and, with Collect, the word counts in the results.
	opTailStart = "tail_start"
	opTailWait  = "tail_wait"
	// opTCPListen accepts one raw TCP connection and counts the fixed-size
	// records of RecordBytes bytes read from it until EOF; opTCPWait
	// returns the count and the wall time of EOF.
	opTCPListen = "tcp_listen"
	opTCPWait   = "tcp_wait"
	// opTCPSend generates Records records with the forward pipeline's blob
	// generator, connects to Addr and writes each as a raw record of
	// RecordBytes bytes through a 256 KiB buffered writer; it returns when
	// all are written, with StartNanos taken when the request arrived
	// (before connecting, as engine runs are timed from before their tasks
	// start).
	opTCPSend = "tcp_send"
	// opWCListen accepts Partitions connections of the hand-written word
	// count and counts the words they carry; opWCWait returns the counts
	// and the wall time the last partition ended.
	opWCListen = "wc_listen"
	opWCWait   = "wc_wait"
	// opWCSend generates Records lines (words generator, Seed), splits
	// them into words and hash-partitions the words over Partitions
	// connections to Addr.
	opWCSend = "wc_send"
	// opStats reports the worker's snapshot figures: SnapshotBytes, the
	// encoded bytes of the task snapshots its engine served (moves out).
	opStats = "stats"
	// opStalls reports the worker's stall sampler's events (Stalls).
	opStalls = "stalls"
	// opTraceWrite writes the worker's flight recording (hello with
	// FlightRecorder) to the file Spec names.
	opTraceWrite = "trace_write"
	// opOutputPos reports, as LastID, the id of the last tuple task Task
	// of Query appended to its output stream to Consumer (partition 0).
	opOutputPos = "output_pos"
	// opEventsStart follows the result stream of sink task Task (no ack)
	// as opTailStart does, but records every tuple of it (stable and
	// tentative results, UNDO, REC_DONE, boundaries) with the wall time it
	// was read, until the final boundary; opTailWait returns them as
	// Events (bench dcaa).
	opEventsStart = "events_start"
	// opFaults replaces the worker's cut data-plane links by those of Spec
	// (dataplane.ParseFaults; empty heals every link). Only for a worker
	// whose hello asked for Faults.
	opFaults = "faults"
	// opProfileStart starts a CPU profile of the worker process into the
	// file Spec names; opProfileStop ends it (bench dcaa: one profile per
	// saturation run). A worker profiling its whole life (--cpuprofile)
	// refuses it.
	opProfileStart = "profile_start"
	opProfileStop  = "profile_stop"
	// opTaskStats reports, as TaskIn, the input tuples each task of the
	// active engine has taken so far (runtime.TaskStats.InTuples), and
	// the process's garbage collections so far (GCCycles) and its tasks
	// not STABLE (Unstable): bench dcaa's
	// side-by-side overhead reads them window by window.
	opTaskStats = "task_stats"
	// opGC runs a garbage collection in the worker process and reports
	// its collections so far (GCCycles): bench dcaa's paired overhead
	// rounds start from a collected heap, so that the garbage of one
	// round is not collected, and charged, in the next.
	opGC = "gc"
)

// request is one control message from the parent to a bench worker.
type request struct {
	Op          string             `json:"op"`
	Tasks       []runtime.TaskSpec `json:"tasks,omitempty"`
	Unbatched   bool               `json:"unbatched,omitempty"`
	Query       string             `json:"query,omitempty"`
	Task        string             `json:"task,omitempty"`
	Collect     bool               `json:"collect,omitempty"`
	Addr        string             `json:"addr,omitempty"`
	Records     int64              `json:"records,omitempty"`
	RecordBytes int                `json:"record_bytes,omitempty"`
	Seed        int64              `json:"seed,omitempty"`
	Partitions  int                `json:"partitions,omitempty"`
	// Consumer names the output stream of opOutputPos.
	Consumer string `json:"consumer,omitempty"`
	// Rows makes a tail (opTailStart) return every result row, formatted,
	// with the wall time it was read (bench move).
	Rows bool `json:"rows,omitempty"`
	// SourceSpeedup runs the worker's generator sources this many times
	// faster than their rate (hello; runtime.Options.SourceSpeedup).
	SourceSpeedup int `json:"source_speedup,omitempty"`
	// BoundaryInterval is the stime spacing of the sources' boundaries
	// (hello; runtime.Options.BoundaryInterval, 0: its default of 50 ms).
	BoundaryInterval time.Duration `json:"boundary_interval,omitempty"`
	// StreamSnapshots makes the worker fetch snapshots over the
	// FetchSnapshot stream only, never over a connection of their own
	// (hello; runtime.BulkOptions.Disabled): for comparisons.
	StreamSnapshots bool `json:"stream_snapshots,omitempty"`
	// TLS is the worker's certificate material (hello; nil: plaintext).
	TLS *tlsMaterial `json:"tls,omitempty"`
	// Faults gives the worker's data plane a fault injection hook
	// (hello; opFaults drives it).
	Faults bool `json:"faults,omitempty"`
	// Stalls starts the worker's stall sampler (hello), for opStalls:
	// bench move's only (its goroutine wakes every millisecond).
	Stalls bool `json:"stalls,omitempty"`
	// FlightRecorder starts the worker's flight recorder (hello), for
	// opTraceWrite.
	FlightRecorder bool `json:"flight_recorder,omitempty"`
	// Spec is the fault specification of opFaults.
	Spec string `json:"spec,omitempty"`
}

// tlsMaterial is a bench worker's TLS identity, made by the parent.
type tlsMaterial struct {
	CA   []byte `json:"ca"`
	Cert []byte `json:"cert"`
	Key  []byte `json:"key"`
}

// response answers one request. Times are Unix nanoseconds of the wall
// clock: parent and workers run on one machine, so they compare.
type response struct {
	Error string `json:"error,omitempty"`
	Addr  string `json:"addr,omitempty"`
	// UnbatchedAddr is the unbatched engine's DataPlane address (hello).
	UnbatchedAddr string `json:"unbatched_addr,omitempty"`
	StartNanos    int64  `json:"start_nanos,omitempty"`
	FirstNanos    int64  `json:"first_nanos,omitempty"`
	EndNanos      int64  `json:"end_nanos,omitempty"`
	Records       int64  `json:"records,omitempty"`
	Bytes         int64  `json:"bytes,omitempty"`
	// Words is the number of words a word-count sender sent.
	Words int64 `json:"words,omitempty"`
	// Counts are the word counts (occurrences per word) a word count
	// computed.
	Counts map[string]int64 `json:"counts,omitempty"`
	// Rows are a tail's result rows in stream order and RowNanos the wall
	// time each was read (opTailStart with Rows).
	Rows     []string `json:"rows,omitempty"`
	RowNanos []int64  `json:"row_nanos,omitempty"`
	// LastID is what opOutputPos reports.
	LastID uint64 `json:"last_id,omitempty"`
	// Events are what an events tail read (opEventsStart), in order.
	Events []streamEvent `json:"events,omitempty"`
	// SnapshotBytes and Bootstrap are what opStats reports: the bytes of
	// the snapshots the worker served, and the phases of the latest task
	// start from a fetched snapshot on it.
	SnapshotBytes uint64                   `json:"snapshot_bytes,omitempty"`
	Bootstrap     *runtime.BootstrapTiming `json:"bootstrap,omitempty"`
	// Served is the timing of the latest snapshot the worker served
	// (opStats).
	Served *runtime.ServeTiming `json:"served,omitempty"`
	// TaskIn, GCCycles and Unstable are what opTaskStats reports;
	// Unstable counts the tasks whose DCAA replica state is not STABLE
	// or whose output is tentative now.
	TaskIn   map[string]uint64 `json:"task_in,omitempty"`
	GCCycles uint64            `json:"gc_cycles,omitempty"`
	Unstable int               `json:"unstable,omitempty"`
	// CPUNanos is the worker process's CPU time so far (user and system),
	// set on every response.
	CPUNanos int64 `json:"cpu_nanos,omitempty"`
	// Stalls are the worker process's late wake-ups and GC pauses
	// (opStalls).
	Stalls []stallEvent `json:"stalls,omitempty"`
}

// workerClient talks to one bench worker. Calls are serialised: the
// protocol is strictly request/response.
type workerClient struct {
	name string
	mu   sync.Mutex
	enc  *json.Encoder
	dec  *json.Decoder
	proc *WorkerProcess
	// addr and unbatchedAddr are the DataPlane addresses of the worker's
	// batched and unbatched engines (from hello).
	addr, unbatchedAddr string
}

func newWorkerClient(name string, p *WorkerProcess) *workerClient {
	return &workerClient{name: name, enc: json.NewEncoder(p.In), dec: json.NewDecoder(p.Out), proc: p}
}

// call sends req and waits for the response, or for ctx to end (then the
// worker is stopped: its pipe is out of step and cannot be reused).
func (c *workerClient) call(ctx context.Context, req request) (response, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	type result struct {
		resp response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if err := c.enc.Encode(&req); err != nil {
			r.err = err
		} else if err := c.dec.Decode(&r.resp); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			r.err = err
		}
		done <- r
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return response{}, fmt.Errorf("%w: %s: %s: %w", ErrWorker, c.name, req.Op, r.err)
		}
		if r.resp.Error != "" {
			return r.resp, fmt.Errorf("%w: %s: %s: %s", ErrWorker, c.name, req.Op, r.resp.Error)
		}
		return r.resp, nil
	case <-ctx.Done():
		// Stopping the worker closes its pipes, which ends the goroutine.
		_ = c.proc.Stop()
		<-done
		return response{}, fmt.Errorf("%w: %s: %s: %w", ErrWorker, c.name, req.Op, ctx.Err())
	}
}
