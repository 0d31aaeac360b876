package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestQueryStatsOutput: the --json shape the README documents, and a
// table that marks a task not reported yet.
func TestQueryStatsOutput(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	resp := &pb.QueryStatsResponse{Query: "q", Tasks: []*pb.TaskStats{
		{Task: "q/a/p0/r0", Worker: "w-1", InTps: 10, OutTps: 5, Busy: 0.5, Queue: 3, BackpressureMsPerS: 7, OutputBufferBytes: 2048, ReportedAtMs: now.UnixMilli() - 1500},
		{Task: "q/b/p0/r0", Worker: "w-2"},
	}}
	var buf bytes.Buffer
	if err := printJSON(&buf, queryStatsJSON(resp)); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Query string           `json:"query"`
		Tasks []map[string]any `json:"tasks"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Query != "q" || len(got.Tasks) != 2 {
		t.Fatalf("json: %s", buf.String())
	}
	for _, k := range []string{"task", "worker", "in_tps", "out_tps", "busy", "queue", "backpressure_ms_per_s"} {
		if _, ok := got.Tasks[0][k]; !ok {
			t.Errorf("task object lacks %q: %v", k, got.Tasks[0])
		}
	}
	if got.Tasks[0]["in_tps"] != 10.0 || got.Tasks[0]["worker"] != "w-1" {
		t.Errorf("task values: %v", got.Tasks[0])
	}
	buf.Reset()
	if err := printQueryStats(&buf, resp, now); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "2.0 KiB") || !strings.Contains(out, "50%") || !strings.Contains(out, "1.5s") || !strings.Contains(out, "not reported yet") {
		t.Errorf("table:\n%s", out)
	}
}
