package webui

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

const testQuery = `
name: words
replicas: 2
sources:
  - {name: lines, generator: {kind: words, rate: 100, seed: 1}}
operators:
  - {name: long, type: filter, input: lines, where: "len(line) > 3"}
  - {name: counts, type: aggregate, input: long, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}, parallelism: 2}
sinks:
  - {name: out, input: counts}
`

// fakeSource answers from fixed values; statsErr replaces QueryStats's
// answer, and tokens records the token each call saw.
type fakeSource struct {
	spec     []byte
	statsErr error
	err      error
	// requireToken, when set, is the one token the source accepts.
	requireToken string
	// ghost is a query Queries lists and Query does not find, as when it
	// is removed between the two reads.
	ghost  string
	mu     sync.Mutex
	tokens []string
}

func (f *fakeSource) saw(ctx context.Context) error {
	f.mu.Lock()
	f.tokens = append(f.tokens, Token(ctx))
	f.mu.Unlock()
	switch tok := Token(ctx); {
	case f.requireToken == "":
	case tok == "":
		return status.Error(codes.Unauthenticated, "missing token: this call needs a token with role reader")
	case tok != f.requireToken:
		return status.Error(codes.PermissionDenied, "wrong token: it matches no token of this org")
	}
	return f.err
}

func (f *fakeSource) Status(ctx context.Context) (*pb.StatusResponse, error) {
	if err := f.saw(ctx); err != nil {
		return nil, err
	}
	return &pb.StatusResponse{Org: "acme", NodeId: "c2", State: "Follower", LeaderId: "c1", LastIndex: 12, AppliedIndex: 11,
		Peers: []*pb.Peer{{Id: "c1", Addr: "a1", Suffrage: "Voter"}, {Id: "c2", Addr: "a2", Suffrage: "Voter"}}}, nil
}

func (f *fakeSource) Workers(ctx context.Context) (*pb.ListWorkersResponse, error) {
	if err := f.saw(ctx); err != nil {
		return nil, err
	}
	return &pb.ListWorkersResponse{Workers: []*pb.WorkerInfo{
		{Id: "w-1", Name: "w1", Status: "ready", Cores: 2, Tasks: []string{"words/lines/p0/r0", "words/counts/p0/r0"},
			TaskStates: []*pb.TaskState{{TaskId: "words/lines/p0/r0", State: "running", Generation: 1}}},
		{Id: "w-2", Status: "down"},
	}}, nil
}

func (f *fakeSource) Queries(ctx context.Context) (*pb.ListQueriesResponse, error) {
	if err := f.saw(ctx); err != nil {
		return nil, err
	}
	q, _ := f.Query(ctx, "words")
	q.SpecJson = nil
	resp := &pb.ListQueriesResponse{Queries: []*pb.QueryInfo{q}}
	if f.ghost != "" {
		resp.Queries = append(resp.Queries, &pb.QueryInfo{Name: f.ghost, Status: "running"})
	}
	return resp, nil
}

func (f *fakeSource) Query(ctx context.Context, name string) (*pb.QueryInfo, error) {
	if err := f.saw(ctx); err != nil {
		return nil, err
	}
	if name != "words" {
		return nil, status.Errorf(codes.NotFound, "no query named %q", name)
	}
	q := &pb.QueryInfo{Name: "words", Status: "running", Replicas: 2, SpecJson: f.spec}
	for _, frag := range []struct {
		name  string
		parts int
	}{{"lines", 1}, {"counts", 2}, {"out", 1}} {
		for p := 0; p < frag.parts; p++ {
			for r := 0; r < 2; r++ {
				q.Tasks = append(q.Tasks, &pb.TaskInfo{TaskId: queryspec.TaskID("words", frag.name, p, r), Fragment: frag.name,
					Partition: int32(p), Replica: int32(r), WorkerId: "w-1", State: "running"})
			}
		}
	}
	return q, nil
}

