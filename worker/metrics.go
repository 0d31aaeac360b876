package worker

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// byteCounts counts the data plane's bytes on the wire (TLS included): in
// is everything read from its connections, out everything written, over
// the server's accepted connections and the subscriptions' dialed ones.
// One atomic add per read or write of a connection, never per tuple.
type byteCounts struct{ in, out atomic.Uint64 }

// countingConn counts a connection's bytes into c.
type countingConn struct {
	net.Conn
	c *byteCounts
}

func (cc countingConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	cc.c.in.Add(uint64(n))
	return n, err
}

func (cc countingConn) Write(p []byte) (int, error) {
	n, err := cc.Conn.Write(p)
	cc.c.out.Add(uint64(n))
	return n, err
}

// countingListener wraps every accepted connection in a countingConn.
type countingListener struct {
	net.Listener
	c *byteCounts
}

func (l countingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{conn, l.c}, nil
}

// dial is the data-plane client's dialer: plain TCP, counted.
func (c *byteCounts) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return countingConn{conn, c}, nil
}

// Metric descriptions of a worker. Per-task series carry the query and
// the task id (bounded by the tasks the worker runs; a task's series go
// when it stops, since they are read from the running tasks at scrape
// time).
var (
	taskLabels      = []string{"query", "task"}
	descInTuples    = prometheus.NewDesc("fedstream_task_input_tuples_total", "Data tuples a task took from its inputs (operators, sinks), drew from its generator or ingested (sources).", taskLabels, nil)
	descOutTuples   = prometheus.NewDesc("fedstream_task_output_tuples_total", "Data tuples a task emitted to its outputs.", taskLabels, nil)
	descBusy        = prometheus.NewDesc("fedstream_task_busy_seconds_total", "Time a task spent processing, not counting time blocked on a full output buffer.", taskLabels, nil)
	descBlocked     = prometheus.NewDesc("fedstream_task_backpressure_seconds_total", "Time a task spent blocked on a full output buffer (a downstream that does not keep up).", taskLabels, nil)
	descQueue       = prometheus.NewDesc("fedstream_task_input_queue_tuples", "Data tuples received by a task and not processed yet.", taskLabels, nil)
	descOutBytes    = prometheus.NewDesc("fedstream_task_output_buffer_bytes", "Bytes held in a task's output buffers.", taskLabels, nil)
	descUnacked     = prometheus.NewDesc("fedstream_task_unacknowledged_tuples", "Tuples of a task's output streams that some downstream has not acknowledged yet.", taskLabels, nil)
	descSwitches    = prometheus.NewDesc("fedstream_task_subscription_switches_total", "Input subscriptions of a task that went to another copy of the upstream task than before (replica fail-over, moved upstream).", taskLabels, nil)
	descGeneration  = prometheus.NewDesc("fedstream_task_generation", "Generation of the copy of a task that runs on this worker.", taskLabels, nil)
	descBytesIn     = prometheus.NewDesc("fedstream_dataplane_received_bytes_total", "Bytes the worker's data plane read from the network (subscriptions' data, acknowledgements, ingest), TLS included.", nil, nil)
	descBytesOut    = prometheus.NewDesc("fedstream_dataplane_sent_bytes_total", "Bytes the worker's data plane wrote to the network, TLS included.", nil, nil)
	descRegistered  = prometheus.NewDesc("fedstream_worker_registered", "1 once the worker is registered with its org.", nil, nil)
	descWorkerTasks = prometheus.NewDesc("fedstream_worker_tasks", "Tasks running on the worker.", nil, nil)
)

// collector serves a worker's metrics, read from the runtime at scrape
// time.
type collector struct{ w *Worker }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInTuples, descOutTuples, descBusy, descBlocked, descQueue, descOutBytes,
		descUnacked, descSwitches, descGeneration, descBytesIn, descBytesOut, descRegistered, descWorkerTasks} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	stats := c.w.runtime.Stats()
	for _, s := range stats {
		collectTask(ch, s)
	}
	ch <- prometheus.MustNewConstMetric(descWorkerTasks, prometheus.GaugeValue, float64(len(stats)))
	ch <- prometheus.MustNewConstMetric(descBytesIn, prometheus.CounterValue, float64(c.w.bytes.in.Load()))
	ch <- prometheus.MustNewConstMetric(descBytesOut, prometheus.CounterValue, float64(c.w.bytes.out.Load()))
	reg := 0.0
	if c.w.ID() != "" {
		reg = 1
	}
	ch <- prometheus.MustNewConstMetric(descRegistered, prometheus.GaugeValue, reg)
}

