package integration

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fedstream/fedstream/config/logging"
)

var testLogSeq atomic.Int64

// testLogger is logging.Discard unless FEDSTREAM_TEST_LOG names a
// directory: then component's records (info and above) go to a file there
// named after the test, kept after the test for diagnosing rare failures
// (the org's coordinators and the live reconfiguration and move tests'
// workers log through it).
func testLogger(t *testing.T, component string) *slog.Logger {
	dir := os.Getenv("FEDSTREAM_TEST_LOG")
	if dir == "" {
		return logging.Discard()
	}
	name := fmt.Sprintf("%s-%d-%s.log", strings.ReplaceAll(t.Name(), "/", "_"), testLogSeq.Add(1), component)
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return logging.New(f, "info", false).With("component", component)
}

// testSwitchMarginMs is the switch margin the live reconfiguration tests
// give their plans: 5 ms, shorter than a plan takes to switch on a
// loaded machine, so that source replicas regularly reach the lowest
// cut a plan can get before they learn it and hold there (the path that
// keeps replicas switching at the same stime). FEDSTREAM_TEST_SWITCH_MARGIN_MS
// sets another (a long one, 300, keeps the sources from ever holding).
func testSwitchMarginMs() int64 {
	if v, err := strconv.ParseInt(os.Getenv("FEDSTREAM_TEST_SWITCH_MARGIN_MS"), 10, 64); err == nil {
		return v
	}
	return 5
}
