package health

import (
	"cmp"
	"fmt"
	"slices"
)

// Rebalancing hash slots away from a hot partition (the data-skew
// resolver). A keyed fragment's slot map says which partition owns each
// hash slot; the tasks routing to it sample the slot of one tuple in 64
// and report the most frequent ones (Sample.Keys). Over the window, a
// slot's share of the sampled tuples times the fragment's input rate is
// its estimated rate. The hot partition's sampled slots, hottest first,
// each go to the partition with the least load while that lowers the
// larger of the two loads, until the hot partition is within
// RebalanceTolerance of the mean. The new map then goes through the live
// rescale with the number of partitions unchanged: the moved slots'
// state moves with them at a cut.
//
// The estimate is relative, so it holds under backpressure too (every
// partition is then held to the pace of the hot one, in proportion to
// its share of the keys). It is rough where the reports say less: an
// upstream routing to two keyed fragments reports one sampled total for
// both (shares come out low: fewer slots move), and a report the loop
// reads in two samples (another worker reported in between) counts
// twice, in the total as in its slots. Load in slots no upstream reported (outside
// each report's most frequent ones) stays where it is; a slot hotter than
// the gap between the hot partition and the least loaded one is never
// moved: it would only move the hot spot.

// SlotMove is one slot given to another partition.
type SlotMove struct {
	Slot, From, To int
	// Rate is the slot's estimated rate (tuples per second).
	Rate float64
}

// slotRates estimates, over f's window, the rate of every sampled slot:
// its share of the sampled tuples times the fragment's mean input rate.
func slotRates(f *Fragment) map[int]float64 {
	counts := map[int]float64{}
	sampled, in := 0.0, 0.0
	n := 0
	for _, s := range f.Samples {
		for slot, c := range s.Keys {
			counts[slot] += c
		}
		sampled += s.KeysSampled
		for _, i := range s.Instances {
			in += i.InRate
		}
		n++
	}
	if sampled <= 0 || n == 0 {
		return nil
	}
	in /= float64(n)
	out := make(map[int]float64, len(counts))
	for slot, c := range counts {
		out[slot] = c / sampled * in
	}
	return out
}

// Rebalance plans moving slots of f's partition hot to less loaded
// partitions. ok is false, with the reason, when f has no slot map, no
// key samples, or no move would lower the hot partition's load.
func Rebalance(f *Fragment, hot int, c Config) (moves []SlotMove, loads map[int]float64, ok bool, why string) {
	if f == nil || len(f.Owners) == 0 {
		return nil, nil, false, "no slot map known for the fragment"
	}
	if f.Parallelism < 2 {
		return nil, nil, false, "one partition: no other to give slots to"
	}
	rates := slotRates(f)
	if len(rates) == 0 {
		return nil, nil, false, "no key samples in the window"
	}
	loads = perPartition(f, f.Samples, func(i Instance) float64 { return i.InRate })
	for p := range f.Parallelism {
		if _, ok := loads[p]; !ok {
			loads[p] = 0
		}
	}
	total := 0.0
	for _, l := range loads {
		total += l
	}
	meanLoad := total / float64(f.Parallelism)
	var hotSlots []int
	for slot, r := range rates {
		if slot >= 0 && slot < len(f.Owners) && f.Owners[slot] == hot && r > 0 {
			hotSlots = append(hotSlots, slot)
		}
	}
	if len(hotSlots) == 0 {
		return nil, loads, false, fmt.Sprintf("no sampled key slot of partition %d", hot)
	}
	slices.SortFunc(hotSlots, func(a, b int) int { return cmp.Or(cmp.Compare(rates[b], rates[a]), cmp.Compare(a, b)) })
	tol := c.RebalanceTolerance
	if tol < 1 {
		tol = 1
	}
	for _, slot := range hotSlots {
		if loads[hot] <= meanLoad*tol {
			break
		}
		r := rates[slot]
		to := -1
		for p := range f.Parallelism {
			if p != hot && (to < 0 || loads[p] < loads[to]) {
				to = p
			}
		}
		if to < 0 || loads[to]+r >= loads[hot] {
			continue // it would only move the hot spot
		}
		moves = append(moves, SlotMove{Slot: slot, From: hot, To: to, Rate: r})
		loads[hot] -= r
		loads[to] += r
	}
	if len(moves) == 0 {
		return nil, loads, false, fmt.Sprintf("no sampled slot of partition %d can move without making another partition as hot (hottest slot %d at %.0f tuples/s, mean load %.0f)",
			hot, hotSlots[0], rates[hotSlots[0]], meanLoad)
	}
	slices.SortFunc(moves, func(a, b SlotMove) int { return cmp.Compare(a.Slot, b.Slot) })
	return moves, loads, true, ""
}
