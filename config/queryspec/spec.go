// Package queryspec is the user-facing definition of a continuous query: the
// YAML format users write, its validation (every error names the file, the
// field and what is wrong), expression type-checking against schemas, and the
// canonical JSON form stored in Raft and handed to workers.
package queryspec

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// Query is a continuous query as submitted by a user.
type Query struct {
	Name         string       `yaml:"name" json:"name"`
	Replicas     int          `yaml:"replicas" json:"replicas"`
	Availability Availability `yaml:"availability" json:"availability"`
	Sources      []Source     `yaml:"sources" json:"sources"`
	Operators    []Operator   `yaml:"operators" json:"operators"`
	Sinks        []Sink       `yaml:"sinks" json:"sinks"`
	// SLO are the query's objectives for the health manager.
	SLO *SLO `yaml:"slo,omitempty" json:"slo,omitempty"`
	// Autoscale lets the org leader's health manager rescale and move the
	// query's tasks (a query with an SLO is watched too).
	Autoscale bool `yaml:"autoscale,omitempty" json:"autoscale,omitempty"`

	// lines maps a field path ("operators[2].where") to its line in the
	// YAML file, so that validation errors can point at the source. It is
	// only set by Parse and never serialised.
	lines map[string]int
}

// SLO are a query's service level objectives.
type SLO struct {
	// Throughput is the rate the query must sustain, in input records
	// per second its sources take (summed over its sources), whatever
	// its windows and joins make of them: a windowed query's sinks see
	// results only when windows close. See docs/HEALTH.md.
	Throughput float64 `yaml:"throughput" json:"throughput"`
}

// Availability is the query's DCAA bound X.
type Availability struct {
	// MaxDelay is a Go duration ("2s", "500ms"), "0" (answer at once) or
	// "strict" (never emit tentative results).
	MaxDelay string `yaml:"max_delay" json:"max_delay"`
}

// Source is an input stream: a built-in generator, ingest or a Kafka topic.
type Source struct {
	Name   string     `yaml:"name" json:"name"`
	Schema Schema     `yaml:"schema" json:"schema"`
	Gen    *Generator `yaml:"generator,omitempty" json:"generator,omitempty"`
	Ingest bool       `yaml:"ingest,omitempty" json:"ingest,omitempty"`
	// Parallelism is the number of source partitions (generators; a kafka
	// source's is its partition count).
	Parallelism int `yaml:"parallelism,omitempty" json:"parallelism,omitempty"`
	// AllowedLateness (ingest sources, a Go duration; empty means 0) is
	// how far behind the newest accepted record a record may be and still
	// be accepted. See Source.Lateness.
	AllowedLateness string `yaml:"allowed_lateness,omitempty" json:"allowed_lateness,omitempty"`
	// Kafka reads a Kafka topic (see kafka.go).
	Kafka *KafkaSource `yaml:"kafka,omitempty" json:"kafka,omitempty"`
}

// Generator selects a deterministic built-in source.
type Generator struct {
	// Kind is one of "netmon", "words", "vitals", "blob".
	Kind string `yaml:"kind" json:"kind"`
	// Rate in records per second per partition; 0 means as fast as possible.
	Rate int   `yaml:"rate" json:"rate"`
	Seed int64 `yaml:"seed" json:"seed"`
	// Monitors is the number of simulated monitors (netmon).
	Monitors int `yaml:"monitors,omitempty" json:"monitors,omitempty"`
	// Size is the payload length in bytes of each record (blob).
	Size int `yaml:"size,omitempty" json:"size,omitempty"`
	// Limit stops the generator after this many records (0: unbounded).
	Limit int64 `yaml:"limit,omitempty" json:"limit,omitempty"`
	// Start is the stime of the first record (RFC 3339); empty means the
	// Unix epoch, so that runs are reproducible.
	Start string `yaml:"start,omitempty" json:"start,omitempty"`
}

// Field is one column in a schema, in declaration order.
type Field struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// Schema keeps the order the user wrote the fields in (YAML maps are ordered
// in the file; Go maps are not). In YAML it is a mapping name: type; in JSON
// a list of fields.
type Schema []Field

