// Command fedstream is the one binary of the system: coordinator, worker,
// the single-process dev federation, and the client/admin commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCmd()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", describe(err))
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

// exitError carries a specific exit code (e.g. 2 for partially bad input).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// describe strips gRPC's "rpc error: code = X desc = " noise: users want
// the reason.
func describe(err error) string {
	msg := err.Error()
	for {
		i := strings.Index(msg, "rpc error: code = ")
		if i < 0 {
			break
		}
		j := strings.Index(msg[i:], "desc = ")
		if j < 0 {
			break
		}
		msg = msg[:i] + msg[i+j+len("desc = "):]
	}
	if strings.Contains(msg, "larger than max") && !strings.Contains(msg, "receive limit") {
		// grpc's own words name neither side nor what to do.
		msg += " (a gRPC message was over the receiving server's size limit, which is fixed when the server is built: coordinators take 4 MiB, workers 16 MiB; send less per call)"
	}
	return msg
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "fedstream",
		Short:         "Federated, fault-tolerant stream processing",
		SilenceUsage:  true,
		SilenceErrors: true,
		Long: `fedstream runs continuous queries on the workers of federated organizations.

Start a whole federation in one process:   fedstream dev
Run an org by hand:                        fedstream coordinator ... / fedstream worker ...
Talk to an org:                            fedstream status | workers | query ... | ingest | tail`,
	}
	root.AddCommand(
		newCoordinatorCmd(),
		newWorkerCmd(),
		newDevCmd(),
		newStatusCmd(),
		newWorkersCmd(),
		newQueryCmd(),
		newTaskCmd(),
		newIngestCmd(),
		newTailCmd(),
		newTokenCmd(),
		newBenchCmd(),
		newBenchWorkerCmd(),
		newTLSCmd(),
		newKeygenCmd(),
		newOperatorCmd(),
		newSimCmd(),
		newLedgerCmd(),
		newContractCmd(),
		newMembersCmd(),
	)
	return root
}
