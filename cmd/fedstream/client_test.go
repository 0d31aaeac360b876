package main

import (
	"testing"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestQueryJSONReason: query status --json gives each task's state and
// reason (message kept for older scripts).
func TestQueryJSONReason(t *testing.T) {
	q := queryJSON(&pb.QueryInfo{Name: "q", Tasks: []*pb.TaskInfo{{TaskId: "q/a/p0/r0", State: "stalled", Message: "output blocked 30s"}}})
	task := q["tasks"].([]map[string]any)[0]
	if task["state"] != "stalled" || task["reason"] != "output blocked 30s" || task["message"] != "output blocked 30s" {
		t.Fatalf("task JSON %v", task)
	}
}
