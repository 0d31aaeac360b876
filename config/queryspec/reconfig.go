package queryspec

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
)

// ErrNotReconfigurable means a new definition of a running query changes
// something a live reconfiguration cannot change (its graph, its sources
// or sinks, the state of a stateful operator, or what crosses the
// network between fragments).
var ErrNotReconfigurable = errors.New("not a live reconfiguration")

// ReconfigChanges compares the definition of a running query (cur) with a
// new one (next, validated) and returns the operators whose definitions
// differ, in declaration order. The definitions of stateless operators
// (filter, map, split, union), of an aggregate (its functions and window;
// not its group_by, which routes its input) and of a join (its where) may
// change, and only so that
// every fragment keeps its output schema (tuples in flight between
// fragments stay readable by every version); the graph (operator names,
// types, inputs, parallelism), the sources, the sinks, replicas and
// availability must stay as they are. A join keeps its window and keys
// (its versions share its buffered tuples); its where may change. Every
// problem is reported, each naming the operator.
func ReconfigChanges(cur, next *Query) ([]string, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrNotReconfigurable, fmt.Sprintf(format, args...)))
	}
	if cur.Name != next.Name {
		bad("the query is named %q, the running one %q", next.Name, cur.Name)
	}
	if cur.Replicas != next.Replicas || cur.Availability != next.Availability {
		bad("replicas and availability must stay as they are")
	}
	if !sameJSON(cur.Sources, next.Sources) {
		bad("sources must stay as they are")
	}
	if !sameJSON(cur.Sinks, next.Sinks) {
		bad("sinks must stay as they are")
	}
	if len(cur.Operators) != len(next.Operators) {
		bad("the query has %d operators, the running one %d: operators cannot be added or removed", len(next.Operators), len(cur.Operators))
		return nil, errors.Join(errs...)
	}
	var changed []string
	for i := range cur.Operators {
		a, b := &cur.Operators[i], &next.Operators[i]
		if a.Name != b.Name {
			bad("operator %d is %q, in the running query %q: operators cannot be renamed or reordered", i+1, b.Name, a.Name)
			continue
		}
		if sameJSON(a, b) {
			continue
		}
		if a.Type != b.Type || a.Input != b.Input || !slices.Equal(a.Inputs, b.Inputs) || a.Left != b.Left || a.Right != b.Right || a.Parallelism != b.Parallelism {
			bad("operator %q: its type, inputs and parallelism must stay as they are", a.Name)
			continue
		}
		if a.Type == "join" && (!sameJSON(a.Window, b.Window) || !slices.Equal(a.On, b.On)) {
			// A join's window and keys shape its buffered tuples; its
			// versions share them, so only its `where` may change (see
			// operator.VersionedJoin).
			bad("operator %q: a join's window and keys cannot change (its buffered tuples cannot be migrated to other windows or keys); only its where may", a.Name)
			continue
		}
		if a.Type == "aggregate" && !slices.Equal(a.GroupBy, b.GroupBy) {
			// The group_by keys also route the aggregate's input to its
			// partitions and hash slots, which every upstream task and
			// the slot maps fix for the query's life.
			bad("operator %q: an aggregate's group_by cannot change (it decides how the aggregate's input is partitioned and routed, which a running query keeps); its window and aggregates may", a.Name)
			continue
		}
		// An aggregate's versions with its window share its windows and
		// groups (operator.VersionedAggregate); a version with another
		// window runs a state of its own from the switch on, while the old
		// one finishes its open windows (operator.StagedAggregate).
		changed = append(changed, a.Name)
	}
	if len(errs) == 0 {
		cp, err1 := cur.FusedPlan()
		np, err2 := next.FusedPlan()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		for _, n := range cp.Nodes {
			m := np.Node(n.Name)
			if m == nil || !reflect.DeepEqual(n.Schema.Fields, m.Schema.Fields) {
				bad("fragment %q: its output schema would change (what crosses the network must stay readable by every version)", n.Name)
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(changed) == 0 {
		return nil, fmt.Errorf("%w: no operator's definition changed", ErrNotReconfigurable)
	}
	return changed, nil
}

// OperatorByName returns the named operator's definition, or nil.
func (q *Query) OperatorByName(name string) *Operator {
	for i := range q.Operators {
		if q.Operators[i].Name == name {
			return &q.Operators[i]
		}
	}
	return nil
}

func sameJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}
