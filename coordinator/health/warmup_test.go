package health

import (
	"strings"
	"testing"
)

// startQuery is the word count at 10 splitters + 20 counters (bench
// scaling's noise and load-change scenarios) over n samples: the source
// gives src(k), each splitter partition splitter(k, p), each counter
// partition counter(k, p).
func startQuery(n int, src, splitter, counter gen) *Query {
	return &Query{Name: "wordcount", Fragments: []Fragment{
		{Name: "lines", Source: true, SourceRate: 1000, SourceScalable: true, Parallelism: 1, Downstreams: []string{"splitter"}, Samples: window(n, 1, src)},
		{Name: "splitter", Scalable: true, Parallelism: 10, Upstreams: []string{"lines"}, Downstreams: []string{"counter"}, Samples: window(n, 10, splitter)},
		{Name: "counter", Scalable: true, Parallelism: 20, Upstreams: []string{"splitter"}, Downstreams: []string{"counts"}, Samples: window(n, 20, counter)},
		{Name: "counts", Sink: true, Parallelism: 1, Upstreams: []string{"counter"}, Samples: window(n, 1, steady(Instance{InRate: 6000, Busy: 0.05}))},
	}}
}

// TestCatchingUp: the warm-up rule (CatchingUp) over windows of the
// shapes recorded on bench scaling. A start-up backlog being worked off
// is catching up; one that holds or grows, or a source that falls
// further behind its schedule, is not, and neither is a query with no
// backlog.
func TestCatchingUp(t *testing.T) {
	c := DefaultConfig()
	src600 := steady(Instance{InRate: 600, OutRate: 600, Busy: 0.05, Unacked: 40})
	split60 := steady(Instance{InRate: 60, OutRate: 590, Busy: 0.6, Queue: 20})
	// The noise scenario's start (session 10, 10.7 s after the
	// submission): the splitters hold some 16 000 words for each counter
	// partition, which works them off at its full 500 words/s while 300/s
	// arrive.
	drainingCounters := func(k, p int) Instance {
		return Instance{InRate: 500, OutRate: 60, Busy: 1, Queue: 16158 - 200*float64(k) + 300*float64(p%3)}
	}
	for _, tc := range []struct {
		name string
		q    *Query
		want bool
		why  string
	}{
		{"start-up backlog worked off", startQuery(20, src600, split60, drainingCounters), true, "backlog worked off"},
		{"caught up: no backlog", startQuery(20, src600, split60, steady(Instance{InRate: 300, OutRate: 40, Busy: 0.6, Queue: 30})), false, "no backlog"},
		// Every partition's backlog but one shrinks: the one whose grows
		// is slow (or hot), which the policy must see.
		{"one backlog grows", startQuery(20, src600, split60, func(k, p int) Instance {
			in := drainingCounters(k, p)
			if p == 3 {
				in.Queue = 3000 + 75*float64(k)
			}
			return in
		}), false, "partition 3 of counter"},
		// An operator too small behind full buffers: its backlog holds.
		{"full buffers hold", startQuery(20, src600, split60, func(k, p int) Instance {
			return Instance{InRate: 500, Busy: 1, Queue: 20000 + 50*float64((k+p)%2)}
		}), false, "does not shrink"},
		// The word count at 1 + 1 (recorded): the splitter works off what
		// it took in the first seconds, its queue shrinks, but the source
		// is held back at the splitter's 100 sentences/s: the query falls
		// further behind, it does not catch up.
		{"source held back below its rate", func() *Query {
			q := startQuery(20, steady(Instance{Unacked: 2000}), func(k, _ int) Instance {
				return Instance{InRate: 10, OutRate: 98, Busy: 1, Queue: 11576 - 10*float64(k)}
			}, drainingCounters)
			return q
		}(), false, "source lines is held back at 100 records/s"},
		// Held back while the splitters take the source's full rate: the
		// source says nothing (on schedule, or late by what it does not
		// make up), the queues decide: the splitters' holds.
		{"source held back, consumers at its rate", startQuery(20, steady(Instance{Unacked: 20000}), func(k, _ int) Instance {
			return Instance{InRate: 102, OutRate: 1000, Busy: 1, Queue: 2000}
		}, drainingCounters), false, "partition 0 of splitter"},
		// Held back only in the earlier half: the later half decides.
		{"source no longer held back, splitters draining", startQuery(20, func(k, _ int) Instance {
			if k < 10 {
				return Instance{Unacked: 20000}
			}
			return src600(k, 0)
		}, func(k, _ int) Instance {
			return Instance{InRate: 102, OutRate: 1000, Busy: 1, Queue: 5000 - 100*float64(k)}
		}, drainingCounters), true, "backlog worked off"},
		// The source behind its schedule draws above its rate: the
		// counters' queues grow as the lag reaches them.
		{"source above its rate", startQuery(20, steady(Instance{InRate: 1100, OutRate: 1100, Busy: 0.1, Unacked: 40}), split60, func(k, p int) Instance {
			return Instance{InRate: 500, OutRate: 60, Busy: 1, Queue: 1000 + 100*float64(k)}
		}), true, "source lines draws 1100 records/s"},
		// The source's lag behind its schedule decides where it is
		// reported: shrinking, the source catches up (whatever the
		// counters' queues, which its lag reaches); growing, it falls
		// behind (whatever the queues in front of the splitters).
		{"lag shrinking", startQuery(20, func(k, _ int) Instance {
			return Instance{InRate: 600, OutRate: 600, Busy: 0.1, LagS: 12 - 0.4*float64(k)}
		}, split60, func(k, p int) Instance {
			return Instance{InRate: 500, OutRate: 60, Busy: 1, Queue: 1000 + 100*float64(k)}
		}), true, "source lines 6.2 s behind its schedule"},
		{"lag growing", startQuery(20, func(k, _ int) Instance {
			return Instance{InRate: 600, OutRate: 600, Busy: 0.1, LagS: 2 + 0.4*float64(k)}
		}, func(k, _ int) Instance {
			return Instance{InRate: 60, OutRate: 590, Busy: 1, Queue: 5000 - 100*float64(k)}
		}, drainingCounters), false, "does not catch up"},
		{"too few samples", startQuery(3, src600, split60, steady(Instance{InRate: 500, Busy: 1, Queue: 20000})), true, "too few"},
	} {
		got, why := CatchingUp(tc.q, c)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: catching up %v (%s), want %v (%q)", tc.name, got, why, tc.want, tc.why)
		}
	}
}
