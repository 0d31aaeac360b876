package queryspec

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/fedstream/fedstream/worker/tuple"
)

// Limits and defaults of the query format (documented in docs/QUERY.md).
const (
	DefaultMaxDelay = "2s"
	MaxReplicas     = 5
	MaxParallelism  = 64
	// MaxOperators bounds the operators of one query. With MaxParallelism
	// and MaxReplicas it keeps a query's plan and task list small enough to
	// hold and ship; the coordinators' task limits bound what actually runs.
	MaxOperators = 100
	MaxMonitors  = 64
	MaxNameLen   = 63
	// DefaultBlobSize is the payload length of a blob generator whose size
	// is unset: an encoded blob record (tuple header, seq, payload) is then
	// 100 bytes for records 2^21..2^24 or so, the record size of the
	// benchmarks' raw TCP baseline (varint lengths of id, stime and seq
	// make it 1-2 bytes smaller before and larger after).
	DefaultBlobSize = 81
	// MaxBlobSize bounds a blob generator's payload length.
	MaxBlobSize = 64 << 10
	// WindowEndField is the timestamp field an aggregate appends to its output.
	WindowEndField = "window_end"
	// RightPrefix is prepended to a join's right-side field whose name is
	// already taken by a left-side field.
	RightPrefix = "right_"
	// DefaultSplitAs is the name of a split's token field when `as` is unset.
	DefaultSplitAs = "word"
)

// Operator types.
const (
	OpFilter    = "filter"
	OpMap       = "map"
	OpSplit     = "split"
	OpUnion     = "union"
	OpAggregate = "aggregate"
	OpJoin      = "join"
)

// Generator kinds.
const (
	GenNetmon = "netmon"
	GenWords  = "words"
	GenVitals = "vitals"
	GenBlob   = "blob"
)

var (
	nodeNameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	fieldNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// reservedWords cannot be field names: expressions could not refer to them.
	reservedWords = map[string]bool{
		"true": true, "false": true, "nil": true, "and": true, "or": true, "not": true,
		"in": true, "matches": true, "contains": true, "startsWith": true, "endsWith": true,
		"let": true, "if": true, "else": true,
	}
)

// generatorSchemas are the fixed output schemas of the built-in generators.
var generatorSchemas = map[string]Schema{
	GenNetmon: {{"time", "timestamp"}, {"src", "string"}, {"dst", "string"}, {"port", "int"}},
	GenWords:  {{"line", "string"}},
	GenVitals: {{"time", "timestamp"}, {"patient", "string"}, {"temperature", "float"},
		{"heart_rate", "int"}, {"resp_rate", "int"}, {"bp_sys", "int"}, {"bp_dia", "int"}},
	GenBlob: {{"seq", "int"}, {"payload", "string"}},
}

// GeneratorSchema is the fixed schema of a built-in generator kind.
func GeneratorSchema(kind string) (Schema, error) {
	s, ok := generatorSchemas[kind]
	if !ok {
		return nil, fmt.Errorf("%w: unknown generator kind %q (want %s)", ErrInvalidQuery, kind, generatorKinds())
	}
	return append(Schema(nil), s...), nil
}

func generatorKinds() string { return "netmon, words, vitals, blob" }

// MaxDelayDuration is the availability bound X. strict reports "never emit
// tentative results"; d is then math.MaxInt64 so that code which ignores
// strict still never times out. An invalid value yields the default (2s):
// call it on validated queries.
func (q *Query) MaxDelayDuration() (d time.Duration, strict bool) {
	d, strict, err := parseMaxDelay(q.Availability.MaxDelay)
	if err != nil {
		d, _, _ = parseMaxDelay(DefaultMaxDelay)
		return d, false
	}
	return d, strict
}

func parseMaxDelay(s string) (time.Duration, bool, error) {
	switch strings.TrimSpace(s) {
	case "":
		s = DefaultMaxDelay
	case "strict":
		return time.Duration(math.MaxInt64), true, nil
	case "0":
		return 0, false, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, false, fmt.Errorf("%q is not a duration (want e.g. 500ms, 2s, 0 or strict)", s)
	}
	if d < 0 {
		return 0, false, fmt.Errorf("%q is negative", s)
	}
	return d, false, nil
}

// Lateness is the source's allowed lateness: a record whose time is more
// than this before the newest record the source accepted is refused as
// late, and the source promises downstream (with its boundaries) no
// record earlier than newest - Lateness. Zero (the default) means records
// must come in non-decreasing time order. Call it on validated queries (an
// invalid value yields 0).
func (s *Source) Lateness() time.Duration {
	d, err := parseLateness(s.AllowedLateness)
	if err != nil {
		return 0
	}
	return d
}

