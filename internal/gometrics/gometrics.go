// Package gometrics bridges the go-metrics figures that hashicorp/raft,
// serf and memberlist emit into Prometheus.
//
// Those libraries report to go-metrics' process-wide global sink, so the
// bridge is process-wide too: Install puts one Sink there (once), and
// every coordinator of the process registers that same Sink, a
// prometheus.Collector, in its own registry. When several coordinators
// share a process (fedstream dev, tests) their library figures are
// therefore summed together; fedstream's own metrics are per coordinator.
//
// Names follow Prometheus conventions: the go-metrics key in snake_case
// ("raft.commitTime" becomes raft_commit_time), counters end in _total,
// samples (timers included) become summaries without quantiles (count and
// sum). Timers are in seconds (Install sets go-metrics' timer granularity
// to one second); the few samples a library measures itself keep that
// library's unit, which the metric's help names.
package gometrics

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	metrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// MaxSeries bounds how many series the bridge keeps: a key it has not
// seen once this many exist is dropped (and counted), so a library that
// put unbounded values into keys could not grow a scrape without limit.
const MaxSeries = 2000

type kind uint8

const (
	kindGauge kind = iota
	kindCounter
	kindSummary
)

type series struct {
	name   string
	key    string // the go-metrics key, for the help text
	kind   kind
	labels []string // label values, in the order of the family's names
	value  float64  // gauge value or counter total
	count  uint64   // summary
	sum    float64  // summary
}

type family struct {
	kind  kind
	names []string // label names
	desc  *prometheus.Desc
}

// Sink is a go-metrics sink that keeps the latest figures in memory and
// serves them as a prometheus.Collector.
type Sink struct {
	mu       sync.Mutex
	families map[string]*family
	series   map[string]*series // name + "\xff" + label values
	dropped  uint64
	droppedD *prometheus.Desc
	// rejected are names that break Prometheus conventions (see
	// conventional): their updates are dropped.
	rejected map[string]bool
}

// NewSink returns an empty sink (tests use their own; processes use
// Install's).
func NewSink() *Sink {
	return &Sink{families: map[string]*family{}, series: map[string]*series{}, rejected: map[string]bool{},
		droppedD: prometheus.NewDesc("fedstream_gometrics_dropped_total",
			"go-metrics updates the bridge dropped (series beyond its bound, or label names differing from the first series of the same name).", nil, nil)}
}

var (
	installOnce sync.Once
	global      *Sink
)

// Install makes the process-wide sink go-metrics' global sink (the first
// call does; later calls return the same sink) and returns it.
func Install() *Sink {
	installOnce.Do(func() {
		global = NewSink()
		cfg := metrics.DefaultConfig("")
		cfg.EnableHostname = false
		cfg.EnableRuntimeMetrics = false // the Go collector covers it
		cfg.TimerGranularity = time.Second
		// NewGlobal only fails for sink types it builds itself.
		if _, err := metrics.NewGlobal(cfg, global); err != nil {
			panic(fmt.Sprintf("gometrics: install global sink: %v", err))
		}
	})
	return global
}

// SetGauge implements metrics.MetricSink.
func (s *Sink) SetGauge(key []string, val float32) { s.SetGaugeWithLabels(key, val, nil) }

// SetGaugeWithLabels implements metrics.MetricSink.
func (s *Sink) SetGaugeWithLabels(key []string, val float32, labels []metrics.Label) {
	s.update(key, labels, kindGauge, func(se *series) { se.value = float64(val) })
}

// EmitKey implements metrics.MetricSink; it is kept as a gauge.
func (s *Sink) EmitKey(key []string, val float32) { s.SetGaugeWithLabels(key, val, nil) }

// IncrCounter implements metrics.MetricSink.
func (s *Sink) IncrCounter(key []string, val float32) { s.IncrCounterWithLabels(key, val, nil) }

