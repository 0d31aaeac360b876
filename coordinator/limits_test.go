package coordinator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// wideQuery has 1 source task, parallelism tasks of a keyed aggregate and
// 1 sink task per replica.
const wideQuery = `name: %s
replicas: %d
sources:
  - {name: text, generator: {kind: words, rate: 10, seed: 1}}
operators:
  - {name: split, type: split, input: text, field: line}
  - name: counts
    type: aggregate
    input: split
    window: {size: 1s}
    group_by: [word]
    aggregates: {n: "count()"}
    parallelism: %d
sinks:
  - {name: out, input: counts}
`

func submitYAML(t *testing.T, c pb.AdminServiceClient, name, yaml string) (*pb.SubmitQueryResponse, error) {
	t.Helper()
	return c.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(yaml), Filename: name + ".yaml", IdempotencyKey: "submit-" + name})
}

// Queries over the task limits, or with more replicas than the org has
// workers, are refused at submit with an error that names the limit, its
// value, what the query needs and how to raise it; nothing is stored.
func TestSubmitRefusedOverLimits(t *testing.T) {
	t.Parallel()
	c := newTestClusterWith(t, 1, "", "", testTimings(), func(cfg *Config) { cfg.Limits.MaxTasksPerOrg = 100 })
	l := c.leader()
	c.startWorker(t, l, "w1") // 4 cores each: a derived limit of 128 tasks
	c.startWorker(t, l, "w2")
	waitReady(t, c, l, 2)
	cases := []struct {
		name, yaml string
		code       codes.Code
		want       []string
	}{
		{"replicas", fmt.Sprintf(wideQuery, "r5", 5, 1), codes.FailedPrecondition,
			[]string{"replicas: 5 but the org has 2 ready workers", "lower replicas"}},
		{"per query", fmt.Sprintf(wideQuery, "big", 2, 64), codes.ResourceExhausted,
			[]string{"needs 132 tasks", "max-tasks-per-query is 128", "8 cores of workers not down x 16 tasks per core", "raise max-tasks-per-query"}},
	}
	for _, tc := range cases {
		_, err := submitYAML(t, c.admin(l), tc.name, tc.yaml)
		if status.Code(err) != tc.code {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.code)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, status.Convert(err).Message(), w)
			}
		}
	}
	// The org limit counts the tasks of running queries.
	if _, err := submitYAML(t, c.admin(l), "first", fmt.Sprintf(wideQuery, "first", 2, 30)); err != nil {
		t.Fatalf("first query: %v", err) // 64 tasks
	}
	_, err := submitYAML(t, c.admin(l), "second", fmt.Sprintf(wideQuery, "second", 2, 30))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "org runs 64 already, but max-tasks-per-org is 100 (configured)") {
		t.Fatalf("second query: %v", err)
	}
	if got := queryNames(t, c.admin(l)); strings.Join(got, ",") != "first" {
		t.Fatalf("queries stored: %v", got)
	}
}

// A task that cannot be placed says why in its status message instead of
// staying pending with an empty one.
func TestPendingTasksSayWhy(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 1, "", "")
	l := c.leader()
	w1 := c.startWorker(t, l, "w1")
	c.startWorker(t, l, "w2")
	waitReady(t, c, l, 2)
	submit(t, c.admin(l), "pair", 2)
	w1.stop() // its replicas have nowhere to go: w2 runs the other replica
	waitFor(t, 10*time.Second, "pending tasks with a reason", func() bool {
		q, err := c.admin(l).GetQuery(ctxT(t, 5*time.Second), &pb.GetQueryRequest{Name: "pair"})
		if err != nil {
			t.Fatal(err)
		}
		pending := 0
		for _, task := range q.Tasks {
			if task.WorkerId == "" {
				if task.State != "pending" {
					t.Fatalf("unplaced task %s is %s", task.TaskId, task.State)
				}
				if !strings.Contains(task.Message, "replicas of a partition run on different workers") {
					return false
				}
				pending++
			}
		}
		return pending == 2
	})
}

// waitReady waits until n workers show ready on node i.
func waitReady(t *testing.T, c *testCluster, i, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d ready workers", n), func() bool {
		ready := 0
		for _, w := range workerStatus(t, c.admin(i)) {
			if w.Status == "ready" {
				ready++
			}
		}
		return ready == n
	})
}
