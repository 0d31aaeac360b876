package queryspec

import (
	"fmt"
	"net"
	"strconv"
)

// Kafka connector settings (documented in docs/QUERY.md, "Kafka").

// KafkaSource reads a Kafka topic. Kafka partition i of the topic feeds
// source partition i (one to one), so the source's parallelism is its
// partition count and each source task reads one Kafka partition in offset
// order: the stream is a function of the topic's contents, identical on
// every replica.
type KafkaSource struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string `yaml:"brokers" json:"brokers"`
	Topic   string   `yaml:"topic" json:"topic"`
	// Partitions is how many partitions of the topic are read: 0..N-1
	// (default 1). It is the source's parallelism.
	Partitions int `yaml:"partitions,omitempty" json:"partitions,omitempty"`
	// Start is where a source task without a snapshot starts reading each
	// partition: "earliest" (default), "latest", or an offset.
	Start string `yaml:"start,omitempty" json:"start,omitempty"`
	// Format of the record values: "json" (default, the only one), one
	// object per record with exactly the schema's fields, as ingest lines.
	Format string `yaml:"format,omitempty" json:"format,omitempty"`
}

// KafkaSink writes a sink's results to a Kafka topic with a
// transactional producer (see docs/QUERY.md).
type KafkaSink struct {
	Brokers []string `yaml:"brokers" json:"brokers"`
	Topic   string   `yaml:"topic" json:"topic"`
	// Key lists the result fields that form each record's key. Unset:
	// the group_by fields of the aggregate the sink reads (through
	// filters), when the sink's schema has them; otherwise no key.
	Key []string `yaml:"key,omitempty" json:"key,omitempty"`
	// Format of the record values: "json" (default, the only one).
	Format string `yaml:"format,omitempty" json:"format,omitempty"`
}

// Kafka settings' values.
const (
	KafkaStartEarliest = "earliest"
	KafkaStartLatest   = "latest"
	KafkaFormatJSON    = "json"
)

// KafkaStartOffset parses a validated Start: earliest/latest, or offset
// (ok with earliest and latest false).
func KafkaStartOffset(start string) (earliest, latest bool, offset int64, err error) {
	switch start {
	case "", KafkaStartEarliest:
		return true, false, 0, nil
	case KafkaStartLatest:
		return false, true, 0, nil
	}
	off, perr := strconv.ParseInt(start, 10, 64)
	if perr != nil || off < 0 {
		return false, false, 0, fmt.Errorf("%q is not earliest, latest or an offset >= 0", start)
	}
	return false, false, off, nil
}

func (k *KafkaSource) applyDefaults() {
	if k.Partitions == 0 {
		k.Partitions = 1
	}
	if k.Start == "" {
		k.Start = KafkaStartEarliest
	}
	if k.Format == "" {
		k.Format = KafkaFormatJSON
	}
}

func (k *KafkaSink) applyDefaults() {
	if k.Format == "" {
		k.Format = KafkaFormatJSON
	}
}

// checkKafkaCommon checks brokers, topic and format.
func (a *analysis) checkKafkaCommon(p path, brokers []string, topic, format string) {
	ps := a.ps
	if len(brokers) == 0 {
		ps.add(p.field("brokers"), "required: at least one broker address (host:port)")
	}
	for i, b := range brokers {
		host, port, err := net.SplitHostPort(b)
		if err != nil || host == "" || port == "" {
			ps.add(p.field("brokers").elem(i, ""), "%q is not a broker address (want host:port)", b)
			continue
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			ps.add(p.field("brokers").elem(i, ""), "%q: port %q is not a number in 1..65535", b, port)
		}
	}
	switch {
	case topic == "":
		ps.add(p.field("topic"), "required: the Kafka topic")
	case !validTopic(topic):
		ps.add(p.field("topic"), "%q is not a valid Kafka topic name (want 1..249 of letters, digits, '.', '_' and '-', not \".\" or \"..\")", topic)
	}
	if format != KafkaFormatJSON {
		ps.add(p.field("format"), "unknown format %q (want json)", format)
	}
}

// validTopic applies Kafka's rule for topic names.
func validTopic(s string) bool {
	if s == "" || len(s) > 249 || s == "." || s == ".." {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// checkKafkaSource checks a kafka source (its schema is checked with the
// other sources').
func (a *analysis) checkKafkaSource(n *gnode, parallelismSet bool) {
	k, ps := n.src.Kafka, a.ps
	kp := n.path.field("kafka")
	a.checkKafkaCommon(kp, k.Brokers, k.Topic, k.Format)
	if k.Partitions < 1 || k.Partitions > MaxParallelism {
		ps.add(kp.field("partitions"), "%d is out of range (want 1..%d: Kafka partitions 0..N-1 are read, one per source partition)", k.Partitions, MaxParallelism)
	}
	if parallelismSet && n.src.Parallelism != k.Partitions {
		ps.add(n.path.field("parallelism"), "%d differs from kafka.partitions %d: a kafka source has one partition per Kafka partition (omit parallelism)", n.src.Parallelism, k.Partitions)
	}
	_, latest, _, err := KafkaStartOffset(k.Start)
	switch {
	case err != nil:
		ps.add(kp.field("start"), "%v", err)
	case latest && a.q.Replicas > 1:
		ps.add(kp.field("start"), "latest with replicas: %d: each replica would resolve the end of the topic at its own start and the replicas would differ; use earliest or an offset", a.q.Replicas)
	}
}

// checkKafkaSink checks a kafka sink's settings; its key needs the sink's
// schema (see checkKafkaSinkKey).
func (a *analysis) checkKafkaSink(n *gnode) {
	k := n.sink.Kafka
	a.checkKafkaCommon(n.path.field("kafka"), k.Brokers, k.Topic, k.Format)
	if i := firstDuplicate(k.Key); i >= 0 {
		a.ps.add(n.path.field("kafka").field("key").elem(i, ""), "field %q is listed twice", k.Key[i])
	}
}

// checkKafkaSinkKeys resolves and checks the key fields of every kafka
// sink against its schema, once schemas are known.
func (a *analysis) checkKafkaSinkKeys() {
	for _, n := range a.topo {
		if n.kind != KindSink || n.sink.Kafka == nil {
			continue
		}
		k := n.sink.Kafka
		schema := a.schemas[n.name]
		if schema == nil {
			continue
		}
		if k.Key == nil {
			k.Key = a.defaultKafkaKey(n)
			continue
		}
		for i, f := range k.Key {
			if schema.Index(f) < 0 {
				a.ps.add(n.path.field("kafka").field("key").elem(i, ""), "unknown field %q (sink %s has: %s)", f, n.name, fieldList(schema))
			}
		}
	}
}

// defaultKafkaKey is the group key of the aggregate a sink reads, through
// any filters (which keep their input's schema): its group_by fields, or
// an empty key when there is no such aggregate or it has no group_by.
func (a *analysis) defaultKafkaKey(n *gnode) []string {
	schema := a.schemas[n.name]
	cur := n
	for len(cur.inputs) == 1 && cur.inputs[0].ok {
		up := a.nodes[cur.inputs[0].name]
		if up == nil || up.op == nil {
			break
		}
		switch up.op.Type {
		case OpFilter:
			cur = up
			continue
		case OpAggregate:
			for _, g := range up.op.GroupBy {
				if schema.Index(g) < 0 {
					return []string{}
				}
			}
			return append([]string{}, up.op.GroupBy...)
		}
		break
	}
	return []string{}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
