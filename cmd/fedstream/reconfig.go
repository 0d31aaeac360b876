package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func newQueryUpdateCmd() *cobra.Command {
	var strategy, tracking string
	var margin time.Duration
	cmd := serviceCmd(&cobra.Command{
		Use:   "update FILE",
		Short: "Upgrade operators of a running query without stopping it",
		Long: `Submit a new definition of a running query (the whole YAML, with some
operators' definitions changed) as one live reconfiguration plan. Each changed
operator gets a new version; old and new versions run side by side, every tuple
is processed by one consistent set of versions, and old versions are removed
once markers from every upstream instance have arrived. A definition that
cannot be applied live changes nothing. Follow the plan with
'fedstream query versions NAME'.`,
		Args: cobra.ExactArgs(1),
	}, pb.NewReconfigServiceClient, func(ctx context.Context, c pb.ReconfigServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		data, err := os.ReadFile(args[0])
		if err != nil {
			return err
		}
		resp, err := c.UpdateQuery(ctx, &pb.UpdateQueryRequest{
			Yaml: data, Filename: args[0], Strategy: strategy, Tracking: tracking,
			SwitchMarginMs: margin.Milliseconds(),
			IdempotencyKey: fmt.Sprintf("update/%s/%d", args[0], time.Now().UnixNano()),
		})
		if err != nil {
			return err
		}
		if f.json {
			changes := []map[string]any{}
			for _, ch := range resp.Changes {
				changes = append(changes, map[string]any{"operator": ch.Operator, "version": ch.Version})
			}
			return printJSON(cmd.OutOrStdout(), map[string]any{"name": resp.Name, "epoch": resp.Epoch, "changes": changes})
		}
		parts := make([]string, 0, len(resp.Changes))
		for _, ch := range resp.Changes {
			parts = append(parts, fmt.Sprintf("%s v%d", ch.Operator, ch.Version))
		}
		fmt.Fprintf(cmd.OutOrStdout(), "query %s: reconfiguration plan %d committed (%s)\n", resp.Name, resp.Epoch, strings.Join(parts, ", "))
		return nil
	})
	cmd.Flags().StringVar(&strategy, "strategy", "live", "live (versions side by side, no pause) or quiescent (the comparison baseline: the sources pause from when they learn the plan until it has loaded, the stream drained and the versions swapped)")
	cmd.Flags().StringVar(&tracking, "tracking", "", "version tracking: static or dynamic (default: keep the query's, static at first)")
	cmd.Flags().DurationVar(&margin, "switch-margin", 0, "stream time between the highest reported frontier and the sources' switch, and how far a source runs past its acknowledged frontier before it waits for the switch point (default 2s live, none quiescent)")
	return cmd
}

func newQueryVersionsCmd() *cobra.Command {
	return serviceCmd(&cobra.Command{
		Use:   "versions NAME",
		Short: "Show the versions of a query's operators and the progress of its reconfiguration plans",
		Args:  cobra.ExactArgs(1),
	}, pb.NewReconfigServiceClient, func(ctx context.Context, c pb.ReconfigServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		resp, err := c.QueryVersions(ctx, &pb.QueryVersionsRequest{Name: args[0]})
		if err != nil {
			return err
		}
		type version struct {
			Version         int32  `json:"version"`
			Active          bool   `json:"active"`
			Epoch           uint64 `json:"epoch"`
			Tasks           int32  `json:"tasks"`
			TasksAcked      int32  `json:"tasks_acked"`
			MarkersExpected int32  `json:"markers_expected"`
			MarkersSeen     int32  `json:"markers_seen"`
		}
		type operator struct {
			Operator string    `json:"operator"`
			Versions []version `json:"versions"`
		}
		type change struct {
			Operator string `json:"operator"`
			Version  int32  `json:"version"`
		}
		type plan struct {
			Epoch           uint64   `json:"epoch"`
			Phase           string   `json:"phase"`
			Strategy        string   `json:"strategy"`
			Cut             int64    `json:"cut"`
			Changes         []change `json:"changes"`
			Tasks           int32    `json:"tasks"`
			TasksAcked      int32    `json:"tasks_acked"`
			MarkersExpected int32    `json:"markers_expected"`
			MarkersSeen     int32    `json:"markers_seen"`
			MarkersMissing  int32    `json:"markers_missing"`
			Disconnected    []string `json:"disconnected"`
		}
		ops := []operator{}
		for _, o := range resp.Operators {
			op := operator{Operator: o.Operator, Versions: []version{}}
			for _, v := range o.Versions {
				op.Versions = append(op.Versions, version{v.Version, v.Active, v.Epoch, v.Tasks, v.TasksAcked, v.MarkersExpected, v.MarkersSeen})
			}
			ops = append(ops, op)
		}
		plans := []plan{}
		for _, p := range resp.Plans {
			pl := plan{Epoch: p.Epoch, Phase: p.Phase, Strategy: p.Strategy, Cut: p.Cut, Changes: []change{}, Tasks: p.Tasks, TasksAcked: p.TasksAcked,
				MarkersExpected: p.MarkersExpected, MarkersSeen: p.MarkersSeen, MarkersMissing: p.MarkersExpected - p.MarkersSeen, Disconnected: append([]string{}, p.Disconnected...)}
			for _, ch := range p.Changes {
				pl.Changes = append(pl.Changes, change{ch.Operator, ch.Version})
			}
			plans = append(plans, pl)
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), map[string]any{"name": resp.Name, "tracking": resp.Tracking, "operators": ops, "plans": plans})
		}
		out := cmd.OutOrStdout()
		fmt.Fprintf(out, "query %s (version tracking: %s)\n", resp.Name, resp.Tracking)
		tw := newTable(out)
		fmt.Fprintln(tw, "OPERATOR\tVERSION\tACTIVE\tEPOCH\tTASKS ACKED\tMARKERS")
		for _, o := range ops {
			for _, v := range o.Versions {
				fmt.Fprintf(tw, "%s\tv%d\t%v\t%d\t%d/%d\t%d/%d\n", o.Operator, v.Version, v.Active, v.Epoch, v.TasksAcked, v.Tasks, v.MarkersSeen, v.MarkersExpected)
			}
		}
		tw.Flush()
		for _, p := range plans {
			fmt.Fprintf(out, "plan %d: %s, %d/%d tasks acknowledged, %d markers still expected", p.Epoch, p.Phase, p.TasksAcked, p.Tasks, p.MarkersMissing)
			if len(p.Disconnected) > 0 {
				fmt.Fprintf(out, ", waiting for disconnected: %s", strings.Join(p.Disconnected, ", "))
			}
			fmt.Fprintln(out)
		}
		return nil
	})
}
