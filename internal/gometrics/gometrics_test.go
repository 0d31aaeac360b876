package gometrics

import (
	"strings"
	"testing"

	metrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestName(t *testing.T) {
	for key, want := range map[string]string{
		"raft.commitTime":                  "raft_commit_time",
		"raft.replication.appendEntries":   "raft_replication_append_entries",
		"serf.coordinate.adjustment-ms":    "serf_coordinate_adjustment_seconds",
		"x.sizeMB.h":                       "x_size_bytes_h_unit",
		"memberlist.udp.received":          "memberlist_udp_received",
		"raft.fsm.applyBatchNum":           "raft_fsm_apply_batch_num",
		"serf.member.STATUS":               "serf_member_status",
		"raft.leader.dispatchNumLogs..x-y": "raft_leader_dispatch_num_logs_x_y",
	} {
		if got := Name(strings.Split(key, ".")); got != want {
			t.Errorf("Name(%s) = %s, want %s", key, got, want)
		}
	}
}

// TestSinkServesLintFreeMetrics feeds the sink what raft and serf emit
// and checks the result with promlint: counters end in _total, names are
// snake_case, and label sets stay consistent within a family (an update
// with other label names is dropped and counted, as is raft's legacy
// per-peer key).
func TestSinkServesLintFreeMetrics(t *testing.T) {
	s := NewSink()
	s.IncrCounter([]string{"raft", "apply"}, 1)
	s.IncrCounter([]string{"raft", "apply"}, 2)
	s.AddSample([]string{"raft", "commitTime"}, 0.002)
	s.AddSample([]string{"raft", "commitTime"}, 0.004)
	s.SetGauge([]string{"raft", "peers"}, 3)
	s.AddSampleWithLabels([]string{"raft", "replication", "appendEntries", "rpc"}, 0.001, []metrics.Label{{Name: "peer_id", Value: "c2"}})
	s.IncrCounter([]string{"raft", "replication", "appendEntries", "logs", "c2"}, 4) // legacy per-peer key: dropped
	s.IncrCounterWithLabels([]string{"serf", "member", "join"}, 1, []metrics.Label{{Name: "network", Value: "lan"}})
	s.IncrCounterWithLabels([]string{"serf", "member", "join"}, 1, nil) // other label names: dropped
	s.AddSample([]string{"serf", "coordinate", "adjustment-ms"}, 250)   // in seconds: 0.25
	s.SetGauge([]string{"raft", "gauge", "count"}, 1)                   // the type in its name, which promlint rejects: dropped

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	want := `
# HELP raft_apply_total go-metrics counter raft.apply, from hashicorp/raft.
# TYPE raft_apply_total counter
raft_apply_total 3
# HELP raft_peers go-metrics gauge raft.peers, from hashicorp/raft.
# TYPE raft_peers gauge
raft_peers 3
# HELP serf_member_join_total go-metrics counter serf.member.join, from hashicorp/serf.
# TYPE serf_member_join_total counter
serf_member_join_total{network="lan"} 1
# HELP fedstream_gometrics_dropped_total go-metrics updates the bridge dropped (series beyond its bound, or label names differing from the first series of the same name).
# TYPE fedstream_gometrics_dropped_total counter
fedstream_gometrics_dropped_total 2
# HELP serf_coordinate_adjustment_seconds go-metrics samples (durations timed by go-metrics in seconds, a unit the key names in its base unit) serf.coordinate.adjustment-ms, from hashicorp/serf.
# TYPE serf_coordinate_adjustment_seconds summary
serf_coordinate_adjustment_seconds_sum 0.25
serf_coordinate_adjustment_seconds_count 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "raft_apply_total", "raft_peers", "serf_member_join_total", "fedstream_gometrics_dropped_total", "serf_coordinate_adjustment_seconds"); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg, "raft_commit_time", "raft_replication_append_entries_rpc", "raft_replication_append_entries_logs_total")
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%d series of the samples and the legacy key, want 2 (the legacy per-peer key dropped)", n)
	}
}

// TestInstallBridgesTheGlobalSink: what the libraries send to go-metrics'
// global sink reaches the installed bridge.
func TestInstallBridgesTheGlobalSink(t *testing.T) {
	s := Install()
	if Install() != s {
		t.Fatal("Install returned another sink the second time")
	}
	metrics.IncrCounter([]string{"fedstream", "test", "bridged"}, 5)
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP fedstream_test_bridged_total go-metrics counter fedstream.test.bridged, from hashicorp/fedstream.
# TYPE fedstream_test_bridged_total counter
fedstream_test_bridged_total 5
`), "fedstream_test_bridged_total"); err != nil {
		t.Error(err)
	}
}
