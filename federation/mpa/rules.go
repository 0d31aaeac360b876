package mpa

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Reasons a move does not happen. The rules return them wrapped with the
// figures that decided, so a log line says why.
var (
	// ErrNotProfitable: the owner's marginal cost does not exceed the
	// price plus the migration cost, or the partner's marginal cost with
	// the extra load would not stay below the price, or no price inside
	// the contract's bounds satisfies both.
	ErrNotProfitable = errors.New("move not profitable for both orgs")
	// ErrOutsideTerms: the contract does not allow this move (validity,
	// direction, task class, maximum load, price bounds).
	ErrOutsideTerms = errors.New("move outside the contract's terms")
	// ErrBadTerms: the terms themselves are unusable.
	ErrBadTerms = errors.New("invalid contract terms")
)

// Direction says which way load may move under a contract, seen from the
// org that proposed it.
type Direction string

// Directions.
const (
	// DirOut: the proposer's tasks may run at the partner.
	DirOut Direction = "out"
	// DirIn: the partner's tasks may run at the proposer.
	DirIn Direction = "in"
	// DirBoth: either way.
	DirBoth Direction = "both"
)

// ParseDirection checks a direction name; "" means both.
func ParseDirection(s string) (Direction, error) {
	switch Direction(s) {
	case "", DirBoth:
		return DirBoth, nil
	case DirOut, DirIn:
		return Direction(s), nil
	}
	return "", fmt.Errorf("%w: direction %q: want out, in or both", ErrBadTerms, s)
}

// Terms are the parts of a contract the rules need.
type Terms struct {
	ID       string
	Proposer string
	Partner  string
	// PriceMin and PriceMax bound the price of every move, per load unit
	// per second. Equal bounds make a fixed-price contract.
	PriceMin, PriceMax float64
	// MaxLoad is the most load one party hosts for the other at one time
	// under this contract.
	MaxLoad   float64
	Direction Direction
	// Classes lists the task classes that may move; empty allows all.
	Classes []string
	// The contract is in force for NotBefore <= now < NotAfter.
	NotBefore, NotAfter time.Time
	// Notice is how long an owner announces that it takes a task back
	// before it does (the host can plan with the load that long).
	Notice time.Duration
}

// Validate checks terms in themselves (not their validity at a time).
func (t Terms) Validate() error {
	switch {
	case t.Proposer == "" || t.Partner == "":
		return fmt.Errorf("%w: proposer %q and partner %q must be named", ErrBadTerms, t.Proposer, t.Partner)
	case t.Proposer == t.Partner:
		return fmt.Errorf("%w: an org cannot contract with itself (%q)", ErrBadTerms, t.Proposer)
	case !(t.PriceMin >= 0) || math.IsInf(t.PriceMax, 0) || math.IsNaN(t.PriceMax):
		return fmt.Errorf("%w: prices must be finite and non-negative (p_min %v, p_max %v)", ErrBadTerms, t.PriceMin, t.PriceMax)
	case t.PriceMin > t.PriceMax:
		return fmt.Errorf("%w: p_min %v is above p_max %v", ErrBadTerms, t.PriceMin, t.PriceMax)
	case !(t.MaxLoad > 0) || math.IsInf(t.MaxLoad, 0):
		return fmt.Errorf("%w: max load %v must be a positive number", ErrBadTerms, t.MaxLoad)
	case !t.NotAfter.After(t.NotBefore):
		return fmt.Errorf("%w: validity ends (%s) before it starts (%s)", ErrBadTerms, t.NotAfter.Format(time.RFC3339), t.NotBefore.Format(time.RFC3339))
	case t.Notice < 0:
		return fmt.Errorf("%w: notice %s is negative", ErrBadTerms, t.Notice)
	}
	if _, err := ParseDirection(string(t.Direction)); err != nil {
		return err
	}
	return nil
}

// InForce reports whether now is inside the validity.
func (t Terms) InForce(now time.Time) bool {
	return !now.Before(t.NotBefore) && now.Before(t.NotAfter)
}

// Allows reports whether the contract lets owner's tasks run at host.
func (t Terms) Allows(owner, host string) bool {
	d := t.Direction
	if d == "" {
		d = DirBoth
	}
	switch {
	case owner == t.Proposer && host == t.Partner:
		return d == DirOut || d == DirBoth
	case owner == t.Partner && host == t.Proposer:
		return d == DirIn || d == DirBoth
	}
	return false
}

// AllowsClass reports whether tasks of class c may move.
func (t Terms) AllowsClass(c string) bool {
	return len(t.Classes) == 0 || slices.Contains(t.Classes, c)
}

