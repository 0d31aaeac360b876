// Package config loads coordinator and worker configuration with viper: a
// YAML file (--config), environment variables FEDSTREAM_<NAME> (dashes become
// underscores) and command-line flags, flags taking precedence.
package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// ErrConfigFile is returned when the --config file cannot be read or parsed.
var ErrConfigFile = errors.New("config file")

// Coordinator is the configuration of `fedstream coordinator`.
type Coordinator struct {
	Org             string   `mapstructure:"org"`
	NodeID          string   `mapstructure:"node-id"`
	DataDir         string   `mapstructure:"data-dir"`
	GRPCAddr        string   `mapstructure:"grpc-addr"`
	RaftAddr        string   `mapstructure:"raft-addr"`
	SerfAddr        string   `mapstructure:"serf-addr"`
	BootstrapExpect int      `mapstructure:"bootstrap-expect"`
	Join            []string `mapstructure:"join"`
	JoinToken       string   `mapstructure:"join-token"`
	AdminToken      string   `mapstructure:"admin-token"`
	JoinTokenFile   string   `mapstructure:"join-token-file"`
	AdminTokenFile  string   `mapstructure:"admin-token-file"`
	HeartbeatTTL    string   `mapstructure:"heartbeat-ttl"`
	LogLevel        string   `mapstructure:"log-level"`
	// MaxTasksPerQuery and MaxTasksPerOrg bound the tasks of one query and
	// of all running queries; 0 derives them from the cores of the workers not down.
	MaxTasksPerQuery int `mapstructure:"max-tasks-per-query"`
	MaxTasksPerOrg   int `mapstructure:"max-tasks-per-org"`
	// RemoveDownWorkersAfter is how long a down worker keeps its record.
	RemoveDownWorkersAfter string `mapstructure:"remove-down-workers-after"`
	TLS                    TLS    `mapstructure:",squash"`
	// TLSCAKey is the org CA's key, to sign the certificates of workers
	// (default: ca-key.pem in tls-dir when that file exists).
	TLSCAKey string `mapstructure:"tls-ca-key"`
	// WorkerCertTTL is the lifetime of the certificates signed for workers.
	WorkerCertTTL string `mapstructure:"worker-cert-ttl"`
	// GossipKey (base64) or GossipKeyFile (a file holding it) encrypts serf.
	GossipKey     string `mapstructure:"gossip-key"`
	GossipKeyFile string `mapstructure:"gossip-key-file"`
	// DeadVoterTimeout: see coordinator.Timings.DeadVoterTimeout.
	DeadVoterTimeout string `mapstructure:"dead-voter-timeout"`
	// HTTPAddr serves /metrics, /healthz and /readyz ("" : none).
	HTTPAddr string `mapstructure:"http-addr"`
	// Federation places the coordinator in the federation pool (YAML
	// section federation:, flags --federation.KEY).
	Federation Federation `mapstructure:"federation"`
	// Health configures the health manager (YAML section health:, flags
	// --health.KEY).
	Health Health `mapstructure:"health"`
}

// Health configures the health manager's policy loop on the org leader.
type Health struct {
	// Off turns the loop off; All makes it watch every query, not only
	// those whose definition sets autoscale or an slo.
	Off bool `mapstructure:"off"`
	All bool `mapstructure:"all"`
	// Interval between two steps of the loop and Settle after an action
	// (Go durations).
	Interval string `mapstructure:"interval"`
	Settle   string `mapstructure:"settle"`
	// Warmup: how long the loop watches a query that started (or that a
	// new leader found) before it may act on it; empty: one settling time.
	Warmup string `mapstructure:"warmup"`
}

// Federation is the coordinator's place in the federation pool. Bind
// empty: the org is in no federation.
type Federation struct {
	// Bind is the federation pool's gossip address.
	Bind string `mapstructure:"bind"`
	// GRPCAddr is the cross-org gRPC port partners call.
	GRPCAddr string `mapstructure:"grpc-addr"`
	// DataAddr is the cross-org data port through which partners'
	// coordinators relay the streams of moved tasks (empty: a free port
	// on grpc-addr's host, advertised in the pool).
	DataAddr string `mapstructure:"data-addr"`
	// Join lists federation pool addresses of coordinators of any org.
	Join []string `mapstructure:"join"`
	// KeyringFile (or Keyring, base64) holds the federation pool's gossip
	// key, which must differ from the org's gossip key.
	KeyringFile string `mapstructure:"keyring-file"`
	Keyring     string `mapstructure:"keyring"`
	// Load tunes the org's load manager (federation.load).
	Load FederationLoad `mapstructure:"load"`
}

