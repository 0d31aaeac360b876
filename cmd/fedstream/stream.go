package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/internal/retry"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/worker/tuple"
)

// resolveNode fetches a query and the schema of one of its nodes.
func resolveNode(ctx context.Context, c pb.AdminServiceClient, query, node string, kind queryspec.NodeKind) (*pb.QueryInfo, *queryspec.Node, error) {
	q, err := c.GetQuery(ctx, &pb.GetQueryRequest{Name: query})
	if err != nil {
		return nil, nil, err
	}
	spec, err := queryspec.FromJSON(q.SpecJson)
	if err != nil {
		return nil, nil, fmt.Errorf("query %s: stored spec: %w", query, err)
	}
	plan, err := spec.Plan()
	if err != nil {
		return nil, nil, err
	}
	var names []string
	for _, n := range plan.Nodes {
		if n.Kind == kind {
			names = append(names, n.Name)
			if node == "" {
				node = n.Name
			}
		}
	}
	n := plan.Node(node)
	if n == nil || n.Kind != kind {
		return nil, nil, fmt.Errorf("query %s has no %s named %q (it has: %s)", query, kind, node, strings.Join(names, ", "))
	}
	return q, n, nil
}

// tailer follows a sink's result stream, moving to another replica of the
// sink when the one it reads fails; ids are identical across replicas, so
// it resumes after the last id it printed.
type tailer struct {
	flags  *clientFlags
	query  string
	sink   string
	stable bool
	print  func(t *tuple.Tuple, schema *tuple.Schema, sink string) error
	// lastID is the last result id printed.
	lastID uint64
}

func (tl *tailer) run(ctx context.Context) error {
	backoff := retry.Policy{Initial: 200 * time.Millisecond, Max: 2 * time.Second}.New()
	// A query just submitted through the leader may not have reached the
	// coordinator we read from yet: "not found" is final only after a while.
	notFoundUntil := time.Now().Add(10 * time.Second)
	for ctx.Err() == nil {
		err := tl.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if code := status.Code(err); code == codes.PermissionDenied || code == codes.Unauthenticated {
			return err
		}
		if errors.Is(err, errNoSuchNode) && time.Now().After(notFoundUntil) {
			return err
		}
		if backoff.Wait(ctx) != nil {
			return nil
		}
	}
	return nil
}

var errNoSuchNode = errors.New("no such node")

func (tl *tailer) once(ctx context.Context) error {
	c, cctx, done, err := tl.flags.admin(ctx)
	if err != nil {
		return err
	}
	q, node, err := resolveNode(cctx, c, tl.query, tl.sink, queryspec.KindSink)
	done()
	if err != nil {
		if status.Code(err) == codes.NotFound || status.Code(err) == codes.Unknown {
			return fmt.Errorf("%w: %v", errNoSuchNode, err)
		}
		return err
	}
	var lastErr error = fmt.Errorf("no running replica of sink %s yet", node.Name)
	for _, t := range q.Tasks {
		if t.Fragment != node.Name || t.WorkerAddr == "" || t.State == states.TaskLost {
			continue
		}
		lastErr = tl.follow(ctx, t, node.Schema, node.Name)
		if ctx.Err() != nil {
			return nil
		}
	}
	return lastErr
}

