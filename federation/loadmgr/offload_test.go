package loadmgr

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fedstream/fedstream/federation/ledger"
)

// TestOffloadOnlyUnderAProfitableContract: the health manager's offload
// moves the tasks it names, and only them, to a partner under an active
// contract, at a price the offer rule finds profitable, each move in both
// ledgers; without a contract, or when the org's marginal cost does not
// exceed the contract's lowest price plus the migration cost, nothing
// moves and the error says why.
func TestOffloadOnlyUnderAProfitableContract(t *testing.T) {
	ctx := context.Background()
	f := newFed(t, false, testConfig(), map[string]float64{"alpha": 10, "beta": 10, "calm": 10})
	f.w.addTasks("alpha", 12, 1, "q") // over capacity
	f.w.addTasks("beta", 2, 1, "q")
	f.w.addTasks("calm", 2, 1, "q") // far under it
	want := []string{"alpha/t03", "alpha/t07"}

	if ok, why := f.mgrs["alpha"].CanOffload(); ok || !strings.Contains(why, "no contract") {
		t.Fatalf("CanOffload without a contract: %v %q", ok, why)
	}
	if moved, err := f.mgrs["alpha"].Offload(ctx, want); !errors.Is(err, ErrNoOffload) || len(moved) != 0 {
		t.Fatalf("offload without a contract: moved %+v, err %v", moved, err)
	}
	req := terms(nil)
	id := f.contract("alpha", "beta", req)
	f.contract("calm", "beta", terms(nil))
	f.step(period) // beta measures itself: it quotes only then

	if ok, why := f.mgrs["alpha"].CanOffload(); !ok {
		t.Fatalf("CanOffload under a contract: %q", why)
	}
	moved, err := f.mgrs["alpha"].Offload(ctx, want)
	if err != nil || len(moved) == 0 {
		t.Fatalf("offload under a contract: moved %+v, err %v", moved, err)
	}
	for _, m := range moved {
		if (m.Task != want[0] && m.Task != want[1]) || m.Partner != "beta" || m.Contract != id || m.Price < req.PriceMin || m.Price > req.PriceMax {
			t.Fatalf("moved %+v: want one of %v to beta under %s at a price in [%v, %v]", m, want, id, req.PriceMin, req.PriceMax)
		}
	}
	for _, org := range []string{"alpha", "beta"} {
		if n := len(f.records(org, ledger.KindMove)); n != len(moved) {
			t.Fatalf("%s's ledger holds %d moves, the offload made %d", org, n, len(moved))
		}
	}

	_, err = f.mgrs["calm"].Offload(ctx, []string{"calm/t00"})
	if !errors.Is(err, ErrNoOffload) || !strings.Contains(err.Error(), "marginal cost") || len(f.movers["calm"].moves()) != 0 {
		t.Fatalf("offload of an org under capacity: %v, moves %v", err, f.movers["calm"].moves())
	}
}
