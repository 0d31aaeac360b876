package mpa

import (
	"errors"
	"math"
	"testing"
)

func TestNewOverloadRefusesBadParameters(t *testing.T) {
	base := MM1{T: 10, U: DefaultUtilisation}
	for _, tc := range []struct {
		name    string
		base    Cost
		penalty float64
	}{
		{"no base", nil, 1},
		{"negative", base, -1},
		{"NaN", base, math.NaN()},
		{"infinite", base, math.Inf(1)},
	} {
		if _, err := NewOverload(tc.base, tc.penalty); !errors.Is(err, ErrBadCost) {
			t.Errorf("%s: NewOverload = %v, want ErrBadCost", tc.name, err)
		}
	}
	if _, err := NewOverload(base, 0); err != nil {
		t.Errorf("penalty 0: %v", err)
	}
}

// The step sits exactly past capacity; Value stays continuous and its
// derivative is Marginal on both sides; the marginal cost never falls.
func TestOverloadStepsAtCapacity(t *testing.T) {
	base := mustMM1(t, 20)
	c, err := NewOverload(base, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		x, want float64
	}{
		{0, base.Marginal(0)},
		{10, base.Marginal(10)},
		{20, base.Marginal(20)}, // at T: the base's
		{20.001, base.Marginal(20.001) + 10},
		{22, base.Marginal(22) + 10},
		{30, base.Marginal(30) + 10}, // past the M/M/1 joint too
	} {
		if got := c.Marginal(tc.x); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Marginal(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
	if d := c.Value(20+1e-9) - c.Value(20); d > 1e-6 {
		t.Errorf("Value jumps at T by %v", d)
	}
	if got, want := c.Value(23), base.Value(23)+10*3; math.Abs(got-want) > 1e-9 {
		t.Errorf("Value(23) = %v, want %v", got, want)
	}
	prev := c.Marginal(0)
	for x := 0.05; x < 40; x += 0.05 {
		mc := c.Marginal(x)
		if mc < prev {
			t.Fatalf("marginal falls at %v: %v < %v", x, mc, prev)
		}
		prev = mc
		if math.Abs(x-20) < 0.01 {
			continue
		}
		h := 1e-5
		if num := (c.Value(x+h) - c.Value(x-h)) / (2 * h); math.Abs(num-mc)/mc > 1e-3 {
			t.Fatalf("at %v: d Value = %v, Marginal = %v", x, num, mc)
		}
	}
	if c.Capacity() != 20 {
		t.Fatalf("capacity %v", c.Capacity())
	}
}

func TestPolicyCost(t *testing.T) {
	base := mustMM1(t, 10)
	if got := (Policy{}).Cost(base); got != Cost(base) {
		t.Fatalf("no step: got %#v, want the base", got)
	}
	pol := SuggestedPolicy(DefaultUtilisation)
	if !(pol.OverloadPenalty > pol.MigrationCost) {
		t.Fatalf("suggested step %v does not exceed the migration cost %v: a move across capacity would not pay", pol.OverloadPenalty, pol.MigrationCost)
	}
	c := pol.Cost(base)
	if got, want := c.Marginal(10.5), base.Marginal(10.5)+pol.OverloadPenalty; math.Abs(got-want) > 1e-9 {
		t.Fatalf("Marginal past T = %v, want %v", got, want)
	}
}

// An org just over capacity next to a partner just under it: with the
// smooth cost alone their marginal costs differ by little more than the
// migration cost, the price that settles leaves the partner room for less
// than one task, and the overload stays. With the step the owner offers at
// a price that fills the partner up to (not past) its capacity, and both
// end at or under capacity.
func TestOverloadMovesAcrossCapacity(t *testing.T) {
	const capacity = 50.0
	pol := SuggestedPolicy(DefaultUtilisation)
	pmin, pmax := SuggestedPrices(DefaultUtilisation)
	tm := terms(pmin, pmax)
	tasks := []Task{{ID: "t1", Load: 0.3}, {ID: "t2", Load: 0.3}, {ID: "t3", Load: 0.3}}
	ownerLoad, hostLoad := 1.004*capacity, 0.99*capacity
	for _, tc := range []struct {
		name  string
		step  float64
		moves int
	}{
		{"smooth cost", 0, 0},
		{"overload step", pol.OverloadPenalty, 1},
	} {
		p := pol
		p.OverloadPenalty = tc.step
		owner, host := p.Cost(mustMM1(t, capacity)), p.Cost(mustMM1(t, capacity))
		hostMC := host.Marginal(hostLoad)
		price, ok := SettlePrice(owner.Marginal(ownerLoad), hostMC, p.MigrationCost, pmin, pmax)
		var room float64
		if ok {
			room = Room(host, hostLoad, price)
		}
		off, err := PlanOffer(OfferInput{Owner: "a", Host: "b", Terms: tm, Cost: owner, Load: ownerLoad,
			HostMarginal: hostMC, HostRoom: room, Tasks: tasks, MigrationCost: p.MigrationCost, Now: t0})
		if tc.moves == 0 {
			if !errors.Is(err, ErrNotProfitable) {
				t.Fatalf("%s: PlanOffer = %+v, %v; want ErrNotProfitable", tc.name, off, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		took, err := Accept(AcceptInput{Host: "b", Terms: tm, Cost: host, Load: hostLoad, Offer: off, Now: t0})
		if err != nil {
			t.Fatalf("%s: Accept: %v", tc.name, err)
		}
		moved := 0.0
		for _, task := range took {
			moved += task.Load
		}
		if len(took) != tc.moves || ownerLoad-moved > capacity || hostLoad+moved > capacity {
			t.Fatalf("%s: moved %d tasks (%v): owner at %v, host at %v of capacity %v", tc.name, len(took), moved, ownerLoad-moved, hostLoad+moved, capacity)
		}
		if !(price > hostMC && owner.Marginal(ownerLoad) > price+p.MigrationCost) {
			t.Fatalf("%s: price %v does not leave both sides a gain", tc.name, price)
		}
	}
}