func parseLateness(s string) (time.Duration, error) {
	switch strings.TrimSpace(s) {
	case "", "0":
		return 0, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (want e.g. 0, 500ms, 5s, 2m)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative (want 0 or more)", s)
	}
	return d, nil
}

// applyDefaults fills in every optional field so that the canonical form is
// explicit. Zero means "unset" for the numeric settings.
func (q *Query) applyDefaults() {
	if q.Replicas == 0 {
		q.Replicas = 1
	}
	if q.Availability.MaxDelay == "" {
		q.Availability.MaxDelay = DefaultMaxDelay
	}
	for i := range q.Sources {
		s := &q.Sources[i]
		if s.Kafka != nil {
			s.Kafka.applyDefaults()
			if s.Parallelism == 0 && s.Kafka.Partitions >= 1 && s.Kafka.Partitions <= MaxParallelism {
				// Out of range is reported once, on kafka.partitions.
				s.Parallelism = s.Kafka.Partitions
			}
		}
		if s.Parallelism == 0 {
			s.Parallelism = 1
		}
		if s.Gen != nil {
			if gs, ok := generatorSchemas[s.Gen.Kind]; ok && len(s.Schema) == 0 {
				s.Schema = append(Schema(nil), gs...)
			}
			if s.Gen.Kind == GenNetmon && s.Gen.Monitors == 0 {
				s.Gen.Monitors = 1
			}
			if s.Gen.Kind == GenBlob && s.Gen.Size == 0 {
				s.Gen.Size = DefaultBlobSize
			}
		}
	}
	for i := range q.Sinks {
		if k := q.Sinks[i].Kafka; k != nil {
			k.applyDefaults()
		}
	}
	for i := range q.Operators {
		op := &q.Operators[i]
		if op.Parallelism == 0 {
			op.Parallelism = 1
		}
		if op.Type == OpSplit && op.As == "" {
			op.As = DefaultSplitAs
		}
	}
}

// Validate fills in defaults and checks every rule of the query format. It
// returns all problems found (errors.Join of *FieldError, each wrapping
// ErrInvalidQuery), or nil. filename labels the messages.
func (q *Query) Validate(filename string) error {
	a := q.analyze(filename)
	return a.ps.err()
}

// OutputSchema is the schema of the tuples a node emits (a sink's is its
// input's). It fills in defaults and fails if the node does not exist or its
// schema cannot be derived.
func (q *Query) OutputSchema(node string) (*tuple.Schema, error) {
	a := q.analyze("")
	if _, ok := a.nodes[node]; !ok {
		return nil, fmt.Errorf("%w: no node named %q", ErrInvalidQuery, node)
	}
	if s := a.schemas[node]; s != nil {
		return s, nil
	}
	if err := a.ps.err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: cannot derive the schema of %q", ErrInvalidQuery, node)
}

// gnode is one node of the query graph during analysis.
type gnode struct {
	name   string
	kind   NodeKind
	decl   int // position in declaration order (sources, operators, sinks)
	path   path
	src    *Source
	op     *Operator
	sink   *Sink
	inputs []input
	keys   []string
}

type input struct {
	name string
	path path
	ok   bool // refers to an existing non-sink node
}

type analysis struct {
	q       *Query
	ps      *problems
	nodes   map[string]*gnode
	decl    []*gnode
	topo    []*gnode // nil when the graph is cyclic
	schemas map[string]*tuple.Schema
	outputs map[string][]string
	badRefs bool // some input did not resolve; "output not used" would only echo it
}

func (q *Query) analyze(filename string) *analysis {
	q.applyDefaults()
	a := &analysis{
		q:       q,
		ps:      &problems{file: filename, lines: q.lines},
		nodes:   map[string]*gnode{},
		schemas: map[string]*tuple.Schema{},
		outputs: map[string][]string{},
	}
	a.checkTop()
	a.collectNodes()
	a.checkInputs()
	a.sortGraph()
	if a.topo != nil {
		for _, n := range a.topo {
			a.schemas[n.name] = a.inferSchema(n)
		}
		a.checkUsed()
		a.checkKafkaSinkKeys()
	}
	return a
}

