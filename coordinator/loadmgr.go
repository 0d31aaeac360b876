package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fedstream/fedstream/federation/loadmgr"
	"github.com/fedstream/fedstream/fsm"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// The load manager (issue 11 items 4-5) runs on the org leader of an org
// in a federation: it measures the org's load from the workers' per-task
// CPU figures and its capacity from their cores, and moves tasks to
// contract partners and back (package federation/loadmgr).

// setupLoadManager builds the org's load manager (in a federation only)
// and makes it the receiver of partners' quotes and offers.
func (s *Server) setupLoadManager() error {
	if !s.cfg.Federation.Enabled() {
		return nil
	}
	// The server itself moves tasks across orgs (MigrateTaskOut,
	// ReturnTaskHome: the live task move through a partner's Raft).
	m, err := loadmgr.New(s.cfg.Federation.Load, s.fed, s.loadSample, s, s.logger)
	if err != nil {
		return fmt.Errorf("federation.load: %w", err)
	}
	s.load = m
	s.fed.SetLoadHandler(m)
	return nil
}

// loadSample measures the org for the load manager: every task the
// workers report with its CPU seconds per second (the larger figure when
// two workers report one task during a move), its class (the task's query
// name), and the cores of the ready workers.
func (s *Server) loadSample() loadmgr.Sample {
	var out loadmgr.Sample
	ws, err := s.State().Workers(nil)
	if err != nil {
		return out
	}
	for _, w := range ws {
		if w.Status == fsm.WorkerStatusReady {
			out.Cores += float64(max(w.Cores, 1))
		}
	}
	byTask := map[string]float64{}
	for _, ts := range s.LiveTaskStats("") {
		byTask[ts.Task] = max(byTask[ts.Task], ts.CpuSecondsPerS)
	}
	tasks, err := s.State().Tasks(nil)
	if err != nil {
		return out
	}
	for _, t := range tasks {
		load, ok := byTask[t.ID]
		if !ok || t.WorkerID == "" {
			continue
		}
		out.Tasks = append(out.Tasks, loadmgr.TaskLoad{ID: t.ID, Class: t.Query, Load: load})
	}
	return out
}

// LoadStatus is the load manager's status; ok is false outside a
// federation.
func (s *Server) LoadStatus() (loadmgr.Status, bool) {
	if s.load == nil {
		return loadmgr.Status{}, false
	}
	return s.load.Status(), true
}

type loadService struct {
	pb.UnimplementedLoadServiceServer
	s *Server
}

const loadMethod = "/fedstream.v1.LoadService/"

// LoadStatus answers with the leader's load manager status.
func (ls *loadService) LoadStatus(ctx context.Context, req *pb.LoadStatusRequest) (*pb.LoadStatusResponse, error) {
	resp := &pb.LoadStatusResponse{}
	if handled, err := ls.s.leaderOrForward(ctx, loadMethod+"LoadStatus", req, resp); handled {
		return resp, err
	}
	st, ok := ls.s.LoadStatus()
	if !ok {
		return resp, nil
	}
	b, err := json.Marshal(st)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &pb.LoadStatusResponse{Enabled: true, StatusJson: b}, nil
}

var (
	descFedLoad     = prometheus.NewDesc("fedstream_federation_load", "The org's smoothed load in CPU seconds per second (partners' tasks hosted here included), as the leader's load manager measured it.", nil, nil)
	descFedCapacity = prometheus.NewDesc("fedstream_federation_capacity", "The org's capacity T: its ready workers' cores times the target utilisation.", nil, nil)
	descFedMC       = prometheus.NewDesc("fedstream_federation_marginal_cost", "The org's marginal cost at its load.", nil, nil)
	descFedAway     = prometheus.NewDesc("fedstream_federation_tasks_at_partners", "This org's tasks the ledger records at partners.", nil, nil)
	descFedHosted   = prometheus.NewDesc("fedstream_federation_tasks_hosted", "Partners' tasks the ledger records hosted here.", nil, nil)
)

var loadDescs = []*prometheus.Desc{descFedLoad, descFedCapacity, descFedMC, descFedAway, descFedHosted}

// collectLoad adds the load manager's gauges (leader only).
func (s *Server) collectLoad(gauge func(d *prometheus.Desc, v float64, labels ...string)) {
	if s.load == nil || !s.IsLeader() {
		return
	}
	st := s.load.Status()
	gauge(descFedLoad, st.Load)
	gauge(descFedCapacity, st.Capacity)
	gauge(descFedMC, st.MarginalCost)
	gauge(descFedAway, float64(len(st.Out)))
	gauge(descFedHosted, float64(len(st.In)))
}

// loadOffloader is the health manager's offloader in a federation: the
// load manager's offer rule, for the tasks of one fragment (health
// HealthConfig.Offload).
type loadOffloader struct{ s *Server }

// Available: a contract in force lets this org's tasks run at a partner.
func (o loadOffloader) Available(time.Time) (bool, string) {
	if o.s.load == nil {
		return false, "no load manager: the coordinator is not in a federation"
	}
	return o.s.load.CanOffload()
}

// Offload offers the fragment's tasks running at home (every replica of
// every partition) to contract partners through the load manager: a task
// moves only under a valid contract whose price the offer rule finds
// profitable, and each move is co-signed into the ledger.
func (o loadOffloader) Offload(ctx context.Context, query, fragment string) (string, error) {
	if o.s.load == nil {
		return "", errors.New("no load manager: the coordinator is not in a federation")
	}
	tasks, err := o.s.State().TasksByQuery(nil, query)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, t := range tasks {
		if t.Fragment == fragment && t.WorkerID != "" && !strings.HasPrefix(t.WorkerID, partnerWorkerID("")) {
			ids = append(ids, t.ID)
		}
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("%w: no task of %s/%s runs at home", loadmgr.ErrNoOffload, query, fragment)
	}
	moved, err := o.s.load.Offload(ctx, ids)
	if err != nil {
		return "", err
	}
	parts := make([]string, len(moved))
	for i, m := range moved {
		parts[i] = fmt.Sprintf("%s to %s under contract %s at price %.4g (load %.3g)", m.Task, m.Partner, m.Contract, m.Price, m.Load)
	}
	return "offloaded " + strings.Join(parts, ", "), nil
}
