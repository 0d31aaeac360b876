package health

import (
	"fmt"
	"sort"
)

// CatchingUp reports whether a query that just started is still working
// off its start-up backlog, and why: the loop's warm-up lasts until it
// is not (coordinator HealthConfig.Warmup). q's windows are the samples
// since a lookback (longer than the policy's window: a backlog drains
// over tens of seconds, and over one second's samples it is noise).
//
// A query just submitted is not at its load: its tasks start at
// different moments and the sources' records sent meanwhile wait in front
// of the partitions that connected last. Such a backlog is no symptom as
// long as it is being worked off; one that is not is. So the query is
// not catching up when a generator source is held back (see heldBack)
// while taking less than its configured rate (less SLOMargin): such a
// source falls further behind its schedule, a backlog the queues do not
// show (they are bounded by the buffers). A source that reports its lag
// behind its schedule (Instance.LagS, more than half a second) is
// catching up while the lag shrinks and not while it holds or grows;
// the rules on its rates stand in for workers that do not report it. It
// is catching up when a generator draws more than its rate (behind its
// schedule, it sends what it is late by as fast as its consumers take
// it): what the sources could not send is being worked off, and the
// queues of the operators that backlog moves on to grow meanwhile.
// Otherwise it is catching up when
//
//   - some partition of an operator or sink holds a backlog (a mean queue
//     above QueueHigh over the later half of the window, what its
//     upstreams hold for it included), and every such backlog shrinks:
//     its mean over the later half of the window is below that over the
//     earlier half.
//
// No backlog is a query that has caught up; a backlog that holds or grows
// is one that cannot (an operator too small, a slow instance, a hot
// partition), which the policy must see. Too few samples to tell
// (MinSamples per fragment) count as catching up: the caller bounds the
// warm-up.
func CatchingUp(q *Query, c Config) (bool, string) {
	for i := range q.Fragments {
		if f := &q.Fragments[i]; len(f.Samples) < max(c.MinSamples, 2) {
			return true, fmt.Sprintf("%d samples of %s, too few to tell", len(f.Samples), f.Name)
		}
	}
	var gaining []string
	for i := range q.Fragments {
		f := &q.Fragments[i]
		if !f.Source || f.SourceRate <= 0 {
			continue
		}
		later := f.Samples[len(f.Samples)/2:]
		// Its lag behind its schedule, where the worker reports it, says
		// it directly: shrinking, the source catches up; holding or
		// growing, it does not.
		lag := func(ss []Sample) float64 {
			return mean(ss, func(s Sample) float64 { return maxOf(s.Instances, func(i Instance) float64 { return i.LagS }) })
		}
		if late, early := lag(later), lag(f.Samples[:len(f.Samples)/2]); late > lagFloor {
			if late >= early {
				return false, fmt.Sprintf("source %s is %.1f s behind its schedule (%.1f s before): it does not catch up", f.Name, late, early)
			}
			gaining = append(gaining, fmt.Sprintf("source %s %.1f s behind its schedule, %.1f s before", f.Name, late, early))
			continue
		}
		// Drawing faster than its rate: behind its schedule and gaining
		// (a generator sends what it is late by as fast as its
		// consumers take it).
		if drawn := mean(later, func(s Sample) float64 { return sum(s.Instances, func(i Instance) float64 { return i.InRate }) }); drawn > f.SourceRate*(1+c.SLOMargin) {
			gaining = append(gaining, fmt.Sprintf("source %s draws %.0f records/s, above its rate of %.0f/s", f.Name, drawn, f.SourceRate))
			continue
		}
		held := 0
		for _, s := range later {
			if heldBack(s) {
				held++
			}
		}
		if 2*held <= len(later) {
			continue
		}
		rate := 0.0
		for k := range later {
			rate += sourceRate(q, f, f.Samples[len(f.Samples)-1-k], k)
		}
		rate /= float64(len(later))
		if rate < f.SourceRate*(1-c.SLOMargin) {
			return false, fmt.Sprintf("source %s is held back at %.0f records/s, below its rate of %.0f/s: it falls behind its schedule", f.Name, rate, f.SourceRate)
		}
		// Held back at its rate: it keeps its schedule, or is late by
		// some amount it does not make up (no lag reported to tell
		// which); the queues decide.
	}
	if len(gaining) > 0 {
		// What the sources could not send is being worked off at their
		// rate or faster: the backlog moves down the query, and the
		// queues of the operators it reaches grow meanwhile.
		return true, "catching up with the sources' schedule: " + joinMax(gaining, 4)
	}
	var draining []string
	for i := range q.Fragments {
		f := &q.Fragments[i]
		if f.Source {
			continue
		}
		half := len(f.Samples) / 2
		early := perPartition(f, f.Samples[:half], func(i Instance) float64 { return i.Queue })
		late := perPartition(f, f.Samples[half:], func(i Instance) float64 { return i.Queue })
		parts := make([]int, 0, len(late))
		for p := range late {
			parts = append(parts, p)
		}
		sort.Ints(parts)
		for _, p := range parts {
			if late[p] <= c.QueueHigh {
				continue
			}
			if late[p] >= early[p] {
				return false, fmt.Sprintf("partition %d of %s holds a backlog that does not shrink (%.0f tuples on average, %.0f before)", p, f.Name, late[p], early[p])
			}
			draining = append(draining, fmt.Sprintf("%s/%d %.0f -> %.0f", f.Name, p, early[p], late[p]))
		}
	}
	if len(draining) == 0 {
		return false, "no backlog: caught up"
	}
	return true, "backlog worked off: " + joinMax(draining, 4)
}

// lagFloor: a source less late than this (seconds) is on schedule, as
// far as the warm-up is concerned (a loaded machine wakes a pacing timer
// late by some milliseconds).
const lagFloor = 0.5

// maxOf returns the largest f over xs (0 for none).
func maxOf[T any](xs []T, f func(T) float64) float64 {
	m := 0.0
	for i, x := range xs {
		if v := f(x); i == 0 || v > m {
			m = v
		}
	}
	return m
}

// joinMax joins the first n of xs, saying how many more there are.
func joinMax(xs []string, n int) string {
	out := ""
	for i, x := range xs {
		if i == n {
			return out + fmt.Sprintf(" and %d more", len(xs)-n)
		}
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}