func (a *analysis) checkTop() {
	q, ps := a.q, a.ps
	switch {
	case q.Name == "":
		ps.add(rootPath("name"), "required: the query's name")
	case !validNodeName(q.Name):
		ps.add(rootPath("name"), "%q is not a valid name (want lower-case letters, digits, '-' and '_', starting with a letter or digit, at most %d characters)", q.Name, MaxNameLen)
	}
	if q.Replicas < 1 || q.Replicas > MaxReplicas {
		ps.add(rootPath("replicas"), "%d is out of range (want 1..%d)", q.Replicas, MaxReplicas)
	}
	if _, _, err := parseMaxDelay(q.Availability.MaxDelay); err != nil {
		ps.add(rootPath("availability").field("max_delay"), "%v", err)
	}
	if q.SLO != nil && (q.SLO.Throughput <= 0 || math.IsNaN(q.SLO.Throughput) || math.IsInf(q.SLO.Throughput, 0)) {
		ps.add(rootPath("slo").field("throughput"), "%v: want a positive rate in input records per second", q.SLO.Throughput)
	}
	if len(q.Sources) == 0 {
		ps.add(rootPath("sources"), "required: at least one source")
	}
	if len(q.Sinks) == 0 {
		ps.add(rootPath("sinks"), "required: at least one sink (the query's output)")
	}
	if len(q.Operators) > MaxOperators {
		ps.add(rootPath("operators"), "%d operators; a query may have at most %d (split it into several queries)", len(q.Operators), MaxOperators)
	}
}

func validNodeName(s string) bool { return len(s) <= MaxNameLen && nodeNameRE.MatchString(s) }

func (a *analysis) register(n *gnode) {
	ps := a.ps
	n.decl = len(a.decl)
	a.decl = append(a.decl, n)
	np := n.path.field("name")
	switch {
	case n.name == "":
		ps.add(np, "required")
		return
	case !validNodeName(n.name):
		ps.add(np, "%q is not a valid name (want lower-case letters, digits, '-' and '_', starting with a letter or digit, at most %d characters)", n.name, MaxNameLen)
		return
	}
	if prev, dup := a.nodes[n.name]; dup {
		ps.add(np, "duplicate node name %q (also %s); names must be unique across sources, operators and sinks", n.name, prev.path.display)
		return
	}
	a.nodes[n.name] = n
}

func (a *analysis) collectNodes() {
	q := a.q
	for i := range q.Sources {
		s := &q.Sources[i]
		n := &gnode{name: s.Name, kind: KindSource, src: s, path: rootPath("sources").elem(i, s.Name)}
		a.register(n)
		a.checkSource(n)
	}
	for i := range q.Operators {
		op := &q.Operators[i]
		n := &gnode{name: op.Name, kind: KindOperator, op: op, path: rootPath("operators").elem(i, op.Name)}
		a.register(n)
		a.checkOperator(n)
	}
	for i := range q.Sinks {
		s := &q.Sinks[i]
		n := &gnode{name: s.Name, kind: KindSink, sink: s, path: rootPath("sinks").elem(i, s.Name)}
		a.register(n)
		if s.Input == "" {
			a.ps.add(n.path.field("input"), "required: the node whose output this sink exposes")
		} else {
			n.inputs = []input{{name: s.Input, path: n.path.field("input")}}
		}
		if s.Kafka != nil {
			a.checkKafkaSink(n)
		}
	}
}

func (a *analysis) checkSource(n *gnode) {
	s, ps := n.src, a.ps
	if s.Parallelism < 1 || s.Parallelism > MaxParallelism {
		ps.add(n.path.field("parallelism"), "%d is out of range (want 1..%d)", s.Parallelism, MaxParallelism)
	}
	switch kinds := btoi(s.Gen != nil) + btoi(s.Ingest) + btoi(s.Kafka != nil); {
	case kinds > 1:
		ps.add(n.path, "set exactly one of generator, ingest and kafka, not several")
	case kinds == 0:
		ps.add(n.path, "set exactly one of generator (a built-in test source), ingest: true and kafka (a Kafka topic)")
	case s.Ingest && s.Parallelism > 1:
		ps.add(n.path.field("parallelism"), "ingest sources have one partition; parallelism applies to generators")
	}
	if s.Gen != nil {
		a.checkGenerator(n)
	}
	if s.AllowedLateness != "" {
		if _, err := parseLateness(s.AllowedLateness); err != nil {
			ps.add(n.path.field("allowed_lateness"), "%v", err)
		} else if !s.Ingest {
			ps.add(n.path.field("allowed_lateness"), "only ingest sources have allowed_lateness (generators and Kafka partitions produce records in time order)")
		}
	}
	if s.Kafka != nil {
		a.checkKafkaSource(n, a.q.lines == nil || a.q.lines[n.path.key+".parallelism"] != 0)
	}
	if len(s.Schema) == 0 && (s.Gen == nil || generatorSchemas[s.Gen.Kind] != nil) {
		ps.add(n.path.field("schema"), "required: at least one field (name: type)")
	}
}

