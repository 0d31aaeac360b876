package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// healthCmd completes a client command that calls a coordinator's
// HealthService (see serviceCmd).
func healthCmd(cmd *cobra.Command, run func(ctx context.Context, c pb.HealthServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error) *cobra.Command {
	return serviceCmd(cmd, pb.NewHealthServiceClient, run)
}

func newHealthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "health",
		Short: "The health manager's action log and blacklist (self-regulation)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newHealthActionsCmd(), newHealthBlacklistCmd())
	return cmd
}

// healthActionJSON is one entry of `fedstream health actions --json`.
type healthActionJSON struct {
	ID              string `json:"id"`
	Query           string `json:"query"`
	Fragment        string `json:"fragment"`
	Diagnosis       string `json:"diagnosis"`
	Action          string `json:"action"`
	Symptoms        string `json:"symptoms"`
	Detail          string `json:"detail"`
	At              string `json:"at"`
	FromParallelism int32  `json:"from_parallelism,omitempty"`
	ToParallelism   int32  `json:"to_parallelism,omitempty"`
	// Metrics are the figures behind the diagnosis, as logged (JSON).
	Metrics       rawJSON `json:"metrics,omitempty"`
	Outcome       string  `json:"outcome"`
	OutcomeDetail string  `json:"outcome_detail,omitempty"`
	EvaluatedAt   string  `json:"evaluated_at,omitempty"`
}

// rawJSON embeds logged JSON text as it is (null when empty).
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) {
	if r == "" {
		return []byte("null"), nil
	}
	return []byte(r), nil
}

func msTime(ms int64) string {
	if ms == 0 {
		return ""
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
}

func newHealthActionsCmd() *cobra.Command {
	var query string
	cmd := &cobra.Command{
		Use:   "actions [--query NAME] [--json]",
		Short: "List the health manager's actions: diagnosis, action, the figures behind it and its evaluated outcome",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().StringVar(&query, "query", "", "only this query's actions")
	return healthCmd(cmd, func(ctx context.Context, c pb.HealthServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		resp, err := c.Actions(ctx, &pb.HealthActionsRequest{Query: query})
		if err != nil {
			return err
		}
		if f.json {
			out := []healthActionJSON{}
			for _, a := range resp.Actions {
				out = append(out, healthActionJSON{ID: a.Id, Query: a.Query, Fragment: a.Fragment, Diagnosis: a.Diagnosis, Action: a.Action,
					Symptoms: a.Symptoms, Detail: a.Detail, At: msTime(a.AtMs), FromParallelism: a.FromParallelism, ToParallelism: a.ToParallelism,
					Metrics: rawJSON(a.Metrics), Outcome: a.Outcome, OutcomeDetail: a.OutcomeDetail, EvaluatedAt: msTime(a.EvaluatedAtMs)})
			}
			return printJSON(cmd.OutOrStdout(), out)
		}
		if len(resp.Actions) == 0 {
			fmt.Fprintln(cmd.OutOrStdout(), "no health actions yet")
			return nil
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "AT\tQUERY\tFRAGMENT\tDIAGNOSIS\tACTION\tPARALLELISM\tOUTCOME\tDETAIL")
		for _, a := range resp.Actions {
			par := ""
			if a.ToParallelism > 0 {
				par = fmt.Sprintf("%d -> %d", a.FromParallelism, a.ToParallelism)
			}
			detail := a.Detail
			if a.OutcomeDetail != "" {
				detail += "; outcome: " + a.OutcomeDetail
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", time.UnixMilli(a.AtMs).UTC().Format("15:04:05"), a.Query, a.Fragment,
				a.Diagnosis, a.Action, par, a.Outcome, strings.ReplaceAll(detail, "\t", " "))
		}
		return tw.Flush()
	})
}

func newHealthBlacklistCmd() *cobra.Command {
	var query string
	cmd := &cobra.Command{
		Use:   "blacklist [--query NAME] [--json]",
		Short: "List each diagnosis/action pair with evaluated actions, and whether it is blacklisted",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().StringVar(&query, "query", "", "only this query's pairs")
	return healthCmd(cmd, func(ctx context.Context, c pb.HealthServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		resp, err := c.Blacklist(ctx, &pb.HealthBlacklistRequest{Query: query})
		if err != nil {
			return err
		}
		if f.json {
			type pair struct {
				Query       string `json:"query"`
				Operator    string `json:"operator"`
				Diagnosis   string `json:"diagnosis"`
				Action      string `json:"action"`
				Evaluated   int32  `json:"evaluated"`
				Failed      int32  `json:"failed"`
				Blacklisted bool   `json:"blacklisted"`
			}
			out := struct {
				FailureRatio float64 `json:"failure_ratio"`
				MinEvaluated int32   `json:"min_evaluated"`
				Pairs        []pair  `json:"pairs"`
			}{FailureRatio: resp.FailureRatio, MinEvaluated: resp.MinEvaluated, Pairs: []pair{}}
			for _, p := range resp.Pairs {
				q, op := pairScope(p.Query)
				out.Pairs = append(out.Pairs, pair{q, op, p.Diagnosis, p.Action, p.Evaluated, p.Failed, p.Blacklisted})
			}
			return printJSON(cmd.OutOrStdout(), out)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "a pair is blacklisted once %d or more of its actions were evaluated and at least %.0f%% of them failed\n",
			resp.MinEvaluated, resp.FailureRatio*100)
		if len(resp.Pairs) == 0 {
			fmt.Fprintln(cmd.OutOrStdout(), "no evaluated actions yet")
			return nil
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "QUERY\tOPERATOR\tDIAGNOSIS\tACTION\tEVALUATED\tFAILED\tBLACKLISTED")
		for _, p := range resp.Pairs {
			q, op := pairScope(p.Query)
			if op == "" {
				op = "*"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%v\n", q, op, p.Diagnosis, p.Action, p.Evaluated, p.Failed, p.Blacklisted)
		}
		return tw.Flush()
	})
}

// pairScope splits a blacklist pair's scope, "query/operator", into its
// query and operator; a query-wide pair (an action logged without an
// operator) has operator "".
func pairScope(scope string) (query, operator string) {
	query, operator, _ = strings.Cut(scope, "/")
	return query, operator
}
