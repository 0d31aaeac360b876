package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator/webui"
	"github.com/fedstream/fedstream/internal/browsertest"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// TestWebViewInBrowser runs the dev org with the demo query, opens the web
// view in headless chromium and checks what a user would look at: no
// console errors, the query's graph drawn with every fragment, stream and
// task (with its worker), and a throughput figure that moves.
func TestWebViewInBrowser(t *testing.T) {
	browsertest.Path(t) // fail at once, before starting an org, without a browser
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var level slog.LevelVar
	level.Set(slog.LevelError)
	logger := logging.NewLeveled(os.Stderr, &level, false)
	fed, err := startDev(ctx, devOptions{org: "demo", coordinators: 1, workers: 2, dataDir: t.TempDir(), logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer fed.stop()
	f := &clientFlags{addr: fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: fed.tlsDir}}
	if err := fed.waitReady(ctx, f, 2); err != nil {
		t.Fatal(err)
	}
	c, cctx, done, err := f.admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.SubmitQuery(cctx, &pb.SubmitQueryRequest{Yaml: demoQuery, Filename: "demo-netmon.yaml", IdempotencyKey: "webview-test"})
	done()
	if err != nil {
		t.Fatal(err)
	}

	// The page as the coordinator serves it on its own HTTP server, with
	// the per-task figures its workers report (QueryStats).
	if fed.coords[0].HTTPAddr() == "" {
		t.Fatal("the dev coordinator serves no HTTP")
	}
	srv := struct{ URL string }{URL: "http://" + fed.coords[0].HTTPAddr()}

	// What the page must draw, from the API it reads, once every task is
	// placed on a worker.
	var want webui.QueryDetail
	waitFor(t, ctx, "every task of netmon placed", func() bool {
		want = webui.QueryDetail{}
		if err := getJSON(srv.URL+"/api/queries/netmon", &want); err != nil {
			return false
		}
		for _, tk := range want.Tasks {
			if tk.Worker == "" {
				return false
			}
		}
		return len(want.Tasks) > 0
	})
	if len(want.Graph.Nodes) < 5 || len(want.Graph.Edges) < 4 || want.Graph.Error != "" {
		t.Fatalf("graph of the demo query: %+v", want.Graph)
	}

	browser := browsertest.Start(t, ctx, 1360, 1000)
	defer browser.CheckConsole(t)
	tab := browser.Ctx
	if err := chromedp.Do(tab, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}

	// Every fragment, stream and task of the query is drawn, and each task
	// shows the name of the worker it runs on.
	type drawn struct {
		Fragments []string          `json:"fragments"`
		Edges     []string          `json:"edges"`
		Tasks     map[string]string `json:"tasks"`
		Workers   int               `json:"workers"`
		Peers     int               `json:"peers"`
		Reserved  []string          `json:"reserved"`
	}
	const readDOM = `(() => {
		const q = document.querySelector('[data-query="netmon"]');
		const out = {fragments: [], edges: [], tasks: {}, workers: document.querySelectorAll('[data-worker]').length,
			peers: document.querySelectorAll('[data-peer]').length,
			reserved: [...document.querySelectorAll('section.reserved')].map((s) => s.textContent)};
		if (!q) return out;
		q.querySelectorAll('svg.graph g.frag').forEach((g) => out.fragments.push(g.dataset.fragment));
		q.querySelectorAll('svg.graph path.edge').forEach((p) => out.edges.push(p.dataset.edge));
		q.querySelectorAll('svg.graph g.task').forEach((g) => { out.tasks[g.dataset.task] = g.textContent; });
		return out;
	})()`
	var ws webui.Workers
	if err := getJSON(srv.URL+"/api/workers", &ws); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, w := range ws.Workers {
		names[w.ID] = w.Name
	}
	var got drawn
	waitFor(t, ctx, "the graph of netmon drawn with all its tasks", func() bool {
		got, err = chromedp.Run(tab, chromedp.Evaluate[drawn](readDOM))
		if err != nil || len(got.Fragments) != len(want.Graph.Nodes) || len(got.Edges) != len(want.Graph.Edges) || len(got.Tasks) != len(want.Tasks) {
			return false
		}
		for _, tk := range want.Tasks {
			label, ok := got.Tasks[tk.ID]
			if !ok || !strings.Contains(label, names[tk.Worker]) {
				return false
			}
		}
		return got.Workers == 2 && got.Peers == 1
	})
	for _, e := range want.Graph.Edges {
		if !contains(got.Edges, e.From+"->"+e.To) {
			t.Errorf("stream %s -> %s not drawn; drawn: %v", e.From, e.To, got.Edges)
		}
	}
	if len(got.Reserved) != 2 || !strings.Contains(got.Reserved[0], "none yet") || !strings.Contains(got.Reserved[1], "none yet") {
		t.Errorf("reserved sections for the ledger and health actions: %q", got.Reserved)
	}

	// The throughput shown moves while the page is open: the query's total
	// and the rates of its tasks in the graph. (With real figures the total
	// of paced sources may hold steady while the windowed aggregate's
	// output, emitted at window ends, does not.)
	type figures struct {
		Total string `json:"total"`
		Tasks string `json:"tasks"`
	}
	read := func() figures {
		f, err := chromedp.Run(tab, chromedp.Evaluate[figures](`(() => ({
			total: (document.querySelector('[data-query-tps="netmon"]') || {}).textContent || '',
			tasks: [...document.querySelectorAll('[data-query="netmon"] svg.graph g.task .tps')].map((e) => e.textContent).join(' '),
		}))()`))
		if err != nil {
			return figures{}
		}
		return f
	}
	var first figures
	waitFor(t, ctx, "throughput figures for netmon", func() bool {
		first = read()
		return strings.HasSuffix(first.Total, "tuples/s") && strings.Contains(first.Tasks, "/s")
	})
	var later figures
	waitFor(t, ctx, "the throughput figures to change", func() bool {
		later = read()
		return strings.HasSuffix(later.Total, "tuples/s") && later != first
	})
	t.Logf("throughput shown: %q, then %q", first.Total, later.Total)

	// A few seconds of history in the throughput line, for the picture.
	waitFor(t, ctx, "the throughput line to have a few points", func() bool {
		n, err := chromedp.Run(tab, chromedp.Evaluate[int](`(() => {
			const p = document.querySelector('[data-query="netmon"] .spark polyline');
			return p ? p.getAttribute('points').split(' ').length : 0;
		})()`))
		return err == nil && n >= 5
	})
	shot, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("FEDSTREAM_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "web-view.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (set FEDSTREAM_TEST_ARTIFACTS to keep it)", path)

}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, failing the test at ctx's deadline.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