// IncrCounterWithLabels implements metrics.MetricSink.
func (s *Sink) IncrCounterWithLabels(key []string, val float32, labels []metrics.Label) {
	if val < 0 {
		return // a counter only grows
	}
	s.update(key, labels, kindCounter, func(se *series) { se.value += float64(val) })
}

// AddSample implements metrics.MetricSink.
func (s *Sink) AddSample(key []string, val float32) { s.AddSampleWithLabels(key, val, nil) }

// AddSampleWithLabels implements metrics.MetricSink.
func (s *Sink) AddSampleWithLabels(key []string, val float32, labels []metrics.Label) {
	s.update(key, labels, kindSummary, func(se *series) { se.count++; se.sum += float64(val) })
}

// legacyPeerKey reports a key hashicorp/raft emits twice: once with the
// peer's id appended to the key and no labels (the legacy form, one metric
// name per peer), once with the peer as a label. The bridge keeps the
// labelled form only.
func legacyPeerKey(key []string, labels []metrics.Label) bool {
	return len(labels) == 0 && len(key) >= 4 && key[0] == "raft" && key[1] == "replication"
}

func (s *Sink) update(key []string, labels []metrics.Label, k kind, f func(*series)) {
	if len(key) == 0 || legacyPeerKey(key, labels) {
		return
	}
	name, scale := nameAndScale(key)
	if k == kindCounter {
		name += "_total"
	}
	if scale != 1 {
		inner := f
		f = func(se *series) {
			// The update functions add or set float64(val): apply the
			// unit's scale to what they changed.
			before := *se
			inner(se)
			se.value = before.value + (se.value-before.value)*scale
			se.sum = before.sum + (se.sum-before.sum)*scale
		}
	}
	ls := append([]metrics.Label(nil), labels...)
	sort.Slice(ls, func(i, j int) bool { return ls[i].Name < ls[j].Name })
	names := make([]string, len(ls))
	values := make([]string, len(ls))
	for i, l := range ls {
		names[i], values[i] = snake(l.Name), l.Value
	}
	id := name + "\xff" + strings.Join(values, "\xff")
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.series[id]
	if se == nil {
		fam := s.families[name]
		if fam == nil && !s.rejected[name] {
			fam = &family{kind: k, names: names, desc: prometheus.NewDesc(name, help(key, k), names, nil)}
			if !conventional(name, help(key, k), k, names) {
				s.rejected[name] = true
				fam = nil
			}
		}
		if fam == nil || fam.kind != k || strings.Join(fam.names, ",") != strings.Join(names, ",") || len(s.series) >= MaxSeries {
			s.dropped++
			return
		}
		s.families[name] = fam
		se = &series{name: name, key: strings.Join(key, "."), kind: k, labels: values}
		s.series[id] = se
	}
	f(se)
}

// conventional reports whether a new family passes promlint, so that the
// bridge never serves a name Prometheus conventions reject (a library may
// add keys in a later version). It runs once per family.
func conventional(name, helpText string, k kind, labels []string) bool {
	m := &dto.Metric{}
	for _, l := range labels {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l), Value: proto.String("x")})
	}
	typ := map[kind]dto.MetricType{kindGauge: dto.MetricType_GAUGE, kindCounter: dto.MetricType_COUNTER, kindSummary: dto.MetricType_SUMMARY}[k]
	switch k {
	case kindGauge:
		m.Gauge = &dto.Gauge{Value: proto.Float64(0)}
	case kindCounter:
		m.Counter = &dto.Counter{Value: proto.Float64(0)}
	case kindSummary:
		m.Summary = &dto.Summary{SampleCount: proto.Uint64(0), SampleSum: proto.Float64(0)}
	}
	mf := &dto.MetricFamily{Name: proto.String(name), Help: proto.String(helpText), Type: &typ, Metric: []*dto.Metric{m}}
	problems, err := promlint.NewWithMetricFamilies([]*dto.MetricFamily{mf}).Lint()
	return err == nil && len(problems) == 0
}

