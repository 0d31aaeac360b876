package queryspec

import (
	"fmt"
	"math"

	"github.com/fedstream/fedstream/worker/tuple"
)

// NodeKind says what role a node plays in the dataflow graph.
type NodeKind string

// The node kinds.
const (
	KindSource   NodeKind = "source"
	KindOperator NodeKind = "operator"
	KindSink     NodeKind = "sink"
)

// Plan is a validated query as a dataflow graph. Each node is one fragment
// (fragment name = node name); a fragment runs as Partitions x Replicas tasks.
type Plan struct {
	Query *Query
	// Nodes are in topological order: every node comes after all of its
	// inputs; ties keep declaration order (sources, operators, sinks).
	Nodes  []*Node
	byName map[string]*Node
}

// Node is one fragment of the plan.
type Node struct {
	Name   string
	Kind   NodeKind
	Op     *Operator // operators only
	Source *Source   // sources only
	Sink   *Sink     // sinks only
	// Inputs are the upstream node names by input port: [input] for filter,
	// map, split, aggregate and sinks; Inputs in order for union; [left, right] for
	// join; none for sources.
	Inputs []string
	// Partitions is the parallelism: Operator.Parallelism, Source.Parallelism,
	// 1 for sinks.
	Partitions int
	// KeyFields partition the node's input by hash slot (aggregate: group_by,
	// join: on); nil means not keyed.
	KeyFields []string
	// Outputs are the downstream node names, in declaration order.
	Outputs []string
	// Schema is the node's output schema (a sink's is its input's); for a
	// fused fragment, the output schema of its last chained operator.
	Schema *tuple.Schema
	// Chain lists the stateless operators fused into this fragment (see
	// FusedPlan), applied in order to the head's output; ChainInputs[i] is
	// the input schema of Chain[i]. Empty in the logical plan.
	Chain       []*Operator
	ChainInputs []*tuple.Schema
	// Members names every node of the logical plan this fragment runs: the
	// head first, then the chained operators.
	Members []string
}

// HeadSchema is the output schema of the fragment's head before any chained
// operator: for a source, the schema its generator or ingest lines have.
func (n *Node) HeadSchema() *tuple.Schema {
	if len(n.ChainInputs) > 0 {
		return n.ChainInputs[0]
	}
	return n.Schema
}

// Node returns the named node, or nil.
func (p *Plan) Node(name string) *Node { return p.byName[name] }

// Plan validates the query (filling in defaults) and builds its graph.
func (q *Query) Plan() (*Plan, error) {
	a := q.analyze(q.Name)
	if err := a.ps.err(); err != nil {
		return nil, err
	}
	p := &Plan{Query: q, byName: make(map[string]*Node, len(a.topo))}
	for _, g := range a.topo {
		n := &Node{
			Name:       g.name,
			Kind:       g.kind,
			Op:         g.op,
			Source:     g.src,
			Sink:       g.sink,
			Partitions: 1,
			Schema:     a.schemas[g.name],
		}
		for _, in := range g.inputs {
			n.Inputs = append(n.Inputs, in.name)
		}
		switch {
		case g.op != nil:
			n.Partitions = g.op.Parallelism
			if len(g.keys) > 0 {
				n.KeyFields = append([]string(nil), g.keys...)
			}
		case g.src != nil:
			n.Partitions = g.src.Parallelism
		}
		p.Nodes = append(p.Nodes, n)
		p.byName[n.Name] = n
	}
	// Outputs in declaration order of the consumers.
	for _, g := range a.decl {
		n := p.byName[g.name]
		if n == nil || a.nodes[g.name] != g {
			continue
		}
		for _, in := range n.Inputs {
			up := p.byName[in]
			if !contains(up.Outputs, n.Name) {
				up.Outputs = append(up.Outputs, n.Name)
			}
		}
	}
	return p, nil
}

// fusible reports whether an operator may run inside its upstream's
// fragment: stateless, one input, not keyed.
func fusible(n *Node) bool {
	if n.Kind != KindOperator || len(n.Inputs) != 1 || n.KeyFields != nil {
		return false
	}
	switch n.Op.Type {
	case OpFilter, OpMap, OpSplit:
		return true
	}
	return false
}

