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
	"slices"
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
	"github.com/fedstream/fedstream/worker/dataplane"
	"github.com/fedstream/fedstream/worker/runtime"
)

//go:embed demo-netmon.yaml
var demoQuery []byte

// devFederation is an org of coordinators and workers in one process.
type devFederation struct {
	org     string
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
	// federation, when set, places every coordinator of the org in this
	// federation pool (its addresses are chosen here: port 0).
	federation *coordinator.FederationConfig
	// alphaCores, in a dev federation, is the capacity in cores alpha's
	// load manager counts (0: devAlphaCores).
	alphaCores float64
	// boundaryInterval is the workers' source boundary interval (0: the
	// default); workerFaults[i], when set, injects network faults into
	// worker i's data plane (benchmarks cut links with it).
	boundaryInterval time.Duration
	workerFaults     []*dataplane.Faults
	// paceFromOrigin: the workers' generators follow their query's
	// pacing origin (worker.Config.PaceFromOrigin).
	paceFromOrigin bool
	// health configures the coordinators' health manager (the zero value:
	// its defaults); sensorWindow the workers' sensor window (0: 1 s).
	health       coordinator.HealthConfig
	sensorWindow time.Duration
	// bufferTuples bounds the workers' output buffers (0: the default).
	bufferTuples int
	// lastCostScale, when set, makes the last worker slow: it multiplies
	// the calibrated cost of the operators it runs.
	lastCostScale float64
	// sourcePace, when set, paces every worker's generator sources
	// (benchmarks change a running query's load with it).
	sourcePace *runtime.Pace
	// timings are the coordinators' clocks (nil: devTimings, the quick
	// ones of tests and benchmarks; the dev command uses demoTimings).
	timings *coordinator.Timings
}

// httpAddr is the HTTP address each process of the dev org serves on.
func (o devOptions) httpAddr() string {
	if o.noHTTP {
		return ""
	}
	return "127.0.0.1:0"
}