func help(key []string, k kind) string {
	what := map[kind]string{kindGauge: "gauge", kindCounter: "counter", kindSummary: "samples (durations timed by go-metrics in seconds, a unit the key names in its base unit)"}[k]
	return fmt.Sprintf("go-metrics %s %s, from hashicorp/%s.", what, strings.Join(key, "."), key[0])
}

// Describe implements prometheus.Collector. It describes nothing: the
// families are only known as the libraries report them (an unchecked
// collector).
func (s *Sink) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (s *Sink) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, se := range s.series {
		fam := s.families[se.name]
		var m prometheus.Metric
		var err error
		switch se.kind {
		case kindGauge:
			m, err = prometheus.NewConstMetric(fam.desc, prometheus.GaugeValue, se.value, se.labels...)
		case kindCounter:
			m, err = prometheus.NewConstMetric(fam.desc, prometheus.CounterValue, se.value, se.labels...)
		case kindSummary:
			m, err = prometheus.NewConstSummary(fam.desc, se.count, se.sum, nil, se.labels...)
		}
		if err == nil {
			ch <- m
		}
	}
	ch <- prometheus.MustNewConstMetric(s.droppedD, prometheus.CounterValue, float64(s.dropped))
}

// Name turns a go-metrics key into a Prometheus metric name: each part in
// snake_case, joined by underscores, with anything outside [a-z0-9_]
// replaced by an underscore, and units in their base form (see
// nameAndScale).
func Name(key []string) string {
	name, _ := nameAndScale(key)
	return name
}

// baseUnits maps a unit word a key may hold to its Prometheus base unit
// and the factor that converts a value into it ("adjustment-ms" becomes
// adjustment_seconds, values times 0.001). Abbreviations and non-base
// units in names are what Prometheus conventions (and promlint) reject.
var baseUnits = map[string]struct {
	base  string
	scale float64
}{
	"ns": {"seconds", 1e-9}, "nanoseconds": {"seconds", 1e-9},
	"us": {"seconds", 1e-6}, "microseconds": {"seconds", 1e-6},
	"ms": {"seconds", 1e-3}, "milliseconds": {"seconds", 1e-3},
	"s": {"seconds", 1}, "sec": {"seconds", 1}, "secs": {"seconds", 1},
	"minutes": {"seconds", 60}, "hours": {"seconds", 3600}, "days": {"seconds", 86400},
	"b": {"bytes", 1}, "kb": {"bytes", 1e3}, "mb": {"bytes", 1e6}, "gb": {"bytes", 1e9},
	"kilobytes": {"bytes", 1e3}, "megabytes": {"bytes", 1e6}, "gigabytes": {"bytes", 1e9},
	"kib": {"bytes", 1 << 10}, "mib": {"bytes", 1 << 20}, "gib": {"bytes", 1 << 30},
}

// ambiguous are one-letter words that read as unit abbreviations (metres,
// hours, days) without saying which; they are spelled out as "x_unit".
var ambiguous = map[string]bool{"m": true, "h": true, "d": true, "tb": true, "pb": true}

// nameAndScale is Name with the factor that converts the key's values to
// the base unit its name now states (1 when it states none).
func nameAndScale(key []string) (string, float64) {
	var words []string
	scale := 1.0
	for _, k := range key {
		if p := snake(k); p != "" {
			words = append(words, strings.Split(p, "_")...)
		}
	}
	for i, w := range words {
		if u, ok := baseUnits[w]; ok {
			words[i] = u.base
			scale *= u.scale
		} else if ambiguous[w] {
			words[i] = w + "_unit"
		}
	}
	return strings.Join(words, "_"), scale
}

// snake converts camelCase (and dashes, dots) to snake_case.
func snake(s string) string {
	var b strings.Builder
	prevLower := false
	for _, r := range s {
		switch {
		case unicode.IsUpper(r):
			if prevLower {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
			prevLower = false
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			prevLower = true
		default:
			if b.Len() > 0 && !strings.HasSuffix(b.String(), "_") {
				b.WriteByte('_')
			}
			prevLower = false
		}
	}
	return strings.Trim(b.String(), "_")
}
