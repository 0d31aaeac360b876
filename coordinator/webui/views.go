package webui

import (
	"sort"
	"strings"

	"github.com/fedstream/fedstream/config/queryspec"
	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
)

// The API's JSON documents. The CLI's --json output (fedstream status,
// workers, query list, query status) prints these same documents, so a
// script reads either; the API adds a few fields the page needs (marked).
// TaskStats has the keys `fedstream query stats --json` prints. Lists are
// never null.

// Org is GET /api/org: the answering coordinator's view of the cluster.
type Org struct {
	Org               string `json:"org"`
	NodeID            string `json:"node_id"`
	State             string `json:"state"`
	LeaderID          string `json:"leader_id"`
	LeaderAddr        string `json:"leader_addr"`
	LeaderGRPCAddr    string `json:"leader_grpc_addr"`
	Peers             []Peer `json:"peers"`
	LastIndex         uint64 `json:"last_index"`
	AppliedIndex      uint64 `json:"applied_index"`
	DevMode           bool   `json:"dev_mode"`
	InsecurePlaintext bool   `json:"insecure_plaintext"`
}

// Peer is one coordinator of the Raft configuration.
type Peer struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	Suffrage string `json:"suffrage"`
	// Leader marks the current leader (addition).
	Leader bool `json:"leader"`
}

// OrgView converts a Status answer.
func OrgView(st *pb.StatusResponse) Org {
	o := Org{
		Org: st.Org, NodeID: st.NodeId, State: st.State,
		LeaderID: st.LeaderId, LeaderAddr: st.LeaderAddr, LeaderGRPCAddr: st.LeaderGrpcAddr,
		Peers: []Peer{}, LastIndex: st.LastIndex, AppliedIndex: st.AppliedIndex,
		DevMode: st.DevMode, InsecurePlaintext: st.InsecurePlaintext,
	}
	for _, p := range st.Peers {
		o.Peers = append(o.Peers, Peer{ID: p.Id, Addr: p.Addr, Suffrage: p.Suffrage, Leader: p.Id != "" && p.Id == st.LeaderId})
	}
	return o
}

// Workers is GET /api/workers.
type Workers struct {
	Workers []Worker `json:"workers"`
	// TasksPerCore is placement's bound per worker core (0: none).
	TasksPerCore int `json:"tasks_per_core"`
}

// Worker is one worker, as `fedstream workers --json` prints it.
type Worker struct {
	ID     string `json:"id"`
	Org    string `json:"org"`
	Addr   string `json:"addr"`
	Status string `json:"status"`
	// StatusNote says why Status is what it is when the leader shows a
	// status the workers table does not hold (unreachable).
	StatusNote string            `json:"status_note,omitempty"`
	Cores      int32             `json:"cores"`
	Labels     map[string]string `json:"labels"`
	Name       string            `json:"name"`
	Tasks      []string          `json:"tasks"`
	TaskStates []TaskState       `json:"task_states"`
	// DataPlaneLevel is the data-plane feature level the worker's build
	// registered with (0: it stated none, an older build counted as
	// level 1; see docs/ARCHITECTURE.md, "Rolling upgrades").
	DataPlaneLevel int32 `json:"dataplane_level"`
	// Capacity is how many tasks placement may put on the worker
	// (cores x tasks_per_core), and Load the share of it its tasks use
	// (additions; left out when unbounded or unknown, as in the CLI's
	// output).
	Capacity int     `json:"capacity,omitempty"`
	Load     float64 `json:"load,omitempty"`
}

// TaskState is a task's state as its worker reported it.
type TaskState struct {
	ID         string `json:"id"`
	Generation int32  `json:"generation"`
	State      string `json:"state"`
	Reason     string `json:"reason"`
}

// WorkersView converts a ListWorkers answer.
func WorkersView(ws *pb.ListWorkersResponse, tasksPerCore int) Workers {
	out := Workers{Workers: []Worker{}, TasksPerCore: tasksPerCore}
	for _, w := range ws.Workers {
		v := Worker{ID: w.Id, Org: w.Org, Addr: w.Addr, Status: w.Status, StatusNote: w.StatusNote, Cores: w.Cores, Labels: w.Labels, Name: w.Name,
			Tasks: append([]string{}, w.Tasks...), TaskStates: []TaskState{}, DataPlaneLevel: w.DataplaneLevel}
		if v.Labels == nil {
			v.Labels = map[string]string{}
		}
		for _, st := range w.TaskStates {
			v.TaskStates = append(v.TaskStates, TaskState{ID: st.TaskId, Generation: st.Generation, State: st.State, Reason: st.Message})
		}
		if tasksPerCore > 0 {
			v.Capacity = int(max(w.Cores, 1)) * tasksPerCore
			v.Load = float64(len(w.Tasks)) / float64(v.Capacity)
		}
		out.Workers = append(out.Workers, v)
	}
	return out
}

