package main

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/worker/dataplane"
)

// Lines of any length are read one by one; a line over the limit is
// skipped, reported by its length, and does not end the input (the
// scanner used to fail the whole ingest at a line over 16 MiB).
func TestLineReader(t *testing.T) {
	long := strings.Repeat("x", 300)
	in := "a\n" + long + "\n\nb\r\nlast"
	lr := newLineReader(strings.NewReader(in), 100)
	type got struct {
		line string
		size int
	}
	var all []got
	for {
		line, size, err := lr.next()
		if err != nil {
			break
		}
		all = append(all, got{string(line), size})
	}
	want := []got{{"a", 1}, {"", 300}, {"", 0}, {"b\r", 2}, {"last", 4}}
	if len(all) != len(want) {
		t.Fatalf("lines %v, want %v", all, want)
	}
	for i := range want {
		if all[i] != want[i] {
			t.Errorf("line %d = %v, want %v", i+1, all[i], want[i])
		}
	}
	msg := tooLongLine(2, 20<<20)
	for _, w := range []string{"line 2:", "20.0 MiB", "at most 16.0 MiB", "receive limit"} {
		if !strings.Contains(msg, w) {
			t.Errorf("%q does not say %q", msg, w)
		}
	}
}

// Batches are cut by bytes too: the largest request (a full batch, or one
// line of the longest accepted length) stays under the worker's limit
// with room for the request's other fields.
func TestIngestBatchUnderLimit(t *testing.T) {
	if largest := max(ingestBatchBytes, ingestMaxLine+1); largest+32<<10 > dataplane.MaxMessageBytes {
		t.Fatalf("a request may carry %d bytes of lines; the worker accepts %d per message", largest, dataplane.MaxMessageBytes)
	}
}

// A gRPC size refusal is explained: which limit, and what to do.
func TestDescribeMessageTooLarge(t *testing.T) {
	err := status.Error(codes.ResourceExhausted, "grpc: received message larger than max (20971520 vs. 16777216)")
	msg := describe(fmt.Errorf("ingest at 127.0.0.1:1: %w", err))
	for _, w := range []string{"20971520 vs. 16777216", "size limit", "workers 16 MiB", "send less per call"} {
		if !strings.Contains(msg, w) {
			t.Errorf("%q does not say %q", msg, w)
		}
	}
	if got := describe(explainIngestError(err)); strings.Count(got, "limit") != strings.Count(explainIngestError(err).Error(), "limit") {
		t.Errorf("explained twice: %q", got)
	}
}
