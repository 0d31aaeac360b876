package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// TestAckBeyondSentIsRefused subscribes to a running task's stream on the
// worker process as the strongest caller the data plane admits (a worker
// certificate of the org, which may acknowledge) and acknowledges beyond
// what the worker sent it: the worker ends the subscription with
// InvalidArgument, as it does for an acknowledgement in the opening
// request. Before the acknowledgement rule, an ack of 2^62 under a task's
// name discarded tuples its real downstream had not read.
func TestAckBeyondSentIsRefused(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts real processes")
	}
	o := startOrg(t, 1, 1)
	o.waitReady(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	adminFile := writeSecret(t, dir, "admin", o.adminToken)
	queryFile := filepath.Join(dir, "ward.yaml")
	// One replica, and an endless generator (limit 0) that keeps the stream open.
	query := strings.Replace(strings.Replace(vitalsQuery, "replicas: 2", "replicas: 1", 1), "limit: %d", "limit: 0", 1)
	if err := os.WriteFile(queryFile, []byte(query), 0o600); err != nil {
		t.Fatal(err)
	}
	if err, out, errOut := run(ctx, t, "", "query", "submit", queryFile, "--addr", o.grpc[0], "--token-file", adminFile); err != nil {
		t.Fatalf("submit: %v\n%s%s", err, out, errOut)
	}
	var q struct {
		Tasks []struct {
			ID         string `json:"id"`
			Fragment   string `json:"fragment"`
			WorkerAddr string `json:"worker_addr"`
			State      string `json:"state"`
		} `json:"tasks"`
	}
	var sinkAddr, sinkID string
	waitFor(t, 30*time.Second, "the sink task running", func() bool {
		if err := cli(ctx, t, &q, "query", "status", "ward", "--addr", o.grpc[0], "--token-file", adminFile); err != nil {
			return false
		}
		for _, tk := range q.Tasks {
			if tk.Fragment == "out" && tk.State == "running" && tk.WorkerAddr != "" {
				sinkAddr, sinkID = tk.WorkerAddr, tk.ID
				return true
			}
		}
		return false
	})

	// A worker certificate signed by the org's CA, as the coordinators
	// sign for registered workers.
	ca, err := tlsutil.LoadCA(filepath.Join(o.tlsDir, "ca.pem"), filepath.Join(o.tlsDir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(rpc.Identity{Org: "acme", Role: rpc.RoleWorker, Name: "w-tester"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := tlsutil.New([]byte(mustRead(t, filepath.Join(o.tlsDir, "ca.pem"))))
	if err != nil {
		t.Fatal(err)
	}
	if err := creds.SetCertificate(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	conn, err := rpc.Dial(sinkAddr, "", creds.DialOption(tlsutil.Peer{Roles: []string{rpc.RoleWorker}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	dp := pb.NewDataPlaneClient(conn)
	ref := &pb.StreamRef{Query: "ward", TaskId: sinkID}

	// An acknowledgement in the opening request: nothing was sent yet.
	s, err := dp.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.SubscribeRequest{Stream: ref, Subscriber: "tester", AckId: 1 << 62}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("opening ack 2^62: %v, want InvalidArgument", err)
	}

	// An acknowledgement beyond the last id received.
	s, err = dp.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.SubscribeRequest{Stream: ref, Subscriber: "tester"}); err != nil {
		t.Fatal(err)
	}
	b, err := s.Recv()
	if err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if err := s.Send(&pb.SubscribeRequest{AckId: b.LastId}); err != nil {
		t.Fatalf("ack of what was received: %v", err)
	}
	if err := s.Send(&pb.SubscribeRequest{AckId: 1 << 62}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := s.Recv()
		if err == nil {
			continue // batches sent before the worker read the ack
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "beyond the last id sent") {
			t.Fatalf("ack 2^62 after id %d: %v, want InvalidArgument naming the last id sent", b.LastId, err)
		}
		break
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
