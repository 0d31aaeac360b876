package mpa

import (
	"errors"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustMM1(t *testing.T, capacity float64) MM1 {
	t.Helper()
	c, err := NewMM1(capacity, DefaultUtilisation)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func terms(pmin, pmax float64) Terms {
	return Terms{ID: "c1", Proposer: "a", Partner: "b", PriceMin: pmin, PriceMax: pmax, MaxLoad: 50,
		Direction: DirBoth, NotBefore: t0, NotAfter: t0.Add(24 * time.Hour), Notice: 3 * time.Minute}
}

func TestNewMM1RefusesBadParameters(t *testing.T) {
	for _, tc := range []struct{ t, u float64 }{{0, 0.8}, {-1, 0.8}, {math.NaN(), 0.8}, {math.Inf(1), 0.8}, {10, 0}, {10, 1}, {10, 1.2}} {
		if _, err := NewMM1(tc.t, tc.u); !errors.Is(err, ErrBadCost) {
			t.Errorf("NewMM1(%v, %v) = %v, want ErrBadCost", tc.t, tc.u, err)
		}
	}
}

func TestMM1IsConvexAndMatchesItsMarginal(t *testing.T) {
	c := mustMM1(t, 10)
	prev := c.Marginal(0)
	if prev != 1 {
		t.Fatalf("marginal at 0 = %v, want 1", prev)
	}
	for x := 0.05; x < 30; x += 0.05 {
		mc := c.Marginal(x)
		if mc < prev {
			t.Fatalf("marginal falls at %v: %v < %v", x, mc, prev)
		}
		prev = mc
		// Value's numeric derivative agrees with Marginal (the joint
		// included).
		h := 1e-5
		num := (c.Value(x+h) - c.Value(x-h)) / (2 * h)
		if math.Abs(num-mc)/mc > 1e-3 {
			t.Fatalf("at %v: d Value = %v, Marginal = %v", x, num, mc)
		}
	}
	// At capacity the marginal cost is 1/(1-U)^2 whatever the size.
	for _, capacity := range []float64{1, 10, 1000} {
		if got := mustMM1(t, capacity).Marginal(capacity); math.Abs(got-25) > 1e-9 {
			t.Errorf("capacity %v: MC(T) = %v, want 25", capacity, got)
		}
	}
}

func TestSettlePrice(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		owner, host, m, lo, hi float64
		want                   float64
		ok                     bool
	}{
		{"between the two, leaning to the owner", 30, 10, 4, 5, 40, 22.8, true},
		{"clamped to p_max, both still gain", 200, 5, 4, 10, 40, 40, true},
		{"clamped to p_min, both still gain", 12, 1, 0, 10, 40, 10, true},
		{"owner not above price plus migration", 13, 1, 4, 10, 40, 10, false},
		{"partner not below clamped price", 200, 45, 4, 10, 40, 40, false},
		{"fixed price", 30, 5, 4, 12, 12, 12, true},
		{"equal marginals never trade", 20, 20, 0, 0, 100, 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := SettlePrice(tc.owner, tc.host, tc.m, tc.lo, tc.hi)
			if math.Abs(p-tc.want) > 1e-9 || ok != tc.ok {
				t.Fatalf("SettlePrice = %v, %v; want %v, %v", p, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestTermsValidate(t *testing.T) {
	good := terms(10, 40)
	for _, tc := range []struct {
		name string
		edit func(*Terms)
	}{
		{"p_min above p_max", func(x *Terms) { x.PriceMin = 50 }},
		{"negative price", func(x *Terms) { x.PriceMin = -1 }},
		{"zero load", func(x *Terms) { x.MaxLoad = 0 }},
		{"negative load", func(x *Terms) { x.MaxLoad = -3 }},
		{"expired before start", func(x *Terms) { x.NotAfter = x.NotBefore }},
		{"self contract", func(x *Terms) { x.Partner = x.Proposer }},
		{"no partner", func(x *Terms) { x.Partner = "" }},
		{"bad direction", func(x *Terms) { x.Direction = "sideways" }},
		{"negative notice", func(x *Terms) { x.Notice = -time.Second }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := good
			tc.edit(&x)
			if err := x.Validate(); !errors.Is(err, ErrBadTerms) {
				t.Fatalf("Validate = %v, want ErrBadTerms", err)
			}
		})
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("good terms: %v", err)
	}
}

func TestPlanOffer(t *testing.T) {
	owner := mustMM1(t, 10)
	pmin, pmax := SuggestedPrices(DefaultUtilisation)
	pol := SuggestedPolicy(DefaultUtilisation)
	tasks := []Task{{ID: "t1", Class: "op", Load: 1}, {ID: "t2", Class: "op", Load: 0.5}, {ID: "t3", Class: "src", Load: 0.5}, {ID: "t4", Class: "op", Load: 0.25}}
	base := OfferInput{Owner: "a", Host: "b", Terms: terms(pmin, pmax), Cost: owner, HostMarginal: MarginalAtShare(0.4, DefaultUtilisation),
		Tasks: tasks, MigrationCost: pol.MigrationCost, Now: t0.Add(time.Hour)}
	for _, tc := range []struct {
		name    string
		edit    func(*OfferInput)
		wantErr error
		check   func(*testing.T, Offer)
	}{
		{name: "overloaded owner offers and stays at or above the price line", edit: func(in *OfferInput) { in.Load = 11 }, check: func(t *testing.T, o Offer) {
			if o.Price < pmin || o.Price > pmax {
				t.Fatalf("price %v outside [%v, %v]", o.Price, pmin, pmax)
			}
			if 11-o.Load > 10 {
				t.Fatalf("owner left at %v, still above capacity with a cheap partner", 11-o.Load)
			}
			for _, task := range o.Tasks {
				if task.ID == "" {
					t.Fatal("empty task")
				}
			}
		}},
		{name: "owner below the offer line does not offer", edit: func(in *OfferInput) { in.Load = 9 }, wantErr: ErrNotProfitable},
		{name: "partner as loaded as the owner refuses in advance", edit: func(in *OfferInput) {
			in.Load = 11
			in.HostMarginal = owner.Marginal(11)
		}, wantErr: ErrNotProfitable},
		{name: "expired contract", edit: func(in *OfferInput) { in.Load = 11; in.Now = t0.Add(48 * time.Hour) }, wantErr: ErrOutsideTerms},
		{name: "not yet valid", edit: func(in *OfferInput) { in.Load = 11; in.Now = t0.Add(-time.Second) }, wantErr: ErrOutsideTerms},
		{name: "direction forbids", edit: func(in *OfferInput) { in.Load = 11; in.Terms.Direction = DirIn }, wantErr: ErrOutsideTerms},
		{name: "wrong pair", edit: func(in *OfferInput) { in.Load = 11; in.Host = "c" }, wantErr: ErrOutsideTerms},
		{name: "max load already used", edit: func(in *OfferInput) { in.Load = 11; in.Hosted = 50 }, wantErr: ErrOutsideTerms},
		{name: "class filter leaves only sources", edit: func(in *OfferInput) { in.Load = 11; in.Terms.Classes = []string{"src"} }, check: func(t *testing.T, o Offer) {
			if len(o.Tasks) != 1 || o.Tasks[0].ID != "t3" {
				t.Fatalf("tasks %+v, want only t3", o.Tasks)
			}
		}},
		{name: "max load caps the set", edit: func(in *OfferInput) { in.Load = 12; in.Terms.MaxLoad = 0.6 }, check: func(t *testing.T, o Offer) {
			if o.Load > 0.6 {
				t.Fatalf("offered %v > max load 0.6", o.Load)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base
			tc.edit(&in)
			o, err := PlanOffer(in)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("PlanOffer = %+v, %v; want %v", o, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

func TestAccept(t *testing.T) {
	host := mustMM1(t, 10)
	pmin, pmax := SuggestedPrices(DefaultUtilisation)
	offer := Offer{Contract: "c1", Owner: "a", Host: "b", Price: pmin,
		Tasks: []Task{{ID: "t1", Class: "op", Load: 2}, {ID: "t2", Class: "op", Load: 1}, {ID: "t3", Class: "src", Load: 0.5}}, Load: 3.5}
	base := AcceptInput{Host: "b", Terms: terms(pmin, pmax), Cost: host, Load: 4, Offer: offer, Now: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name    string
		edit    func(*AcceptInput)
		wantErr error
		want    []string
	}{
		{name: "idle partner takes all", want: []string{"t1", "t2", "t3"}},
		{name: "partner stops below the price (90% of T at p_min)", edit: func(in *AcceptInput) { in.Load = 7.5 }, want: []string{"t2"}},
		{name: "partner at the price line takes nothing", edit: func(in *AcceptInput) { in.Load = 8.8 }, wantErr: ErrNotProfitable},
		{name: "higher price lets it take more", edit: func(in *AcceptInput) { in.Load = 7.6; in.Offer.Price = pmax }, want: []string{"t1", "t2"}},
		{name: "price above p_max refused", edit: func(in *AcceptInput) { in.Offer.Price = pmax + 1 }, wantErr: ErrOutsideTerms},
		{name: "price below p_min refused", edit: func(in *AcceptInput) { in.Offer.Price = pmin - 1 }, wantErr: ErrOutsideTerms},
		{name: "max load", edit: func(in *AcceptInput) { in.Hosted = 48.5 }, want: []string{"t2", "t3"}},
		{name: "class", edit: func(in *AcceptInput) { in.Terms.Classes = []string{"src"} }, want: []string{"t3"}},
		{name: "expired", edit: func(in *AcceptInput) { in.Now = t0.Add(25 * time.Hour) }, wantErr: ErrOutsideTerms},
		{name: "direction out only, partner's tasks may not come", edit: func(in *AcceptInput) {
			in.Terms.Direction = DirIn
		}, wantErr: ErrOutsideTerms},
		{name: "a high price tempts it past capacity", edit: func(in *AcceptInput) { in.Load = 8.9; in.Offer.Price = pmax }, want: []string{"t1"}},
		{name: "the ceiling keeps it within what it can pass on", edit: func(in *AcceptInput) {
			in.Load, in.Offer.Price, in.Ceiling = 8.9, pmax, 10.5
		}, want: []string{"t2", "t3"}},
		{name: "nothing fits under the ceiling", edit: func(in *AcceptInput) {
			in.Load, in.Offer.Price, in.Ceiling = 8.9, pmax, 9.2
		}, wantErr: ErrNotProfitable},
		{name: "offer for someone else", edit: func(in *AcceptInput) { in.Host = "c" }, wantErr: ErrOutsideTerms},
		{name: "other contract", edit: func(in *AcceptInput) { in.Offer.Contract = "c9" }, wantErr: ErrOutsideTerms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base
			if tc.edit != nil {
				tc.edit(&in)
			}
			got, err := Accept(in)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Accept = %+v, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, x := range got {
				ids = append(ids, x.ID)
			}
			if len(ids) != len(tc.want) {
				t.Fatalf("accepted %v, want %v", ids, tc.want)
			}
			for i := range ids {
				if ids[i] != tc.want[i] {
					t.Fatalf("accepted %v, want %v", ids, tc.want)
				}
			}
			// Whatever it took keeps its MC below the price.
			y := in.Load
			for _, x := range got {
				y += x.Load
			}
			if host.Marginal(y) >= in.Offer.Price {
				t.Fatalf("partner ends at MC %v >= price %v", host.Marginal(y), in.Offer.Price)
			}
		})
	}
}

func TestReturnHasHysteresisAndNotice(t *testing.T) {
	c := mustMM1(t, 10)
	pmin, pmax := SuggestedPrices(DefaultUtilisation)
	tr := terms(pmin, pmax)
	pol := SuggestedPolicy(DefaultUtilisation)
	task := Task{ID: "t", Load: 1}
	for _, tc := range []struct {
		load float64
		want bool
	}{
		{9.5, false}, // would be above capacity again
		{8, false},   // 90% with it: inside the dead band, stays away
		{6.9, true},  // 79% with it: comes home
		{3, true},
	} {
		if got := WantsBack(c, tc.load, task, tr, pol.ReturnMargin); got != tc.want {
			t.Errorf("WantsBack at load %v = %v, want %v", tc.load, got, tc.want)
		}
	}
	// A task that comes home never puts its owner back on the offer line.
	for load := 0.0; load < 12; load += 0.01 {
		if WantsBack(c, load, task, tr, pol.ReturnMargin) && c.Marginal(load+task.Load) > tr.PriceMin+pol.MigrationCost {
			t.Fatalf("return at %v would make the owner offer again", load)
		}
	}

	var h Homecoming
	notice := 3 * time.Minute
	steps := []struct {
		at         time.Duration
		wants, now bool
	}{
		{0, true, false},
		{time.Minute, true, false},
		{2 * time.Minute, false, false}, // dip: notice withdrawn
		{3 * time.Minute, true, false},  // notice again from here
		{5 * time.Minute, true, false},
		{6 * time.Minute, true, true}, // served
	}
	for _, s := range steps {
		if got := h.Step(s.wants, t0.Add(s.at), notice); got != s.now {
			t.Fatalf("at %v: Step = %v, want %v", s.at, got, s.now)
		}
	}
}

// Under +-10% noise on the measured load, an org between the accept line
// and the offer line does not start offering once its load is smoothed.
func TestSmoothingDampsNoise(t *testing.T) {
	c := mustMM1(t, 10)
	pmin, _ := SuggestedPrices(DefaultUtilisation)
	pol := SuggestedPolicy(DefaultUtilisation)
	s := Smoother{Alpha: pol.Smoothing}
	offers := 0
	// A fixed pseudo-random sequence in [-0.1, 0.1].
	x := uint32(12345)
	for i := 0; i < 1000; i++ {
		x = x*1664525 + 1013904223
		noise := (float64(x>>8)/float64(1<<24))*0.2 - 0.1
		v := s.Add(8.8 * (1 + noise)) // true load 88% of T
		if c.Marginal(v) > pmin+pol.MigrationCost {
			offers++
		}
	}
	if offers != 0 {
		t.Fatalf("an org at 88%% of T would have offered in %d of 1000 noisy periods", offers)
	}
	var raw int
	for i := 0; i < 1000; i++ {
		x = x*1664525 + 1013904223
		noise := (float64(x>>8)/float64(1<<24))*0.2 - 0.1
		if c.Marginal(9.2*(1+noise)) > pmin+pol.MigrationCost {
			raw++
		}
	}
	if raw == 0 {
		t.Fatal("the unsmoothed check never fired: the test cannot tell smoothing from no noise")
	}
}

func TestAcceptCeiling(t *testing.T) {
	for _, tc := range []struct {
		capacity, own, room, want float64
	}{
		{10, 0, 5, 10},  // nothing of its own to pass on: capacity
		{10, 3, 5, 13},  // all its own tasks fit in its other contracts
		{10, 3, 1, 11},  // its other contracts take only 1
		{10, 3, 0, 10},  // they are full
		{10, 3, -2, 10}, // a negative room counts as none
	} {
		if got := AcceptCeiling(tc.capacity, tc.own, tc.room); got != tc.want {
			t.Errorf("AcceptCeiling(%v, %v, %v) = %v, want %v", tc.capacity, tc.own, tc.room, got, tc.want)
		}
	}
}
