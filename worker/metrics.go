package worker

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

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
	descCutHolds    = prometheus.NewDesc("fedstream_task_reconfig_cut_holds_total", "Times a source held before a live reconfiguration plan's lowest possible cut until it learned the cut (the plan took longer than its switch margin).", taskLabels, nil)
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
		descUnacked, descSwitches, descCutHolds, descGeneration, descBytesIn, descBytesOut, descRegistered, descWorkerTasks} {
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
	counter(descCutHolds, float64(s.CutHolds))
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