// Operator is one node of the dataflow graph.
type Operator struct {
	Name string `yaml:"name" json:"name"`
	// Type is one of filter, map, split, union, aggregate, join.
	Type string `yaml:"type" json:"type"`
	// Input names the input stream (filter, map, split, aggregate).
	Input string `yaml:"input,omitempty" json:"input,omitempty"`
	// Inputs names the input streams (union).
	Inputs []string `yaml:"inputs,omitempty" json:"inputs,omitempty"`
	// Left and Right name the join's inputs.
	Left  string `yaml:"left,omitempty" json:"left,omitempty"`
	Right string `yaml:"right,omitempty" json:"right,omitempty"`
	// Where is the filter predicate (expression yielding bool); on a
	// join, an optional predicate over each matched pair's output fields.
	Where string `yaml:"where,omitempty" json:"where,omitempty"`
	// Fields are the map projections, output name -> expression, in order.
	Fields Exprs `yaml:"fields,omitempty" json:"fields,omitempty"`
	// Window configures aggregate and join windows.
	Window *Window `yaml:"window,omitempty" json:"window,omitempty"`
	// GroupBy lists the aggregate's key fields.
	GroupBy []string `yaml:"group_by,omitempty" json:"group_by,omitempty"`
	// Aggregates are output name -> "fn(field)", in order.
	Aggregates Exprs `yaml:"aggregates,omitempty" json:"aggregates,omitempty"`
	// On lists the join's equi-join key fields (same name on both sides).
	On []string `yaml:"on,omitempty" json:"on,omitempty"`
	// Field is the string field a split tokenises.
	Field string `yaml:"field,omitempty" json:"field,omitempty"`
	// As names the split's token field (default DefaultSplitAs).
	As string `yaml:"as,omitempty" json:"as,omitempty"`
	// Lower makes a split lower-case its tokens.
	Lower bool `yaml:"lower,omitempty" json:"lower,omitempty"`
	// Parallelism is the number of partitions (default 1).
	Parallelism int `yaml:"parallelism,omitempty" json:"parallelism,omitempty"`
	// Cost is a processing time each input tuple costs the operator on
	// top of its work (a Go duration, at most MaxOperatorCost): a
	// calibrated load for tests and benchmarks of the health manager.
	Cost string `yaml:"cost,omitempty" json:"cost,omitempty"`
}

// MaxOperatorCost bounds Operator.Cost.
const MaxOperatorCost = 100 * time.Millisecond

// CostDuration is the operator's Cost (0 when unset or invalid: validation
// refuses an invalid one).
func (op *Operator) CostDuration() time.Duration {
	if op == nil || op.Cost == "" {
		return 0
	}
	d, err := time.ParseDuration(op.Cost)
	if err != nil || d < 0 {
		return 0
	}
	return d
}

// Window is a tumbling (slide empty or equal to size) or sliding window on stime.
type Window struct {
	Size  string `yaml:"size" json:"size"`
	Slide string `yaml:"slide,omitempty" json:"slide,omitempty"`
}

// NamedExpr is one output name and its expression.
type NamedExpr struct {
	Name string `json:"name"`
	Expr string `json:"expr"`
}

// Exprs keeps declaration order: a mapping in YAML, a list in JSON.
type Exprs []NamedExpr

// Sink is a named query output that clients tail.
type Sink struct {
	Name  string `yaml:"name" json:"name"`
	Input string `yaml:"input" json:"input"`
	// Kafka also writes the sink's results to a Kafka topic (see kafka.go).
	Kafka *KafkaSink `yaml:"kafka,omitempty" json:"kafka,omitempty"`
}

// UnmarshalYAML reads a schema written as a mapping `name: type` (the usual
// form, order preserved) or as a list of {name, type} (the JSON form).
// Type names are checked later by Validate so that all problems are reported
// together with their field paths.
func (s *Schema) UnmarshalYAML(n *yaml.Node) error {
	out, err := decodeOrdered(n, "schema entries must be `name: type` scalars",
		"schema must be a mapping of field name to type",
		func(name, value string) Field { return Field{Name: name, Type: value} })
	*s = out
	return err
}

// decodeOrdered reads a YAML mapping of scalars `name: value`, keeping its
// order (Go maps would lose it), or the equivalent list of objects (the JSON
// form), into []T; null is an empty list. entryErr and kindErr are the
// messages for a non-scalar entry and for a node of the wrong kind.
func decodeOrdered[T any](n *yaml.Node, entryErr, kindErr string, pair func(name, value string) T) ([]T, error) {
	switch n.Kind {
	case yaml.MappingNode:
		out := make([]T, 0, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || v.Kind != yaml.ScalarNode {
				return nil, &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s", k.Line, entryErr)}}
			}
			out = append(out, pair(k.Value, v.Value))
		}
		return out, nil
	case yaml.SequenceNode:
		var list []T
		if err := n.Decode(&list); err != nil {
			return nil, err
		}
		return list, nil
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return nil, nil
		}
	}
	return nil, &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s", n.Line, kindErr)}}
}

// MarshalYAML writes the schema as a mapping `name: type` in field order.
func (s Schema) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
	for _, f := range s {
		n.Content = append(n.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Value: f.Name},
			&yaml.Node{Kind: yaml.ScalarNode, Value: f.Type})
	}
	return n, nil
}

// UnmarshalYAML reads expressions written as a mapping `name: expression`
// (order preserved) or as a list of {name, expr} (the JSON form).
func (e *Exprs) UnmarshalYAML(n *yaml.Node) error {
	out, err := decodeOrdered(n, "entries must be `name: expression` scalars",
		"must be a mapping of output name to expression",
		func(name, value string) NamedExpr { return NamedExpr{Name: name, Expr: value} })
	*e = out
	return err
}

// MarshalYAML writes the expressions as a mapping `name: expression` in order.
func (e Exprs) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, x := range e {
		n.Content = append(n.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Value: x.Name},
			&yaml.Node{Kind: yaml.ScalarNode, Value: x.Expr, Style: yaml.DoubleQuotedStyle})
	}
	return n, nil
}