// FederationLoad tunes the load manager on the org's leader: capacity is
// the ready workers' cores times TargetUtilisation; the cost function of
// load gives the marginal cost compared with contract prices every
// Period. Zero values take the defaults (0.8, mm1, 5s, 1m, and the
// migration cost and return margin matching the suggested prices).
type FederationLoad struct {
	TargetUtilisation float64 `mapstructure:"target-utilisation"`
	// Cores, when positive, replaces the ready workers' cores in the
	// capacity (an org lending fedstream only part of its machines).
	Cores       float64       `mapstructure:"cores"`
	Cost        string        `mapstructure:"cost"`
	Period      time.Duration `mapstructure:"period"`
	SettleEvery time.Duration `mapstructure:"settle-every"`
	// MigrationCost and ReturnMargin, when set, replace the suggested
	// ones (in price units).
	MigrationCost float64 `mapstructure:"migration-cost"`
	ReturnMargin  float64 `mapstructure:"return-margin"`
	// AutoAccept accepts partners' proposals without an operator.
	AutoAccept AutoAccept `mapstructure:"auto-accept"`
}

// AutoAccept is the policy under which a coordinator accepts contract
// proposals: from the listed orgs only, with p_min at least
// PriceMinAtLeast where this org hosts, p_max at most PriceMaxAtMost
// where its tasks go out (0: any), max load at most MaxLoadAtMost (0:
// any), valid for at most MaxValidity (0: any).
type AutoAccept struct {
	From            []string      `mapstructure:"from"`
	PriceMinAtLeast float64       `mapstructure:"price-min-at-least"`
	PriceMaxAtMost  float64       `mapstructure:"price-max-at-most"`
	MaxLoadAtMost   float64       `mapstructure:"max-load-at-most"`
	MaxValidity     time.Duration `mapstructure:"max-validity"`
}

// TLS names a process's TLS files: explicit files, or a directory written
// by fedstream tls init holding them under their standard names.
type TLS struct {
	Dir  string `mapstructure:"tls-dir"`
	CA   string `mapstructure:"tls-ca"`
	Cert string `mapstructure:"tls-cert"`
	Key  string `mapstructure:"tls-key"`
	// InsecurePlaintext turns TLS off (explicitly; logged loudly).
	InsecurePlaintext bool `mapstructure:"insecure-plaintext"`
}

// Worker is the configuration of `fedstream worker`.
type Worker struct {
	Org           string            `mapstructure:"org"`
	Name          string            `mapstructure:"name"`
	Coordinators  []string          `mapstructure:"coordinators"`
	GRPCAddr      string            `mapstructure:"grpc-addr"`
	Cores         int               `mapstructure:"cores"`
	Labels        map[string]string `mapstructure:"labels"`
	JoinToken     string            `mapstructure:"join-token"`
	JoinTokenFile string            `mapstructure:"join-token-file"`
	LogLevel      string            `mapstructure:"log-level"`
	// GCPercent is the worker process's garbage collection target (Go's
	// GOGC); see DefaultWorkerGCPercent.
	GCPercent int `mapstructure:"gc-percent"`
	// StallAfter: a task that has something to do and does not move for
	// this long is reported stalled. SubscriberLease: how long a
	// downstream subscriber that went away still holds an output buffer.
	// OverrunGrace: how long a full buffer held only by subscribers that
	// are not connected waits before it discards their oldest tuples.
	StallAfter      time.Duration `mapstructure:"stall-after"`
	SubscriberLease time.Duration `mapstructure:"subscriber-lease"`
	OverrunGrace    time.Duration `mapstructure:"overrun-grace"`
	// DCAAKeepTuples bounds the input a replicated query's task keeps for
	// a correction's replay, InputPendingTuples the tuples each input of a
	// task holds waiting for release (0: the runtime's defaults; see
	// runtime.Options).
	DCAAKeepTuples     int `mapstructure:"dcaa-keep-tuples"`
	InputPendingTuples int `mapstructure:"input-pending-tuples"`
	// SensorWindow is the window over which every task's figures are
	// measured for the health manager and sent to the leader.
	SensorWindow time.Duration `mapstructure:"sensor-window"`
	// MaxFuture bounds how far ahead of an ingest source's time a record's
	// time may be (see runtime.Options.MaxFuture).
	MaxFuture string `mapstructure:"max-future"`
	// FaultsFile: data-plane fault injection by hand (testing only).
	FaultsFile string `mapstructure:"faults-file"`
	// TLS: a worker needs only the org's CA (tls-ca, or ca.pem in
	// tls-dir); the coordinators sign its certificate when it registers.
	TLS TLS `mapstructure:",squash"`
	// HTTPAddr serves /metrics, /healthz and /readyz ("" : none).
	HTTPAddr string `mapstructure:"http-addr"`
}