func (a *analysis) checkGenerator(n *gnode) {
	g, ps, gp := n.src.Gen, a.ps, n.path.field("generator")
	if _, ok := generatorSchemas[g.Kind]; !ok {
		if g.Kind == "" {
			ps.add(gp.field("kind"), "required (want %s)", generatorKinds())
		} else {
			ps.add(gp.field("kind"), "unknown generator kind %q (want %s)", g.Kind, generatorKinds())
		}
	}
	if g.Rate < 0 {
		ps.add(gp.field("rate"), "%d is negative (records per second; 0 = as fast as possible)", g.Rate)
	}
	if g.Limit < 0 {
		ps.add(gp.field("limit"), "%d is negative (0 = unbounded)", g.Limit)
	}
	if g.Kind == GenNetmon {
		if g.Monitors < 1 || g.Monitors > MaxMonitors {
			ps.add(gp.field("monitors"), "%d is out of range (want 1..%d)", g.Monitors, MaxMonitors)
		}
	} else if g.Monitors != 0 {
		ps.add(gp.field("monitors"), "only the netmon generator has monitors")
	}
	if g.Kind == GenBlob {
		if g.Size < 1 || g.Size > MaxBlobSize {
			ps.add(gp.field("size"), "%d is out of range (want 1..%d payload bytes)", g.Size, MaxBlobSize)
		}
	} else if g.Size != 0 {
		ps.add(gp.field("size"), "only the blob generator has size")
	}
	if g.Start != "" {
		if _, err := time.Parse(time.RFC3339Nano, g.Start); err != nil {
			ps.add(gp.field("start"), "%q is not an RFC 3339 time (e.g. 2024-01-01T00:00:00Z)", g.Start)
		}
	}
}

// setFields lists the operator fields that are set, by YAML name.
func setFields(op *Operator) []string {
	var out []string
	add := func(set bool, name string) {
		if set {
			out = append(out, name)
		}
	}
	add(op.Input != "", "input")
	add(op.Inputs != nil, "inputs")
	add(op.Left != "", "left")
	add(op.Right != "", "right")
	add(op.Where != "", "where")
	add(op.Fields != nil, "fields")
	add(op.Window != nil, "window")
	add(op.GroupBy != nil, "group_by")
	add(op.Aggregates != nil, "aggregates")
	add(op.On != nil, "on")
	add(op.Field != "", "field")
	add(op.As != "", "as")
	add(op.Lower, "lower")
	return out
}

// operatorFields is what each operator type accepts besides name, type and
// parallelism.
var operatorFields = map[string][]string{
	OpFilter:    {"input", "where"},
	OpMap:       {"input", "fields"},
	OpSplit:     {"input", "field", "as", "lower"},
	OpUnion:     {"inputs"},
	OpAggregate: {"input", "window", "group_by", "aggregates"},
	OpJoin:      {"left", "right", "on", "window", "where"},
}

func operatorTypes() string { return "filter, map, split, union, aggregate or join" }

