package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/federation/loadmgr"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func newLoadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Show the org's load, capacity and marginal cost, and the tasks at partners or hosted for them",
		Long: `load asks the org's leader for its load manager's view: the load (CPU seconds per
second of every task on its workers, partners' tasks included, smoothed), the
capacity T (ready workers' cores x target utilisation), the marginal cost at
that load, this org's tasks at partners (with the contract, price, and the end
of any return notice), partners' tasks hosted here, and what the last load
period decided. --json prints the same as one object.`,
		Args: cobra.NoArgs,
	}
	return serviceCmd(cmd, pb.NewLoadServiceClient, func(ctx context.Context, c pb.LoadServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		resp, err := c.LoadStatus(ctx, &pb.LoadStatusRequest{})
		if err != nil {
			return fmt.Errorf("load from %s: %w", f.addr, err)
		}
		if !resp.Enabled {
			return fmt.Errorf("%s is in no federation (federation.bind is not set): it runs no load manager", f.addr)
		}
		var st loadmgr.Status
		if err := json.Unmarshal(resp.StatusJson, &st); err != nil {
			return fmt.Errorf("load status: %w", err)
		}
		out := cmd.OutOrStdout()
		if f.json {
			return printJSON(out, st)
		}
		return printLoad(out, st)
	})
}

func printLoad(out io.Writer, st loadmgr.Status) error {
	share := 0.0
	if st.Capacity > 0 {
		share = st.Load / st.Capacity
	}
	fmt.Fprintf(out, "org %s: load %.3f (measured %.3f) of capacity %.3f (%.0f%%; %g cores x %g), marginal cost %.4g\n",
		st.Org, st.Load, st.Measured, st.Capacity, 100*share, st.Cores, st.Utilisation, st.MarginalCost)
	fmt.Fprintf(out, "recorded by this leader: %d moves, %d returns, %d settlements; reserved for partners %.3f\n", st.Moves, st.Returns, st.Settlements, st.Reserved)
	for _, part := range []struct {
		title string
		ps    []loadmgr.Placement
		who   func(loadmgr.Placement) string
	}{
		{"AT PARTNERS", st.Out, func(p loadmgr.Placement) string { return p.Host }},
		{"HOSTED FOR PARTNERS", st.In, func(p loadmgr.Placement) string { return p.Owner }},
	} {
		if len(part.ps) == 0 {
			continue
		}
		fmt.Fprintln(out)
		tw := newTable(out)
		fmt.Fprintf(tw, "%s\tORG\tCONTRACT\tLOAD\tPRICE\tSINCE\tRETURNING AT\n", part.title)
		for _, p := range part.ps {
			ret := ""
			if !p.ReturningAt.IsZero() {
				ret = p.ReturningAt.Local().Format(time.TimeOnly)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%.4g\t%s\t%s\n", p.Task, part.who(p), p.Contract, p.Load, p.Price, p.Since.Local().Format(time.TimeOnly), ret)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(st.Last) > 0 {
		fmt.Fprintln(out, "\nlast period:")
		for _, l := range st.Last {
			fmt.Fprintln(out, "  "+l)
		}
	}
	return nil
}