func (tl *tailer) follow(ctx context.Context, t *pb.TaskInfo, schema *tuple.Schema, sink string) error {
	opts, err := tl.flags.tls.dialOption(rpc.RoleWorker)
	if err != nil {
		return err
	}
	conn, err := rpc.Dial(t.WorkerAddr, tl.flags.token, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewDataPlaneClient(conn).Subscribe(ctx)
	if err != nil {
		return err
	}
	err = stream.Send(&pb.SubscribeRequest{
		Stream:     &pb.StreamRef{Query: tl.query, TaskId: t.TaskId},
		AfterId:    tl.lastID,
		Subscriber: fmt.Sprintf("tail-%d", os.Getpid()),
		NoAck:      true,
	})
	if err != nil {
		return err
	}
	var tup tuple.Tuple
	reader := tuple.NewBatchReader(nil, 0)
	for {
		b, err := stream.Recv()
		if err != nil {
			return err
		}
		// Ids are consecutive in a batch, which names its last one.
		if b.Count == 0 || b.LastId < uint64(b.Count) {
			return fmt.Errorf("results from %s: a batch of %d tuples ending with id %d", t.WorkerAddr, b.Count, b.LastId)
		}
		reader.Reset(b.Data, b.LastId-uint64(b.Count)+1)
		for reader.Next(&tup) {
			if tup.ID != 0 && tup.ID <= tl.lastID && tup.Type != tuple.Boundary {
				continue
			}
			if tup.Type == tuple.Boundary {
				continue
			}
			if tl.stable && tup.Type != tuple.Stable {
				continue
			}
			if err := tl.print(&tup, schema, sink); err != nil {
				return err
			}
			tl.lastID = max(tl.lastID, tup.ID)
		}
		if err := reader.Err(); err != nil {
			return fmt.Errorf("decode results from %s: %w", t.WorkerAddr, err)
		}
	}
}

// valueJSON renders a value for JSON output.
func valueJSON(v tuple.Value) any {
	switch v.Kind {
	case tuple.KindInt:
		return v.I
	case tuple.KindFloat:
		if math.IsNaN(v.F) || math.IsInf(v.F, 0) {
			return strconv.FormatFloat(v.F, 'g', -1, 64)
		}
		return v.F
	case tuple.KindBool:
		return v.I != 0
	case tuple.KindTimestamp:
		return time.Unix(0, v.I).UTC().Format(time.RFC3339Nano)
	default:
		return v.S
	}
}

func valueText(v tuple.Value) string {
	switch v.Kind {
	case tuple.KindInt:
		return strconv.FormatInt(v.I, 10)
	case tuple.KindFloat:
		return strconv.FormatFloat(v.F, 'g', 6, 64)
	case tuple.KindBool:
		return strconv.FormatBool(v.I != 0)
	case tuple.KindTimestamp:
		return time.Unix(0, v.I).UTC().Format("15:04:05.000")
	default:
		return v.S
	}
}

// resultPrinter prints result tuples as JSON lines or readable text.
func resultPrinter(w io.Writer, asJSON bool) func(t *tuple.Tuple, schema *tuple.Schema, sink string) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	return func(t *tuple.Tuple, schema *tuple.Schema, sink string) error {
		if asJSON {
			obj := make(map[string]any, len(t.Values)+4)
			obj["type"] = t.Type.String()
			obj["id"] = t.ID
			obj["sink"] = sink
			for i, v := range t.Values {
				name := fmt.Sprintf("f%d", i)
				if schema != nil && i < schema.Len() {
					name = schema.Fields[i].Name
				}
				obj[name] = valueJSON(v)
			}
			if err := enc.Encode(obj); err != nil {
				return err
			}
		} else {
			var sb strings.Builder
			fmt.Fprintf(&sb, "%-9s #%-6d", t.Type, t.ID)
			for i, v := range t.Values {
				name := fmt.Sprintf("f%d", i)
				if schema != nil && i < schema.Len() {
					name = schema.Fields[i].Name
				}
				fmt.Fprintf(&sb, " %s=%s", name, valueText(v))
			}
			sb.WriteByte('\n')
			if _, err := bw.WriteString(sb.String()); err != nil {
				return err
			}
		}
		return bw.Flush()
	}
}

func newTailCmd() *cobra.Command {
	var (
		f      clientFlags
		sink   string
		stable bool
	)
	cmd := &cobra.Command{
		Use:   "tail QUERY",
		Short: "Stream a query's results as they arrive",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tl := &tailer{flags: &f, query: args[0], sink: sink, stable: stable}
			tl.print = resultPrinter(cmd.OutOrStdout(), f.json)
			return tl.run(cmd.Context())
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&sink, "sink", "", "sink to follow (default: the query's first sink)")
	cmd.Flags().BoolVar(&stable, "stable", false, "print only stable results (no tentative results or corrections)")
	return cmd
}

