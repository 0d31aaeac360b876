package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func newTaskCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Act on one running task"}
	cmd.AddCommand(newTaskMoveCmd())
	return cmd
}

func newTaskMoveCmd() *cobra.Command {
	var to string
	cmd := adminCmd(&cobra.Command{
		Use:   "move TASK --to WORKER",
		Short: "Move a running task to another worker without stopping its query",
		Long: `Move a running task (an operator, a sink or a source: generator, kafka or
ingest) to another worker while its query runs. The new copy starts from a
snapshot of the old copy's state and positions; downstream tasks switch to it;
the old copy stops once the new one runs. WORKER is a worker id or a unique
worker name. An ingest source's old copy refuses lines from its snapshot on:
fedstream ingest then resends, from the last line each replica acknowledged,
to where the source runs now.`,
		Args: cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		if to == "" {
			return errors.New("task move: --to WORKER is required")
		}
		resp, err := c.MoveTask(ctx, &pb.MoveTaskRequest{TaskId: args[0], ToWorker: to})
		if err != nil {
			return err
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), map[string]any{"task": resp.TaskId, "from_worker": resp.FromWorker,
				"to_worker": resp.ToWorker, "generation": resp.Generation})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "task %s moving from %s to %s (generation %d); `fedstream query status` shows it running there\n",
			resp.TaskId, resp.FromWorker, resp.ToWorker, resp.Generation)
		return nil
	})
	cmd.Flags().StringVar(&to, "to", "", "worker id or name to move the task to")
	return cmd
}
