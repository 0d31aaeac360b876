package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config"
	"github.com/fedstream/fedstream/coordinator/webui"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
)

// clientFlags are shared by every command that talks to a coordinator.
type clientFlags struct {
	addr      string
	token     string
	tokenFile string
	json      bool
	timeout   time.Duration
	tls       clientTLS
}

func (f *clientFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addr, "addr", envOr("FEDSTREAM_ADDR", "127.0.0.1:7400"), "coordinator gRPC address (env FEDSTREAM_ADDR)")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", os.Getenv("FEDSTREAM_TOKEN_FILE"), "file holding the access token (env FEDSTREAM_TOKEN_FILE); or set FEDSTREAM_TOKEN")
	cmd.Flags().StringVar(&f.token, "token", "", "access token (visible in ps: prefer --token-file or FEDSTREAM_TOKEN)")
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON instead of a table")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 15*time.Second, "how long to wait for the coordinator")
	f.tls.register(cmd)
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := f.resolveToken(); err != nil {
			return err
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

// resolveToken settles the token from --token, --token-file or
// FEDSTREAM_TOKEN, in that order; two explicit sources are an error.
func (f *clientFlags) resolveToken() error {
	if f.tokenFile != "" {
		if f.token != "" {
			return fmt.Errorf("both --token and --token-file are given: use one")
		}
		tok, err := config.ReadTokenFile(f.tokenFile)
		if err != nil {
			return err
		}
		f.token = tok
	}
	if f.token == "" {
		f.token = os.Getenv("FEDSTREAM_TOKEN")
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (f *clientFlags) dial() (*grpc.ClientConn, error) {
	opts, err := f.tls.dialOption(rpc.RoleCoordinator)
	if err != nil {
		return nil, err
	}
	conn, err := rpc.Dial(f.addr, f.token, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", f.addr, err)
	}
	return conn, nil
}

func (f *clientFlags) admin(ctx context.Context) (pb.AdminServiceClient, context.Context, func(), error) {
	conn, err := f.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	return pb.NewAdminServiceClient(conn), ctx, func() { cancel(); conn.Close() }, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// serviceCmd completes a client command that calls one gRPC service of a
// coordinator: it registers the client flags, dials (mutual TLS, token)
// and bounds the call by --timeout.
func serviceCmd[C any](cmd *cobra.Command, newClient func(grpc.ClientConnInterface) C, run func(ctx context.Context, c C, f *clientFlags, cmd *cobra.Command, args []string) error) *cobra.Command {
	f := &clientFlags{}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		conn, err := f.dial()
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
		defer cancel()
		return run(ctx, newClient(conn), f, cmd, args)
	}
	f.register(cmd)
	return cmd
}

// adminCmd completes a client command that calls one coordinator's admin
// API: it registers the shared client flags, dials, bounds the call with
// --timeout, and hands the client to run.
func adminCmd(cmd *cobra.Command, run func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error) *cobra.Command {
	f := &clientFlags{}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, ctx, done, err := f.admin(cmd.Context())
		if err != nil {
			return err
		}
		defer done()
		return run(ctx, c, f, cmd, args)
	}
	f.register(cmd)
	return cmd
}

func newStatusCmd() *cobra.Command {
	return adminCmd(&cobra.Command{
		Use:   "status",
		Short: "Show the coordinator cluster: leader, peers, Raft indexes",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		st, err := c.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			return fmt.Errorf("status from %s: %w", f.addr, err)
		}
		out := cmd.OutOrStdout()
		if f.json {
			return printJSON(out, webui.OrgView(st))
		}
		tw := newTable(out)
		fmt.Fprintf(tw, "org\t%s\nnode\t%s (%s)\nleader\t%s raft=%s grpc=%s\nlast index\t%d (applied %d)\n",
			st.Org, st.NodeId, st.State, orNone(st.LeaderId), orNone(st.LeaderAddr), orNone(st.LeaderGrpcAddr), st.LastIndex, st.AppliedIndex)
		if st.DevMode {
			fmt.Fprintf(tw, "auth\tdev mode (no tokens)\n")
		}
		if st.InsecurePlaintext {
			fmt.Fprintf(tw, "transport\tINSECURE PLAINTEXT (no TLS: --insecure-plaintext)\n")
		} else {
			fmt.Fprintf(tw, "transport\tmutual TLS\n")
		}
		tw.Flush()
		tw = newTable(out)
		fmt.Fprintln(tw, "\nPEER\tRAFT ADDR\tSUFFRAGE")
		for _, p := range st.Peers {
			mark := ""
			if p.Id == st.LeaderId {
				mark = " (leader)"
			}
			fmt.Fprintf(tw, "%s%s\t%s\t%s\n", p.Id, mark, p.Addr, p.Suffrage)
		}
		return tw.Flush()
	})
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func newWorkersCmd() *cobra.Command {
	return adminCmd(&cobra.Command{
		Use:   "workers",
		Short: "List the org's workers",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		resp, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{})
		if err != nil {
			return fmt.Errorf("workers from %s: %w", f.addr, err)
		}
		out := cmd.OutOrStdout()
		if f.json {
			return printJSON(out, webui.WorkersView(resp, 0).Workers)
		}
		tw := newTable(out)
		fmt.Fprintln(tw, "ID\tNAME\tADDR\tSTATUS\tCORES\tTASKS\tLEVEL")
		for _, w := range resp.Workers {
			// LEVEL: the data-plane feature level of the worker's build
			// ("-": it stated none, an older build).
			level := "-"
			if w.DataplaneLevel > 0 {
				level = strconv.Itoa(int(w.DataplaneLevel))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", w.Id, w.Name, w.Addr, w.Status, w.Cores, len(w.Tasks), level)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, w := range resp.Workers {
			if w.StatusNote != "" {
				fmt.Fprintf(out, "%s %s: %s\n", w.Id, w.Status, w.StatusNote)
			}
		}
		return nil
	})
}

func newQueryCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "query", Short: "Submit, list, inspect and stop continuous queries"}
	cmd.AddCommand(newQuerySubmitCmd(), newQueryListCmd(), newQueryStatusCmd(), newQueryStopCmd(), newQueryStatsCmd(), newQueryScaleCmd(),
		newQueryUpdateCmd(), newQueryVersionsCmd())
	return cmd
}