func newIngestCmd() *cobra.Command {
	var (
		f         clientFlags
		batchSize int
	)
	cmd := &cobra.Command{
		Use:   "ingest QUERY SOURCE < file.jsonl",
		Short: "Feed JSON lines from stdin into an ingest source of a query",
		Long: `Reads one JSON object per line from standard input and sends them to every
replica of the named ingest source. Each line is checked against the source's
schema; a bad line is refused with its line number and field, and the good
lines are still accepted. Exits 2 when any line was refused.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return ingest(cmd.Context(), &f, args[0], args[1], cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), batchSize)
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&batchSize, "batch", 1000, "lines per message")
	return cmd
}

func ingest(ctx context.Context, f *clientFlags, query, source string, in io.Reader, out, errOut io.Writer, batchSize int) error {
	c, cctx, done, err := f.admin(ctx)
	if err != nil {
		return err
	}
	q, node, err := resolveNode(cctx, c, query, source, queryspec.KindSource)
	done()
	if err != nil {
		return err
	}
	if node.Source == nil || !node.Source.Ingest {
		return fmt.Errorf("source %s of query %s is a generator, not an ingest source", source, query)
	}
	var streams []pb.DataPlane_IngestClient
	var addrs []string
	for _, t := range q.Tasks {
		if t.Fragment != node.Name || t.WorkerAddr == "" {
			continue
		}
		opts, err := f.tls.dialOption(rpc.RoleWorker)
		if err != nil {
			return err
		}
		conn, err := rpc.Dial(t.WorkerAddr, f.token, opts...)
		if err != nil {
			return err
		}
		defer conn.Close()
		s, err := pb.NewDataPlaneClient(conn).Ingest(ctx)
		if err != nil {
			return fmt.Errorf("ingest to %s: %w", t.WorkerAddr, err)
		}
		streams = append(streams, s)
		addrs = append(addrs, t.WorkerAddr)
	}
	if len(streams) == 0 {
		return fmt.Errorf("source %s of query %s is not running on any worker yet", source, query)
	}
	lr := newLineReader(in, ingestMaxLine)
	var (
		buf      []byte
		lines    int
		first    uint64 = 1
		lineNo   uint64
		sendErrs error
		refused  []string // lines refused here, before sending
	)
	// A request carries consecutive lines; a line refused here is sent
	// as an empty line so the worker's numbering stays the file's.
	flush := func() {
		if lines == 0 {
			return
		}
		for i, s := range streams {
			if err := s.Send(&pb.IngestRequest{Query: query, Source: source, Lines: buf, FirstLine: first}); err != nil {
				sendErrs = errors.Join(sendErrs, fmt.Errorf("send to %s: %w", addrs[i], err))
			}
		}
		buf, lines, first = buf[:0:0], 0, lineNo+1
	}
	for {
		line, size, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read stdin at line %d: %w", lineNo+1, err)
		}
		if len(buf)+len(line)+1 > ingestBatchBytes {
			flush()
		}
		lineNo++
		if line == nil && size > 0 {
			refused = append(refused, tooLongLine(lineNo, size))
		}
		buf = append(buf, line...)
		buf = append(buf, '\n')
		lines++
		if lines >= batchSize {
			flush()
		}
	}
	flush()
	var resp *pb.IngestResponse
	for i, s := range streams {
		r, err := s.CloseAndRecv()
		if err != nil {
			sendErrs = errors.Join(sendErrs, fmt.Errorf("ingest at %s: %w", addrs[i], explainIngestError(err)))
			continue
		}
		if resp == nil {
			resp = r
		}
	}
	if resp == nil {
		return sendErrs
	}
	for _, msg := range refused {
		fmt.Fprintln(errOut, msg)
	}
	workerRefused := 0
	for _, le := range resp.Errors {
		if le.Error == "" || strings.Contains(le.Error, "empty line") && isRefusedHere(refused, le.Line) {
			continue // the placeholder of a line refused here
		}
		workerRefused++
		fmt.Fprintln(errOut, le.Error) // the worker names the line and field
	}
	fmt.Fprintf(out, "ingested %d of %d lines into %s/%s (%d replicas)\n", resp.Accepted, lineNo, query, source, len(streams))
	if sendErrs != nil {
		return sendErrs
	}
	if n := workerRefused + len(refused); n > 0 {
		return &exitError{code: 2, err: fmt.Errorf("%d lines refused", n)}
	}
	return nil
}

// isRefusedHere reports whether line was refused by the CLI (its
// messages start with "line N:").
func isRefusedHere(refused []string, line uint64) bool {
	prefix := fmt.Sprintf("line %d:", line)
	for _, m := range refused {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

// explainIngestError adds what to do to a worker's refusal of a message
// over its size limit (the CLI keeps under it; an older or differently
// built worker may have a smaller one).
func explainIngestError(err error) error {
	if status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "larger than max") {
		return fmt.Errorf("%w (the worker's gRPC receive limit for one message: send fewer lines per message with --batch, and split records larger than the limit)", err)
	}
	return err
}
