package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func newQueryScaleCmd() *cobra.Command {
	var op string
	var parallelism int
	cmd := adminCmd(&cobra.Command{
		Use:   "scale NAME --operator OP --parallelism N",
		Short: "Change the number of partitions of a keyed operator or a generator source while the query runs",
		Long: `Change the number of partitions of a keyed operator (an aggregate with group_by
or a join) of a running query, adding or removing partitions without stopping
it. Slot ranges move between partitions with their state at one cut of the
stream, so the results are the same as without the rescale. Prints the new
slot map (with --json: fragment, epoch, the cut and the slot ranges per
partition).

OP may also be a generator source: at the cut (a stream time), partitions
removed end their stream below it and partitions added start their own
deterministic stream at it; the operators reading the source read the new
partitions from there. A source's map only counts its partitions (its slot
ranges mean nothing). Ingest and kafka sources are refused.`,
		Args: cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.AdminServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		if op == "" {
			return errors.New("query scale: --operator OP is required")
		}
		if parallelism < 1 {
			return errors.New("query scale: --parallelism N (at least 1) is required")
		}
		resp, err := c.ScaleQuery(ctx, &pb.ScaleQueryRequest{Query: args[0], Operator: op, Parallelism: int32(parallelism)})
		if err != nil {
			return err
		}
		type slotRange struct {
			First     uint32 `json:"first"`
			Last      uint32 `json:"last"`
			Partition int32  `json:"partition"`
		}
		byPart := map[int32][]slotRange{}
		ranges := make([]slotRange, 0, len(resp.Ranges))
		for _, r := range resp.Ranges {
			sr := slotRange{First: r.First, Last: r.Last, Partition: r.Partition}
			ranges = append(ranges, sr)
			byPart[r.Partition] = append(byPart[r.Partition], sr)
		}
		if f.json {
			parts := make([]map[string]any, 0, resp.Partitions)
			for p := range resp.Partitions {
				parts = append(parts, map[string]any{"partition": p, "ranges": byPart[p]})
			}
			return printJSON(cmd.OutOrStdout(), map[string]any{"query": resp.Query, "fragment": resp.Fragment,
				"epoch": resp.Epoch, "partitions": resp.Partitions, "cut": resp.Cut, "ranges": ranges, "by_partition": parts})
		}
		writeSlotMap(cmd.OutOrStdout(), resp)
		return nil
	})
	cmd.Flags().StringVar(&op, "operator", "", "the keyed operator or generator source to rescale")
	cmd.Flags().IntVar(&parallelism, "parallelism", 0, "the number of partitions it should have")
	if t := cmd.Flags().Lookup("timeout"); t != nil {
		// A rescale waits for every task involved to reach the cut.
		if err := t.Value.Set("2m"); err == nil {
			t.DefValue = "2m0s"
		}
	}
	return cmd
}

// writeSlotMap prints a rescale's new slot map: its partitions, then the
// slot ranges of each.
func writeSlotMap(w io.Writer, resp *pb.ScaleQueryResponse) {
	byPart := map[int32][]*pb.SlotRange{}
	for _, r := range resp.Ranges {
		byPart[r.Partition] = append(byPart[r.Partition], r)
	}
	fmt.Fprintf(w, "%s/%s: %s, slot map epoch %d\n", resp.Query, resp.Fragment, plural(int(resp.Partitions), "partition", "partitions"), resp.Epoch)
	for p := range resp.Partitions {
		fmt.Fprintf(w, "  partition %d:", p)
		for _, r := range byPart[p] {
			fmt.Fprintf(w, " %d-%d", r.First, r.Last)
		}
		fmt.Fprintln(w)
	}
}