func newQuerySubmitCmd() *cobra.Command {
	return adminCmd(&cobra.Command{
		Use:   "submit FILE",
		Short: "Validate a query YAML file and start it",
		Args:  cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		data, err := os.ReadFile(args[0])
		if err != nil {
			return err
		}
		resp, err := c.SubmitQuery(ctx, &pb.SubmitQueryRequest{
			Yaml: data, Filename: args[0],
			IdempotencyKey: fmt.Sprintf("submit/%s/%d", args[0], time.Now().UnixNano()),
		})
		if err != nil {
			return err
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), map[string]any{"name": resp.Name, "index": resp.Index, "tasks": resp.Tasks})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "query %s submitted: %s (index %d)\n", resp.Name, plural(int(resp.Tasks), "task", "tasks"), resp.Index)
		return nil
	})
}

func newQueryListCmd() *cobra.Command {
	return adminCmd(&cobra.Command{
		Use:   "list",
		Short: "List queries",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		resp, err := c.ListQueries(ctx, &pb.ListQueriesRequest{})
		if err != nil {
			return err
		}
		if f.json {
			list := []webui.Query{}
			for _, q := range resp.Queries {
				list = append(list, webui.QueryView(q))
			}
			return printJSON(cmd.OutOrStdout(), list)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "NAME\tSTATUS\tREPLICAS\tMAX DELAY\tTASKS\tRUNNING")
		for _, q := range resp.Queries {
			running := 0
			for _, t := range q.Tasks {
				if t.State == states.TaskRunning {
					running++
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\n", q.Name, q.Status, q.Replicas, q.MaxDelay, len(q.Tasks), running)
		}
		return tw.Flush()
	})
}

func newQueryStatusCmd() *cobra.Command {
	return adminCmd(&cobra.Command{
		Use:   "status NAME",
		Short: "Show a query's tasks, where they run and their state",
		Args:  cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		q, err := c.GetQuery(ctx, &pb.GetQueryRequest{Name: args[0]})
		if err != nil {
			return err
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), webui.QueryView(q))
		}
		view := webui.QueryView(q)
		results := "stable"
		if view.Tentative {
			results = "TENTATIVE (corrections will follow)"
		}
		fmt.Fprintf(cmd.OutOrStdout(), "query %s: %s, replicas %d, max_delay %s", q.Name, q.Status, q.Replicas, q.MaxDelay)
		if q.Replicas > 1 {
			fmt.Fprintf(cmd.OutOrStdout(), ", results %s", results)
		}
		fmt.Fprint(cmd.OutOrStdout(), "\n\n")
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "TASK\tGEN\tWORKER\tADDR\tSTATE\tREPLICA\tMESSAGE")
		sort.Slice(q.Tasks, func(i, j int) bool { return q.Tasks[i].TaskId < q.Tasks[j].TaskId })
		for _, t := range q.Tasks {
			where := orNone(t.WorkerId)
			if t.Org != "" {
				// At a partner org (cross-org migration): its workers are
				// not this org's to name.
				where = "org " + t.Org
			}
			replica := orNone(webui.ReplicaStateName(t.ReplicaState))
			if t.Tentative {
				replica += " (tentative)"
			}
			if t.Lossy {
				replica += " LOSSY"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", t.TaskId, max(t.Generation, 1), where, t.WorkerAddr, t.State, replica, strings.TrimSpace(t.Message))
		}
		return tw.Flush()
	})
}

func newQueryStopCmd() *cobra.Command {
	return adminCmd(&cobra.Command{
		Use:   "stop NAME",
		Short: "Stop a query and release its tasks",
		Args:  cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		if _, err := c.StopQuery(ctx, &pb.StopQueryRequest{Name: args[0], IdempotencyKey: fmt.Sprintf("stop/%s/%d", args[0], time.Now().UnixNano())}); err != nil {
			return err
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), map[string]any{"name": args[0], "status": states.QueryStopped})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "query %s stopped\n", args[0])
		return nil
	})
}
