package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/rpc"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	"github.com/fedstream/fedstream/rpc/states"
	"github.com/fedstream/fedstream/rpc/tlsutil"
	"github.com/fedstream/fedstream/worker"
)

//go:embed demo-netmon.yaml
var demoQuery []byte

// devFederation is an org of coordinators and workers in one process.
type devFederation struct {
	coords  []*coordinator.Server
	workers []*worker.Worker
	// ctx ends when the federation stops; cancel ends it.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	dataDir string
	// tlsDir holds the org CA and certificates dev made for this run.
	tlsDir string
}

type devOptions struct {
	org          string
	coordinators int
	workers      int
	dataDir      string
	logger       *slog.Logger
	// noHTTP turns off the processes' HTTP servers (metrics, health),
	// which dev otherwise runs on free loopback ports.
	noHTTP bool
}

// httpAddr is the HTTP address each process of the dev org serves on.
func (o devOptions) httpAddr() string {
	if o.noHTTP {
		return ""
	}
	return "127.0.0.1:0"
}

func startDev(ctx context.Context, o devOptions) (*devFederation, error) {
	d := &devFederation{dataDir: o.dataDir, tlsDir: filepath.Join(o.dataDir, "tls")}
	ctx, d.cancel = context.WithCancel(ctx)
	d.ctx = ctx
	// The org runs mutual TLS as a real one does, with a CA made for this
	// run in the temp dir (the CLI can use it: --tls-dir).
	var ids []string
	for i := 0; i < o.coordinators; i++ {
		ids = append(ids, fmt.Sprintf("c%d", i+1))
	}
	if _, err := tlsutil.InitDir(d.tlsDir, tlsutil.InitOptions{Org: o.org, Coordinators: ids, Clients: []string{defaultClientName}, Hosts: []string{"127.0.0.1", "localhost"}}); err != nil {
		d.cancel()
		return nil, fmt.Errorf("dev TLS: %w", err)
	}
	gossip, err := newGossipKey()
	if err != nil {
		d.cancel()
		return nil, err
	}
	caFile := filepath.Join(d.tlsDir, tlsutil.CAFile)
	ca, err := tlsutil.LoadCA(caFile, filepath.Join(d.tlsDir, tlsutil.CAKeyFile))
	if err != nil {
		d.cancel()
		return nil, err
	}
	// Port 0 everywhere: the OS picks free ports and the coordinators
	// advertise the real ones; later nodes join the first through serf.
	var join []string
	for i := 0; i < o.coordinators; i++ {
		id := ids[i]
		_, certFile, keyFile := tlsutil.Paths(d.tlsDir, "", "", "", rpc.RoleCoordinator, id)
		creds, err := tlsutil.Load(caFile, certFile, keyFile)
		var srv *coordinator.Server
		if err == nil {
			srv, err = coordinator.New(coordinator.Config{
				Org: o.org, NodeID: id, DataDir: fmt.Sprintf("%s/%s", o.dataDir, id),
				GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
				BootstrapExpect: o.coordinators, Join: join,
				TLS: creds, CA: ca, GossipKey: gossip, HTTPAddr: o.httpAddr(),
				Timings: devTimings(), Logger: o.logger,
			})
		}
		if err == nil {
			err = srv.Start()
		}
		if err != nil {
			d.stop()
			return nil, fmt.Errorf("coordinator %s: %w", id, err)
		}
		d.coords = append(d.coords, srv)
		join = append(join, srv.SerfAddr())
	}
	var grpcAddrs []string
	for _, c := range d.coords {
		grpcAddrs = append(grpcAddrs, c.GRPCAddr())
	}
	for i := 0; i < o.workers; i++ {
		// Each worker holds its own credentials: the coordinators sign its
		// certificate when it registers.
		creds, err := tlsutil.Load(caFile, "", "")
		var w *worker.Worker
		if err == nil {
			w, err = worker.New(worker.Config{
				Org: o.org, Name: fmt.Sprintf("w%d", i+1), Coordinators: grpcAddrs,
				Cores: 2, Labels: map[string]string{"zone": fmt.Sprintf("z%d", i+1)}, Logger: o.logger,
				TLS: creds, HTTPAddr: o.httpAddr(),
			})
		}
		if err == nil {
			err = w.Listen()
		}
		if err != nil {
			d.stop()
			return nil, fmt.Errorf("worker %d: %w", i+1, err)
		}
		d.workers = append(d.workers, w)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				o.logger.Error("worker stopped", "err", err)
			}
		}()
	}
	return d, nil
}

// devTimings keep failure detection quick, but tolerate the scheduling
// delays of a whole org sharing one process with its data plane.
func devTimings() coordinator.Timings {
	t := coordinator.DefaultTimings()
	t.HeartbeatTTL = 5 * time.Second
	t.LeaderGrace = 5 * time.Second
	t.GossipInterval = 200 * time.Millisecond
	return t
}

func (d *devFederation) stop() {
	d.cancel()
	d.wg.Wait()
	for _, c := range d.coords {
		_ = c.Shutdown()
	}
}