// Queries is GET /api/queries.
type Queries struct {
	Queries []Query `json:"queries"`
}

// Query is one query with its tasks, as `fedstream query status --json`
// prints it.
type Query struct {
	Name     string `json:"name"`
	Status   string `json:"status"`
	Index    uint64 `json:"index"`
	Replicas int32  `json:"replicas"`
	MaxDelay string `json:"max_delay"`
	Tasks    []Task `json:"tasks"`
	// Tentative: some task's output is tentative now, so the query's
	// results are too (until corrected).
	Tentative bool `json:"tentative"`
}

// Task is one task of a query and where it runs.
type Task struct {
	ID         string `json:"id"`
	Generation int32  `json:"generation"`
	Fragment   string `json:"fragment"`
	Partition  int32  `json:"partition"`
	Replica    int32  `json:"replica"`
	Worker     string `json:"worker"`
	WorkerAddr string `json:"worker_addr"`
	State      string `json:"state"`
	Reason     string `json:"reason"`
	Message    string `json:"message"`
	SlotEpoch  uint64 `json:"slot_epoch,omitempty"`
	Slots      int32  `json:"slots,omitempty"`
	MovingFrom string `json:"moving_from,omitempty"`
	// Org is the partner org the task runs at (cross-org migration), and
	// OrgPhase moving, running or returning; empty at home.
	Org      string `json:"org,omitempty"`
	OrgPhase string `json:"org_phase,omitempty"`
	// ReplicaState is the task replica's DCAA state ("STABLE",
	// "UP_FAILURE", "STABILIZATION"; omitted when its query has no
	// replicas) and Tentative whether its output is tentative now.
	ReplicaState string `json:"replica_state,omitempty"`
	Tentative    bool   `json:"tentative,omitempty"`
	// Lossy: a DCAA correction could not make the replica's results
	// exact; the leader replaces it from a STABLE peer when there is one.
	Lossy bool `json:"lossy,omitempty"`
}

// ReplicaStateName is how a DCAA replica state shows ("" when unset).
func ReplicaStateName(s pb.ReplicaState) string {
	if s == pb.ReplicaState_REPLICA_STATE_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(s.String(), "REPLICA_")
}

// QueryView converts a query answer (its spec is left out).
func QueryView(q *pb.QueryInfo) Query {
	out := Query{Name: q.Name, Status: q.Status, Index: q.Index, Replicas: q.Replicas, MaxDelay: q.MaxDelay, Tasks: []Task{}}
	for _, t := range q.Tasks {
		out.Tasks = append(out.Tasks, Task{ID: t.TaskId, Generation: t.Generation, Fragment: t.Fragment, Partition: t.Partition,
			Replica: t.Replica, Worker: t.WorkerId, WorkerAddr: t.WorkerAddr, State: t.State, Reason: t.Message, Message: t.Message,
			SlotEpoch: t.SlotEpoch, Slots: t.SlotCount, MovingFrom: t.MovingFrom, Org: t.Org, OrgPhase: t.OrgPhase,
			ReplicaState: ReplicaStateName(t.ReplicaState), Tentative: t.Tentative, Lossy: t.Lossy})
		out.Tentative = out.Tentative || t.Tentative
	}
	sort.Slice(out.Tasks, func(i, j int) bool { return out.Tasks[i].ID < out.Tasks[j].ID })
	return out
}

// QueryDetail is GET /api/queries/{name}: the query, its operator graph and
// its tasks' live figures.
type QueryDetail struct {
	Query
	Graph Graph `json:"graph"`
	Stats Stats `json:"stats"`
}

// Graph is a query's plan as it runs: one node per fragment (stateless
// operators fused into their upstream are its members), one edge per
// stream between fragments.
type Graph struct {
	Nodes []GraphNode `json:"nodes"`
	Edges []Edge      `json:"edges"`
	// Error says why the graph holds only the fragments named by the tasks,
	// without edges: the spec could not be read.
	Error string `json:"error,omitempty"`
}

// GraphNode is one fragment.
type GraphNode struct {
	Name string `json:"name"`
	// Kind is source, operator or sink.
	Kind string `json:"kind"`
	// Type is the head's operator type (aggregate, join, ...), a source's
	// generator kind or "ingest", or "sink".
	Type string `json:"type"`
	// Members are the logical operators the fragment runs, head first.
	Members    []string `json:"members"`
	Partitions int      `json:"partitions"`
	KeyedBy    []string `json:"keyed_by"`
}

