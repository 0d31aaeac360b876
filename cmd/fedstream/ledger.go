package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation"
	"github.com/fedstream/fedstream/federation/ledger"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// fedCmd completes a client command that calls a coordinator's
// federation API (see serviceCmd).
func fedCmd(cmd *cobra.Command, run func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error) *cobra.Command {
	return serviceCmd(cmd, pb.NewFederationServiceClient, run)
}

func newLedgerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "The org's co-signed, hash-chained federation ledger (auditor tokens may use every subcommand)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newLedgerListCmd(), newLedgerBalanceCmd(), newLedgerExportCmd(), newLedgerVerifyCmd(), newLedgerKeysCmd())
	return cmd
}

func fetchLedger(ctx context.Context, c pb.FederationServiceClient) (string, []ledger.Entry, error) {
	resp, err := c.ListLedger(ctx, &pb.ListLedgerRequest{})
	if err != nil {
		return "", nil, err
	}
	es, err := ledger.UnmarshalEntries(resp.EntriesJson)
	return resp.Org, es, err
}

// parseSince reads an RFC 3339 time or a duration back from now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-05-01T09:00:00Z) or a duration back from now (24h)", s)
}

func newLedgerListCmd() *cobra.Command {
	var partner, since string
	cmd := &cobra.Command{
		Use:   "list [--partner ORG] [--since TIME]",
		Short: "List ledger entries",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().StringVar(&partner, "partner", "", "only entries naming this org")
	cmd.Flags().StringVar(&since, "since", "", "only entries at or after this time (RFC 3339, or a duration back from now such as 24h)")
	return fedCmd(cmd, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		from, err := parseSince(since, time.Now())
		if err != nil {
			return err
		}
		_, es, err := fetchLedger(ctx, c)
		if err != nil {
			return err
		}
		out := filterEntries(es, partner, from)
		if f.json {
			return printJSON(cmd.OutOrStdout(), out)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tID\tCONTRACT\tA\tB\tDETAILS\tHASH")
		for _, e := range out {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.12s\n", e.Seq, e.Record.Time.UTC().Format(time.RFC3339), e.Record.Kind, e.Record.ID,
				orNone(e.Record.Contract), e.Record.A, orNone(e.Record.B), details(e.Record.Fields), e.Hash)
		}
		return tw.Flush()
	})
}

