// Package kafkatest runs an in-process Kafka (franz-go's kfake, on
// loopback) for tests of kafka sources and sinks, and reads and writes
// its topics.
package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Start runs a one-broker Kafka with the given topics (name -> partition
// count) until the test ends, and returns its address.
func Start(t testing.TB, topics map[string]int32) string {
	t.Helper()
	var opts []kfake.Opt
	for name, parts := range topics {
		opts = append(opts, kfake.SeedTopics(parts, name))
	}
	c, err := kfake.NewCluster(append(opts, kfake.NumBrokers(1))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()[0]
}

// Produce writes values to one partition of topic, in order. It returns
// the error instead of failing the test, so that it can run on another
// goroutine.
func Produce(broker, topic string, partition int32, values [][]byte) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Partition: partition, Value: v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// Record is one committed record read back.
type Record struct {
	Partition  int32
	Offset     int64
	Key, Value []byte
	Headers    map[string]string
}

// ReadCommitted reads every committed record of topic (read_committed:
// records of aborted transactions are not returned), every partition
// to its last stable offset.
func ReadCommitted(t testing.TB, broker, topic string) []Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	// Control records (transaction markers) are read too, so that the
	// last offset below the end is always seen.
	remaining := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			remaining[o.Partition] = o.Offset
		}
	})
	var out []Record
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v (partitions not read to their end: %v)", topic, ctx.Err(), remaining)
		}
		fs.EachRecord(func(r *kgo.Record) {
			end := ends[topic][r.Partition].Offset
			if r.Offset >= end-1 {
				delete(remaining, r.Partition)
			}
			if r.Offset >= end || r.Attrs.IsControl() {
				return
			}
			rec := Record{Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Headers: map[string]string{}}
			for _, h := range r.Headers {
				rec.Headers[h.Key] = string(h.Value)
			}
			out = append(out, rec)
		})
	}
	return out
}
