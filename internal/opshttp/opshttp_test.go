package opshttp

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestServer: /healthz answers at once, /readyz follows the installed
// check (503 until there is one), /metrics serves the server's own
// registry in lint-free text, and a handler mounted at "/" gets every
// other path without taking the fixed ones.
func TestServer(t *testing.T) {
	s := New(nil)
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "fedstream_test_things_total", Help: "Things."})
	s.Registry().MustRegister(c)
	c.Add(3)
	s.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "view "+r.URL.Path) }))
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr()
	if code, body := get(t, base+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "starting") {
		t.Errorf("/readyz before a check is installed: %d %q", code, body)
	}
	var ready atomic.Bool
	why := "waiting for the moon"
	s.SetReady(func() (bool, string) { return ready.Load(), why })
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, why) {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz ready: %d", code)
	}
	code, body := get(t, base+"/metrics")
	if code != 200 || !strings.Contains(body, "fedstream_test_things_total 3") || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	if code, body := get(t, base+"/api/queries"); code != 200 || body != "view /api/queries" {
		t.Errorf("mounted handler: %d %q", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("server still answers after Close")
	}
}
