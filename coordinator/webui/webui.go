// Package webui is the coordinator's live web view: a page of embedded
// static files (plain HTML, CSS and JavaScript: nothing to build, nothing
// fetched from the network) and the JSON API under /api/ that the page
// polls. The API shows what the admin gRPC API shows, in the keys the CLI's
// --json output uses, so a script can read either.
//
// The package knows nothing of Raft or the state store: it reads through a
// Source, which the coordinator implements with its admin service.
//
// Authorization: the static files hold no data and need no credential. Each
// API call carries the caller's bearer token (the Authorization header) in
// its context (see Token), and the Source checks it exactly as the gRPC
// call of the same data would be checked. The page keeps a token the user
// types in sessionStorage; the server never writes a token into anything it
// serves.
package webui

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// Source is a coordinator's view of its org, as the admin gRPC API serves
// it. Errors are gRPC statuses: Unauthenticated and PermissionDenied when
// the request's token (Token(ctx)) does not allow the read, NotFound for an
// unknown query, Unimplemented from QueryStats when the coordinator cannot
// report figures.
type Source interface {
	Status(ctx context.Context) (*pb.StatusResponse, error)
	Workers(ctx context.Context) (*pb.ListWorkersResponse, error)
	Queries(ctx context.Context) (*pb.ListQueriesResponse, error)
	// Query returns one query with its tasks and its spec (SpecJson).
	Query(ctx context.Context, name string) (*pb.QueryInfo, error)
	QueryStats(ctx context.Context, name string) (*pb.QueryStatsResponse, error)
	// TasksPerCore is how many tasks placement puts on one worker core at
	// most (0: no bound); the view shows each worker's load against it.
	TasksPerCore() int
}

type tokenKey struct{}

// Token returns the bearer token the HTTP request behind ctx carried, or ""
// when it carried none.
func Token(ctx context.Context) string {
	t, _ := ctx.Value(tokenKey{}).(string)
	return t
}

// WithToken returns ctx carrying a bearer token, as the handler passes it
// to the Source (tests of a Source use it too).
func WithToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

//go:embed static
var staticFiles embed.FS

// callTimeout bounds one API request's reads from the Source.
const callTimeout = 10 * time.Second

// contentSecurityPolicy lets the page load only its own files and talk only
// to its own origin: no inline script, nothing from elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the page at "/" and the JSON API under "/api/". Mount it
// at the root of a coordinator's HTTP server. A nil logger discards.
func Handler(src Source, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &handler{src: src, logger: logger}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/org", h.api(h.org))
	mux.HandleFunc("GET /api/workers", h.api(h.workers))
	mux.HandleFunc("GET /api/queries", h.api(h.queries))
	mux.HandleFunc("GET /api/queries/{name}", h.api(h.query))
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no API call "+r.Method+" "+r.URL.Path+": the API answers GET on /api/org, /api/workers, /api/queries and /api/queries/NAME")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		hdr := w.Header()
		hdr.Set("Content-Security-Policy", contentSecurityPolicy)
		hdr.Set("X-Content-Type-Options", "nosniff")
		hdr.Set("Referrer-Policy", "no-referrer")
		hdr.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	return mux
}

type handler struct {
	src    Source
	logger *slog.Logger
}

// apiFunc answers one API request with a value to encode as JSON.
type apiFunc func(ctx context.Context, r *http.Request) (any, error)

func (h *handler) api(f apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
		defer cancel()
		ctx = WithToken(ctx, bearer(r))
		v, err := f(ctx, r)
		if err != nil {
			code, msg := httpStatus(err)
			if code == http.StatusInternalServerError {
				h.logger.Warn("web API request failed", "path", r.URL.Path, "err", err)
			}
			writeError(w, code, msg)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			h.logger.Debug("web API response not written", "path", r.URL.Path, "err", err)
		}
	}
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header.
func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// httpStatus maps a Source error (a gRPC status) to an HTTP status and a
// message. Status messages never carry a token's secret.
func httpStatus(err error) (int, string) {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return http.StatusGatewayTimeout, err.Error()
	}
	st, ok := status.FromError(err)
	if !ok {
		return http.StatusInternalServerError, err.Error()
	}
	switch st.Code() {
	case codes.Unauthenticated:
		return http.StatusUnauthorized, st.Message()
	case codes.PermissionDenied:
		return http.StatusForbidden, st.Message()
	case codes.NotFound:
		return http.StatusNotFound, st.Message()
	case codes.InvalidArgument:
		return http.StatusBadRequest, st.Message()
	case codes.Unavailable:
		return http.StatusServiceUnavailable, st.Message()
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout, st.Message()
	}
	return http.StatusInternalServerError, st.Message()
}

// apiError is the body of every API error.
type apiError struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fedstream"`)
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(apiError{Error: msg})
}

func (h *handler) org(ctx context.Context, _ *http.Request) (any, error) {
	st, err := h.src.Status(ctx)
	if err != nil {
		return nil, err
	}
	return OrgView(st), nil
}

func (h *handler) workers(ctx context.Context, _ *http.Request) (any, error) {
	ws, err := h.src.Workers(ctx)
	if err != nil {
		return nil, err
	}
	return WorkersView(ws, h.src.TasksPerCore()), nil
}

func (h *handler) queries(ctx context.Context, _ *http.Request) (any, error) {
	qs, err := h.src.Queries(ctx)
	if err != nil {
		return nil, err
	}
	out := Queries{Queries: []Query{}}
	for _, q := range qs.Queries {
		out.Queries = append(out.Queries, QueryView(q))
	}
	return out, nil
}

func (h *handler) query(ctx context.Context, r *http.Request) (any, error) {
	name := r.PathValue("name")
	q, err := h.src.Query(ctx, name)
	if err != nil {
		return nil, err
	}
	d := QueryDetail{Query: QueryView(q), Graph: GraphOf(q)}
	d.Stats = h.stats(ctx, name)
	return d, nil
}

// stats reads a query's live figures. Their absence is not an error of the
// request: the query's tasks and graph are worth showing without them, so
// the reason goes into the answer instead.
func (h *handler) stats(ctx context.Context, name string) Stats {
	resp, err := h.src.QueryStats(ctx, name)
	if err != nil {
		reason := "no figures: " + status.Convert(err).Message()
		if status.Code(err) == codes.Unimplemented {
			reason = "no figures: this coordinator does not report per-task statistics"
		}
		return Stats{Reason: reason, Tasks: []TaskStats{}}
	}
	return StatsView(resp)
}
