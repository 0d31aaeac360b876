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

// A key slot too hot for any instance. Slots are the unit of placement:
// a slot's tuples all go to one partition, so a slot that alone carries
// more than one instance processes per second keeps its partition
// saturated whatever else moves away from it, and more partitions only
// spread the other slots. Neither a rebalance, nor moving the instance,
// nor a scale-up can help: the key itself needs more spread.
//
// The slot's rate is its share of the sampled tuples times what the
// fragment must take: the larger of its input rate over the window and
// its demand (DS2's propagated target rate, see Demand). Under
// backpressure the input rate is held to the hot partition's pace, so a
// slot measured against it can never look hotter than its partition
// processes; the demand says what it would carry unblocked. One
// instance's capacity is the larger of the partition's true rate (tuples
// per useful second over the window, as TrueRate) and the median of the
// others': a slow instance is judged by what a healthy one would do, so
// that moving it stays the cure when a healthy instance could keep up.

// HotSlot is the hottest sampled slot of a partition and what one
// instance processes.
type HotSlot struct {
	Slot, Partition int
	// Rate is the slot's estimated rate, Capacity one instance's true
	// processing rate (both tuples per second).
	Rate, Capacity float64
}

// Why says, for an alert, why no action can help.
func (h HotSlot) Why() string {
	return fmt.Sprintf("key slot %d carries ~%.0f/s, more than one instance processes (~%.0f/s): no rebalance or scale-up can help; consider a key with more spread",
		h.Slot, h.Rate, h.Capacity)
}

// TooHotSlot reports the hottest sampled slot of partition p of f when it
// alone carries more than one instance of f processes (see above); ok is
// false when no slot does, or when the window cannot tell (no slot map,
// no key samples, too little useful time for a true rate).
func TooHotSlot(f *Fragment, p int, demand float64, c Config) (h HotSlot, ok bool) {
	if f == nil || p < 0 || len(f.Owners) == 0 || len(f.Samples) == 0 {
		return HotSlot{}, false
	}
	counts := map[int]float64{}
	sampled := 0.0
	for _, s := range f.Samples {
		for slot, n := range s.Keys {
			counts[slot] += n
		}
		sampled += s.KeysSampled
	}
	if sampled <= 0 {
		return HotSlot{}, false
	}
	in := 0.0
	for _, s := range f.Samples {
		for _, i := range s.Instances {
			in += i.InRate
		}
	}
	in /= float64(len(f.Samples))
	total := max(in, demand)
	best, bestN := -1, 0.0
	for slot, n := range counts {
		if slot >= 0 && slot < len(f.Owners) && f.Owners[slot] == p && (n > bestN || n == bestN && slot < best) {
			best, bestN = slot, n
		}
	}
	if best < 0 {
		return HotSlot{}, false
	}
	// The partitions' true rates over completed releases, where they can
	// be told (trueRates, as slower).
	rates, _ := trueRates(f, c)
	capacity := rates[p]
	var others []float64
	for q, r := range rates {
		if q != p {
			others = append(others, r)
		}
	}
	capacity = max(capacity, median(others))
	if capacity <= 0 {
		return HotSlot{}, false
	}
	h = HotSlot{Slot: best, Partition: p, Rate: bestN / sampled * total, Capacity: capacity}
	return h, h.Rate > capacity
}
