// Package mpa holds the decision rules of the bounded-price load mechanism
// between federated orgs: an org's convex cost of load and its marginal
// cost, when to offer a set of tasks to a contract partner, when a partner
// accepts, at which price inside the contract's bounds a move is settled,
// and when moved tasks come home. It does no I/O and keeps no clock: the
// load manager on an org leader and the `fedstream sim mpa` simulation call
// the same functions with the figures they have.
//
// Units: load is CPU seconds per second (cores busy); capacity T is the
// load an org is meant to carry (its workers' cores times a target
// utilisation); prices and marginal costs are in cost units per load unit
// per second.
package mpa

import (
	"errors"
	"fmt"
	"math"
)

// ErrBadCost is returned when a cost function's parameters are unusable.
var ErrBadCost = errors.New("invalid cost function")

// Cost is an org's cost of carrying load. Value must be convex and
// increasing, so Marginal is non-decreasing: the more an org carries, the
// more one extra unit costs it. Every rule of this package relies on that.
type Cost interface {
	// Capacity is T, the load the org is meant to carry.
	Capacity() float64
	// Value is the cost of carrying load x (x >= 0).
	Value(x float64) float64
	// Marginal is the derivative of Value at x.
	Marginal(x float64) float64
}

// MM1 is the default cost: the load-weighted delay of an M/M/1 queue,
// Value(x) = x / (1 - x/K), whose marginal cost 1/(1 - x/K)^2 is 1 on an idle
// org and rises steeply as x approaches the physical limit K. K is the
// capacity T divided by the target utilisation U, so at x = T the marginal
// cost is 1/(1-U)^2 whatever the org's size: two orgs at the same share of
// their capacity have the same marginal cost, and one price threshold means
// the same thing to both. Past 95% of K, where the queue formula runs to
// infinity, the cost continues as a parabola with the same value, slope and
// curvature at the joint, so it stays finite, convex and strictly rising
// for any load an overloaded org reports.
type MM1 struct {
	T float64 // capacity (> 0)
	U float64 // target utilisation in (0, 1)
}

// mm1Joint is the fraction of K where the queue formula hands over to the
// parabola.
const mm1Joint = 0.95

// DefaultUtilisation is the target utilisation of the default cost: at
// capacity T an org's workers are 80% busy.
const DefaultUtilisation = 0.8

// NewMM1 returns the M/M/1-like cost with capacity t and target
// utilisation u.
func NewMM1(t, u float64) (MM1, error) {
	if !(t > 0) || math.IsInf(t, 0) {
		return MM1{}, fmt.Errorf("%w: capacity %v must be a positive number", ErrBadCost, t)
	}
	if !(u > 0 && u < 1) {
		return MM1{}, fmt.Errorf("%w: target utilisation %v must be in (0, 1)", ErrBadCost, u)
	}
	return MM1{T: t, U: u}, nil
}

// Capacity implements Cost.
func (c MM1) Capacity() float64 { return c.T }

func (c MM1) k() float64 { return c.T / c.U }

// Value implements Cost.
func (c MM1) Value(x float64) float64 {
	if x <= 0 {
		return 0
	}
	k := c.k()
	xj := mm1Joint * k
	if x <= xj {
		return x / (1 - x/k)
	}
	d := x - xj
	return xj/(1-mm1Joint) + c.Marginal(xj)*d + 0.5*c.slopeAtJoint()*d*d
}

// Marginal implements Cost.
func (c MM1) Marginal(x float64) float64 {
	if x <= 0 {
		x = 0
	}
	k := c.k()
	xj := mm1Joint * k
	if x <= xj {
		r := 1 - x/k
		return 1 / (r * r)
	}
	r := 1 - mm1Joint
	return 1/(r*r) + c.slopeAtJoint()*(x-xj)
}

// slopeAtJoint is d/dx of 1/(1-x/K)^2 at the joint.
func (c MM1) slopeAtJoint() float64 {
	r := 1 - mm1Joint
	return 2 / (c.k() * r * r * r)
}

// MarginalAtShare is the M/M/1 marginal cost of an org at share s of its
// capacity T (s = x/T), for target utilisation u. It does not depend on the
// org's size, which is what lets one contract price mean the same load
// level to both partners.
func MarginalAtShare(s, u float64) float64 {
	c := MM1{T: 1, U: u}
	return c.Marginal(s)
}

// AverageMarginal is the cost per load unit of going from load a to load b
// (either order): (Value(b) - Value(a)) / (b - a), or Marginal(a) when
// they are equal. For a convex cost it lies between the two marginals.
func AverageMarginal(c Cost, a, b float64) float64 {
	if a > b {
		a, b = b, a
	}
	if b-a < 1e-12 {
		return c.Marginal(a)
	}
	return (c.Value(b) - c.Value(a)) / (b - a)
}

// Overload is a cost with a step in its marginal cost at capacity: past T
// every load unit costs Penalty more than under Base. It models the price
// of breaking the org's target (a service level missed, a queue that no
// longer drains) that a smooth curve alone does not: with Base only, an
// org just over T and a partner just under it have nearly the same
// marginal cost, so a move between them cannot pay its migration cost and
// the overload stays. With the step, an org over T always values shedding
// load above what any partner under T asks for it (when Penalty exceeds
// the migration cost), and a partner accepts load only up to its own T
// unless the price pays its step too. The function stays convex (the
// marginal cost only jumps upwards) and increasing, as every rule needs.
type Overload struct {
	Base    Cost
	Penalty float64 // marginal cost added past Base.Capacity(), >= 0
}

// NewOverload wraps base with a marginal-cost step of penalty at its
// capacity.
func NewOverload(base Cost, penalty float64) (Overload, error) {
	if base == nil {
		return Overload{}, fmt.Errorf("%w: no base cost", ErrBadCost)
	}
	if !(penalty >= 0) || math.IsInf(penalty, 0) {
		return Overload{}, fmt.Errorf("%w: overload penalty %v must be a non-negative number", ErrBadCost, penalty)
	}
	return Overload{Base: base, Penalty: penalty}, nil
}

// Capacity implements Cost.
func (c Overload) Capacity() float64 { return c.Base.Capacity() }

// Value implements Cost.
func (c Overload) Value(x float64) float64 {
	v := c.Base.Value(x)
	if t := c.Base.Capacity(); x > t {
		v += c.Penalty * (x - t)
	}
	return v
}

// Marginal implements Cost. At exactly T it is the base's: the step
// belongs to load past capacity.
func (c Overload) Marginal(x float64) float64 {
	m := c.Base.Marginal(x)
	if x > c.Base.Capacity() {
		m += c.Penalty
	}
	return m
}