// FusedPlan is the plan that is placed and run: every stateless one-input
// operator (filter, map, split) whose upstream feeds only it, with the same
// parallelism, runs in its upstream's fragment, so a tuple crosses no
// buffer, encoding or merge between them. Results are the same as the
// logical plan's: the chained operators see the same tuples in the same
// order. Sinks, aggregates, joins and unions head their own fragments.
// Node(name) also answers for a fused node, returning its fragment.
func (q *Query) FusedPlan() (*Plan, error) {
	logical, err := q.Plan()
	if err != nil {
		return nil, err
	}
	owner := map[string]*Node{}
	fp := &Plan{Query: q, byName: map[string]*Node{}}
	for _, ln := range logical.Nodes {
		if fusible(ln) {
			up := logical.byName[ln.Inputs[0]]
			f := owner[up.Name]
			if f != nil && f.Kind != KindSink && len(up.Outputs) == 1 && ln.Partitions == f.Partitions {
				f.Chain = append(f.Chain, ln.Op)
				f.ChainInputs = append(f.ChainInputs, f.Schema)
				f.Schema = ln.Schema
				f.Outputs = append([]string(nil), ln.Outputs...)
				f.Members = append(f.Members, ln.Name)
				owner[ln.Name] = f
				continue
			}
		}
		n := *ln
		n.Inputs = append([]string(nil), ln.Inputs...)
		n.Outputs = append([]string(nil), ln.Outputs...)
		n.Members = []string{ln.Name}
		owner[ln.Name] = &n
		fp.Nodes = append(fp.Nodes, &n)
	}
	// Edges name fragments: a fragment's head, never a fused member.
	for _, n := range fp.Nodes {
		for i, in := range n.Inputs {
			n.Inputs[i] = owner[in].Name
		}
		for i, out := range n.Outputs {
			n.Outputs[i] = owner[out].Name
		}
	}
	for name, f := range owner {
		fp.byName[name] = f
	}
	return fp, nil
}

// TaskID names one task: "<query>/<fragment>/p<partition>/r<replica>".
func TaskID(query, fragment string, partition, replica int) string {
	return fmt.Sprintf("%s/%s/p%d/r%d", query, fragment, partition, replica)
}

// NumSlots is the number of hash slots keyed state is split into. A
// partition owns a set of slots, so rescaling moves slots, not operators.
const NumSlots = 4096

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Slot is the hash slot of a key: FNV-1a (64-bit) over a canonical encoding
// of the values (kind byte, then 8 little-endian bytes for numbers, or a
// length-prefixed string), mod NumSlots. The encoding is fixed forever:
// changing it would move every key's state.
func Slot(key []tuple.Value) int {
	h := uint64(fnvOffset64)
	for _, v := range key {
		h = fnvByte(h, byte(v.Kind))
		switch v.Kind {
		case tuple.KindFloat:
			f := v.F
			if f == 0 { // +0 and -0 are the same key
				f = 0
			}
			h = fnvUint64(h, math.Float64bits(f))
		case tuple.KindString, tuple.KindBytes:
			h = fnvUint64(h, uint64(len(v.S)))
			for i := 0; i < len(v.S); i++ {
				h = fnvByte(h, v.S[i])
			}
		default: // int, timestamp, bool
			h = fnvUint64(h, uint64(v.I))
		}
	}
	return int(h % NumSlots)
}

func fnvByte(h uint64, b byte) uint64 { return (h ^ uint64(b)) * fnvPrime64 }

// fnvUint64 mixes the 8 little-endian bytes of v.
func fnvUint64(h, v uint64) uint64 {
	for i := 0; i < 8; i++ {
		h = fnvByte(h, byte(v>>(8*i)))
	}
	return h
}

// PartitionOfSlot maps a slot to one of partitions contiguous slot ranges:
// slot*partitions/NumSlots. partitions < 1 is treated as 1.
func PartitionOfSlot(slot, partitions int) int {
	if partitions < 1 {
		return 0
	}
	return slot * partitions / NumSlots
}