// check returns ErrOutsideTerms when the contract does not cover a move
// from owner to host at now.
func (t Terms) check(owner, host string, now time.Time) error {
	if !t.InForce(now) {
		return fmt.Errorf("%w: contract %s is not in force at %s (valid %s to %s)", ErrOutsideTerms, t.ID,
			now.UTC().Format(time.RFC3339), t.NotBefore.UTC().Format(time.RFC3339), t.NotAfter.UTC().Format(time.RFC3339))
	}
	if !t.Allows(owner, host) {
		return fmt.Errorf("%w: contract %s (%s, proposed by %s) does not let %s's tasks run at %s", ErrOutsideTerms, t.ID, t.Direction, t.Proposer, owner, host)
	}
	return nil
}

// Task is a movable unit of load.
type Task struct {
	ID    string
	Class string
	Load  float64
}

// SettlePrice is the price of a move when the owner's marginal cost is
// ownerMC and the partner quotes hostMC: between what the partner needs
// (hostMC) and what the owner can pay (ownerMC - migrationCost), at
// PriceSplit of the way up, clamped into [pmin, pmax]. Leaning towards the
// owner's limit gives the partner room for more load (it accepts up to the
// price), which moves an overloaded org's excess in fewer rounds; the
// owner still gains on every unit it moves. ok is false when the clamped price
// leaves one side without a gain: the owner offers only if its MC exceeds
// price + migration cost, the partner accepts only below the price.
func SettlePrice(ownerMC, hostMC, migrationCost, pmin, pmax float64) (price float64, ok bool) {
	p := hostMC + PriceSplit*(ownerMC-migrationCost-hostMC)
	p = math.Min(math.Max(p, pmin), pmax)
	return p, hostMC < p && ownerMC > p+migrationCost
}

// PriceSplit is where between the partner's and the owner's marginal
// cost SettlePrice puts the price (0: the partner's, 1: the owner's limit).
const PriceSplit = 0.8

// OfferInput is what the owner knows when it considers offering tasks to
// one partner.
type OfferInput struct {
	Owner, Host string
	Terms       Terms
	Cost        Cost
	// Load is the owner's measured load, its guests included.
	Load float64
	// HostMarginal is the partner's quoted marginal cost at its load.
	HostMarginal float64
	// HostRoom is the load the partner says it would take at the settled
	// price (Room); 0 or less means it did not say, and then only the
	// contract's maximum bounds the offer.
	HostRoom float64
	// Hosted is the load of the owner's tasks the partner already hosts
	// under this contract.
	Hosted float64
	// Tasks are the owner's own tasks running at home that could move, in
	// the order the owner prefers to move them (the largest first makes
	// the fewest moves).
	Tasks         []Task
	MigrationCost float64
	Now           time.Time
}

// Offer is a set of tasks offered to a partner at a price.
type Offer struct {
	Contract string
	Owner    string
	Host     string
	Price    float64
	Tasks    []Task
	// Load is the sum of the tasks' loads.
	Load float64
}

// PlanOffer applies the offer rule. It settles the price from the two
// marginal costs, then takes tasks in the given order as long as the
// owner's marginal cost at the load it still carries exceeds price +
// migration cost, skipping a task that does not fit in what the partner
// said it would take (HostRoom) or in the contract's maximum load, or
// whose class the contract excludes. The test is the marginal cost before
// each task leaves, not the average over the task's slice of load: an org
// just over its capacity with tasks that are large next to the band it is
// over by still sheds one, instead of staying overloaded because the last
// task's slice reaches down into cheap load.
func PlanOffer(in OfferInput) (Offer, error) {
	if err := in.Terms.check(in.Owner, in.Host, in.Now); err != nil {
		return Offer{}, err
	}
	room := in.Terms.MaxLoad - in.Hosted
	if room <= 1e-12 {
		return Offer{}, fmt.Errorf("%w: %s already hosts %.3g of %s's load under contract %s (max %.3g)", ErrOutsideTerms, in.Host, in.Hosted, in.Owner, in.Terms.ID, in.Terms.MaxLoad)
	}
	ownerMC := in.Cost.Marginal(in.Load)
	price, ok := SettlePrice(ownerMC, in.HostMarginal, in.MigrationCost, in.Terms.PriceMin, in.Terms.PriceMax)
	if !ok {
		return Offer{}, fmt.Errorf("%w: owner MC %.4g, partner MC %.4g, migration cost %.4g, prices [%.4g, %.4g]", ErrNotProfitable, ownerMC, in.HostMarginal, in.MigrationCost, in.Terms.PriceMin, in.Terms.PriceMax)
	}
	if in.HostRoom > 0 && in.HostRoom < room {
		room = in.HostRoom
	}
	off := Offer{Contract: in.Terms.ID, Owner: in.Owner, Host: in.Host, Price: price}
	x := in.Load
	for _, t := range in.Tasks {
		if !(t.Load > 0) || !in.Terms.AllowsClass(t.Class) || off.Load+t.Load > room+1e-12 {
			continue
		}
		if in.Cost.Marginal(x) <= price+in.MigrationCost {
			break
		}
		off.Tasks = append(off.Tasks, t)
		off.Load += t.Load
		x -= t.Load
	}
	if len(off.Tasks) == 0 {
		return Offer{}, fmt.Errorf("%w: no movable task of %s pays its move at price %.4g (owner MC %.4g, migration cost %.4g)", ErrNotProfitable, in.Owner, price, ownerMC, in.MigrationCost)
	}
	return off, nil
}