// Edge is a stream from one fragment to another.
type Edge struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// GraphOf builds a query's graph from its spec. When the spec cannot be
// read (a spec from a newer build, say) the graph still lists the
// fragments the tasks name, and says why it has no edges.
func GraphOf(q *pb.QueryInfo) Graph {
	g := Graph{Nodes: []GraphNode{}, Edges: []Edge{}}
	plan, err := planOf(q.SpecJson)
	if err != nil {
		g.Error = err.Error()
		seen := map[string]bool{}
		for _, t := range q.Tasks {
			if !seen[t.Fragment] {
				seen[t.Fragment] = true
				g.Nodes = append(g.Nodes, GraphNode{Name: t.Fragment, Kind: "unknown", Members: []string{t.Fragment}, KeyedBy: []string{}})
			}
		}
		sort.Slice(g.Nodes, func(i, j int) bool { return g.Nodes[i].Name < g.Nodes[j].Name })
		return g
	}
	for _, n := range plan.Nodes {
		node := GraphNode{Name: n.Name, Kind: string(n.Kind), Members: append([]string{}, n.Members...),
			Partitions: max(n.Partitions, 1), KeyedBy: append([]string{}, n.KeyFields...)}
		switch {
		case n.Op != nil:
			node.Type = n.Op.Type
		case n.Source != nil && n.Source.Gen != nil:
			node.Type = "generator " + n.Source.Gen.Kind
		case n.Source != nil:
			node.Type = "ingest"
		default:
			node.Type = "sink"
		}
		g.Nodes = append(g.Nodes, node)
		for _, in := range n.Inputs {
			e := Edge{From: in, To: n.Name}
			// A self-join reads one upstream twice: one stream to draw.
			if !containsEdge(g.Edges, e) {
				g.Edges = append(g.Edges, e)
			}
		}
	}
	return g
}

func containsEdge(es []Edge, e Edge) bool {
	for _, x := range es {
		if x == e {
			return true
		}
	}
	return false
}

// specError says why a query's spec could not be read.
type specError string

func (e specError) Error() string { return string(e) }

func planOf(spec []byte) (*queryspec.Plan, error) {
	if len(spec) == 0 {
		return nil, specError("the coordinator sent no query spec")
	}
	q, err := queryspec.FromJSON(spec)
	if err != nil {
		return nil, err
	}
	return q.FusedPlan()
}

// Stats are a query's live per-task figures (the keys of
// `fedstream query stats --json`).
type Stats struct {
	// Available is false when the coordinator reported no figures; Reason
	// then says why.
	Available bool        `json:"available"`
	Reason    string      `json:"reason,omitempty"`
	Tasks     []TaskStats `json:"tasks"`
}

// TaskStats are one task's figures over its worker's last report.
type TaskStats struct {
	Task                 string  `json:"task"`
	Worker               string  `json:"worker"`
	InTPS                float64 `json:"in_tps"`
	OutTPS               float64 `json:"out_tps"`
	Busy                 float64 `json:"busy"`
	Queue                int64   `json:"queue"`
	BackpressureMsPerS   float64 `json:"backpressure_ms_per_s"`
	OutputBufferBytes    int64   `json:"output_buffer_bytes"`
	UnackedTuples        int64   `json:"unacked_tuples"`
	SubscriptionSwitches int64   `json:"subscription_switches"`
	CPUSecondsPerS       float64 `json:"cpu_seconds_per_s"`
	ReportedAtMs         int64   `json:"reported_at_ms"`
}

// StatsView converts a QueryStats answer. Task names are the query's task
// ids; a generation suffix ("@g2") is dropped so that figures match the
// task they belong to.
func StatsView(resp *pb.QueryStatsResponse) Stats {
	out := Stats{Available: true, Tasks: []TaskStats{}}
	for _, t := range resp.Tasks {
		id, _, _ := strings.Cut(t.Task, "@")
		out.Tasks = append(out.Tasks, TaskStats{Task: id, Worker: t.Worker, InTPS: t.InTps, OutTPS: t.OutTps, Busy: t.Busy,
			Queue: t.Queue, BackpressureMsPerS: t.BackpressureMsPerS, OutputBufferBytes: t.OutputBufferBytes,
			UnackedTuples: t.UnackedTuples, SubscriptionSwitches: t.SubscriptionSwitches, CPUSecondsPerS: t.CpuSecondsPerS,
			ReportedAtMs: t.ReportedAtMs})
	}
	sort.Slice(out.Tasks, func(i, j int) bool { return out.Tasks[i].Task < out.Tasks[j].Task })
	return out
}
