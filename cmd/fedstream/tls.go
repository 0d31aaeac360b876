package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fedstream/fedstream/config"
	"github.com/fedstream/fedstream/rpc"
	"github.com/fedstream/fedstream/rpc/tlsutil"
)

// defaultClientName is the name of the CLI's client certificate.
const defaultClientName = "admin"

func newTLSCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "tls", Short: "Create an org's certificate authority and certificates"}
	var (
		org, out     string
		coordinators []string
		clients      []string
		hosts        []string
		asJSON       bool
	)
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create an org CA and the coordinator and client certificates",
		Long: `init writes into --out an org CA (ca.pem, ca-key.pem), a certificate and key for
every coordinator node id (coordinator-ID.pem, coordinator-ID-key.pem) and for
every client name (client-NAME.pem, client-NAME-key.pem; the CLI uses
client-admin by default). Keys are written 0600. Workers need only ca.pem: the
coordinators sign a short-lived certificate for each worker when it registers.
Coordinators need ca-key.pem for that. It refuses to overwrite an existing CA.`,
		Example: "  fedstream tls init --org acme --out examples/org/tls\n  fedstream tls init --org acme --out /etc/fedstream/tls --coordinators c1,c2,c3 --hosts 10.0.0.5,c1.acme.internal",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if org == "" || out == "" {
				return errors.New("--org and --out are required")
			}
			files, err := tlsutil.InitDir(out, tlsutil.InitOptions{Org: org, Coordinators: coordinators, Clients: clients, Hosts: hosts})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]any{"org": org, "dir": out, "files": files})
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "org %s: CA and certificates written to %s\n", org, out)
			for _, f := range files {
				fmt.Fprintf(w, "  %-60s %s %s\n", f.Path, f.Kind, f.Identity)
			}
			fmt.Fprintf(w, "keep %s secret: it signs certificates for the whole org (coordinators need it to sign worker certificates)\n", filepath.Join(out, tlsutil.CAKeyFile))
			return nil
		},
	}
	initCmd.Flags().StringVar(&org, "org", "", "organization name (required)")
	initCmd.Flags().StringVar(&out, "out", "", "directory to write into (created 0700; required)")
	initCmd.Flags().StringSliceVar(&coordinators, "coordinators", []string{"c1", "c2", "c3"}, "coordinator node ids to issue certificates for")
	initCmd.Flags().StringSliceVar(&clients, "clients", []string{defaultClientName}, "client certificate names (the CLI uses "+defaultClientName+")")
	initCmd.Flags().StringSliceVar(&hosts, "hosts", []string{"127.0.0.1", "localhost"}, "host names and IP addresses of the coordinators (certificate SANs)")
	initCmd.Flags().BoolVar(&asJSON, "json", false, "print the files written as JSON")
	cmd.AddCommand(initCmd)
	return cmd
}

// coordinatorTLS loads a coordinator's credentials and, when available,
// the CA key it signs worker certificates with. Both are nil in plaintext.
func coordinatorTLS(c *config.Coordinator) (*tlsutil.Credentials, *tlsutil.CA, error) {
	if c.TLS.InsecurePlaintext {
		return nil, nil, nil
	}
	caFile, certFile, keyFile := tlsutil.Paths(c.TLS.Dir, c.TLS.CA, c.TLS.Cert, c.TLS.Key, rpc.RoleCoordinator, c.NodeID)
	if caFile == "" || certFile == "" || keyFile == "" {
		return nil, nil, errors.New("TLS is required: give --tls-dir (see fedstream tls init) or --tls-ca, --tls-cert and --tls-key; --insecure-plaintext runs without TLS")
	}
	creds, err := tlsutil.Load(caFile, certFile, keyFile)
	if err != nil {
		return nil, nil, err
	}
	caKey := c.TLSCAKey
	if caKey == "" && c.TLS.Dir != "" {
		if p := filepath.Join(c.TLS.Dir, tlsutil.CAKeyFile); fileExists(p) {
			caKey = p
		}
	}
	if caKey == "" {
		return creds, nil, nil
	}
	ca, err := tlsutil.LoadCA(caFile, caKey)
	if err != nil {
		return nil, nil, err
	}
	return creds, ca, nil
}

// workerTLS loads the org CA a worker verifies its coordinators with.
func workerTLS(c *config.Worker) (*tlsutil.Credentials, error) {
	if c.TLS.InsecurePlaintext {
		return nil, nil
	}
	caFile, _, _ := tlsutil.Paths(c.TLS.Dir, c.TLS.CA, "", "", "", "")
	if caFile == "" {
		return nil, errors.New("TLS is required: give --tls-ca (the org's ca.pem) or --tls-dir; --insecure-plaintext runs without TLS")
	}
	return tlsutil.Load(caFile, "", "")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// clientTLS are the TLS flags of the client commands.
type clientTLS struct {
	dir, ca, cert, key string
	insecure           bool
	creds              *tlsutil.Credentials
}

func (t *clientTLS) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&t.dir, "tls-dir", os.Getenv("FEDSTREAM_TLS_DIR"), "directory from fedstream tls init: ca.pem and client-"+defaultClientName+".pem (env FEDSTREAM_TLS_DIR)")
	fl.StringVar(&t.ca, "tls-ca", os.Getenv("FEDSTREAM_TLS_CA"), "org CA certificate (env FEDSTREAM_TLS_CA)")
	fl.StringVar(&t.cert, "tls-cert", os.Getenv("FEDSTREAM_TLS_CERT"), "client certificate (env FEDSTREAM_TLS_CERT)")
	fl.StringVar(&t.key, "tls-key", os.Getenv("FEDSTREAM_TLS_KEY"), "client key (env FEDSTREAM_TLS_KEY)")
	fl.BoolVar(&t.insecure, "insecure-plaintext", os.Getenv("FEDSTREAM_INSECURE_PLAINTEXT") == "1", "talk to an org running WITHOUT TLS")
}

// dialOption is the transport credential for a server of role.
func (t *clientTLS) dialOption(roles ...string) ([]grpc.DialOption, error) {
	if t.insecure {
		return nil, nil
	}
	if t.creds == nil {
		caFile, certFile, keyFile := tlsutil.Paths(t.dir, t.ca, t.cert, t.key, rpc.RoleClient, defaultClientName)
		if caFile == "" || certFile == "" || keyFile == "" {
			return nil, errors.New("TLS is required: give --tls-dir (or FEDSTREAM_TLS_DIR) with the org's ca.pem and a client certificate from fedstream tls init, or --tls-ca, --tls-cert and --tls-key; --insecure-plaintext for an org without TLS")
		}
		creds, err := tlsutil.Load(caFile, certFile, keyFile)
		if err != nil {
			return nil, err
		}
		t.creds = creds
	}
	return []grpc.DialOption{t.creds.DialOption(tlsutil.Peer{Roles: roles})}, nil
}

// parseTTL reads a positive duration flag.
func parseTTL(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive duration such as 24h", name, v)
	}
	return d, nil
}