func (f *fakeSource) QueryStats(ctx context.Context, name string) (*pb.QueryStatsResponse, error) {
	if err := f.saw(ctx); err != nil {
		return nil, err
	}
	if f.statsErr != nil {
		return nil, f.statsErr
	}
	return &pb.QueryStatsResponse{Query: name, Tasks: []*pb.TaskStats{
		{Task: "words/lines/p0/r0@g2", Worker: "w-1", InTps: 0, OutTps: 98.5, Busy: 0.1, BackpressureMsPerS: 3},
	}}, nil
}

func (f *fakeSource) TasksPerCore() int { return 4 }

func newFake(t *testing.T) *fakeSource {
	q, err := queryspec.Parse("words.yaml", []byte(testQuery))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := q.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return &fakeSource{spec: spec}
}

func get(t *testing.T, h http.Handler, path, token string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAPIDocuments(t *testing.T) {
	src := newFake(t)
	h := Handler(src, nil)

	org := decode[Org](t, get(t, h, "/api/org", ""))
	if org.Org != "acme" || org.NodeID != "c2" || len(org.Peers) != 2 || !org.Peers[0].Leader || org.Peers[1].Leader || org.LastIndex != 12 {
		t.Errorf("org: %+v", org)
	}

	ws := decode[Workers](t, get(t, h, "/api/workers", ""))
	if ws.TasksPerCore != 4 || len(ws.Workers) != 2 {
		t.Fatalf("workers: %+v", ws)
	}
	if w := ws.Workers[0]; w.Capacity != 8 || w.Load != 0.25 || len(w.TaskStates) != 1 || w.TaskStates[0].State != "running" {
		t.Errorf("worker w1: %+v", w)
	}
	// Lists and maps are empty, never null, for a worker with nothing.
	if rec := get(t, h, "/api/workers", ""); !strings.Contains(rec.Body.String(), `"tasks": []`) || !strings.Contains(rec.Body.String(), `"labels": {}`) {
		t.Errorf("a worker with nothing: %s", rec.Body)
	}

	qs := decode[Queries](t, get(t, h, "/api/queries", ""))
	if len(qs.Queries) != 1 || len(qs.Queries[0].Tasks) != 8 {
		t.Fatalf("queries: %+v", qs)
	}

	d := decode[QueryDetail](t, get(t, h, "/api/queries/words", ""))
	// The filter runs fused into its source's fragment: three fragments,
	// two streams.
	if d.Graph.Error != "" || len(d.Graph.Nodes) != 3 {
		t.Fatalf("graph: %+v", d.Graph)
	}
	lines, counts := d.Graph.Nodes[0], d.Graph.Nodes[1]
	if lines.Name != "lines" || lines.Kind != "source" || lines.Type != "generator words" || strings.Join(lines.Members, ",") != "lines,long" {
		t.Errorf("source fragment: %+v", lines)
	}
	if counts.Type != "aggregate" || counts.Partitions != 2 || strings.Join(counts.KeyedBy, ",") != "line" {
		t.Errorf("aggregate fragment: %+v", counts)
	}
	if want := []Edge{{"lines", "counts"}, {"counts", "out"}}; len(d.Graph.Edges) != 2 || d.Graph.Edges[0] != want[0] || d.Graph.Edges[1] != want[1] {
		t.Errorf("edges: %+v", d.Graph.Edges)
	}
	// Figures match their task: a generation suffix is dropped.
	if !d.Stats.Available || len(d.Stats.Tasks) != 1 || d.Stats.Tasks[0].Task != "words/lines/p0/r0" || d.Stats.Tasks[0].OutTPS != 98.5 {
		t.Errorf("stats: %+v", d.Stats)
	}
}

// A coordinator that cannot report figures still shows the query, and says
// why there are no figures.
func TestQueryWithoutFigures(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unimplemented, "method QueryStats not implemented"), "does not report per-task statistics"},
		{status.Error(codes.Unavailable, "no coordinator leader is known"), "no coordinator leader is known"},
	} {
		src := newFake(t)
		src.statsErr = tc.err
		d := decode[QueryDetail](t, get(t, Handler(src, nil), "/api/queries/words", ""))
		if d.Stats.Available || !strings.HasPrefix(d.Stats.Reason, "no figures") || !strings.Contains(d.Stats.Reason, tc.want) || d.Stats.Tasks == nil {
			t.Errorf("%v: stats %+v", tc.err, d.Stats)
		}
		if len(d.Tasks) != 8 || len(d.Graph.Nodes) != 3 {
			t.Errorf("%v: the query is not shown whole: %+v", tc.err, d.Query)
		}
	}
}

