package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func newOperatorCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "operator", Short: "Operate an org's coordinator cluster"}
	raftCmd := &cobra.Command{Use: "raft", Short: "Inspect and change the Raft configuration (admin)"}
	raftCmd.AddCommand(
		adminCmd(&cobra.Command{
			Use:   "list-peers",
			Short: "List the Raft voters as the coordinator knows them",
			Args:  cobra.NoArgs,
		}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
			resp, err := c.ListRaftPeers(ctx, &pb.ListRaftPeersRequest{})
			if err != nil {
				return fmt.Errorf("list-peers from %s: %w", f.addr, err)
			}
			if f.json {
				peers := []map[string]any{}
				for _, p := range resp.Peers {
					peers = append(peers, map[string]any{"id": p.Id, "addr": p.Addr, "suffrage": p.Suffrage, "leader": p.Id == resp.LeaderId})
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"leader_id": resp.LeaderId, "peers": peers})
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "ID\tRAFT ADDR\tSUFFRAGE\tLEADER")
			for _, p := range resp.Peers {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\n", p.Id, p.Addr, p.Suffrage, p.Id == resp.LeaderId)
			}
			return tw.Flush()
		}),
		adminCmd(&cobra.Command{
			Use:   "remove-peer ID",
			Short: "Remove a coordinator that is gone for good from the Raft configuration",
			Args:  cobra.ExactArgs(1),
		}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
			if _, err := c.RemoveRaftPeer(ctx, &pb.RemoveRaftPeerRequest{Id: args[0]}); err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"removed": args[0]})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s from the raft configuration\n", args[0])
			return nil
		}),
	)
	cmd.AddCommand(raftCmd)
	return cmd
}
