package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"github.com/fedstream/fedstream/config"
	"github.com/fedstream/fedstream/config/logging"
	"github.com/fedstream/fedstream/coordinator"
	"github.com/fedstream/fedstream/federation/loadmgr"
	"github.com/fedstream/fedstream/federation/mpa"
	"github.com/fedstream/fedstream/worker"
)

func newCoordinatorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "coordinator",
		Short: "Run one coordinator of an org (Raft + serf + gRPC API)",
		Example: `  fedstream coordinator --org acme --node-id c1 --data-dir /var/lib/fedstream/c1 \
    --grpc-addr 127.0.0.1:7400 --raft-addr 127.0.0.1:7401 --serf-addr 127.0.0.1:7402 \
    --bootstrap-expect 3 --join 127.0.0.1:7412,127.0.0.1:7422 --tls-dir /etc/fedstream/tls --gossip-key-file /etc/fedstream/gossip.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := config.LoadCoordinator(cmd.Flags())
			if err != nil {
				return err
			}
			logger := logging.Stderr(c.LogLevel)
			timings := coordinator.DefaultTimings()
			if c.HeartbeatTTL != "" {
				d, err := time.ParseDuration(c.HeartbeatTTL)
				if err != nil || d <= 0 {
					return fmt.Errorf("heartbeat-ttl %q: want a positive duration such as 10s", c.HeartbeatTTL)
				}
				timings.HeartbeatTTL = d
				timings.LeaderGrace = d
			}
			if c.RemoveDownWorkersAfter != "" {
				d, err := time.ParseDuration(c.RemoveDownWorkersAfter)
				if err != nil || d <= 0 {
					return fmt.Errorf("remove-down-workers-after %q: want a positive duration such as 1h", c.RemoveDownWorkersAfter)
				}
				timings.RemoveDownWorkersAfter = d
			}
			creds, ca, err := coordinatorTLS(c)
			if err != nil {
				return err
			}
			certTTL, err := parseTTL("worker-cert-ttl", c.WorkerCertTTL)
			if err != nil {
				return err
			}
			if timings.DeadVoterTimeout, err = parseTTL("dead-voter-timeout", c.DeadVoterTimeout); err != nil {
				return err
			}
			gkey, err := gossipKey(c)
			if err != nil {
				return err
			}
			fkey, err := federationKeyring(c)
			if err != nil {
				return err
			}
			hc := coordinator.HealthConfig{Off: c.Health.Off, All: c.Health.All}
			if hc.Interval, err = parseTTL("health.interval", c.Health.Interval); err != nil {
				return err
			}
			if hc.Settle, err = parseTTL("health.settle", c.Health.Settle); err != nil {
				return err
			}
			if c.Health.Warmup != "" {
				if hc.Warmup, err = parseTTL("health.warmup", c.Health.Warmup); err != nil {
					return err
				}
			}
			srv, err := coordinator.New(coordinator.Config{
				Health: hc,
				Org:    c.Org, NodeID: c.NodeID, DataDir: c.DataDir,
				GRPCAddr: c.GRPCAddr, RaftAddr: c.RaftAddr, SerfAddr: c.SerfAddr,
				BootstrapExpect: c.BootstrapExpect, Join: c.Join, GossipKey: gkey,
				JoinToken: c.JoinToken, AdminToken: c.AdminToken,
				TLS: creds, CA: ca, WorkerCertTTL: certTTL, InsecurePlaintext: c.TLS.InsecurePlaintext,
				HTTPAddr: c.HTTPAddr, Timings: timings, Logger: logger,
				Federation: coordinator.FederationConfig{
					SerfAddr: c.Federation.Bind, GRPCAddr: c.Federation.GRPCAddr, DataAddr: c.Federation.DataAddr, Join: c.Federation.Join, Keyring: fkey,
					Load: loadConfig(c.Federation.Load),
				},
				Limits: coordinator.Limits{MaxTasksPerQuery: c.MaxTasksPerQuery, MaxTasksPerOrg: c.MaxTasksPerOrg},
			})
			if err != nil {
				return err
			}
			if err := srv.Start(); err != nil {
				return err
			}
			select {
			case <-cmd.Context().Done():
			case <-srv.Stopped():
				// The node stopped itself (its log holds an entry this
				// build cannot apply): exit non-zero with the reason.
				return errors.Join(srv.Err(), srv.Shutdown())
			}
			logger.Info("shutting down")
			return srv.Shutdown()
		},
	}
	config.CoordinatorFlags(cmd.Flags())
	return cmd
}

func newWorkerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "worker",
		Short:   "Run a stateless worker that joins an org and runs its assigned tasks",
		Example: `  fedstream worker --org acme --coordinators 127.0.0.1:7400,127.0.0.1:7410 --tls-ca /etc/fedstream/tls/ca.pem --cores 2`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := config.LoadWorker(cmd.Flags())
			if err != nil {
				return err
			}
			logger := logging.Stderr(c.LogLevel)
			setWorkerGC(c.GCPercent)
			var maxFuture time.Duration
			if c.MaxFuture != "" {
				if maxFuture, err = time.ParseDuration(c.MaxFuture); err != nil || maxFuture <= 0 {
					return fmt.Errorf("max-future %q: want a positive duration such as 1h", c.MaxFuture)
				}
			}
			creds, err := workerTLS(c)
			if err != nil {
				return err
			}
			w, err := worker.New(worker.Config{
				Org: c.Org, Name: c.Name, Coordinators: c.Coordinators, GRPCAddr: c.GRPCAddr,
				Cores: c.Cores, Labels: c.Labels, JoinToken: c.JoinToken, Logger: logger,
				StallAfter: c.StallAfter, SubscriberLease: c.SubscriberLease, OverrunGrace: c.OverrunGrace,
				DCAAKeepTuples: c.DCAAKeepTuples, InputPendingTuples: c.InputPendingTuples,
				SensorWindow: c.SensorWindow, MaxFuture: maxFuture, FaultsFile: c.FaultsFile,
				TLS: creds, InsecurePlaintext: c.TLS.InsecurePlaintext,
				HTTPAddr: c.HTTPAddr,
			})
			if err != nil {
				return err
			}
			return w.Run(cmd.Context())
		},
	}
	config.WorkerFlags(cmd.Flags())
	return cmd
}

// setWorkerGC sets the garbage collection target of a process whose work
// is a worker's data plane (see config.DefaultWorkerGCPercent), unless the
// environment sets GOGC, which then wins as it does for any Go program.
func setWorkerGC(percent int) {
	if os.Getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(percent)
}

// loadConfig converts the federation.load section into the load
// manager's configuration (zero values take its defaults).
func loadConfig(l config.FederationLoad) loadmgr.Config {
	a := l.AutoAccept
	c := loadmgr.Config{Utilisation: l.TargetUtilisation, Cores: l.Cores, Cost: l.Cost, Period: l.Period, SettleEvery: l.SettleEvery,
		AutoAccept: loadmgr.AutoAccept{From: a.From, PriceMinAtLeast: a.PriceMinAtLeast, PriceMaxAtMost: a.PriceMaxAtMost,
			MaxLoadAtMost: a.MaxLoadAtMost, MaxValidity: a.MaxValidity}}
	if l.MigrationCost != 0 || l.ReturnMargin != 0 {
		u := l.TargetUtilisation
		if u == 0 {
			u = mpa.DefaultUtilisation
		}
		p := mpa.SuggestedPolicy(u)
		if l.MigrationCost != 0 {
			p.MigrationCost = l.MigrationCost
		}
		if l.ReturnMargin != 0 {
			p.ReturnMargin = l.ReturnMargin
		}
		c.Policy = &p
	}
	return c
}
