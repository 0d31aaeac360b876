package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/fedstream/fedstream/coordinator/webui"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestQueryJSONReason: query status --json gives each task's state and
// reason (message kept for older scripts), in the web API's document.
func TestQueryJSONReason(t *testing.T) {
	var buf bytes.Buffer
	if err := printJSON(&buf, webui.QueryView(&pb.QueryInfo{Name: "q", Tasks: []*pb.TaskInfo{{TaskId: "q/a/p0/r0", State: "stalled", Message: "output blocked 30s"}}})); err != nil {
		t.Fatal(err)
	}
	var q struct {
		Tasks []map[string]any `json:"tasks"`
	}
	if err := json.Unmarshal(buf.Bytes(), &q); err != nil {
		t.Fatal(err)
	}
	task := q.Tasks[0]
	if task["id"] != "q/a/p0/r0" || task["state"] != "stalled" || task["reason"] != "output blocked 30s" || task["message"] != "output blocked 30s" {
		t.Fatalf("task JSON %v", task)
	}
}
