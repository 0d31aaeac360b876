// Package logging sets up the process's one logger (log/slog) and adapts it
// for the hashicorp libraries, which speak hclog (raft) or the standard
// library's *log.Logger (serf, memberlist).
package logging

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// New returns a text (or JSON) slog logger writing to w at the given level
// ("debug", "info", "warn", "error").
func New(w io.Writer, level string, json bool) *slog.Logger {
	var lv slog.LevelVar
	lv.Set(ParseLevel(level))
	return NewLeveled(w, &lv, json)
}

// NewLeveled is New with a level the caller can change while the logger
// is in use.
func NewLeveled(w io.Writer, level *slog.LevelVar, json bool) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if json {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Discard is a logger that drops everything, for tests and benchmarks.
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// ParseLevel maps a level name to a slog.Level; unknown names mean info.
func ParseLevel(s string) slog.Level {
	switch strings.ToLower(s) {
	case "trace", "debug":
		return slog.LevelDebug
	case "warn", "warning":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// StdLogger returns a *log.Logger whose lines become slog records. Lines that
// carry a hashicorp-style "[LEVEL]" prefix keep that level.
func StdLogger(l *slog.Logger, component string) *log.Logger {
	return log.New(&stdWriter{l: l.With("component", component)}, "", 0)
}

type stdWriter struct{ l *slog.Logger }

func (w *stdWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for prefix, lv := range map[string]slog.Level{
		"[TRACE]": slog.LevelDebug - 4, "[DEBUG]": slog.LevelDebug,
		"[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError, "[ERROR]": slog.LevelError,
	} {
		if strings.HasPrefix(msg, prefix) {
			level = lv
			msg = strings.TrimSpace(strings.TrimPrefix(msg, prefix))
			break
		}
	}
	w.l.Log(context.Background(), level, msg)
	return len(p), nil
}

// HCLog adapts l to hclog.Logger for hashicorp/raft.
func HCLog(l *slog.Logger, name string) hclog.Logger {
	return &hcAdapter{l: l.With("component", name), name: name}
}

type hcAdapter struct {
	l       *slog.Logger
	name    string
	implied []interface{}
}

var _ hclog.Logger = (*hcAdapter)(nil)

func toSlog(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (h *hcAdapter) Log(level hclog.Level, msg string, args ...interface{}) {
	lv := toSlog(level)
	if lv >= slog.LevelWarn && mentionsOwnShutdown(args) {
		// raft's transport reports its own connections closing as errors
		// while the node shuts down; that is expected, not a fault.
		lv = slog.LevelDebug
	}
	h.l.Log(context.Background(), lv, msg, normalise(args)...)
}

// mentionsOwnShutdown reports whether an hclog argument is raft's
// "transport shutdown" error (matched by text: this package does not
// depend on raft).
func mentionsOwnShutdown(args []interface{}) bool {
	for _, a := range args {
		if err, ok := a.(error); ok && err.Error() == "transport shutdown" {
			return true
		}
	}
	return false
}

// normalise turns hclog key/value pairs into slog arguments; an odd trailing
// value is kept under "extra" rather than dropped.
func normalise(args []interface{}) []any {
	out := make([]any, 0, len(args)+1)
	for i := 0; i < len(args); i += 2 {
		if i+1 >= len(args) {
			out = append(out, "extra", args[i])
			break
		}
		out = append(out, fmt.Sprint(args[i]), args[i+1])
	}
	return out
}

func (h *hcAdapter) Trace(msg string, args ...interface{}) { h.Log(hclog.Trace, msg, args...) }
func (h *hcAdapter) Debug(msg string, args ...interface{}) { h.Log(hclog.Debug, msg, args...) }
func (h *hcAdapter) Info(msg string, args ...interface{})  { h.Log(hclog.Info, msg, args...) }
func (h *hcAdapter) Warn(msg string, args ...interface{})  { h.Log(hclog.Warn, msg, args...) }
func (h *hcAdapter) Error(msg string, args ...interface{}) { h.Log(hclog.Error, msg, args...) }

func (h *hcAdapter) enabled(l slog.Level) bool { return h.l.Enabled(context.Background(), l) }
func (h *hcAdapter) IsTrace() bool             { return h.enabled(slog.LevelDebug - 4) }
func (h *hcAdapter) IsDebug() bool             { return h.enabled(slog.LevelDebug) }
func (h *hcAdapter) IsInfo() bool              { return h.enabled(slog.LevelInfo) }
func (h *hcAdapter) IsWarn() bool              { return h.enabled(slog.LevelWarn) }
func (h *hcAdapter) IsError() bool             { return h.enabled(slog.LevelError) }

func (h *hcAdapter) ImpliedArgs() []interface{} { return h.implied }
func (h *hcAdapter) With(args ...interface{}) hclog.Logger {
	return &hcAdapter{l: h.l.With(normalise(args)...), name: h.name, implied: append(append([]interface{}{}, h.implied...), args...)}
}
func (h *hcAdapter) Name() string { return h.name }
func (h *hcAdapter) Named(name string) hclog.Logger {
	n := name
	if h.name != "" {
		n = h.name + "." + name
	}
	return &hcAdapter{l: h.l.With("sub", name), name: n, implied: h.implied}
}
func (h *hcAdapter) ResetNamed(name string) hclog.Logger {
	return &hcAdapter{l: h.l, name: name, implied: h.implied}
}

// SetLevel is a no-op: the slog handler owns the level.
func (h *hcAdapter) SetLevel(hclog.Level) {}
func (h *hcAdapter) GetLevel() hclog.Level {
	switch {
	case h.IsTrace():
		return hclog.Trace
	case h.IsDebug():
		return hclog.Debug
	case h.IsInfo():
		return hclog.Info
	case h.IsWarn():
		return hclog.Warn
	}
	return hclog.Error
}
func (h *hcAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return StdLogger(h.l, h.name)
}
func (h *hcAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return &stdWriter{l: h.l}
}

// Stderr is the default process logger.
func Stderr(level string) *slog.Logger { return New(os.Stderr, level, false) }