// DefaultWorkerGCPercent is a worker's default GC target. A worker keeps a
// small live heap (bounded buffers) but allocates every byte it moves, so
// at Go's default of 100 it collects dozens of times a second, each cycle
// taking a quarter of the CPUs for marking and slowing pointer writes with
// barriers; 400 lets the heap grow to five times its live size between
// collections instead of twice, for 15-50 % more throughput on the data
// plane benchmark (BENCHMARKS.md).
const DefaultWorkerGCPercent = 400

// ErrDuration means a duration setting is out of range.
var ErrDuration = errors.New("bad duration setting")

// ErrCount means a count setting (a bound in tuples) is out of range.
var ErrCount = errors.New("bad count setting")

// ErrGCPercent means a gc-percent setting is not a positive percentage.
var ErrGCPercent = errors.New("gc-percent must be a positive percentage")

// CoordinatorFlags declares the coordinator's flags on fs.
func CoordinatorFlags(fs *pflag.FlagSet) {
	fs.String("config", "", "YAML config file (keys are the flag names)")
	fs.String("org", "", "organization this coordinator belongs to")
	fs.String("node-id", "", "unique id of this coordinator within its org")
	fs.String("data-dir", "", "directory for the Raft log and snapshots")
	fs.String("grpc-addr", "127.0.0.1:7400", "address of the gRPC API (workers and clients)")
	fs.String("raft-addr", "127.0.0.1:7401", "address of the Raft transport")
	fs.String("serf-addr", "127.0.0.1:7402", "address of the serf gossip (federation membership)")
	fs.Int("bootstrap-expect", 0, "bootstrap once this many coordinators of the org are seen (1, 3 or 5); 0 joins an existing cluster")
	fs.StringSlice("join", nil, "serf addresses of coordinators to join (comma separated)")
	fs.String("join-token", "", "token workers must present (none: dev mode); visible in ps: prefer --join-token-file or FEDSTREAM_JOIN_TOKEN")
	fs.String("admin-token", "", "bootstrap admin token (none: dev mode); visible in ps: prefer --admin-token-file or FEDSTREAM_ADMIN_TOKEN")
	fs.String("join-token-file", "", "file holding the join token")
	fs.String("admin-token-file", "", "file holding the bootstrap admin token")
	fs.String("heartbeat-ttl", "10s", "how long a worker may miss heartbeats before it is marked down")
	fs.String("log-level", "info", "debug, info, warn or error")
	fs.Int("max-tasks-per-query", 0, "most tasks one query may have (0: the cores of the workers not down x 16, at least 64)")
	fs.Int("max-tasks-per-org", 0, "most tasks all running queries may have together (0: the cores of the workers not down x 16, at least 64)")
	fs.String("remove-down-workers-after", "1h", "remove the record of a worker down this long")
	TLSFlags(fs, "coordinator-NODE-ID.pem")
	fs.String("tls-ca-key", "", "org CA key, to sign worker certificates (default: ca-key.pem in --tls-dir)")
	fs.String("worker-cert-ttl", "24h", "lifetime of the certificates signed for workers (they renew at 2/3 of it)")
	fs.String("gossip-key-file", "", "file holding the org's base64 gossip key (fedstream keygen); required unless --insecure-plaintext")
	fs.String("gossip-key", "", "the base64 gossip key itself; prefer --gossip-key-file or FEDSTREAM_GOSSIP_KEY (flags show in ps)")
	fs.String("dead-voter-timeout", "72h", "remove a Raft voter that stays failed this long (one that leaves is removed at once)")
	fs.String("http-addr", "", "serve Prometheus /metrics, /healthz and /readyz over HTTP on this address (empty: off)")
	fs.Bool("health.off", false, "turn the health manager off on this coordinator")
	fs.Bool("health.all", false, "let the health manager look after every query (default: only queries with autoscale: true or an slo)")
	fs.String("health.interval", "1s", "time between two steps of the health manager's policy loop")
	fs.String("health.settle", "30s", "time after a health action before it is evaluated and before another action on the same query")
	fs.String("health.warmup", "", "time the health manager watches a query that started (or that a new leader found) before it may act on it (empty: one settling time)")
	fs.String("federation.bind", "", "federation pool gossip address (empty: the org is in no federation)")
	fs.String("federation.grpc-addr", "", "cross-org gRPC address partners' coordinators call (mutual TLS against the CA pinned for them)")
	fs.String("federation.data-addr", "", "cross-org data-plane address: streams of tasks moved between orgs, relayed by the coordinators (empty: a free port on grpc-addr's host)")
	fs.StringSlice("federation.join", nil, "federation pool addresses of coordinators of any org (comma separated)")
	fs.String("federation.keyring-file", "", "file holding the federation pool's base64 gossip key (fedstream keygen; not the org's gossip key)")
	fs.String("federation.keyring", "", "the federation pool's base64 gossip key itself; prefer --federation.keyring-file")
	fs.Float64("federation.load.target-utilisation", 0.8, "capacity = ready workers' cores x this; the load manager offers load to partners above it")
	fs.String("federation.load.cost", "mm1", "cost function of load (mm1: M/M/1-like, rising steeply near capacity)")
	fs.Duration("federation.load.period", 5*time.Second, "how often the load manager measures, offers and brings tasks home")
	fs.Duration("federation.load.settle-every", time.Minute, "how often the org settles what it owes partners for hosting its tasks")
	fs.StringSlice("federation.load.auto-accept.from", nil, "accept contract proposals from these orgs without an operator (within the auto-accept bounds)")
}

