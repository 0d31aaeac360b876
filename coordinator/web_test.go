package coordinator

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// webGet fetches path from the web view with a bearer token (none if
// empty) and returns the status code and body.
func webGet(t *testing.T, base, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t, 10*time.Second), http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// The web view's API is authorized by the role table, as the gRPC calls
// showing the same data are: Status for any client role, the rest for
// readers; no token, a wrong token or a too weak one is refused, and no
// answer echoes a secret. The page itself holds no data and needs nothing.
func TestWebAPIUsesTheRoleTable(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "join-secret", "admin-secret")
	c.leader()
	tokens := pb.NewTokenServiceClient(c.conn(0, "admin-secret"))
	create := func(role string) string {
		resp, err := tokens.CreateToken(ctxT(t, 10*time.Second), &pb.CreateTokenRequest{Role: role, Description: role + " for the web view"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Secret
	}
	reader, auditor := create("reader"), create("auditor")
	srv := httptest.NewServer(c.nodes[0].WebHandler())
	defer srv.Close()

	secrets := []string{"join-secret", "admin-secret", reader, auditor, "not-a-token-of-this-org"}
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/", "", http.StatusOK},
		{"/app.js", "", http.StatusOK},
		{"/api/org", "", http.StatusUnauthorized},
		{"/api/workers", "", http.StatusUnauthorized},
		{"/api/queries", "", http.StatusUnauthorized},
		{"/api/queries/q", "", http.StatusUnauthorized},
		{"/api/org", "not-a-token-of-this-org", http.StatusForbidden},
		{"/api/org", auditor, http.StatusOK},
		{"/api/workers", auditor, http.StatusForbidden},
		{"/api/queries", auditor, http.StatusForbidden},
		{"/api/org", reader, http.StatusOK},
		{"/api/workers", reader, http.StatusOK},
		{"/api/queries", reader, http.StatusOK},
		{"/api/queries/nope", reader, http.StatusNotFound},
		{"/api/workers", "join-secret", http.StatusForbidden}, // the worker role reads nothing
		{"/api/workers", "admin-secret", http.StatusOK},
	} {
		code, body := webGet(t, srv.URL, tc.path, tc.token)
		if code != tc.want {
			t.Errorf("GET %s with token %.8q: %d, want %d: %s", tc.path, tc.token, code, tc.want, body)
		}
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("GET %s: the answer shows the secret %.8q…: %s", tc.path, s, body)
			}
		}
	}
}

// In dev mode (no tokens configured) the API answers without a token, as
// the gRPC API does.
func TestWebAPIInDevModeNeedsNoToken(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	c.leader()
	srv := httptest.NewServer(c.nodes[0].WebHandler())
	defer srv.Close()
	for _, p := range []string{"/api/org", "/api/workers", "/api/queries"} {
		if code, body := webGet(t, srv.URL, p, ""); code != http.StatusOK {
			t.Errorf("GET %s: %d %s", p, code, body)
		}
	}
	if _, body := webGet(t, srv.URL, "/api/org", ""); !strings.Contains(body, `"dev_mode": true`) || !strings.Contains(body, `"leader": true`) {
		t.Errorf("org: %s", body)
	}
}
