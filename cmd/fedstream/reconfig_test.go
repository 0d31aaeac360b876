package main

import (
	"strings"
	"testing"

	"github.com/fedstream/fedstream/worker/tuple"
)

// TestResultJSONVersion: a result's version tag is printed only when set,
// so tail's output for queries never reconfigured stays as it was.
func TestResultJSONVersion(t *testing.T) {
	tp := &tuple.Tuple{Type: tuple.Stable, ID: 7, STime: 0, Values: []tuple.Value{tuple.Int(1)}}
	line, err := resultJSON(tp, nil, "out")
	if err != nil || strings.Contains(string(line), "version") {
		t.Fatalf("untagged result: %s %v", line, err)
	}
	tp.Version = 2
	line, err = resultJSON(tp, nil, "out")
	if err != nil || !strings.Contains(string(line), `"stime":"1970-01-01T00:00:00Z","version":2,"values"`) {
		t.Fatalf("tagged result: %s %v", line, err)
	}
}
