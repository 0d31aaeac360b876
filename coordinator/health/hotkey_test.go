package health

import (
	"strings"
	"testing"
)

// keyed gives op of q a slot map of 64 slots (slot s owned by partition
// s mod parallelism) and key samples in which slot hot carries share of
// the tuples, the rest spread evenly over the other slots.
func keyed(q *Query, hot int, share float64) *Query {
	op := q.Fragment("op")
	op.Owners = make([]int, 64)
	for s := range op.Owners {
		op.Owners[s] = s % op.Parallelism
	}
	for k := range op.Samples {
		keys := map[int]float64{}
		for s := range 64 {
			keys[s] = (1 - share) * 1000 / 63
		}
		keys[hot] = share * 1000
		op.Samples[k].Keys, op.Samples[k].KeysSampled = keys, 1000
	}
	return q
}

// withRate sets the source's configured rate (the demand).
func withRate(q *Query, rate float64) *Query {
	q.Fragments[0].SourceRate = rate
	return q
}

// TestKeySlotTooHotForAnyInstance: a data skew or a slow instance whose
// partition's hottest key slot alone carries more than one instance
// processes is an alert, not an action (no rebalance, move or scale-up
// can spread one slot); where no single slot is that hot, the real
// faults are still acted on. The slot's rate is taken from the demand
// (the source's rate): under backpressure the measured rates are held to
// the hot partition's pace and never show a slot hotter than it.
func TestKeySlotTooHotForAnyInstance(t *testing.T) {
	c := DefaultConfig()
	// Word count at 60% load: 20 counters of 500/s (busy = rate/500), the
	// hottest word 10% of 6000 words/s on partition 0, which runs
	// saturated with a backlog while the others idle at their share.
	wordCount := func(share, rate float64) *Query {
		q := pipeline(10, 20, blocked, func(k, p int) Instance {
			if p == 0 {
				return Instance{InRate: 500, OutRate: 500, Busy: 1, Queue: 3000}
			}
			return Instance{InRate: 250, OutRate: 250, Busy: 0.5, Queue: 50}
		}, calmSink)
		return withRate(keyed(q, 0, share), rate)
	}
	// A partition saturated by its hot key at about the others' rate, but
	// slower per useful second than they are (their rate per useful
	// second overestimated, as on a loaded machine): read as slow.
	hotLooksSlow := func(rate float64) *Query {
		q := pipeline(10, 4, blocked, func(k, p int) Instance {
			if p == 0 {
				return Instance{InRate: 480, OutRate: 480, Busy: 1, Queue: 3000}
			}
			return Instance{InRate: 470, OutRate: 470, Busy: 0.8, Queue: 50}
		}, calmSink)
		return withRate(keyed(q, 0, 0.2), rate)
	}
	// A slow instance (slowed by slow: 25%, 50%, 100%) held by
	// backpressure, as in TestSlowInstanceHeldByBackpressure, with its
	// hottest slot 20% of the demand.
	slowInstance := func(slow, rate float64) *Query {
		pace := 500 / slow
		q := pipeline(10, 4, blocked, func(k, p int) Instance {
			if p == 3 {
				return Instance{InRate: pace, OutRate: pace, Busy: 1, Queue: 2000}
			}
			return Instance{InRate: pace, OutRate: pace, Busy: pace / 500, Queue: 2000}
		}, calmSink)
		return withRate(keyed(q, 3, 0.2), rate)
	}
	for _, tc := range []struct {
		name      string
		q         *Query
		diagnosis string
		part      int
		action    string // "": an alert
		alert     string
	}{
		// 10% of 6000/s: 600/s, over the 500/s an instance processes.
		{"hot word at 60% load", wordCount(0.1, 6000), DiagDataSkew, 0, "", "key slot 0 carries ~600/s, more than one instance processes (~500/s)"},
		// 10% of 10000/s at full load.
		{"hot word at full load", wordCount(0.1, 10000), DiagDataSkew, 0, "", "key slot 0 carries ~1000/s"},
		// The measured rates alone (5250/s in all, 9%: 472/s) hide it;
		// the demand (6000/s: 540/s) shows it.
		{"hot word seen by the demand", wordCount(0.09, 6000), DiagDataSkew, 0, "", "key slot 0 carries ~540/s"},
		// 8% of 6000/s: 480/s, which one instance keeps up with once the
		// other slots are moved away.
		{"hot word one instance can take", wordCount(0.08, 6000), DiagDataSkew, 0, ActRebalanceSlots, ""},
		// 20% of 4000/s: 800/s, more than even the others' 588/s per
		// useful second.
		{"hot partition read as slow", hotLooksSlow(4000), DiagSlowInstance, 0, "", "key slot 0 carries ~800/s, more than one instance processes (~588/s)"},
		{"slow instance with a cooler key", hotLooksSlow(2500), DiagSlowInstance, 0, ActMove, ""},
		// 20% of 2000/s: 400/s, more than the slowed instance (250/s)
		// but not a healthy one (500/s): moving it helps.
		{"slow instance 25%", slowInstance(1.25, 2000), DiagSlowInstance, 3, ActMove, ""},
		{"slow instance 50%", slowInstance(1.5, 2000), DiagSlowInstance, 3, ActMove, ""},
		{"slow instance 100%", slowInstance(2, 2000), DiagSlowInstance, 3, ActMove, ""},
		{"slow instance 100% on a key too hot", slowInstance(2, 3000), DiagSlowInstance, 3, "", "key slot 3 carries ~600/s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			syms, below, why := Detect(tc.q, c)
			ds := Diagnose(tc.q, syms, below, why, c)
			if len(ds) != 1 || ds[0].Name != tc.diagnosis || ds[0].Partition != tc.part {
				t.Fatalf("diagnoses %+v, want %s of partition %d", ds, tc.diagnosis, tc.part)
			}
			dec, alerts := Choose(tc.q, ds, c, allowAll)
			if tc.action != "" {
				if dec == nil || dec.Action != tc.action {
					t.Fatalf("decision %+v (alerts %+v), want %s", dec, alerts, tc.action)
				}
				return
			}
			if dec != nil {
				t.Fatalf("decision %+v, want no action", dec)
			}
			if len(alerts) != 1 || len(alerts[0].Skipped) == 0 {
				t.Fatalf("alerts %+v, want one with its reason", alerts)
			}
			for _, s := range alerts[0].Skipped {
				if !strings.Contains(s, tc.alert) || !strings.Contains(s, "no rebalance or scale-up can help") {
					t.Fatalf("alert reason %q, want %q", s, tc.alert)
				}
			}
		})
	}
}
