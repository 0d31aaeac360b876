package runtime

import (
	"bufio"
	"errors"
	"fmt"

	"github.com/fedstream/fedstream/config/queryspec"
	"github.com/fedstream/fedstream/worker/operator"
)

// Restoring while the snapshot arrives. A moved task's state is most of
// its snapshot's bytes, and decoding it (building the aggregate's groups
// and count_distinct sets) took a good part of a live move after the last
// byte had come. The bootstrap of a new copy therefore builds the task's
// operators as soon as the transfer begins and decodes the operator state
// as its bytes arrive over the bulk connection (operator.RestoreIncoming),
// so that the state is installed a moment after the last byte. The
// snapshot is still decoded and checked whole afterwards (positions,
// outputs); the task adopts the restored operators only when the fetch
// succeeded and the state it restored is the snapshot's. Any failure of
// the early restore only means the task restores from the whole snapshot
// as before; a fetch that breaks off discards the half-restored operators
// with it, and the retry restores into new ones.

// earlyOp is a task's operators restored from a fetched snapshot while it
// arrived, with the plan they were built from.
type earlyOp struct {
	plan *queryspec.Plan
	op   operator.Operator
	// spec the operators were built for (the task adopts them only if it
	// is the same query and fragment, without a reconfiguration).
	query, fragment string
	// opSize is the size of the operator state restored.
	opSize int
}

// earlyFor is the snapshot's early operators if the task spec describes
// may adopt them (nil s or none: nil).
func (s *TaskSnapshot) earlyFor(spec TaskSpec) *earlyOp {
	if s == nil || s.early == nil || spec.Reconfig != nil || spec.Spec == nil {
		return nil
	}
	if e := s.early; e.query == spec.Query && e.fragment == spec.Fragment && e.op != nil {
		return e
	}
	return nil
}

// canRestoreEarly reports whether a bootstrap of spec may restore its
// operators while the snapshot arrives: an operator task without a
// reconfiguration (whose versions are loaded before the restore).
func canRestoreEarly(spec TaskSpec) bool {
	if spec.Spec == nil || spec.Reconfig != nil {
		return false
	}
	plan, err := spec.Spec.FusedPlan()
	if err != nil {
		return false
	}
	node := plan.Node(spec.Fragment)
	return node != nil && node.Kind == queryspec.KindOperator
}

// restoreEarly builds spec's operators and restores them from the
// operator state of the task snapshot arriving in in (nil, nil: the
// snapshot holds none).
func restoreEarly(spec TaskSpec, in *operator.Incoming) (*earlyOp, error) {
	off, size, hasOp, err := waitSnapshotHead(in)
	if err != nil || !hasOp {
		return nil, err
	}
	e, err := newEarlyOp(spec, size)
	if err != nil {
		return nil, err
	}
	if err := operator.RestoreIncoming(e.op, in, off, size); err != nil {
		return nil, err
	}
	return e, nil
}

// restoreStreamed builds spec's operators and restores them from the
// next size bytes of br, the operator state of a task snapshot read off
// the connection (operator.RestoreStream).
func restoreStreamed(spec TaskSpec, br *bufio.Reader, size int) (*earlyOp, error) {
	e, err := newEarlyOp(spec, size)
	if err != nil {
		return nil, err
	}
	if err := operator.RestoreStream(e.op, br, size); err != nil {
		return nil, err
	}
	return e, nil
}

// newEarlyOp builds the operators of spec's fragment, which must be an
// operator fragment, fresh, for a restore from an operator state of size
// bytes that the caller makes.
func newEarlyOp(spec TaskSpec, size int) (*earlyOp, error) {
	plan, err := spec.Spec.FusedPlan()
	if err != nil {
		return nil, err
	}
	node := plan.Node(spec.Fragment)
	if node == nil || node.Kind != queryspec.KindOperator {
		return nil, fmt.Errorf("%w: %q is not an operator fragment", ErrSnapshotMismatch, spec.Fragment)
	}
	op, err := operatorOf(plan, node)
	if err != nil {
		return nil, err
	}
	return &earlyOp{plan: plan, op: op, query: spec.Query, fragment: spec.Fragment, opSize: size}, nil
}

// snapshotHeadBytes is what waitSnapshotHead waits for first: more than
// a snapshot's head takes with names of ordinary length.
const snapshotHeadBytes = 512

// waitSnapshotHead waits for the head of a task snapshot arriving in in
// (MarshalBinary's fields up to the operator state) and returns where
// the operator state lies.
func waitSnapshotHead(in *operator.Incoming) (opOff, opSize int, hasOp bool, err error) {
	for want := snapshotHeadBytes; ; want *= 2 {
		n, werr := in.Wait(want)
		opOff, opSize, hasOp, err = snapshotHead(in.Buf[:n])
		if err == nil || n == len(in.Buf) {
			return opOff, opSize, hasOp, err
		}
		if werr != nil {
			return 0, 0, false, werr
		}
	}
}

// errHeadShort means the bytes hold only part of a snapshot's head.
var errHeadShort = errors.New("task snapshot head incomplete")

// snapshotHead parses the head of a task snapshot's encoding (see
// marshalAround): the operator state, when the snapshot has one, is
// b[opOff:opOff+opSize] of the whole encoding.
func snapshotHead(b []byte) (opOff, opSize int, hasOp bool, err error) {
	if len(b) < len(taskSnapshotMagic)+1 {
		return 0, 0, false, errHeadShort
	}
	if string(b[:len(taskSnapshotMagic)]) != taskSnapshotMagic {
		return 0, 0, false, fmt.Errorf("%w: missing header", ErrBadTaskSnapshot)
	}
	if v := b[len(taskSnapshotMagic)]; v < 1 || v > taskSnapshotVersion {
		return 0, 0, false, fmt.Errorf("%w: format version %d", ErrBadTaskSnapshot, v)
	}
	r := &snapReader{b: b[len(taskSnapshotMagic)+1:], alias: true}
	r.str("task id")
	r.str("query")
	r.str("fragment")
	r.small("partition")
	r.small("replica")
	flag := r.uv("operator flag")
	var size uint64
	if flag == 1 {
		size = r.uv("operator state size")
	}
	switch {
	case r.err != nil:
		return 0, 0, false, errHeadShort
	case flag > 1:
		return 0, 0, false, fmt.Errorf("%w: operator flag %d", ErrBadTaskSnapshot, flag)
	case flag == 0:
		return 0, 0, false, nil
	case size > MaxFetchedSnapshotBytes:
		return 0, 0, false, fmt.Errorf("%w: operator state of %d bytes", ErrBadTaskSnapshot, size)
	}
	return len(b) - len(r.b), int(size), true, nil
}
