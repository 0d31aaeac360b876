// Package browsertest starts a headless chromium for tests of the web
// view and watches its console. It is used by tests only.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
)

// DefaultChromium is where Debian's chromium package puts the browser.
const DefaultChromium = "/usr/bin/chromium"

// Path is the chromium the tests drive: FEDSTREAM_CHROMIUM, or Debian's. A
// missing browser fails the test, with how to install it: a browser test
// that skipped silently would pass on every machine without one.
func Path(t testing.TB) string {
	t.Helper()
	p := os.Getenv("FEDSTREAM_CHROMIUM")
	if p == "" {
		p = DefaultChromium
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the web view's browser tests need a headless chromium at %s: install it (apt-get install -y chromium; .ci/run does) or set FEDSTREAM_CHROMIUM: %v", p, err)
	}
	return p
}

// Tab is one page of a fresh headless chromium, with its console watched
// from before the first navigation.
type Tab struct {
	// Ctx is the chromedp context of the tab: pass it to chromedp.Run.
	Ctx context.Context

	mu     sync.Mutex
	errors []chromedp.ConsoleMessage
}

// Start launches chromium with a new empty profile, closed to the network
// beyond what the test asks for (no background traffic, updates or sync:
// on a machine without network these make chromium fail), and opens a tab.
// The browser stops when ctx ends or the test ends.
func Start(t testing.TB, ctx context.Context, width, height int) *Tab {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(Path(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	)
	tabCtx, cancelTab := chromedp.NewContext(alloc)
	tab := &Tab{Ctx: tabCtx}
	// The first Run starts the browser; it lives as long as tabCtx.
	if err := chromedp.Do(tabCtx); err != nil {
		cancelTab()
		cancelAlloc()
		t.Fatalf("start chromium (%s): %v", Path(t), err)
	}
	consoleCtx, stopConsole := context.WithCancel(tabCtx)
	messages := chromedp.Console(consoleCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				tab.mu.Lock()
				tab.errors = append(tab.errors, m)
				tab.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		stopConsole()
		<-done
		cancelTab()
		cancelAlloc()
	})
	return tab
}

// CheckConsole fails the test if the page wrote an error to the console or
// threw an exception nothing caught, except messages that ignore accepts
// (the browser's own log entry for an answer the test expects, say).
func (tab *Tab) CheckConsole(t testing.TB, ignore ...func(chromedp.ConsoleMessage) bool) {
	t.Helper()
	tab.mu.Lock()
	defer tab.mu.Unlock()
	var bad []string
next:
	for _, m := range tab.errors {
		for _, ig := range ignore {
			if ig(m) {
				continue next
			}
		}
		bad = append(bad, fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line))
	}
	if len(bad) > 0 {
		t.Errorf("the page wrote errors to the console:\n%s", strings.Join(bad, "\n"))
	}
}