// TLSFlags declares the TLS flags shared by every process; certName is
// the certificate's file name in --tls-dir, for the help text.
func TLSFlags(fs *pflag.FlagSet, certName string) {
	fs.String("tls-dir", "", "directory written by fedstream tls init (ca.pem, "+certName+" and its key)")
	fs.String("tls-ca", "", "org CA certificate (default: ca.pem in --tls-dir)")
	fs.String("tls-cert", "", "this process's certificate (default: from --tls-dir)")
	fs.String("tls-key", "", "this process's private key (default: from --tls-dir)")
	fs.Bool("insecure-plaintext", false, "run WITHOUT TLS: unencrypted, unauthenticated connections (debugging only)")
}

// WorkerFlags declares the worker's flags on fs.
func WorkerFlags(fs *pflag.FlagSet) {
	fs.String("config", "", "YAML config file (keys are the flag names)")
	fs.String("org", "", "organization this worker joins")
	fs.String("name", "", "human-readable worker name (default: host name)")
	fs.StringSlice("coordinators", nil, "gRPC addresses of the org's coordinators (comma separated)")
	fs.String("grpc-addr", "127.0.0.1:0", "address of the worker's data plane")
	fs.Int("cores", 0, "cores offered to the org (default: all)")
	fs.StringToString("labels", nil, "labels, e.g. zone=a,rack=3")
	fs.String("join-token", "", "the org's worker join token; visible in ps: prefer --join-token-file or FEDSTREAM_JOIN_TOKEN")
	fs.String("join-token-file", "", "file holding the org's worker join token")
	fs.String("log-level", "info", "debug, info, warn or error")
	fs.Int("gc-percent", DefaultWorkerGCPercent, "garbage collection target of the worker process, as GOGC (GOGC in the environment wins)")
	fs.Duration("stall-after", 30*time.Second, "report a task stalled when it has something to do and has not moved for this long")
	fs.Duration("subscriber-lease", 30*time.Second, "how long a downstream subscriber that went away still holds an output buffer")
	fs.Duration("overrun-grace", 3*time.Second, "how long a full output buffer held only by disconnected or missing subscribers waits before discarding their oldest tuples")
	fs.Int("dcaa-keep-tuples", 256<<10, "replicated queries: the most input tuples a task keeps for correcting its tentative results; past it the oldest go and the results that depended on them are reported uncorrectable")
	fs.Int("input-pending-tuples", 64<<10, "the most tuples each input of a task holds waiting for release; past it the input takes nothing more until some is released (flow control)")
	fs.Duration("sensor-window", time.Second, "measure every task's rates, busy share, backpressure and key sample over windows this long, each sent to the org's leader as it closes (the health manager's sensors)")
	fs.String("max-future", "1h", "refuse ingested records dated further ahead than this of the source's time (newest accepted record, or the clock if later)")
	fs.String("faults-file", "", "TESTING ONLY: cut or hold data-plane links as this file says, re-read while it changes (lines: `cut ADDR [hold|reset]`, `cut-incoming [hold|reset]`; empty: no fault)")
	fs.String("tls-dir", "", "directory holding the org's ca.pem (fedstream tls init); the worker gets its own certificate when it registers")
	fs.String("tls-ca", "", "org CA certificate (default: ca.pem in --tls-dir)")
	fs.Bool("insecure-plaintext", false, "run WITHOUT TLS: unencrypted, unauthenticated connections (debugging only)")
	fs.String("http-addr", "", "serve Prometheus /metrics, /healthz and /readyz over HTTP on this address (empty: off)")
}

