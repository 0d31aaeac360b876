package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/coordinator"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke the org's access tokens (admin)",
		Long: `Tokens live in the org's replicated state; only the hash of a secret is
stored. Roles: admin (everything, including tokens), writer (submit and stop
queries, ingest, and everything a reader may), reader (status, workers, query
list and status, tail), auditor (status, and reading and verifying the
federation ledger and contracts; no write), worker (an extra join token for
workers).

The join and admin tokens of the coordinator's configuration keep working:
they bootstrap an org, whose first admin creates the other tokens.`,
	}
	cmd.AddCommand(newTokenCreateCmd(), newTokenListCmd(), newTokenRevokeCmd())
	return cmd
}

func tokenJSON(t *pb.TokenInfo) map[string]any {
	m := map[string]any{"id": t.Id, "role": t.Role, "description": t.Description,
		"created": time.UnixMilli(t.CreatedUnixMs).UTC().Format(time.RFC3339), "expires": nil}
	if t.ExpiresUnixMs > 0 {
		m["expires"] = time.UnixMilli(t.ExpiresUnixMs).UTC().Format(time.RFC3339)
	}
	return m
}

func expiresText(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339)
}

// tokenCmd is serviceCmd for the token service.
func tokenCmd(cmd *cobra.Command, run func(ctx context.Context, c pb.TokenServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error) *cobra.Command {
	return serviceCmd(cmd, pb.NewTokenServiceClient, run)
}

func newTokenCreateCmd() *cobra.Command {
	var (
		role, description string
		ttl               time.Duration
	)
	cmd := tokenCmd(&cobra.Command{
		Use:   "create --role admin|writer|reader|auditor|worker",
		Short: "Create a token and print its secret (shown once)",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c pb.TokenServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		if ttl < 0 {
			return fmt.Errorf("--ttl %s: want a positive duration, or 0 for no expiry", ttl)
		}
		// The secret is drawn here, so a retry with the same idempotency
		// key stores and returns the same token.
		secret, err := coordinator.NewTokenSecret()
		if err != nil {
			return err
		}
		req := &pb.CreateTokenRequest{Role: role, TtlMs: ttl.Milliseconds(), Description: description, Secret: secret,
			IdempotencyKey: fmt.Sprintf("create/%d", time.Now().UnixNano())}
		resp, err := c.CreateToken(ctx, req)
		if err != nil {
			return fmt.Errorf("create token at %s: %w", f.addr, err)
		}
		out := cmd.OutOrStdout()
		if f.json {
			m := tokenJSON(resp.Token)
			m["secret"] = resp.Secret
			return printJSON(out, m)
		}
		fmt.Fprintf(out, "token %s (role %s, expires %s)\nsecret: %s\n\nThe secret is shown only now. Store it in a file readable only by its user\nand pass it with --token-file FILE or FEDSTREAM_TOKEN, not --token (ps shows flags).\n",
			resp.Token.Id, resp.Token.Role, expiresText(resp.Token.ExpiresUnixMs), resp.Secret)
		return nil
	})
	cmd.Flags().StringVar(&role, "role", "", "admin, writer, reader, auditor or worker (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 24h (default: no expiry)")
	cmd.Flags().StringVar(&description, "description", "", "what the token is for")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

func newTokenListCmd() *cobra.Command {
	return tokenCmd(&cobra.Command{
		Use:   "list",
		Short: "List the org's tokens (never their secrets)",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c pb.TokenServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		resp, err := c.ListTokens(ctx, &pb.ListTokensRequest{})
		if err != nil {
			return fmt.Errorf("list tokens at %s: %w", f.addr, err)
		}
		if f.json {
			list := []map[string]any{}
			for _, t := range resp.Tokens {
				list = append(list, tokenJSON(t))
			}
			return printJSON(cmd.OutOrStdout(), list)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "ID\tROLE\tCREATED\tEXPIRES\tDESCRIPTION")
		for _, t := range resp.Tokens {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Id, t.Role, time.UnixMilli(t.CreatedUnixMs).UTC().Format(time.RFC3339), expiresText(t.ExpiresUnixMs), t.Description)
		}
		return tw.Flush()
	})
}

func newTokenRevokeCmd() *cobra.Command {
	return tokenCmd(&cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token: coordinators refuse it at once, workers within 30 s",
		Args:  cobra.ExactArgs(1),
	}, func(ctx context.Context, c pb.TokenServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		_, err := c.RevokeToken(ctx, &pb.RevokeTokenRequest{Id: args[0], IdempotencyKey: fmt.Sprintf("revoke/%s/%d", args[0], time.Now().UnixNano())})
		if err != nil {
			return fmt.Errorf("revoke token at %s: %w", f.addr, err)
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), map[string]any{"id": args[0], "revoked": true})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", args[0])
		return nil
	})
}
