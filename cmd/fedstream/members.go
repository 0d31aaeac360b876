package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// memberJSON is one row of `fedstream members --json`.
type memberJSON struct {
	Org    string `json:"org"`
	Node   string `json:"node"`
	Addr   string `json:"addr"`
	Status string `json:"status"`
	Leader bool   `json:"leader"`
	Build  string `json:"build,omitempty"`
	Proto  string `json:"proto,omitempty"`
}

func newMembersCmd() *cobra.Command {
	f := &clientFlags{}
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List every org's coordinators in the federation pool, with their health and leader (serf's view)",
		Long: `members asks one coordinator for the federation pool as its gossip sees it:
every org's coordinators, their cross-org address, their status (alive, failed,
left) and which one leads its org. A crashed or partitioned org shows failed
within the gossip failure-detection time. This is discovery, not authority:
contracts and pinned partners live in each org's Raft state.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := f.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			resp, err := pb.NewFederationPeerServiceClient(conn).Members(ctx, &pb.FederationMembersRequest{})
			if err != nil {
				return fmt.Errorf("members from %s: %w", f.addr, err)
			}
			out := cmd.OutOrStdout()
			if f.json {
				rows := make([]memberJSON, 0, len(resp.Members))
				for _, m := range resp.Members {
					rows = append(rows, memberJSON{Org: m.Org, Node: m.Node, Addr: m.Addr, Status: m.Status, Leader: m.Leader, Build: m.Build, Proto: m.Proto})
				}
				return printJSON(out, rows)
			}
			tw := newTable(out)
			fmt.Fprintln(tw, "ORG\tNODE\tADDR\tSTATUS\tLEADER")
			for _, m := range resp.Members {
				lead := ""
				if m.Leader {
					lead = "leader"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Org, m.Node, m.Addr, m.Status, lead)
			}
			return tw.Flush()
		},
	}
	f.register(cmd)
	return cmd
}