// load merges file, environment and flags into out.
func load(fs *pflag.FlagSet, out any) error {
	v := viper.New()
	v.SetEnvPrefix("FEDSTREAM")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_", ".", "_"))
	v.AutomaticEnv()
	if err := v.BindPFlags(fs); err != nil {
		return err
	}
	if f := v.GetString("config"); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("%w %s: %w", ErrConfigFile, f, err)
		}
		v.SetConfigType("yaml")
		if err := v.ReadConfig(strings.NewReader(string(data))); err != nil {
			return fmt.Errorf("%w %s: %w", ErrConfigFile, f, err)
		}
	}
	// AutomaticEnv only answers Get for keys viper knows; every flag is
	// bound above, so env values reach Unmarshal through AllSettings.
	if err := v.Unmarshal(out); err != nil {
		return fmt.Errorf("%w: %w", ErrConfigFile, err)
	}
	return nil
}

// LoadCoordinator reads the coordinator's configuration.
func LoadCoordinator(fs *pflag.FlagSet) (*Coordinator, error) {
	var c Coordinator
	if err := load(fs, &c); err != nil {
		return nil, err
	}
	c.Join = splitList(c.Join)
	c.Federation.Join = splitList(c.Federation.Join)
	c.Federation.Load.AutoAccept.From = splitList(c.Federation.Load.AutoAccept.From)
	if err := tokenFromFile("join-token", &c.JoinToken, c.JoinTokenFile); err != nil {
		return nil, err
	}
	if err := tokenFromFile("admin-token", &c.AdminToken, c.AdminTokenFile); err != nil {
		return nil, err
	}
	return &c, nil
}

// LoadWorker reads the worker's configuration.
func LoadWorker(fs *pflag.FlagSet) (*Worker, error) {
	var w Worker
	if err := load(fs, &w); err != nil {
		return nil, err
	}
	w.Coordinators = splitList(w.Coordinators)
	if err := tokenFromFile("join-token", &w.JoinToken, w.JoinTokenFile); err != nil {
		return nil, err
	}
	if w.GCPercent <= 0 {
		return nil, fmt.Errorf("%w, got %d", ErrGCPercent, w.GCPercent)
	}
	for name, n := range map[string]int{"dcaa-keep-tuples": w.DCAAKeepTuples, "input-pending-tuples": w.InputPendingTuples} {
		if n < 0 {
			return nil, fmt.Errorf("%w: %s must not be negative, got %d", ErrCount, name, n)
		}
	}
	if w.SensorWindow < 0 || w.SensorWindow > 0 && w.SensorWindow < 10*time.Millisecond {
		return nil, fmt.Errorf("%w: sensor-window must be at least 10ms, got %s", ErrDuration, w.SensorWindow)
	}
	for name, d := range map[string]time.Duration{"stall-after": w.StallAfter, "subscriber-lease": w.SubscriberLease, "overrun-grace": w.OverrunGrace} {
		if d < 0 {
			return nil, fmt.Errorf("%w: %s must not be negative, got %s", ErrDuration, name, d)
		}
	}
	return &w, nil
}

// splitList accepts both YAML lists and comma-separated strings (env vars).
func splitList(in []string) []string {
	var out []string
	for _, s := range in {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}
