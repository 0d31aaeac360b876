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
	cmd.AddCommand(newTaskMoveCmd(), newTaskReturnCmd())
	return cmd
}

func newTaskMoveCmd() *cobra.Command {
	var to, toOrg, contract string
	cmd := adminCmd(&cobra.Command{
		Use:   "move TASK --to WORKER | --to-org ORG --contract ID",
		Short: "Move a running task to another worker without stopping its query",
		Long: `Move a running task (an operator, a sink or a source: generator, kafka or
ingest) to another worker while its query runs. The new copy starts from a
snapshot of the old copy's state and positions; downstream tasks switch to it;
the old copy stops once the new one runs. WORKER is a worker id or a unique
worker name. An ingest source's old copy refuses lines from its snapshot on:
fedstream ingest then resends, from the last line each replica acknowledged,
to where the source runs now.

With --to-org ORG --contract ID the task moves to a partner org under that
contract (which must be active, in force, allow this org's tasks to run at
ORG and this task's class, and have room under its max load): the partner
places it on one of its workers, which starts from a snapshot of the running
copy and reads its upstreams here across the orgs' data ports; downstream
tasks switch to it once it has caught up. The command returns when the
partner's copy serves every consumer, or fails after rolling the move back
(the task then still runs here). fedstream task return TASK brings it home.`,
		Args: cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		if toOrg != "" || contract != "" {
			if to != "" || toOrg == "" || contract == "" {
				return errors.New("task move: give --to WORKER, or --to-org ORG with --contract ID")
			}
			resp, err := c.MigrateTask(ctx, &pb.MigrateTaskRequest{TaskId: args[0], ToOrg: toOrg, Contract: contract})
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"task": resp.TaskId, "org": resp.Org, "generation": resp.Generation})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "task %s runs at org %s (generation %d); fedstream task return %s brings it home\n",
				resp.TaskId, resp.Org, resp.Generation, resp.TaskId)
			return nil
		}
		if to == "" {
			return errors.New("task move: --to WORKER (or --to-org ORG --contract ID) is required")
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
	cmd.Flags().StringVar(&toOrg, "to-org", "", "partner org to move the task to (with --contract)")
	cmd.Flags().StringVar(&contract, "contract", "", "id of the contract the move is made under (fedstream contract list)")
	longTimeout(cmd)
	return cmd
}

// longTimeout gives a command that waits for a task to take over at its
// new place (up to the catch-up bound plus the partner timeouts) a
// longer default --timeout; the move rolls back if the call ends first.
func longTimeout(cmd *cobra.Command) {
	if fl := cmd.Flags().Lookup("timeout"); fl != nil {
		_ = fl.Value.Set("90s")
		fl.DefValue = fl.Value.String()
	}
}

func newTaskReturnCmd() *cobra.Command {
	cmd := adminCmd(&cobra.Command{
		Use:   "return TASK",
		Short: "Bring a task running at a partner org back home without stopping its query",
		Long: `Bring a task this org moved to a partner org back to one of this org's
workers while its query runs: the new copy starts from a snapshot of the
partner's copy, downstream tasks switch to it once it has caught up, and the
partner stops its copy.`,
		Args: cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		resp, err := c.ReturnTask(ctx, &pb.ReturnTaskRequest{TaskId: args[0]})
		if err != nil {
			return err
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), map[string]any{"task": resp.TaskId, "worker": resp.WorkerId, "generation": resp.Generation})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "task %s is home on worker %s (generation %d)\n", resp.TaskId, resp.WorkerId, resp.Generation)
		return nil
	})
	longTimeout(cmd)
	return cmd
}
