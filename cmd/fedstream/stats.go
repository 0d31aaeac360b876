package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func newQueryStatsCmd() *cobra.Command {
	return adminCmd(&cobra.Command{
		Use:   "stats NAME",
		Short: "Show each task's live throughput, load and backpressure",
		Long: `stats shows, for every task of a query, the figures its worker reported with
its last heartbeat (a few seconds old at most): tuples per second in and out,
the share of time spent processing (busy), tuples waiting in its input queue,
milliseconds per second blocked on a full output buffer (backpressure), its
output buffer's bytes and unacknowledged tuples, and how often its input
subscriptions switched upstream copy. The leader answers (followers forward).`,
		Args: cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		resp, err := c.QueryStats(ctx, &pb.QueryStatsRequest{Query: args[0]})
		if err != nil {
			return err
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), queryStatsJSON(resp))
		}
		return printQueryStats(cmd.OutOrStdout(), resp, time.Now())
	})
}

// queryStatsJSON is the --json shape of query stats (documented in the
// README): the query and one object per task and reporting worker.
func queryStatsJSON(resp *pb.QueryStatsResponse) map[string]any {
	tasks := []map[string]any{}
	for _, t := range resp.Tasks {
		task := map[string]any{
			"task": t.Task, "worker": t.Worker,
			"in_tps": t.InTps, "out_tps": t.OutTps, "busy": t.Busy, "queue": t.Queue,
			"backpressure_ms_per_s": t.BackpressureMsPerS,
			"output_buffer_bytes":   t.OutputBufferBytes, "unacked_tuples": t.UnackedTuples,
			"subscription_switches": t.SubscriptionSwitches, "cpu_seconds_per_s": t.CpuSecondsPerS,
			"reported_at_ms": t.ReportedAtMs,
		}
		tasks = append(tasks, task)
	}
	return map[string]any{"query": resp.Query, "tasks": tasks}
}

func printQueryStats(w io.Writer, resp *pb.QueryStatsResponse, now time.Time) error {
	fmt.Fprintf(w, "query %s\n\n", resp.Query)
	tw := newTable(w)
	fmt.Fprintln(tw, "TASK\tWORKER\tIN/S\tOUT/S\tBUSY\tQUEUE\tBACKPRESSURE\tBUFFER\tUNACKED\tSWITCHES\tAGE")
	for _, t := range resp.Tasks {
		if t.ReportedAtMs == 0 {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\tnot reported yet\n", t.Task, orNone(t.Worker))
			continue
		}
		age := now.Sub(time.UnixMilli(t.ReportedAtMs)).Round(100 * time.Millisecond)
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.0f%%\t%d\t%.0f ms/s\t%s\t%d\t%d\t%s\n", t.Task, t.Worker, t.InTps, t.OutTps,
			100*t.Busy, t.Queue, t.BackpressureMsPerS, bytesText(t.OutputBufferBytes), t.UnackedTuples, t.SubscriptionSwitches, max(age, 0))
	}
	return tw.Flush()
}

// bytesText writes a byte count with a binary unit.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