// A spec this build cannot read still gives the fragments, without edges.
func TestGraphOfUnreadableSpec(t *testing.T) {
	src := newFake(t)
	src.spec = []byte(`{"name":"words","from_a_newer_build":1}`)
	d := decode[QueryDetail](t, get(t, Handler(src, nil), "/api/queries/words", ""))
	if d.Graph.Error == "" || len(d.Graph.Nodes) != 3 || len(d.Graph.Edges) != 0 || d.Graph.Nodes[0].Name != "counts" {
		t.Errorf("graph: %+v", d.Graph)
	}
}

// The request's bearer token reaches the Source; the Source's refusals
// become HTTP statuses whose bodies say what is needed.
func TestTokensAndRefusals(t *testing.T) {
	src := newFake(t)
	h := Handler(src, nil)
	get(t, h, "/api/org", "s3cret")
	get(t, h, "/api/org", "")
	if len(src.tokens) != 2 || src.tokens[0] != "s3cret" || src.tokens[1] != "" {
		t.Errorf("tokens seen by the source: %q", src.tokens)
	}
	for _, tc := range []struct {
		err  error
		want int
	}{
		{status.Error(codes.Unauthenticated, "missing token: this call needs a token with role reader"), http.StatusUnauthorized},
		{status.Error(codes.PermissionDenied, "the token's role is auditor"), http.StatusForbidden},
		{status.Error(codes.Unavailable, "no leader"), http.StatusServiceUnavailable},
		{status.Error(codes.Internal, "read workers: boom"), http.StatusInternalServerError},
	} {
		src.err = tc.err
		rec := get(t, h, "/api/workers", "s3cret")
		var body apiError
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tc.want || body.Error != status.Convert(tc.err).Message() {
			t.Errorf("%v: %d %s", tc.err, rec.Code, rec.Body)
		}
		if strings.Contains(rec.Body.String(), "s3cret") {
			t.Errorf("the token is echoed: %s", rec.Body)
		}
		if tc.want == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") == "" {
			t.Error("401 without WWW-Authenticate")
		}
	}
	src.err = nil
	if rec := get(t, h, "/api/queries/nope", ""); rec.Code != http.StatusNotFound {
		t.Errorf("unknown query: %d %s", rec.Code, rec.Body)
	}
	if rec := get(t, h, "/api/nope", ""); rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "/api/queries/NAME") {
		t.Errorf("unknown API path: %d %s", rec.Code, rec.Body)
	}
}

// The page is served with a policy that lets it load only its own files,
// and its files name nothing outside the coordinator: no CDN, no font
// service, no external script.
func TestPageIsSelfContained(t *testing.T) {
	h := Handler(newFake(t), nil)
	rec := get(t, h, "/", "")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `<script src="app.js"`) {
		t.Fatalf("page: %d %s", rec.Code, rec.Body)
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("policy: %q", csp)
	}
	for _, p := range []string{"/app.js", "/style.css"} {
		if rec := get(t, h, p, ""); rec.Code != http.StatusOK || rec.Body.Len() == 0 {
			t.Errorf("%s: %d", p, rec.Code)
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d", rec.Code)
	}

	url := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	err := fs.WalkDir(staticFiles, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := staticFiles.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			return err
		}
		for _, m := range url.FindAllString(string(b), -1) {
			if m != "http://www.w3.org" { // the SVG namespace name, never fetched
				t.Errorf("%s names %s", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