func startDev(ctx context.Context, o devOptions) (*devFederation, error) {
	if o.logger == nil {
		o.logger = slog.Default()
	}
	d := &devFederation{org: o.org, dataDir: o.dataDir, tlsDir: filepath.Join(o.dataDir, "tls")}
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
	var join, fedJoin []string
	if o.federation != nil {
		fedJoin = o.federation.Join
	}
	for i := 0; i < o.coordinators; i++ {
		id := ids[i]
		_, certFile, keyFile := tlsutil.Paths(d.tlsDir, "", "", "", rpc.RoleCoordinator, id)
		creds, err := tlsutil.Load(caFile, certFile, keyFile)
		var srv *coordinator.Server
		if err == nil {
			cfg := coordinator.Config{
				Org: o.org, NodeID: id, DataDir: fmt.Sprintf("%s/%s", o.dataDir, id),
				GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0", SerfAddr: "127.0.0.1:0",
				BootstrapExpect: o.coordinators, Join: join,
				TLS: creds, CA: ca, GossipKey: gossip, HTTPAddr: o.httpAddr(),
				Timings: o.coordTimings(), Logger: o.logger, Health: o.health,
			}
			if f := o.federation; f != nil {
				cfg.Federation = *f
				cfg.Federation.SerfAddr, cfg.Federation.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
				cfg.Federation.Join = slices.Clone(fedJoin)
			}
			srv, err = coordinator.New(cfg)
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
		if a := srv.FederationSerfAddr(); a != "" {
			fedJoin = append(fedJoin, a)
		}
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
			var faults *dataplane.Faults
			if i < len(o.workerFaults) {
				faults = o.workerFaults[i]
			}
			w, err = worker.New(worker.Config{
				Org: o.org, Name: fmt.Sprintf("w%d", i+1), Coordinators: grpcAddrs,
				Cores: 2, Labels: map[string]string{"zone": fmt.Sprintf("z%d", i+1)}, Logger: o.logger,
				TLS: creds, HTTPAddr: o.httpAddr(), BoundaryInterval: o.boundaryInterval, Faults: faults,
				SensorWindow: o.sensorWindow, BufferTuples: o.bufferTuples,
				CostScale: map[bool]float64{true: o.lastCostScale}[i == o.workers-1], SourcePace: o.sourcePace,
				PaceFromOrigin: o.paceFromOrigin,
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

// coordTimings are the clocks of the org's coordinators.
func (o devOptions) coordTimings() coordinator.Timings {
	if o.timings != nil {
		return *o.timings
	}
	return devTimings()
}

// demoTimings are the clocks of `fedstream dev` itself: a newcomer's
// first run, often on a laptop or a shared machine that is busy with
// other work, where the whole federation (9 coordinators, 6 workers and
// the demo's data plane) shares one process. Nothing in the demo fails
// on purpose, so the demo favours staying up over noticing failures
// fast: every clock outlasts a stall of the whole process of several
// seconds, which a loaded machine causes (session 20: at load 20-26 on
// 2 cores, devTimings' 1 s Raft clocks left one org without a leader
// for 5 minutes, 678 candidacies in three orgs, and the 200 ms gossip
// marked live coordinators suspect every few seconds).
//
//   - Raft: heartbeat and election 5 s (Consul's production default,
//     raft_multiplier 5; DefaultTimings keeps hashicorp/raft's 1 s
//     heartbeat timeout, with a 3 s election round),
//     and the leader lease as long as the heartbeat timeout: a leader
//     keeps leading through a stall of the process as its followers do
//     not start an election. The cost: the first leader of each org comes
//     5-10 s after start instead of 1-2 s.
//   - ForwardWait above a whole election (up to twice the election
//     timeout), so the demo's own calls held by a follower while an
//     org has no leader wait for the next one instead of failing.
//   - Gossip: the libraries' LAN defaults in the org pools and WAN ones
//     in the federation pool (GossipInterval 0), as in production, not
//     the 200 ms of tests, which suspect a member after 400 ms without
//     an answer.
//   - Workers: a heartbeat TTL and leader grace of 20 s (twice
//     DefaultTimings'); a worker beats every quarter of it and waits up
//     to half of it for an answer. With 10 s, two dev federations side
//     by side at load 29-54 had 7 live workers marked down (heartbeat calls
//     unanswered for 5 s) and their tasks placed again.
//   - PartnerTimeout 60 s (15 s in DefaultTimings): a partner (or an
//     owner) whose leader is stalled or being elected keeps its tasks (in
//     a run at load 28, partners dropped the tasks they hosted after
//     15 s without a sync). The cost: a cross-org move that never ends
//     is rolled back after MoveCatchUpBound plus twice this, 2.5 min.
func demoTimings() coordinator.Timings {
	t := coordinator.DefaultTimings()
	t.RaftHeartbeat = 5 * time.Second
	t.RaftElection = 5 * time.Second
	t.RaftLeaderLease = 5 * time.Second
	t.ForwardWait = 15 * time.Second
	t.HeartbeatTTL = 20 * time.Second
	t.LeaderGrace = 20 * time.Second
	t.GossipInterval = 0
	t.PartnerTimeout = time.Minute
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
		orgs      int
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a whole federation (3 orgs of 3 coordinators and 2 workers) in one process and show a demo query's results",
		Long: `dev starts three orgs, alpha, beta and gamma, each of 3 coordinators and 2
workers with its own CA, on free loopback ports with a temporary data dir, in
one federation pool. Each org pins the others' keys and CAs, alpha proposes
contracts to beta and gamma and beta to gamma, and the partners' auto-accept
policies accept them. The network-monitoring demo query (or --query FILE) runs
in alpha, whose load manager counts a capacity small enough for the demo to
exceed it. Results print until Ctrl-C or --duration. Results go to stdout (JSON
lines with --json); where everything listens and the logs go to stderr.
--orgs 1 starts the single org "demo" instead.`,
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
			// The libraries' network errors go out as warnings, and
			// watchDemo says what they meant (devwatch.go).
			logger := slog.New(quietLibraries{h: logging.NewLeveled(stderr, &level, false).Handler()})
			dir, err := os.MkdirTemp("", "fedstream-dev-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			timings := demoTimings()
			opts := devOptions{org: "demo", coordinators: 3, workers: 2, dataDir: dir, logger: logger, noHTTP: noHTTP, timings: &timings}
			var fed *devFederation
			var partners []*devFederation
			if orgs == 3 {
				all, err := startDevFederation(context.WithoutCancel(ctx), opts)
				if err != nil {
					return err
				}
				fed, partners = all[0], all[1:]
			} else if orgs == 1 {
				if fed, err = startDev(context.WithoutCancel(ctx), opts); err != nil {
					return err
				}
			} else {
				return fmt.Errorf("--orgs %d: want 1 (one org) or 3 (a federation)", orgs)
			}
			var bg sync.WaitGroup
			bgCtx, bgCancel := context.WithCancel(ctx)
			defer func() {
				bgCancel()
				bg.Wait()
				// The whole federation stops at once: peers reporting each
				// other gone is expected now, not news.
				level.Set(slog.LevelError + 4)
				stopDevOrgs(append([]*devFederation{fed}, partners...))
			}()
			bg.Add(1)
			go func() {
				defer bg.Done()
				watchDemo(bgCtx, stderr, append([]*devFederation{fed}, partners...))
			}()
			fed.printBanner(stderr)
			for _, p := range partners {
				p.printBanner(stderr)
			}
			if addr := fed.coords[0].HTTPAddr(); addr != "" {
				fmt.Fprintf(stderr, "web view: http://%s/\n", addr)
			}
			f := &clientFlags{addr: fed.coords[0].GRPCAddr(), timeout: 10 * time.Second, tls: clientTLS{dir: fed.tlsDir}}
			if len(partners) > 0 {
				// Trust and contracts come up beside the demo, so the
				// first results do not wait for them.
				bg.Add(1)
				go func() {
					defer bg.Done()
					if err := setUpDevPartners(bgCtx, fed, partners, stderr); err != nil && bgCtx.Err() == nil {
						fmt.Fprintf(stderr, "setting up the federation's contracts failed: %v\n", err)
					}
				}()
			}
			if err := fed.waitReady(ctx, f, 2); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			fmt.Fprintf(stderr, "org %s is up: leader elected, 2 workers ready\n", fed.org)
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
			fmt.Fprintf(stderr, "submitted query %s (%s); results follow%s\n\n", resp.Name, plural(int(resp.Tasks), "task", "tasks"),
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
	cmd.Flags().IntVar(&orgs, "orgs", 3, "3: a federation of orgs alpha, beta and gamma with contracts between them, the demo in alpha; 1: one org, demo")
	cmd.Flags().BoolVar(&noHTTP, "no-http", false, "run no HTTP servers (metrics, health), which each process otherwise serves on a free loopback port")
	return cmd
}

func (d *devFederation) printBanner(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "fedstream dev: org %q, data in %s, mutual TLS (CA and certificates in %s), auth: dev mode (no tokens)\n", d.org, d.dataDir, d.tlsDir)
	for _, c := range d.coords {
		fmt.Fprintf(&b, "  coordinator %s  grpc %s%s\n", c.NodeID(), c.GRPCAddr(), httpText(c.HTTPAddr()))
	}
	for i, w := range d.workers {
		fmt.Fprintf(&b, "  worker w%d       data plane %s%s\n", i+1, w.Addr(), httpText(w.HTTPAddr()))
	}
	fmt.Fprintf(&b, "try: bin/fedstream status --addr %s --tls-dir %s   (or: workers, query list, tail netmon, health actions)\n", d.coords[0].GRPCAddr(), d.tlsDir)
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
