package main

import (
	"strings"
	"testing"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func TestPlural(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{{0, "0 partitions"}, {1, "1 partition"}, {2, "2 partitions"}, {-1, "-1 partition"}} {
		if got := plural(tc.n, "partition", "partitions"); got != tc.want {
			t.Errorf("plural(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// TestScaleTextSingular: `query scale` down to 1 partition says "1
// partition" (it said "1 partitions").
func TestScaleTextSingular(t *testing.T) {
	var b strings.Builder
	writeSlotMap(&b, &pb.ScaleQueryResponse{Query: "wc", Fragment: "count", Partitions: 1, Epoch: 3,
		Ranges: []*pb.SlotRange{{First: 0, Last: 4095, Partition: 0}}})
	if want := "wc/count: 1 partition, slot map epoch 3\n  partition 0: 0-4095\n"; b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	writeSlotMap(&b, &pb.ScaleQueryResponse{Query: "wc", Fragment: "count", Partitions: 2, Epoch: 4,
		Ranges: []*pb.SlotRange{{First: 0, Last: 2047, Partition: 0}, {First: 2048, Last: 4095, Partition: 1}}})
	if want := "wc/count: 2 partitions, slot map epoch 4\n  partition 0: 0-2047\n  partition 1: 2048-4095\n"; b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
}
