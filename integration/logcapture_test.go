package integration

import (
	"log/slog"
	"strings"
	"testing"
)

// logCapture keeps what the coordinators and workers of a test log, and
// prints the lines worth reading when the test fails: what the
// coordinator did to the query (a worker declared down, tasks placed
// again, rescales) and what the data plane discarded. A failure under
// load is rarely reproduced on demand; its log is the evidence.
type logCapture struct{ lockedBuffer }

// newLogCapture returns a capture whose lines t logs at its end if it
// failed.
func newLogCapture(t *testing.T) *logCapture {
	c := &logCapture{}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		n := 0
		for _, line := range strings.Split(c.String(), "\n") {
			if logWorthReading(line) {
				if n++; n > 400 {
					t.Log("log: (more lines left off)")
					return
				}
				t.Log("log: " + line)
			}
		}
	})
	return c
}

// logger returns a logger writing to c with the attribute who.
func (c *logCapture) logger(who string) *slog.Logger {
	return slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{Level: slog.LevelInfo})).With("who", who)
}

// logWorthReading: warnings and errors, and what the coordinator did to
// tasks.
func logWorthReading(line string) bool {
	if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
		return true
	}
	for _, s := range []string{"down", "unreachable", "re-place", "replace", "placed", "rescale", "rebalance", "restart", "overrun", "lease", "gap", "lossy", "snapshot"} {
		if strings.Contains(strings.ToLower(line), s) {
			return true
		}
	}
	return false
}