// waitReady waits until a leader is elected and every worker is ready.
func (d *devFederation) waitReady(ctx context.Context, f *clientFlags, workers int) error {
	for {
		c, cctx, done, err := f.admin(ctx)
		if err == nil {
			st, err1 := c.Status(cctx, &pb.StatusRequest{})
			ws, err2 := c.ListWorkers(cctx, &pb.ListWorkersRequest{})
			done()
			if err1 == nil && err2 == nil && st.LeaderId != "" {
				ready := 0
				for _, w := range ws.Workers {
					if w.Status == states.WorkerReady {
						ready++
					}
				}
				if ready >= workers {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func newDevCmd() *cobra.Command {
	var (
		duration  time.Duration
		asJSON    bool
		logLevel  string
		queryFile string
		noQuery   bool
		noHTTP    bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a whole org (3 coordinators, 2 workers) in one process and show a demo query's results",
		Long: `dev starts an org of 3 coordinators and 2 workers on free loopback ports with a
temporary data dir, submits the network-monitoring demo query (or --query FILE)
and prints its results until Ctrl-C or --duration. Results go to stdout (JSON
lines with --json); where everything listens and the logs go to stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			stderr := cmd.ErrOrStderr()
			var level slog.LevelVar
			level.Set(logging.ParseLevel(logLevel))
			logger := logging.NewLeveled(stderr, &level, false)
			dir, err := os.MkdirTemp("", "fedstream-dev-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			fed, err := startDev(context.WithoutCancel(ctx), devOptions{org: "demo", coordinators: 3, workers: 2, dataDir: dir, logger: logger, noHTTP: noHTTP})
			if err != nil {
				return err
			}
			defer func() {
				// The whole org stops at once: peers reporting each other
				// gone is expected now, not news.
				level.Set(slog.LevelError + 4)
				fed.stop()
			}()
			fed.printBanner(stderr)
			if addr := fed.coords[0].HTTPAddr(); addr != "" {
				fmt.Fprintf(stderr, "web view: http://%s/\n", addr)
			}
			f := &clientFlags{addr: fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: fed.tlsDir}}
			if err := fed.waitReady(ctx, f, 2); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			fmt.Fprintln(stderr, "org demo is up: leader elected, 2 workers ready")
			if noQuery {
				<-ctx.Done()
				return nil
			}
			query := demoQuery
			name := "demo-netmon.yaml"
			if queryFile != "" {
				if query, err = os.ReadFile(queryFile); err != nil {
					return err
				}
				name = queryFile
			}
			c, cctx, done, err := f.admin(ctx)
			if err != nil {
				return err
			}
			resp, err := c.SubmitQuery(cctx, &pb.SubmitQueryRequest{Yaml: query, Filename: name, IdempotencyKey: "dev-demo"})
			done()
			if err != nil {
				return fmt.Errorf("submit %s: %w", name, err)
			}
			fmt.Fprintf(stderr, "submitted query %s (%d tasks); results follow%s\n\n", resp.Name, resp.Tasks,
				map[bool]string{true: " as JSON lines on stdout", false: ""}[asJSON])
			tl := &tailer{flags: f, query: resp.Name}
			tl.print = resultPrinter(cmd.OutOrStdout(), asJSON)
			err = tl.run(ctx)
			if ctx.Err() != nil {
				return nil
			}
			return err
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print results as JSON lines")
	cmd.Flags().StringVar(&logLevel, "log-level", "error", "log level of the embedded processes (logs go to stderr)")
	cmd.Flags().StringVar(&queryFile, "query", "", "submit this query file instead of the demo")
	cmd.Flags().BoolVar(&noQuery, "no-query", false, "start the org only")
	cmd.Flags().BoolVar(&noHTTP, "no-http", false, "run no HTTP servers (metrics, health), which each process otherwise serves on a free loopback port")
	return cmd
}

func (d *devFederation) printBanner(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "fedstream dev: org %q, data in %s, mutual TLS (CA and certificates in %s), auth: dev mode (no tokens)\n", "demo", d.dataDir, d.tlsDir)
	for _, c := range d.coords {
		fmt.Fprintf(&b, "  coordinator %s  grpc %s%s\n", c.NodeID(), c.GRPCAddr(), httpText(c.HTTPAddr()))
	}
	for i, w := range d.workers {
		fmt.Fprintf(&b, "  worker w%d       data plane %s%s\n", i+1, w.Addr(), httpText(w.HTTPAddr()))
	}
	fmt.Fprintf(&b, "try: bin/fedstream status --addr %s --tls-dir %s   (or: workers, query list, tail netmon)\n", d.coords[0].GRPCAddr(), d.tlsDir)
	fmt.Fprint(w, b.String())
}

// httpText shows a process's HTTP address in the banner ("" when it has
// none).
func httpText(addr string) string {
	if addr == "" {
		return ""
	}
	return "  http http://" + addr + " (/metrics /healthz /readyz)"
}
