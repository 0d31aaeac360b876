package fsm

import "errors"

// Command types of live reconfiguration, continued (see
// ReconfigureQueryType).
const (
	// UpdateTaskStatesBatchType carries an UpdateTaskStatesBatchRequest:
	// the task reports of several workers in one log entry (protocol 10).
	UpdateTaskStatesBatchType MessageType = 61
)

// UpdateTaskStatesBatchRequest applies several workers' task reports in
// one entry, in order, each exactly as an UpdateTaskStatesRequest of its
// own would be. The leader gathers the reports that acknowledge a
// reconfiguration plan until the last task's acknowledgement arrives and
// writes them together: a plan switches when every task's acknowledgement
// is applied, and reports written one by one queued each behind the
// previous write (a log append with its fsync) on the path of the plan.
// A report refused on its own (its worker unknown, an empty state) is
// refused alone: Errs says so and the others still apply. Value:
// *UpdateTaskStatesBatchResult.
type UpdateTaskStatesBatchRequest struct {
	Reports []UpdateTaskStatesRequest `json:"reports"`
}

// UpdateTaskStatesBatchResult has, per report of the batch, what its
// UpdateTaskStates did and the error that refused it ("" when applied).
type UpdateTaskStatesBatchResult struct {
	Results []UpdateTaskStatesResult `json:"results"`
	Errs    []string                 `json:"errs"`
}

func (r *UpdateTaskStatesBatchRequest) apply(tx *writeTx) (any, error) {
	if len(r.Reports) == 0 {
		return nil, invalid("update task states: an empty batch")
	}
	res := &UpdateTaskStatesBatchResult{Results: make([]UpdateTaskStatesResult, len(r.Reports)), Errs: make([]string, len(r.Reports))}
	for i := range r.Reports {
		v, err := r.Reports[i].apply(tx)
		switch {
		case err == nil:
			res.Results[i] = *v.(*UpdateTaskStatesResult)
		case errors.Is(err, ErrWorkerNotFound), errors.Is(err, ErrInvalidRequest):
			// Both are found before the report changes anything.
			res.Errs[i] = err.Error()
		default:
			return nil, err
		}
	}
	return res, nil
}
