package webui

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/internal/browsertest"
)

// In an org with tokens the page says a token is needed, takes one from its
// field, keeps it in the tab's session storage and sends it with every API
// call, and never shows it. A query listed but gone by the time its details
// are read is left out, not reported as a failure.
func TestPageTakesATokenInBrowser(t *testing.T) {
	const secret = "fst_s3cret-for-the-page"
	src := newFake(t)
	src.requireToken = secret
	src.ghost = "gone"
	srv := httptest.NewServer(Handler(src, nil))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	browser := browsertest.Start(t, ctx, 1200, 900)
	// The browser logs each refused API call (401) and the query listed
	// but not found (404) itself: expected here.
	defer browser.CheckConsole(t, func(m chromedp.ConsoleMessage) bool {
		return m.Source == "network" && (strings.Contains(m.Text, "401") || strings.Contains(m.Text, "404"))
	})
	tab := browser.Ctx

	eval := func(js string) string {
		s, err := chromedp.Run(tab, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return s
	}
	waitUntil := func(what, js string) {
		t.Helper()
		for eval(js) != "yes" {
			select {
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s; notice: %q", what, eval(`document.getElementById('notice').textContent`))
			case <-time.After(100 * time.Millisecond):
			}
		}
	}

	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	waitUntil("the page to ask for a token",
		`(!document.getElementById('notice').hidden && document.getElementById('notice').textContent.includes('requires a token')) ? 'yes' : 'no'`)
	if n := eval(`String(document.querySelectorAll('svg.graph').length)`); n != "0" {
		t.Fatalf("%s graphs drawn without a token", n)
	}

	if err := chromedp.Do(tab, chromedp.SendKeys("#token-input", secret), chromedp.Click("#token-save")); err != nil {
		t.Fatal(err)
	}
	waitUntil("the query's graph with the token",
		`(document.getElementById('notice').hidden && document.querySelectorAll('[data-query="words"] svg.graph g.frag').length === 3) ? 'yes' : 'no'`)

	if got := eval(`sessionStorage.getItem('fedstream.token') || ''`); got != secret {
		t.Errorf("session storage holds %q", got)
	}
	if eval(`document.documentElement.outerHTML.includes('`+secret+`') ? 'yes' : 'no'`) != "no" || eval(`document.getElementById('token-input').value`) != "" {
		t.Error("the token shows in the page")
	}
	src.mu.Lock()
	last := src.tokens[len(src.tokens)-1]
	src.mu.Unlock()
	if last != secret {
		t.Errorf("the API was last called with %q", last)
	}

	// Forgetting it goes back to asking.
	if err := chromedp.Do(tab, chromedp.Click("#token-clear")); err != nil {
		t.Fatal(err)
	}
	waitUntil("the page to ask again", `(!document.getElementById('notice').hidden && sessionStorage.getItem('fedstream.token') === null) ? 'yes' : 'no'`)
}

// A coordinator that reports no per-task figures: the page draws the graph
// and says "no figures" and why, without errors.
func TestPageWithoutFiguresInBrowser(t *testing.T) {
	src := newFake(t)
	src.statsErr = status.Error(codes.Unimplemented, "method QueryStats not implemented")
	srv := httptest.NewServer(Handler(src, nil))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	browser := browsertest.Start(t, ctx, 1200, 900)
	defer browser.CheckConsole(t)
	if err := chromedp.Do(browser.Ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	const js = `(() => {
		const q = document.querySelector('[data-query="words"]');
		if (!q || q.querySelectorAll('svg.graph g.frag').length !== 3) return '';
		return q.querySelector('[data-query-tps]').textContent + ' | ' + q.querySelector('.query-head').textContent;
	})()`
	var got string
	for {
		var err error
		got, err = chromedp.Run(browser.Ctx, chromedp.Evaluate[string](js))
		if err == nil && got != "" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for the graph: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !strings.HasPrefix(got, "no figures | ") || !strings.Contains(got, "does not report per-task statistics") {
		t.Errorf("query head without figures: %q", got)
	}
}
