package loadmgr

import (
	"strconv"
	"time"

	"github.com/fedstream/fedstream/federation/ledger"
)

// Fields of move, return and settlement records written by the load
// manager (besides federation.SettlementFields).
const (
	FieldTask   = "task"
	FieldLoad   = "load"
	FieldPrice  = "price"
	FieldClass  = "class"
	FieldReason = "reason"
)

// Placement is one task of an owner hosted by a partner under a contract,
// as the two orgs' co-signed move record states it.
type Placement struct {
	Task     string    `json:"task"`
	Class    string    `json:"class,omitempty"`
	Owner    string    `json:"owner"`
	Host     string    `json:"host"`
	Contract string    `json:"contract"`
	Load     float64   `json:"load"`
	Price    float64   `json:"price"`
	Since    time.Time `json:"since"`
	// Until is when the return record was signed (zero: still away).
	Until time.Time `json:"until,omitzero"`
	// ReturningAt is, on the owner, when the notice given for the task's
	// return ends (zero: no notice given).
	ReturningAt time.Time `json:"returning_at,omitzero"`
}

// ledgerView is what the org's ledger says about moved tasks: the ledger
// is authoritative (it is in the org's Raft state, so a new leader sees
// the same), the manager's memory only smooths and schedules.
type ledgerView struct {
	// out: this org's tasks at partners; in: partners' tasks hosted here.
	out, in map[string]Placement
	// history holds every placement in the order of the records, returned
	// ones with Until set, for settlements.
	history []Placement
	// settledTo: contract -> end of the last settlement this org signed
	// as payer.
	settledTo map[string]time.Time
}

func num(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0
	}
	return v
}

// readLedger folds the move, return and settlement records of the org's
// chain.
func readLedger(org string, es []ledger.Entry) ledgerView {
	v := ledgerView{out: map[string]Placement{}, in: map[string]Placement{}, settledTo: map[string]time.Time{}}
	open := map[string]int{} // task -> index in history
	for _, e := range es {
		r := e.Record
		if r.A != org && r.B != org {
			continue
		}
		switch r.Kind {
		case ledger.KindMove:
			p := Placement{Task: r.Fields[FieldTask], Class: r.Fields[FieldClass], Owner: r.A, Host: r.B, Contract: r.Contract,
				Load: num(r.Fields[FieldLoad]), Price: num(r.Fields[FieldPrice]), Since: r.Time}
			if p.Task == "" {
				continue
			}
			open[p.Task] = len(v.history)
			v.history = append(v.history, p)
		case ledger.KindReturn:
			t := r.Fields[FieldTask]
			if i, ok := open[t]; ok && v.history[i].Owner == r.A {
				v.history[i].Until = r.Time
				delete(open, t)
			}
		case ledger.KindSettlement:
			if r.A != org {
				continue
			}
			to, err := time.Parse(time.RFC3339Nano, r.Fields["to"])
			if err == nil && to.After(v.settledTo[r.Contract]) {
				v.settledTo[r.Contract] = to
			}
		}
	}
	for _, i := range open {
		p := v.history[i]
		if p.Owner == org {
			v.out[p.Task] = p
		} else {
			v.in[p.Task] = p
		}
	}
	return v
}

// hosted is the load of owner's tasks the host carries under contract.
func hosted(m map[string]Placement, contract string) float64 {
	sum := 0.0
	for _, p := range m {
		if p.Contract == contract {
			sum += p.Load
		}
	}
	return sum
}

// accrued returns, per price, the load-seconds of this org's tasks at
// partners under contract inside [from, to), from the placements'
// recorded loads: both orgs signed those loads in the move records, so
// both can recompute a settlement.
func accrued(history []Placement, owner, contract string, from, to time.Time) map[float64]float64 {
	out := map[float64]float64{}
	for _, p := range history {
		if p.Owner != owner || p.Contract != contract {
			continue
		}
		start, end := p.Since, p.Until
		if end.IsZero() || end.After(to) {
			end = to
		}
		if start.Before(from) {
			start = from
		}
		if d := end.Sub(start).Seconds(); d > 0 {
			out[p.Price] += p.Load * d
		}
	}
	return out
}