// Room is the partner's side of a quote: the most load it would take on
// top of load before its marginal cost reaches price (found by bisection,
// so any Cost works). The owner fills an offer up to it, so that an offer
// of large tasks does not miss a partner with room for small ones.
func Room(c Cost, load, price float64) float64 {
	if c.Marginal(load) >= price {
		return 0
	}
	lo, hi := 0.0, math.Max(c.Capacity(), 1)
	for c.Marginal(load+hi) < price {
		hi *= 2
		if hi > 1e15 {
			return hi
		}
	}
	for range 60 {
		mid := (lo + hi) / 2
		if c.Marginal(load+mid) < price {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// AcceptInput is what the partner knows when an offer arrives.
type AcceptInput struct {
	Host  string
	Terms Terms
	Cost  Cost
	// Load is the partner's measured load, guests included.
	Load float64
	// Hosted is the load it already hosts for the offer's owner under this
	// contract.
	Hosted float64
	Offer  Offer
	Now    time.Time
	// Ceiling, when above 0, is the most load the partner carries after
	// accepting (see AcceptCeiling); 0 sets none.
	Ceiling float64
}

// AcceptCeiling is how much load a partner should carry at most after
// accepting: its capacity plus what it could still pass on, that is the
// load of its own tasks at home that its other contracts have room for.
// A high price may tempt a partner above its capacity; it gets back under
// only by moving its own tasks out, since guests go home only when their
// owner wants them. A partner that accepts past what it can pass on is
// left over capacity with guests it cannot return, which is where the
// bounded rules without this ceiling ended in the runs that missed an
// allocation the central bound found at large load spreads.
func AcceptCeiling(capacity, ownMovable, partnerRoom float64) float64 {
	return capacity + math.Max(0, math.Min(ownMovable, partnerRoom))
}

// Accept applies the accept rule: the offer must be for this partner under
// a contract in force that allows the direction, at a price inside the
// bounds; then the partner takes the offered tasks, in order, whose class
// the contract allows, that keep the hosted load within the maximum, and
// after which its own marginal cost stays below the price. It returns the
// accepted tasks (a subset of the offer, possibly all), or an error when
// it takes none.
func Accept(in AcceptInput) ([]Task, error) {
	o := in.Offer
	if o.Host != in.Host {
		return nil, fmt.Errorf("%w: offer is for %q, not %q", ErrOutsideTerms, o.Host, in.Host)
	}
	if o.Contract != in.Terms.ID {
		return nil, fmt.Errorf("%w: offer names contract %q, not %q", ErrOutsideTerms, o.Contract, in.Terms.ID)
	}
	if err := in.Terms.check(o.Owner, in.Host, in.Now); err != nil {
		return nil, err
	}
	if o.Price < in.Terms.PriceMin || o.Price > in.Terms.PriceMax || math.IsNaN(o.Price) {
		return nil, fmt.Errorf("%w: price %.4g outside [%.4g, %.4g]", ErrOutsideTerms, o.Price, in.Terms.PriceMin, in.Terms.PriceMax)
	}
	var took []Task
	y, hosted := in.Load, in.Hosted
	for _, t := range o.Tasks {
		if !(t.Load > 0) || !in.Terms.AllowsClass(t.Class) || hosted+t.Load > in.Terms.MaxLoad+1e-12 {
			continue
		}
		if in.Cost.Marginal(y+t.Load) >= o.Price || (in.Ceiling > 0 && y+t.Load > in.Ceiling+1e-12) {
			continue
		}
		took = append(took, t)
		y += t.Load
		hosted += t.Load
	}
	if len(took) == 0 {
		return nil, fmt.Errorf("%w: %s's marginal cost %.4g at load %.4g leaves no room below price %.4g within max load %.4g (hosting %.4g)",
			ErrNotProfitable, in.Host, in.Cost.Marginal(in.Load), in.Load, o.Price, in.Terms.MaxLoad, in.Hosted)
	}
	return took, nil
}

// WantsBack is the return rule: an owner wants a moved task back when its
// marginal cost with the task at home again would stay below the
// contract's lowest price by margin, that is, when no price the contract
// allows would make the owner offer it again. Comparing with p_min - margin
// rather than with the price the move was settled at keeps a task that
// left at a high price from coming back while its owner is still near
// capacity and then leaving again: the band between this test and the
// offer rule (MC > price + migration cost) is the hysteresis.
func WantsBack(c Cost, ownerLoad float64, t Task, terms Terms, margin float64) bool {
	return c.Marginal(ownerLoad+t.Load) < terms.PriceMin-margin
}

// Homecoming tracks the notice an owner gives before taking one task back.
// The zero value has given no notice.
type Homecoming struct {
	since time.Time
}

// Step records the return rule's verdict at now and reports whether the
// task should come home now: the owner must have wanted it back without a
// break for the contract's notice period. A false verdict withdraws the
// notice, so a brief dip in load does not bring a task home.
func (h *Homecoming) Step(wants bool, now time.Time, notice time.Duration) bool {
	if !wants {
		h.since = time.Time{}
		return false
	}
	if h.since.IsZero() {
		h.since = now
	}
	return !now.Before(h.since.Add(notice))
}

// Pending reports whether notice has been given.
func (h *Homecoming) Pending() bool { return !h.since.IsZero() }

// Smoother is an exponentially weighted moving average of a load
// measurement. Decisions use the smoothed load so that period-to-period
// noise does not trigger moves. The zero value is not primed: the first
// sample is taken as is.
type Smoother struct {
	Alpha  float64 // weight of a new sample, in (0, 1]
	value  float64
	primed bool
}

// Add folds in a sample and returns the smoothed value.
func (s *Smoother) Add(v float64) float64 {
	if !s.primed || s.Alpha <= 0 || s.Alpha > 1 {
		s.value, s.primed = v, true
		return v
	}
	s.value += s.Alpha * (v - s.value)
	return s.value
}

// Value is the current smoothed value.
func (s *Smoother) Value() float64 { return s.value }

// Shift moves the smoothed value by d without smoothing, for a change the
// org knows exactly (a task moved out or in).
func (s *Smoother) Shift(d float64) { s.value += d }

// Policy holds an org's tuning of the rules.
type Policy struct {
	// MigrationCost is added to the price in the offer rule: the
	// amortised cost of moving a load unit, and the lower edge of the
	// dead band between accepting and offering.
	MigrationCost float64
	// ReturnMargin is how far below p_min the owner's marginal cost with
	// a task back must stay before it takes the task home.
	ReturnMargin float64
	// Smoothing is the EWMA weight of a new load sample.
	Smoothing float64
	// OverloadPenalty is the step an org adds to its marginal cost past
	// its capacity (Overload). It must exceed MigrationCost for a move
	// from an org just over capacity to a partner just under it to pay;
	// 0 means no step.
	OverloadPenalty float64
}

// Cost returns base with the policy's overload step (base itself when
// the step is 0 or less).
func (p Policy) Cost(base Cost) Cost {
	if !(p.OverloadPenalty > 0) {
		return base
	}
	return Overload{Base: base, Penalty: p.OverloadPenalty}
}

// Suggested contract prices and policy, expressed as shares of capacity
// under the M/M/1 cost: partners accept load up to 90% of T at the lowest
// price and up to 110% at the highest (about 109% with the suggested
// overload step, whose 10 they must also be paid); an org offers once it is above 93%
// of T; a moved task comes home once its owner would be below 80% of T
// with it. `fedstream sim mpa` measured these (BENCHMARKS.md): a wider
// band between accepting and offering damps noise further but leaves load
// stuck next to partners that could have taken it. The overload step is
// OverloadFactor times the migration cost: past capacity an org values
// shedding a load unit that much more than a partner just under capacity
// values keeping its headroom.
const (
	SharePriceMin = 0.90
	SharePriceMax = 1.10
	ShareOffer    = 0.93
	ShareReturn   = 0.80
	// OverloadFactor sizes the suggested overload step in migration costs.
	OverloadFactor = 4.0
)

// SuggestedPrices returns [p_min, p_max] for target utilisation u.
func SuggestedPrices(u float64) (pmin, pmax float64) {
	return MarginalAtShare(SharePriceMin, u), MarginalAtShare(SharePriceMax, u)
}

// SuggestedPolicy returns the policy matching SuggestedPrices for target
// utilisation u.
func SuggestedPolicy(u float64) Policy {
	pmin, _ := SuggestedPrices(u)
	mig := MarginalAtShare(ShareOffer, u) - pmin
	return Policy{
		MigrationCost:   mig,
		ReturnMargin:    pmin - MarginalAtShare(ShareReturn, u),
		Smoothing:       0.15,
		OverloadPenalty: OverloadFactor * mig,
	}
}
