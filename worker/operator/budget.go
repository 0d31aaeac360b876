package operator

// exprUser is implemented by operators that evaluate expressions.
type exprUser interface {
	exprEnv() *exprEnv
}

func (f *filter) exprEnv() *exprEnv { return f.env }
func (m *mapOp) exprEnv() *exprEnv  { return m.env }

// each calls fn for op and, for a chain, every operator in it.
func each(op Operator, fn func(Operator)) {
	if c, ok := op.(*chain); ok {
		for _, o := range c.ops {
			each(o, fn)
		}
		return
	}
	if v, ok := op.(*Versioned); ok {
		for _, ver := range v.Versions() {
			each(v.insts[ver], fn)
		}
		return
	}
	if op != nil {
		fn(op)
	}
}

// StopOn makes every expression evaluation of op (and of the operators
// chained in it) abort when done is closed, with an error wrapping
// context.Canceled: a task that is stopped mid-evaluation returns at once
// instead of finishing an expensive predicate. Call it before the first
// Process; op must not be processing.
func StopOn(op Operator, done <-chan struct{}) {
	each(op, func(o Operator) {
		if u, ok := o.(exprUser); ok {
			u.exprEnv().setDone(done)
		}
	})
}

// OverBudgetTuples is the number of tuples op (with the operators chained
// in it) dropped because an expression went over its per-tuple cost
// budget (see queryspec.ExprCostBudget). Such tuples also come back from
// Process as errors wrapping ErrEval and queryspec.ErrCostBudget. Read it
// on the goroutine that calls Process.
func OverBudgetTuples(op Operator) uint64 {
	var n uint64
	each(op, func(o Operator) {
		if u, ok := o.(exprUser); ok {
			n += u.exprEnv().overBudget
		}
	})
	return n
}
