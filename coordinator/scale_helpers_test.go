package coordinator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// What the ScaleQuery tests share: a node running the leader's duties,
// queries built from the same few lines, and the checks of a scale's
// answer.

// Lines of the queries the scale tests submit: words generators (text,
// and more with another seed) and a keyed aggregate of text, per_line,
// counting each line's copies per second.
const (
	textSource = `{name: text, generator: {kind: words, rate: 100, seed: 1}}`
	moreSource = `{name: more, generator: {kind: words, rate: 100, seed: 2}}`
	perLineOp  = `{name: per_line, type: aggregate, input: text, window: {size: 1s}, group_by: [line], aggregates: {n: "count()"}}`
)

// queryYAML is the YAML of query name with its replicas (0: not said),
// its sources and operators (each one entry of its YAML list) and the
// sink out reading sinkInput.
func queryYAML(name string, replicas int, sources, operators []string, sinkInput string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\n", name)
	if replicas > 0 {
		fmt.Fprintf(&b, "replicas: %d\n", replicas)
	}
	b.WriteString("sources:\n")
	for _, s := range sources {
		b.WriteString("  - " + s + "\n")
	}
	if len(operators) > 0 {
		b.WriteString("operators:\n")
		for _, op := range operators {
			b.WriteString("  - " + op + "\n")
		}
	}
	fmt.Fprintf(&b, "sinks:\n  - {name: out, input: %s}\n", sinkInput)
	return b.String()
}

// queryName is the name a query's YAML (from queryYAML) gives on its
// first line.
func queryName(yaml string) string {
	line, _, _ := strings.Cut(yaml, "\n")
	return strings.TrimPrefix(line, "name: ")
}

// leaderNode starts a cluster of one coordinator and waits until it runs
// the leader's duties; it returns the node and its admin client.
func leaderNode(t *testing.T) (*Server, pb.AdminServiceClient) {
	t.Helper()
	c := newTestCluster(t, 1, "", "")
	s := c.nodes[0]
	waitFor(t, 30*time.Second, "leader duties running", func() bool { return s.leading.Load() })
	return s, c.admin(0)
}

// submitYAMLs submits each query (named by its first line, its file by
// its name) and fails the test at the first refusal.
func submitYAMLs(t *testing.T, admin pb.AdminServiceClient, yamls ...string) {
	t.Helper()
	for _, q := range yamls {
		if _, err := admin.SubmitQuery(ctxT(t, 10*time.Second), &pb.SubmitQueryRequest{Yaml: []byte(q), Filename: queryName(q) + ".yaml"}); err != nil {
			t.Fatal(err)
		}
	}
}

// refusedAsReplicated asks, within d, to scale operator op of query to
// two partitions and returns the refusal if it is for the query's
// replicas; nil otherwise (the scale went ahead, or was refused for
// another reason, which the caller does not judge).
func refusedAsReplicated(t *testing.T, admin pb.AdminServiceClient, query, op string, d time.Duration) error {
	t.Helper()
	_, err := admin.ScaleQuery(ctxT(t, d), &pb.ScaleQueryRequest{Query: query, Operator: op, Parallelism: 2})
	if err != nil && strings.Contains(err.Error(), "replicated") {
		return err
	}
	return nil
}
