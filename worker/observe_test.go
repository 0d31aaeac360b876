package worker

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// TestWorkerNotReadyUntilRegistered: a worker whose coordinators cannot
// be reached is alive (/healthz) but not ready (/readyz 503, saying why),
// and its data plane's health service says NOT_SERVING.
func TestWorkerNotReadyUntilRegistered(t *testing.T) {
	w, err := New(Config{Org: "acme", Name: "w", Coordinators: []string{"127.0.0.1:1"}, InsecurePlaintext: true, HTTPAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var base string
	deadline := time.Now().Add(10 * time.Second)
	for base == "" {
		if addr := w.HTTPAddr(); addr != "" {
			base = "http://" + addr
		} else if time.Now().After(deadline) {
			t.Fatal("HTTP server never started")
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not registered") {
		t.Errorf("/readyz of an unregistered worker: %d %q", code, body)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "fedstream_worker_registered 0") {
		t.Errorf("/metrics of an unregistered worker: %d", code)
	}
	resp, err := w.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health of an unregistered worker: %v %v, want NOT_SERVING", resp, err)
	}
}

// TestTaskStatsReportRates: the heartbeat's figures are rates over the
// interval between two readings, and a restarted task (another
// generation, counters back to zero) reports no rate rather than a
// negative or huge one.
func TestTaskStatsReportRates(t *testing.T) {
	a := wrt.TaskStats{TaskID: "q/f/p0/r0", Generation: 1, InTuples: 100, OutTuples: 50, BusyNanos: 1e8, BlockedNanos: 2e8}
	b := a
	b.InTuples, b.OutTuples, b.BusyNanos, b.BlockedNanos = 300, 150, 6e8, 4e8
	if !rateable(a, b) {
		t.Fatal("two readings of one copy not rateable")
	}
	c := b
	c.Generation, c.InTuples = 2, 10
	if rateable(b, c) {
		t.Fatal("readings of two generations taken as one copy")
	}
	w := &sensors{last: map[string]statsReading{a.TaskID: {s: a, at: time.Unix(100, 0)}}}
	got := w.rates("w-1", []wrt.TaskStats{b}, time.Unix(102, 0))
	if len(got) != 1 {
		t.Fatalf("report: %v", got)
	}
	r := got[0]
	if r.InTps != 100 || r.OutTps != 50 || r.Busy != 0.25 || r.BackpressureMsPerS != 100 || r.Worker != "w-1" || r.WindowMs != 2000 {
		t.Fatalf("rates %v, want 100 in/s, 50 out/s, busy 0.25, 100 ms/s blocked", r)
	}
	got = w.rates("w-1", []wrt.TaskStats{c}, time.Unix(104, 0))
	if len(got) != 0 {
		t.Fatalf("restarted task: %v, want no window yet", got)
	}
}
