package main

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/tuple"
)

// tail moves to a sink copy that went tentative before the copy it read:
// it took stable ids up to 33 (the last at 30 ms) from the other copy;
// this one has 11 stable results (1-11 ms), then its tentative results at
// positions 12-27 (11-20 ms, which tail took stable, and 31-35 and 45 ms,
// which it did not). tail resumes by stable id, reads them from their
// start and prints the six past 30 ms, once each, numbered after its last
// stable id. Fails before: resumed after 33 as a position, past the
// copy's whole stream, tail printed nothing for the failure (the wait
// for its six results times out).
func TestTailResumesIntoEarlierTentativeResults(t *testing.T) {
	const ms = int64(time.Millisecond)
	buf := dataplane.NewOutputBuffer(dataplane.BufferOptions{Ring: true})
	pos := uint64(0)
	add := func(typ tuple.Type, at int64) {
		pos++
		if typ != tuple.Stable {
			buf.MarkNonStable(pos, pos)
		}
		tp := tuple.Tuple{Type: typ, ID: pos, STime: at * ms, Values: []tuple.Value{tuple.Int(at)}}
		if err := buf.Append(context.Background(), &tp); err != nil {
			t.Fatal(err)
		}
	}
	for at := int64(1); at <= 11; at++ {
		add(tuple.Stable, at)
	}
	for _, at := range []int64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 31, 32, 33, 34, 35, 45} {
		add(tuple.Tentative, at)
	}
	type line struct {
		typ tuple.Type
		id  uint64
		v   int64
	}
	var got []line
	tl := &tailer{flags: &clientFlags{tls: clientTLS{insecure: true}}, query: "q", count: 6,
		placedElsewhere: func(context.Context, *pb.TaskInfo) (string, error) { return "", nil },
		print: func(tp *tuple.Tuple, _ *tuple.Schema, _ string) error {
			got = append(got, line{tp.Type, tp.ID, tp.Values[0].I})
			return nil
		}}
	tl.lastID, tl.lastSTime, tl.posFrom = 33, 30*ms, "q/out/p0/r0@g1"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	copy1 := &pb.TaskInfo{TaskId: "q/out/p0/r1", Generation: 1, WorkerAddr: serveBuffer(t, buf)}
	if err := tl.follow(ctx, copy1, nil, "out"); !errors.Is(err, errCountReached) {
		t.Fatalf("reading the copy that went tentative earlier: %v after %v, want its six tentative results past 30 ms", err, got)
	}
	want := []line{{tuple.Tentative, 34, 31}, {tuple.Tentative, 35, 32}, {tuple.Tentative, 36, 33},
		{tuple.Tentative, 37, 34}, {tuple.Tentative, 38, 35}, {tuple.Tentative, 39, 45}}
	if !slices.Equal(got, want) {
		t.Fatalf("printed %v, want %v", got, want)
	}
}