// filterEntries keeps the entries naming partner (as A or B; "" keeps
// all) at or after from (zero keeps all). Never nil, so --json prints [].
func filterEntries(es []ledger.Entry, partner string, from time.Time) []ledger.Entry {
	out := []ledger.Entry{}
	for _, e := range es {
		if partner != "" && e.Record.A != partner && e.Record.B != partner {
			continue
		}
		if !from.IsZero() && e.Record.Time.Before(from) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// caFingerprint is "sha256:" and the first 16 hex digits of the SHA-256
// of a PEM certificate's DER (the PEM itself when it does not parse).
func caFingerprint(p string) string {
	block, _ := pem.Decode([]byte(p))
	if block == nil {
		return p
	}
	sum := sha256.Sum256(block.Bytes)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

func details(f map[string]string) string {
	keys := make([]string, 0, len(f))
	for k := range f {
		if k == ledger.FieldKey {
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := f[k]
		if k == federation.FieldCA {
			// A pinned CA certificate is shown by its fingerprint; the
			// JSON and the export hold the PEM.
			v = caFingerprint(v)
		}
		parts = append(parts, k+"="+v)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// balanceRow is what the org and one partner owe each other from the
// settlement entries (each names A as the payer and B as the payee, with
// an "amount" field).
type balanceRow struct {
	Partner       string  `json:"partner"`
	OwedByPartner float64 `json:"owed_by_partner"`
	OwedToPartner float64 `json:"owed_to_partner"`
	Net           float64 `json:"net"` // positive: the partner owes this org
	Settlements   int     `json:"settlements"`
}

func balances(org string, es []ledger.Entry) ([]balanceRow, error) {
	rows := map[string]*balanceRow{}
	row := func(p string) *balanceRow {
		if rows[p] == nil {
			rows[p] = &balanceRow{Partner: p}
		}
		return rows[p]
	}
	for _, e := range es {
		r := e.Record
		if r.Kind != ledger.KindSettlement {
			continue
		}
		amt, err := strconv.ParseFloat(r.Fields["amount"], 64)
		if err != nil {
			return nil, fmt.Errorf("settlement %s (entry %d): amount %q: %v", r.ID, e.Seq, r.Fields["amount"], err)
		}
		switch org {
		case r.A:
			b := row(r.B)
			b.OwedToPartner += amt
			b.Settlements++
		case r.B:
			b := row(r.A)
			b.OwedByPartner += amt
			b.Settlements++
		}
	}
	out := make([]balanceRow, 0, len(rows))
	for _, r := range rows {
		r.Net = r.OwedByPartner - r.OwedToPartner
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partner < out[j].Partner })
	return out, nil
}

func newLedgerBalanceCmd() *cobra.Command {
	return fedCmd(&cobra.Command{
		Use:   "balance",
		Short: "What each partner owes this org and this org owes it, from the settlements",
		Args:  cobra.NoArgs,
	}, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		org, es, err := fetchLedger(ctx, c)
		if err != nil {
			return err
		}
		rows, err := balances(org, es)
		if err != nil {
			return err
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), rows)
		}
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "PARTNER\tOWES "+org+"\t"+org+" OWES\tNET\tSETTLEMENTS")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%.6g\t%.6g\t%.6g\t%d\n", r.Partner, r.OwedByPartner, r.OwedToPartner, r.Net, r.Settlements)
		}
		return tw.Flush()
	})
}

func newLedgerExportCmd() *cobra.Command {
	return fedCmd(&cobra.Command{
		Use:     "export",
		Short:   "Write the whole ledger as JSON to stdout, for offline verification",
		Example: "  fedstream ledger export > ledger.json\n  fedstream ledger verify --file ledger.json --keys keys/",
		Args:    cobra.NoArgs,
	}, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		resp, err := c.ListLedger(ctx, &pb.ListLedgerRequest{})
		if err != nil {
			return err
		}
		_, err = cmd.OutOrStdout().Write(append(resp.EntriesJson, '\n'))
		return err
	})
}

func newLedgerKeysCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "keys [--out DIR]",
		Short: "The public signing keys this org's ledger records (its own and the partners' it pinned)",
		Long: `Prints (or writes as DIR/ORG.pub files, the form ledger verify --keys reads) the
public keys the org's ledger records: its own identity and the partner keys it
pinned. An auditor should not take these on the org's word alone: compare each
key with the one its org publishes before verifying with it.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&out, "out", "", "write ORG.pub files into this directory")
	return fedCmd(cmd, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		_, es, err := fetchLedger(ctx, c)
		if err != nil {
			return err
		}
		keys := ledger.Keyring{}
		for _, e := range es {
			var org string
			switch e.Record.Kind {
			case ledger.KindIdentity:
				org = e.Record.A
			case ledger.KindPin:
				org = e.Record.B
			default:
				continue
			}
			k, err := ledger.DecodePublicKey(e.Record.Fields[ledger.FieldKey])
			if err != nil {
				return fmt.Errorf("entry %d: %w", e.Seq, err)
			}
			keys[org] = k
		}
		if out != "" {
			return ledger.WriteKeyDir(out, keys)
		}
		m := map[string]string{}
		for org, k := range keys {
			m[org] = ledger.EncodePublicKey(k)
		}
		if f.json {
			return printJSON(cmd.OutOrStdout(), m)
		}
		orgs := make([]string, 0, len(m))
		for o := range m {
			orgs = append(orgs, o)
		}
		sort.Strings(orgs)
		tw := newTable(cmd.OutOrStdout())
		fmt.Fprintln(tw, "ORG\tPUBLIC KEY")
		for _, o := range orgs {
			fmt.Fprintf(tw, "%s\t%s\n", o, m[o])
		}
		return tw.Flush()
	})
}

// errLedgerInvalid makes `ledger verify` exit non-zero.
var errLedgerInvalid = errors.New("ledger verification failed")

func newLedgerVerifyCmd() *cobra.Command {
	var file, keysDir string
	cmd := &cobra.Command{
		Use:   "verify [--file F --keys DIR]",
		Short: "Recompute the chain and every signature; name the first bad entry and exit non-zero",
		Long: `Without --file: with --keys, fetches the ledger from the coordinator and verifies
