// Package opshttp is the operations HTTP server every fedstream process
// can run (--http-addr): Prometheus metrics at /metrics, liveness at
// /healthz and readiness at /readyz. Other parts of the process mount
// their own handlers on it with Handle; "/" is left free for them (the
// coordinator's web view).
package opshttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc says whether the process is ready to serve, and if not, why.
// It must not block for long: /readyz calls it on every request.
type ReadyFunc func() (ready bool, why string)

// Server is one process's operations HTTP server. Its zero value is not
// usable: build it with New. Handle may be called before or after Start.
type Server struct {
	mux      *http.ServeMux
	registry *prometheus.Registry
	logger   *slog.Logger

	readyMu sync.Mutex
	ready   ReadyFunc

	mu  sync.Mutex
	lis net.Listener
	srv *http.Server
	// done closes when Serve returned (after Close).
	done chan struct{}
}

// New returns a server with its own Prometheus registry (never the global
// default one: several processes may share one Go process in `fedstream
// dev` and in tests). The registry starts with the Go runtime and process
// collectors; register the process's own collectors on Registry().
func New(logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{mux: http.NewServeMux(), registry: reg, logger: logger}
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slogPrinter{logger},
		ErrorHandling: promhttp.ContinueOnError,
	}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	s.mux.HandleFunc("GET /readyz", s.serveReady)
	return s
}

// Registry is the process's Prometheus registry, served at /metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// SetReady installs the readiness check /readyz answers with (until one
// is installed, /readyz answers 503 "starting").
func (s *Server) SetReady(f ReadyFunc) {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	s.ready = f
}

// Handle mounts h on pattern (net/http.ServeMux patterns, e.g. "/" or
// "GET /api/"). /metrics, /healthz and /readyz are taken; a more general
// pattern such as "/" receives every other path. Safe to call while the
// server runs. It panics, as ServeMux does, on a pattern that conflicts
// with one already mounted.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler is everything the server serves (tests use it without a port).
func (s *Server) Handler() http.Handler { return s.mux }

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	s.readyMu.Lock()
	f := s.ready
	s.readyMu.Unlock()
	ok, why := false, "starting"
	if f != nil {
		ok, why = f()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready:", why)
		return
	}
	fmt.Fprintln(w, "ready")
}

// Start listens on addr (host:port; port 0 picks a free one) and serves
// in the background until Close.
func (s *Server) Start(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http listen on %s: %w", addr, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		lis.Close()
		return errors.New("opshttp: server already started")
	}
	s.lis = lis
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// Addr is the address the server listens on ("" before Start).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return ""
	}
	return s.lis.Addr().String()
}

// Close stops the server: it waits up to ctx for requests in flight, then
// closes what remains. Safe to call more than once and before Start.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	srv, done := s.srv, s.done
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, srv.Close())
	}
	<-done
	return err
}

// slogPrinter lets promhttp report errors of a scrape through slog.
type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.l.Warn("metrics scrape", "err", fmt.Sprint(v...)) }