func collectTask(ch chan<- prometheus.Metric, s wrt.TaskStats) {
	l := []string{s.Query, s.TaskID}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter(descInTuples, float64(s.InTuples))
	counter(descOutTuples, float64(s.OutTuples))
	counter(descBusy, float64(s.BusyNanos)/1e9)
	counter(descBlocked, float64(s.BlockedNanos)/1e9)
	counter(descSwitches, float64(s.Switches))
	gauge(descQueue, float64(s.Queue))
	gauge(descOutBytes, float64(s.OutputBytes))
	gauge(descUnacked, float64(s.Unacked))
	gauge(descGeneration, float64(s.Generation))
}

// HTTPAddr is where the worker serves metrics and health over HTTP (""
// when Config.HTTPAddr is not set or before Run).
func (w *Worker) HTTPAddr() string { return w.ops.Addr() }

// HandleHTTP mounts h on the worker's HTTP server (see opshttp.Server.Handle).
func (w *Worker) HandleHTTP(pattern string, h http.Handler) { w.ops.Handle(pattern, h) }

// ready is the worker's /readyz: registered with its org and serving its
// data plane.
func (w *Worker) ready() (bool, string) {
	switch {
	case w.ID() == "":
		return false, "not registered with the org yet"
	case !w.serving.Load():
		return false, "data plane not serving"
	}
	return true, ""
}

// statsReading is one reading of a task's figures and when it was taken.
type statsReading struct {
	s  wrt.TaskStats
	at time.Time
}

// taskStatsReport turns the tasks' figures into the per-task rates the
// heartbeat carries: differences against the previous reading (a task
// seen for the first time, or restarted since, reports its levels and no
// rates yet). Only the heartbeat goroutine calls it.
func (w *Worker) taskStatsReport(workerID string, now time.Time) []*pb.TaskStats {
	return withKeySamples(w.rates(workerID, w.runtime.Stats(), now), w.runtime.TakeKeySamples())
}

// withKeySamples adds to each task's report the key slots it sampled since
// the previous report (the health manager's data-skew sensor).
func withKeySamples(report []*pb.TaskStats, samples []wrt.KeySamples) []*pb.TaskStats {
	byTask := make(map[string]wrt.KeySamples, len(samples))
	for _, ks := range samples {
		byTask[ks.TaskID] = ks
	}
	for _, ts := range report {
		ks, ok := byTask[ts.Task]
		if !ok {
			continue
		}
		for _, k := range ks.Top {
			ts.KeySample = append(ts.KeySample, &pb.HealthKeySample{Fragment: k.Fragment, Slot: int32(k.Slot), Count: k.Count})
		}
		for _, n := range ks.Sampled {
			ts.KeysSampled += n
		}
	}
	return report
}

// rates turns a reading of the tasks' figures into the report's rates
// against the previous reading, and keeps it for the next.
func (w *Worker) rates(workerID string, stats []wrt.TaskStats, now time.Time) []*pb.TaskStats {
	next := make(map[string]statsReading, len(stats))
	out := make([]*pb.TaskStats, 0, len(stats))
	for _, s := range stats {
		next[s.TaskID] = statsReading{s: s, at: now}
		ts := &pb.TaskStats{Task: s.TaskID, Worker: workerID, Queue: int64(s.Queue), OutputBufferBytes: s.OutputBytes,
			UnackedTuples: s.Unacked, SubscriptionSwitches: int64(s.Switches), ReportedAtMs: now.UnixMilli()}
		if p, ok := w.lastStats[s.TaskID]; ok && rateable(p.s, s) {
			if secs := now.Sub(p.at).Seconds(); secs > 0 {
				ts.InTps = float64(s.InTuples-p.s.InTuples) / secs
				ts.OutTps = float64(s.OutTuples-p.s.OutTuples) / secs
				ts.Busy = min(1, float64(s.BusyNanos-p.s.BusyNanos)/1e9/secs)
				ts.BackpressureMsPerS = float64(s.BlockedNanos-p.s.BlockedNanos) / 1e6 / secs
				// Processing time is the CPU a task uses, near enough: a
				// task processes on one goroutine.
				ts.CpuSecondsPerS = ts.Busy
			}
		}
		out = append(out, ts)
	}
	w.lastStats = next
	return out
}

// rateable reports whether two readings of a task are of the same copy
// with counters that only grew.
func rateable(a, b wrt.TaskStats) bool {
	return a.Generation == b.Generation && b.InTuples >= a.InTuples && b.OutTuples >= a.OutTuples &&
		b.BusyNanos >= a.BusyNanos && b.BlockedNanos >= a.BlockedNanos
}
