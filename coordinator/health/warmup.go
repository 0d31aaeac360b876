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
// show (they are bounded by the buffers). It is catching up when every
// generator source held back takes its rate or more: what the sources
// could not send is being worked off, and the queues of the operators
// the backlog moves on to grow meanwhile (recorded on bench scaling's
// noise scenario: the counters' queues grew for the first 10 s while the
// splitters worked off the source's lag). Otherwise it is catching up
// when
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
		gaining = append(gaining, fmt.Sprintf("source %s held back at %.0f records/s, its rate %.0f/s", f.Name, rate, f.SourceRate))
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
	return true, "backlog shrinking: " + joinMax(draining, 4)
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