it here with those keys; without --keys, the coordinator verifies it with the keys
the ledger itself records (the org's own key and its pinned partner keys).

With --file (a 'ledger export'), works offline: needs --keys, a directory of
ORG.pub files (PEM public keys) for the org whose ledger it is and for every
partner it names, and trusts nothing else.

Prints {"entries", "valid", "first_bad", "reason"} with --json; first_bad is
the seq of the first entry that fails, or null. Exits 1 when the ledger does
not verify.`,
		Example: "  fedstream ledger verify --file ledger.json --keys keys/ --json",
		Args:    cobra.NoArgs,
	}
	cmd.Flags().StringVar(&file, "file", "", "verify this export offline (no coordinator)")
	cmd.Flags().StringVar(&keysDir, "keys", "", "directory of ORG.pub public keys")
	var asJSON bool
	f := &clientFlags{}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var es []ledger.Entry
		var keys ledger.Keyring
		if keysDir != "" {
			k, err := ledger.LoadKeyDir(keysDir)
			if err != nil {
				return err
			}
			keys = k
		}
		if file != "" {
			if keys == nil {
				return fmt.Errorf("--file needs --keys: offline verification trusts only the public keys you give it")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if es, err = ledger.UnmarshalEntries(data); err != nil {
				return err
			}
		} else {
			if err := f.resolveToken(); err != nil {
				return err
			}
			conn, err := f.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			defer cancel()
			c := pb.NewFederationServiceClient(conn)
			if keys == nil {
				resp, err := c.VerifyLedger(ctx, &pb.VerifyLedgerRequest{})
				if err != nil {
					return err
				}
				var rep ledger.Report
				if err := json.Unmarshal(resp.ReportJson, &rep); err != nil {
					return fmt.Errorf("read verification report: %w", err)
				}
				return printReport(cmd, rep, asJSON || f.json)
			}
			if _, es, err = fetchLedger(ctx, c); err != nil {
				return err
			}
		}
		return printReport(cmd, ledger.Verify(es, keys), asJSON || f.json)
	}
	// Only the connection flags; --json is shared.
	cmd.Flags().StringVar(&f.addr, "addr", envOr("FEDSTREAM_ADDR", "127.0.0.1:7400"), "coordinator gRPC address (env FEDSTREAM_ADDR), without --file")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", os.Getenv("FEDSTREAM_TOKEN_FILE"), "file holding the access token (env FEDSTREAM_TOKEN_FILE); or set FEDSTREAM_TOKEN")
	cmd.Flags().StringVar(&f.token, "token", "", "access token (visible in ps: prefer --token-file or FEDSTREAM_TOKEN)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 15*time.Second, "how long to wait for the coordinator")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	f.tls.register(cmd)
	return cmd
}

func printReport(cmd *cobra.Command, rep ledger.Report, asJSON bool) error {
	if asJSON {
		if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
			return err
		}
	} else if rep.Valid {
		fmt.Fprintf(cmd.OutOrStdout(), "valid: %s, every hash, link and signature checks\n", plural(int(rep.Entries), "entry", "entries"))
	}
	if !rep.Valid {
		return &exitError{code: 1, err: fmt.Errorf("%w: %s", errLedgerInvalid, rep.Reason)}
	}
	return nil
}

func newContractCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "contract",
		Short: "Propose, answer, list and end load-sharing contracts with partner orgs",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newContractProposeCmd(), newContractAnswerCmd(true), newContractAnswerCmd(false), newContractListCmd(),
		newContractShowCmd(), newContractTerminateCmd(), newContractPinCmd())
	return cmd
}

func newContractProposeCmd() *cobra.Command {
	var req pb.ProposeContractRequest
	var validFor, notice time.Duration
	cmd := &cobra.Command{
		Use:     "propose --to ORG --price-min P --price-max P --max-load L --valid-for D [--direction out|in|both] [--tasks CLASS,...] [--notice D]",
		Short:   "Propose a contract to a partner org (admin)",
		Example: "  fedstream contract propose --to beta --price-min 12.8 --price-max 69 --max-load 8 --valid-for 720h --direction out --notice 5m",
		Args:    cobra.NoArgs,
	}
	fl := cmd.Flags()
	fl.StringVar(&req.To, "to", "", "partner org (required)")
	fl.Float64Var(&req.PriceMin, "price-min", 0, "lowest price per load unit per second")
	fl.Float64Var(&req.PriceMax, "price-max", 0, "highest price per load unit per second")
	fl.Float64Var(&req.MaxLoad, "max-load", 0, "most load (CPU seconds per second) either party hosts for the other")
	fl.DurationVar(&validFor, "valid-for", 0, "how long the contract is in force, from now")
	fl.StringVar(&req.Direction, "direction", "both", "which way load may move: out (ours to them), in (theirs to us) or both")
	fl.StringSliceVar(&req.Tasks, "tasks", nil, "task classes that may move (default: all)")
	fl.DurationVar(&notice, "notice", 0, "notice before a moved task is taken back")
	fl.StringVar(&req.RequestId, "request-id", "", "an id of this proposal, to give again when retrying it after an unclear answer (Unavailable: the proposal may have been stored): a retry then stores no second proposal; default: a new id")
	for _, n := range []string{"to", "price-min", "price-max", "max-load", "valid-for"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return fedCmd(cmd, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
		req.ValidForMs, req.NoticeMs = validFor.Milliseconds(), notice.Milliseconds()
		if req.RequestId == "" {
			req.RequestId = fmt.Sprintf("propose/%s/%d", req.To, time.Now().UnixNano())
		}
		resp, err := c.ProposeContract(ctx, &req)
		if err != nil {
			if status.Code(err) == codes.Unavailable {
				return fmt.Errorf("%w (retry with --request-id %s: a proposal stored before is then answered, not made twice)", err, req.RequestId)
			}
			return err
		}
		return printContract(cmd, f, resp.ContractJson)
	})
}

func newContractAnswerCmd(accept bool) *cobra.Command {
	use, short := "accept ID", "Accept a contract a partner proposed: sign it, pin its key, record it in both ledgers (admin)"
	if !accept {
		use, short = "reject ID [--reason TEXT]", "Reject a contract a partner proposed (admin)"
	}
	var reason string
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.ExactArgs(1)}
	if !accept {
		cmd.Flags().StringVar(&reason, "reason", "", "why, for the proposer")
	}
	return fedCmd(cmd, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		resp, err := c.AnswerContract(ctx, &pb.AnswerContractRequest{Id: args[0], Accept: accept, Reason: reason})
		if err != nil {
			return err
		}
		return printContract(cmd, f, resp.ContractJson)
	})
}

func newContractTerminateCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{Use: "terminate ID [--reason TEXT]", Short: "End an active contract; both orgs sign and record it (admin)", Args: cobra.ExactArgs(1)}
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded in the ledger")
	return fedCmd(cmd, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		resp, err := c.TerminateContract(ctx, &pb.TerminateContractRequest{Id: args[0], Reason: reason})
		if err != nil {
			return err
		}
		return printContract(cmd, f, resp.ContractJson)
	})
}

func newContractPinCmd() *cobra.Command {
	var caFile string
	cmd := fedCmd(&cobra.Command{
		Use:   "pin ORG KEY [--ca CA.pem]",
		Short: "Pin a partner org's public signing key (base64, as 'ledger keys' prints it) and CA certificate before the first proposal (admin)",
		Long: `pin records a partner's public signing key and, with --ca, its CA certificate
(the partner's ca.pem) in this org's ledger. Both operators pin each other,
having exchanged these out of band, before the first proposal: the cross-org
port admits only coordinators whose certificate the pinned CA signed, and a
proposal is signed with the pinned key. A pin is never replaced.`,
		Args: cobra.ExactArgs(2),
	}, func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
		var caPEM []byte
		if caFile != "" {
			var err error
			if caPEM, err = os.ReadFile(caFile); err != nil {
				return fmt.Errorf("--ca: %w", err)
			}
		}
		if _, err := c.PinKey(ctx, &pb.PinKeyRequest{Org: args[0], Key: args[1], CaPem: caPEM}); err != nil {
			return err
		}
		what := "key"
		if caPEM != nil {
			what = "key and CA"
		}
		fmt.Fprintf(cmd.OutOrStdout(), "pinned %s's %s\n", args[0], what)
		return nil
	})
	cmd.Flags().StringVar(&caFile, "ca", "", "the partner's CA certificate (its ca.pem), for cross-org mutual TLS")
	return cmd
}

func listContracts(ctx context.Context, c pb.FederationServiceClient) ([]federation.ContractDoc, error) {
	resp, err := c.ListContracts(ctx, &pb.ListContractsRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]federation.ContractDoc, 0, len(resp.ContractsJson))
	for _, b := range resp.ContractsJson {
		var d federation.ContractDoc
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("read contract: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
}

func newContractListCmd() *cobra.Command {
	return fedCmd(&cobra.Command{Use: "list", Short: "List contracts", Args: cobra.NoArgs},
		func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, _ []string) error {
			cs, err := listContracts(ctx, c)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), cs)
			}
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintln(tw, "ID\tSTATUS\tPROPOSER\tPARTNER\tPRICE\tMAX LOAD\tDIRECTION\tVALID UNTIL")
			for _, d := range cs {
				t := d.Terms
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t[%g, %g]\t%g\t%s\t%s\n", t.ID, d.Status, t.Proposer, t.Partner, t.PriceMin, t.PriceMax, t.MaxLoad, t.Direction, t.NotAfter.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		})
}

func newContractShowCmd() *cobra.Command {
	return fedCmd(&cobra.Command{Use: "show ID", Short: "Show one contract with its terms and signatures", Args: cobra.ExactArgs(1)},
		func(ctx context.Context, c pb.FederationServiceClient, f *clientFlags, cmd *cobra.Command, args []string) error {
			cs, err := listContracts(ctx, c)
			if err != nil {
				return err
			}
			for _, d := range cs {
				if d.Terms.ID == args[0] {
					return printJSON(cmd.OutOrStdout(), d)
				}
			}
			return fmt.Errorf("%w: %q", federation.ErrNoContract, args[0])
		})
}

func printContract(cmd *cobra.Command, f *clientFlags, data []byte) error {
	var d federation.ContractDoc
	if err := json.Unmarshal(data, &d); err != nil {
		return fmt.Errorf("read contract: %w", err)
	}
	if f.json {
		return printJSON(cmd.OutOrStdout(), d)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "contract %s: %s (%s -> %s, price [%g, %g], max load %g, until %s)\n", d.Terms.ID, d.Status,
		d.Terms.Proposer, d.Terms.Partner, d.Terms.PriceMin, d.Terms.PriceMax, d.Terms.MaxLoad, d.Terms.NotAfter.UTC().Format(time.RFC3339))
	return nil
}
