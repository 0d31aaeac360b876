package queryspec

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// kafkaBase is a valid query with a kafka source and a kafka sink that
// the cases below break one way each.
const kafkaBase = `
name: k
sources:
  - name: events
    schema: {time: timestamp, user: string, amount: int}
    kafka:
      brokers: [127.0.0.1:9092]
      topic: events
      partitions: 2
operators:
  - name: per_user
    type: aggregate
    input: events
    window: {size: 1m}
    group_by: [user]
    aggregates: {n: "count()"}
  - {name: big, type: filter, input: per_user, where: "n > 2"}
sinks:
  - name: out
    input: big
    kafka:
      brokers: [127.0.0.1:9092]
      topic: results
`

func TestKafkaSettings(t *testing.T) {
	q, err := Parse("k.yaml", []byte(kafkaBase))
	if err != nil {
		t.Fatal(err)
	}
	src := q.Sources[0]
	if src.Parallelism != 2 || src.Kafka.Start != KafkaStartEarliest || src.Kafka.Format != KafkaFormatJSON {
		t.Fatalf("defaults: parallelism %d, start %q, format %q", src.Parallelism, src.Kafka.Start, src.Kafka.Format)
	}
	// The sink's key defaults to the group key of the aggregate it
	// reads, through the filter.
	if k := q.Sinks[0].Kafka.Key; !slices.Equal(k, []string{"user"}) {
		t.Fatalf("default key %v, want [user]", k)
	}
	b, err := q.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := FromJSON(b)
	if err != nil {
		t.Fatalf("stored form does not read back: %v\n%s", err, b)
	}
	b2, _ := json.Marshal(back)
	b1, _ := json.Marshal(q)
	if string(b1) != string(b2) {
		t.Fatalf("stored form changes on a round trip:\n%s\n%s", b1, b2)
	}

	cases := []struct {
		name     string
		from, to string
		want     string
	}{
		{"no brokers", "      brokers: [127.0.0.1:9092]\n      topic: events", "      topic: events", "k.yaml: line 6: sources[0] (events).kafka.brokers: required"},
		{"bad broker", "brokers: [127.0.0.1:9092]\n      topic: events", "brokers: [kafka]\n      topic: events", `line 7: sources[0] (events).kafka.brokers[0]: "kafka" is not a broker address (want host:port)`},
		{"bad port", "brokers: [127.0.0.1:9092]\n      topic: events", "brokers: [\"h:0\"]\n      topic: events", `sources[0] (events).kafka.brokers[0]: "h:0": port "0"`},
		{"no topic", "      topic: events\n", "", "sources[0] (events).kafka.topic: required"},
		{"bad topic", "topic: events", "topic: ev/ents", `line 8: sources[0] (events).kafka.topic: "ev/ents" is not a valid Kafka topic name`},
		{"partitions", "partitions: 2", "partitions: 65", "line 9: sources[0] (events).kafka.partitions: 65 is out of range (want 1..64"},
		{"bad start", "partitions: 2", "partitions: 2\n      start: yesterday", `line 10: sources[0] (events).kafka.start: "yesterday" is not earliest, latest or an offset >= 0`},
		{"negative start", "partitions: 2", "partitions: 2\n      start: -3", `sources[0] (events).kafka.start: "-3" is not earliest`},
		{"latest replicated", "name: k\n", "name: k\nreplicas: 2\n", "sources[0] (events).kafka.start: latest with replicas: 2"},
		{"format", "partitions: 2", "partitions: 2\n      format: avro", `line 10: sources[0] (events).kafka.format: unknown format "avro" (want json)`},
		{"parallelism", "partitions: 2", "partitions: 2\n    parallelism: 3", "line 10: sources[0] (events).parallelism: 3 differs from kafka.partitions 2"},
		{"typo", "partitions: 2", "partitons: 2", `line 9: sources[0] (events).kafka.partitons: unknown field "partitons" (want one of: brokers, format, partitions, start, topic)`},
		{"with generator", "    kafka:\n      brokers: [127.0.0.1:9092]\n      topic: events", "    generator: {kind: words}\n    kafka:\n      brokers: [127.0.0.1:9092]\n      topic: events", "sources[0] (events): set exactly one of generator, ingest and kafka"},
		{"sink key", "      topic: results", "      topic: results\n      key: [usr]", `line 24: sinks[0] (out).kafka.key[0]: unknown field "usr" (sink out has: user, n, window_end)`},
		{"sink key twice", "      topic: results", "      topic: results\n      key: [user, user]", `sinks[0] (out).kafka.key[1]: field "user" is listed twice`},
		{"sink topic", "      topic: results", "", "sinks[0] (out).kafka.topic: required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := kafkaBase
			if c.name == "latest replicated" {
				src = strings.Replace(src, "partitions: 2", "partitions: 2\n      start: latest", 1)
			}
			if !strings.Contains(src, c.from) {
				t.Fatalf("case edits %q, which the query lacks", c.from)
			}
			_, err := Parse("k.yaml", []byte(strings.Replace(src, c.from, c.to, 1)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, c.want)
			}
			// One problem, one error (a generator has its own schema too).
			if n := strings.Count(err.Error(), "\n") + 1; n != 1 && c.name != "with generator" {
				t.Fatalf("%d errors for one problem:\n%v", n, err)
			}
		})
	}
}

// TestKafkaOffsetStart accepts an explicit offset, and latest with one
// replica.
func TestKafkaOffsetStart(t *testing.T) {
	for _, start := range []string{"1234", "latest", "earliest"} {
		q, err := Parse("k.yaml", []byte(strings.Replace(kafkaBase, "partitions: 2", "partitions: 2\n      start: "+start, 1)))
		if err != nil {
			t.Fatalf("start %s: %v", start, err)
		}
		e, l, off, err := KafkaStartOffset(q.Sources[0].Kafka.Start)
		if err != nil || e != (start == "earliest") || l != (start == "latest") || (start == "1234") != (off == 1234) {
			t.Fatalf("start %s: earliest %v latest %v offset %d err %v", start, e, l, off, err)
		}
	}
}