func (a *analysis) checkOperator(n *gnode) {
	op, ps := n.op, a.ps
	allowed, ok := operatorFields[op.Type]
	if !ok {
		a.badRefs = true // its inputs are unknown, so others may look unused
		if op.Type == "" {
			ps.add(n.path.field("type"), "required (want %s)", operatorTypes())
		} else {
			ps.add(n.path.field("type"), "unknown operator type %q (want %s)", op.Type, operatorTypes())
		}
		return
	}
	if op.Parallelism < 1 || op.Parallelism > MaxParallelism {
		ps.add(n.path.field("parallelism"), "%d is out of range (want 1..%d)", op.Parallelism, MaxParallelism)
	}
	if op.Cost != "" {
		if d, err := time.ParseDuration(op.Cost); err != nil || d < 0 || d > MaxOperatorCost {
			ps.add(n.path.field("cost"), "%q is not a duration in 0..%s (such as 200us)", op.Cost, MaxOperatorCost)
		}
	}
	for _, f := range setFields(op) {
		if !contains(allowed, f) {
			ps.add(n.path.field(f), "not used by a %s operator (it takes %s)", op.Type, strings.Join(allowed, ", "))
		}
	}
	single := func() {
		if op.Input == "" {
			ps.add(n.path.field("input"), "required: the upstream node")
			return
		}
		n.inputs = []input{{name: op.Input, path: n.path.field("input")}}
	}
	switch op.Type {
	case OpFilter:
		single()
		if strings.TrimSpace(op.Where) == "" {
			ps.add(n.path.field("where"), "required: a bool expression over the input's fields")
		}
	case OpMap:
		single()
		if len(op.Fields) == 0 {
			ps.add(n.path.field("fields"), "required: at least one output field (name: expression)")
		}
		a.checkOutputNames(n.path.field("fields"), op.Fields)
	case OpSplit:
		single()
		if op.Field == "" {
			ps.add(n.path.field("field"), "required: the string field to split into words")
		}
		if err := checkFieldName(op.As); err != nil {
			ps.add(n.path.field("as"), "%v", err)
		}
	case OpUnion:
		if len(op.Inputs) < 2 {
			ps.add(n.path.field("inputs"), "a union needs at least 2 inputs, got %d", len(op.Inputs))
		}
		seen := map[string]bool{}
		for i, in := range op.Inputs {
			p := n.path.field("inputs").elem(i, "")
			if seen[in] {
				ps.add(p, "%q is listed twice", in)
				continue
			}
			seen[in] = true
			n.inputs = append(n.inputs, input{name: in, path: p})
		}
	case OpAggregate:
		single()
		a.checkWindow(n, true)
		if len(op.Aggregates) == 0 {
			ps.add(n.path.field("aggregates"), "required: at least one output (name: \"count()\")")
		}
		a.checkOutputNames(n.path.field("aggregates"), op.Aggregates)
		if dup := firstDuplicate(op.GroupBy); dup >= 0 {
			ps.add(n.path.field("group_by").elem(dup, ""), "%q is listed twice", op.GroupBy[dup])
		}
		if len(op.GroupBy) == 0 && op.Parallelism > 1 {
			ps.add(n.path.field("parallelism"), "an aggregate without group_by has a single group and cannot be partitioned; use parallelism 1")
		}
		n.keys = op.GroupBy
	case OpJoin:
		if op.Left == "" {
			ps.add(n.path.field("left"), "required: the left input")
		}
		if op.Right == "" {
			ps.add(n.path.field("right"), "required: the right input")
		}
		if op.Left != "" && op.Right != "" {
			n.inputs = []input{{name: op.Left, path: n.path.field("left")}, {name: op.Right, path: n.path.field("right")}}
		}
		if len(op.On) == 0 {
			ps.add(n.path.field("on"), "required: the key fields both inputs share")
		}
		if dup := firstDuplicate(op.On); dup >= 0 {
			ps.add(n.path.field("on").elem(dup, ""), "%q is listed twice", op.On[dup])
		}
		a.checkWindow(n, false)
		n.keys = op.On
	}
}

func (a *analysis) checkOutputNames(p path, es Exprs) {
	seen := map[string]bool{}
	for i, e := range es {
		fp := p.elem(i, "")
		if a.ps.lines != nil { // YAML mapping form: point at the key
			if _, ok := a.ps.lines[p.field(e.Name).key]; ok {
				fp = p.field(e.Name)
			}
		}
		if err := checkFieldName(e.Name); err != nil {
			a.ps.add(fp, "%v", err)
		} else if seen[e.Name] {
			a.ps.add(fp, "output field %q is defined twice", e.Name)
		}
		seen[e.Name] = true
	}
}

func checkFieldName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty field name")
	case !fieldNameRE.MatchString(name):
		return fmt.Errorf("%q is not a valid field name (want letters, digits and '_', not starting with a digit)", name)
	case reservedWords[name]:
		return fmt.Errorf("%q is a reserved word in expressions and cannot be a field name", name)
	case strings.HasPrefix(name, "__fs"):
		return fmt.Errorf("%q: field names starting with \"__fs\" are reserved for the engine", name)
	}
	return nil
}

func (a *analysis) checkWindow(n *gnode, slideOK bool) {
	w, ps, wp := n.op.Window, a.ps, n.path.field("window")
	if w == nil {
		ps.add(wp, "required: window: {size: 60s}")
		return
	}
	size, err := time.ParseDuration(w.Size)
	switch {
	case w.Size == "":
		ps.add(wp.field("size"), "required (a duration such as 10s or 1m)")
		return
	case err != nil:
		ps.add(wp.field("size"), "%q is not a duration (e.g. 10s, 1m)", w.Size)
		return
	case size <= 0:
		ps.add(wp.field("size"), "%q must be positive", w.Size)
		return
	}
	if w.Slide == "" {
		return
	}
	slide, err := time.ParseDuration(w.Slide)
	switch {
	case err != nil:
		ps.add(wp.field("slide"), "%q is not a duration (e.g. 10s, 1m)", w.Slide)
	case !slideOK && slide != size:
		ps.add(wp.field("slide"), "join windows are tumbling: omit slide or set it equal to size")
	case slide <= 0:
		ps.add(wp.field("slide"), "%q must be positive", w.Slide)
	case slide > size:
		ps.add(wp.field("slide"), "%s is larger than the window size %s", w.Slide, w.Size)
	case size%slide != 0:
		ps.add(wp.field("slide"), "%s does not divide the window size %s", w.Slide, w.Size)
	}
}

func (a *analysis) checkInputs() {
	for _, n := range a.decl {
		for i := range n.inputs {
			in := &n.inputs[i]
			up, ok := a.nodes[in.name]
			switch {
			case !ok:
				a.badRefs = true
				a.ps.add(in.path, "unknown node %q (have: %s)", in.name, a.producerNames())
			case up.kind == KindSink:
				a.badRefs = true
				a.ps.add(in.path, "%q is a sink; inputs must be sources or operators", in.name)
			case up == n:
				a.badRefs = true
				a.ps.add(in.path, "a node cannot read its own output")
			default:
				in.ok = true
				if a.nodes[n.name] == n {
					a.outputs[in.name] = appendUnique(a.outputs[in.name], n.name)
				}
			}
		}
	}
}

func (a *analysis) producerNames() string {
	var names []string
	for _, n := range a.decl {
		if n.kind != KindSink && a.nodes[n.name] == n {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ", ")
}

// sortGraph orders registered nodes topologically (ties by declaration
// order, so the order is deterministic) or reports a cycle.
func (a *analysis) sortGraph() {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var cycle []string
	var visit func(n *gnode) bool
	visit = func(n *gnode) bool {
		color[n.name] = grey
		stack = append(stack, n.name)
		for _, in := range n.inputs {
			if !in.ok {
				continue
			}
			switch color[in.name] {
			case grey:
				i := len(stack) - 1
				for stack[i] != in.name {
					i--
				}
				cycle = append(append([]string(nil), stack[i:]...), in.name)
				return false
			case white:
				if !visit(a.nodes[in.name]) {
					return false
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n.name] = black
		return true
	}
	for _, n := range a.decl {
		if a.nodes[n.name] != n || color[n.name] != white {
			continue
		}
		if !visit(n) {
			// The cycle was found walking upstream; print it downstream.
			for i, j := 0, len(cycle)-1; i < j; i, j = i+1, j-1 {
				cycle[i], cycle[j] = cycle[j], cycle[i]
			}
			a.ps.add(a.nodes[cycle[0]].path, "the graph has a cycle: %s", strings.Join(cycle, " -> "))
			return
		}
	}
	// Kahn's algorithm, always taking the earliest-declared ready node.
	indeg := map[string]int{}
	for _, n := range a.decl {
		if a.nodes[n.name] != n {
			continue
		}
		for _, in := range n.inputs {
			if in.ok {
				indeg[n.name]++
			}
		}
	}
	var ready []*gnode
	for _, n := range a.decl {
		if a.nodes[n.name] == n && indeg[n.name] == 0 {
			ready = append(ready, n)
		}
	}
	topo := []*gnode{}
	for len(ready) > 0 {
		sort.Slice(ready, func(i, j int) bool { return ready[i].decl < ready[j].decl })
		n := ready[0]
		ready = ready[1:]
		topo = append(topo, n)
		for _, out := range a.outputs[n.name] {
			// An edge may be listed several times (join of a node with itself).
			for _, in := range a.nodes[out].inputs {
				if in.ok && in.name == n.name {
					indeg[out]--
				}
			}
			if indeg[out] == 0 {
				ready = append(ready, a.nodes[out])
			}
		}
	}
	a.topo = topo
}

func (a *analysis) checkUsed() {
	if a.badRefs {
		return
	}
	for _, n := range a.topo {
		if n.kind != KindSink && len(a.outputs[n.name]) == 0 {
			a.ps.add(n.path, "output of %q is not used by any operator or sink", n.name)
		}
	}
}

// inputSchema returns the schema of input i, or nil if it is unknown (the
// problem was reported where it arose).
func (a *analysis) inputSchema(n *gnode, i int) *tuple.Schema {
	if i >= len(n.inputs) || !n.inputs[i].ok {
		return nil
	}
	return a.schemas[n.inputs[i].name]
}

func (a *analysis) inferSchema(n *gnode) *tuple.Schema {
	switch n.kind {
	case KindSource:
		return a.sourceSchema(n)
	case KindSink:
		return a.inputSchema(n, 0)
	}
	if len(n.inputs) == 0 {
		return nil
	}
	ins := make([]*tuple.Schema, len(n.inputs))
	for i := range n.inputs {
		if ins[i] = a.inputSchema(n, i); ins[i] == nil {
			return nil
		}
	}
	op, ps := n.op, a.ps
	inName := n.inputs[0].name
	switch op.Type {
	case OpFilter:
		if op.Where == "" {
			return nil
		}
		if _, err := compileWhere(op.Where, ins[0], inName); err != nil {
			ps.add(n.path.field("where"), "%v", err)
			return nil
		}
		return ins[0]
	case OpMap:
		fields := make([]tuple.Field, 0, len(op.Fields))
		ok := true
		for i, f := range op.Fields {
			fp := n.path.field("fields").field(f.Name)
			if a.ps.lines == nil {
				fp = n.path.field("fields").elem(i, f.Name)
			}
			_, k, err := compileExpr(f.Expr, ins[0], inName)
			if err != nil {
				ps.add(fp, "%v", err)
				ok = false
				continue
			}
			fields = append(fields, tuple.Field{Name: f.Name, Kind: k})
		}
		if !ok || len(fields) == 0 || checkUnique(fields) != "" {
			return nil
		}
		return tuple.NewSchema(fields)
	case OpSplit:
		return a.splitSchema(n, ins[0], inName)
	case OpUnion:
		for i := 1; i < len(ins); i++ {
			if !sameSchema(ins[0], ins[i]) {
				ps.add(n.inputs[i].path, "schema of %q %s differs from the schema of %q %s; union inputs must have identical schemas",
					n.inputs[i].name, schemaString(ins[i]), inName, schemaString(ins[0]))
				return nil
			}
		}
		return ins[0]
	case OpAggregate:
		return a.aggregateSchema(n, ins[0], inName)
	case OpJoin:
		return a.joinSchema(n, ins[0], ins[1])
	}
	return nil
}

func (a *analysis) sourceSchema(n *gnode) *tuple.Schema {
	s, ps := n.src, a.ps
	sp := n.path.field("schema")
	var fields []tuple.Field
	ok := len(s.Schema) > 0
	seen := map[string]bool{}
	for i := range s.Schema {
		f := &s.Schema[i]
		fp := sp.field(f.Name)
		if a.ps.lines == nil || f.Name == "" {
			fp = sp.elem(i, f.Name)
		}
		if err := checkFieldName(f.Name); err != nil {
			ps.add(fp, "%v", err)
			ok = false
			continue
		}
		if seen[f.Name] {
			ps.add(fp, "field %q is declared twice", f.Name)
			ok = false
			continue
		}
		seen[f.Name] = true
		k, valid := tuple.ParseKind(f.Type)
		if !valid {
			ps.add(fp, "unknown type %q (want int, float, string, bool, timestamp, bytes)", f.Type)
			ok = false
			continue
		}
		// Canonical spelling. A query already canonical (every spec after
		// Parse) is only read here: workers plan one shared spec from
		// several goroutines.
		if c := k.String(); f.Type != c {
			f.Type = c
		}
		fields = append(fields, tuple.Field{Name: f.Name, Kind: k})
	}
	if !ok {
		return nil
	}
	if s.Gen != nil {
		if want, known := generatorSchemas[s.Gen.Kind]; known && !equalSchemaDecl(s.Schema, want) {
			ps.add(sp, "does not match the %s generator's schema %s (omit schema to use it)", s.Gen.Kind, declString(want))
			return nil
		}
	}
	return tuple.NewSchema(fields)
}

func (a *analysis) aggregateSchema(n *gnode, in *tuple.Schema, inName string) *tuple.Schema {
	op, ps := n.op, a.ps
	ok := true
	var fields []tuple.Field
	for i, g := range op.GroupBy {
		j := in.Index(g)
		if j < 0 {
			ps.add(n.path.field("group_by").elem(i, ""), "unknown field %q (input %s has: %s)", g, inName, fieldList(in))
			ok = false
			continue
		}
		fields = append(fields, in.Fields[j])
	}
	for i, e := range op.Aggregates {
		ep := n.path.field("aggregates").field(e.Name)
		if a.ps.lines == nil {
			ep = n.path.field("aggregates").elem(i, e.Name)
		}
		call, err := ParseAggregate(e.Expr)
		if err != nil {
			ps.add(ep, "%v", err)
			ok = false
			continue
		}
		arg := tuple.KindInvalid
		if call.Field != "" {
			j := in.Index(call.Field)
			if j < 0 {
				ps.add(ep, "%s: unknown field %q (input %s has: %s)", e.Expr, call.Field, inName, fieldList(in))
				ok = false
				continue
			}
			arg = in.Fields[j].Kind
		}
		k, err := AggregateKind(call, arg)
		if err != nil {
			ps.add(ep, "%v", err)
			ok = false
			continue
		}
		if contains(op.GroupBy, e.Name) || e.Name == WindowEndField {
			ps.add(ep, "output name %q is already used by a group_by field or %s", e.Name, WindowEndField)
			ok = false
			continue
		}
		fields = append(fields, tuple.Field{Name: e.Name, Kind: k})
	}
	if contains(op.GroupBy, WindowEndField) {
		ps.add(n.path.field("group_by"), "%q cannot be a group_by field: the aggregate adds its own %s", WindowEndField, WindowEndField)
		ok = false
	}
	if !ok || len(op.Aggregates) == 0 || checkUnique(fields) != "" {
		return nil
	}
	fields = append(fields, tuple.Field{Name: WindowEndField, Kind: tuple.KindTimestamp})
	return tuple.NewSchema(fields)
}

// splitSchema is the input's fields without the split field, then the token
// field (string).
func (a *analysis) splitSchema(n *gnode, in *tuple.Schema, inName string) *tuple.Schema {
	op, ps := n.op, a.ps
	if op.Field == "" || checkFieldName(op.As) != nil {
		return nil // reported by checkOperator
	}
	j := in.Index(op.Field)
	switch {
	case j < 0:
		ps.add(n.path.field("field"), "unknown field %q (input %s has: %s)", op.Field, inName, fieldList(in))
		return nil
	case in.Fields[j].Kind != tuple.KindString:
		ps.add(n.path.field("field"), "field %q is %s; split needs a string", op.Field, in.Fields[j].Kind)
		return nil
	}
	fields := make([]tuple.Field, 0, in.Len())
	for i, f := range in.Fields {
		if i == j {
			continue
		}
		if f.Name == op.As {
			ps.add(n.path.field("as"), "%q is already a field of input %s; choose another name for the tokens", op.As, inName)
			return nil
		}
		fields = append(fields, f)
	}
	fields = append(fields, tuple.Field{Name: op.As, Kind: tuple.KindString})
	return tuple.NewSchema(fields)
}

func (a *analysis) joinSchema(n *gnode, left, right *tuple.Schema) *tuple.Schema {
	op, ps := n.op, a.ps
	ok := len(op.On) > 0
	for i, k := range op.On {
		p := n.path.field("on").elem(i, "")
		li, ri := left.Index(k), right.Index(k)
		switch {
		case li < 0:
			ps.add(p, "unknown field %q on the left (input %s has: %s)", k, op.Left, fieldList(left))
			ok = false
		case ri < 0:
			ps.add(p, "unknown field %q on the right (input %s has: %s)", k, op.Right, fieldList(right))
			ok = false
		case left.Fields[li].Kind != right.Fields[ri].Kind:
			ps.add(p, "field %q is %s on the left (%s) but %s on the right (%s)", k, left.Fields[li].Kind, op.Left, right.Fields[ri].Kind, op.Right)
			ok = false
		}
	}
	if !ok {
		return nil
	}
	fields := append([]tuple.Field(nil), left.Fields...)
	taken := map[string]bool{}
	for _, f := range left.Fields {
		taken[f.Name] = true
	}
	for _, f := range right.Fields {
		if contains(op.On, f.Name) {
			continue
		}
		name := f.Name
		if taken[name] {
			name = RightPrefix + name
			if taken[name] {
				ps.add(n.path, "right field %q collides with the left side, and so does %q; rename one with a map", f.Name, name)
				return nil
			}
		}
		taken[name] = true
		fields = append(fields, tuple.Field{Name: name, Kind: f.Kind})
	}
	out := tuple.NewSchema(fields)
	if op.Where != "" {
		// A predicate over the pair: over the join's output fields.
		if _, err := compileWhere(op.Where, out, n.op.Name); err != nil {
			ps.add(n.path.field("where"), "%v", err)
			return nil
		}
	}
	return out
}

func sameSchema(a, b *tuple.Schema) bool {
	if a.Len() != b.Len() {
		return false
	}
	for i := range a.Fields {
		if a.Fields[i] != b.Fields[i] {
			return false
		}
	}
	return true
}

func schemaString(s *tuple.Schema) string {
	parts := make([]string, len(s.Fields))
	for i, f := range s.Fields {
		parts[i] = f.Name + ": " + f.Kind.String()
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func declString(s Schema) string {
	parts := make([]string, len(s))
	for i, f := range s {
		parts[i] = f.Name + ": " + f.Type
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func equalSchemaDecl(got, want Schema) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		gk, _ := tuple.ParseKind(got[i].Type)
		wk, _ := tuple.ParseKind(want[i].Type)
		if got[i].Name != want[i].Name || gk != wk {
			return false
		}
	}
	return true
}

func checkUnique(fields []tuple.Field) string {
	seen := map[string]bool{}
	for _, f := range fields {
		if seen[f.Name] {
			return f.Name
		}
		seen[f.Name] = true
	}
	return ""
}

func firstDuplicate(list []string) int {
	seen := map[string]bool{}
	for i, s := range list {
		if seen[s] {
			return i
		}
		seen[s] = true
	}
	return -1
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func appendUnique(list []string, s string) []string {
	if contains(list, s) {
		return list
	}
	return append(list, s)
}
