package runtime

import (
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Failure detection takes an input that heard nothing for the detection
// timeout for failed. A process that could not run meanwhile (the
// machine is loaded, the process was descheduled, its goroutines waited
// in the run queue) hears nothing either, from any upstream: its silence
// says nothing of them. starveClock measures that time, so that silence
// is counted only over the time this process could run (input.silence).
//
// What counts as starved: the time goroutines of this process spent
// runnable without running, as the Go scheduler measures it
// (/sched/latencies:seconds), whenever one waited at least the
// threshold (shorter waits are ordinary time slicing), and the lateness
// of a failure detector's own timer (note). Each measure is taken as the
// interval ending when it is observed; overlapping intervals count once,
// so the total never runs faster than the wall clock.
type starveClock struct {
	// total is the starved time observed so far (nanoseconds).
	total atomic.Int64
	// threshold: shorter waits are not starvation.
	threshold int64

	// read is when the scheduler's histogram was last read (unix
	// nanoseconds): starved, called on every batch an input hears, reads
	// it at most once a millisecond and takes no lock in between.
	read atomic.Int64

	mu sync.Mutex
	// covered is the end of the last interval counted (unix nanoseconds).
	covered int64
	// prev is the last reading (nil: none yet).
	prev   []uint64
	sample []metrics.Sample
}

// schedLatencies is the Go runtime's histogram of how long goroutines
// waited runnable before they ran.
const schedLatencies = "/sched/latencies:seconds"

// newStarveClock counts waits of at least threshold.
func newStarveClock(threshold time.Duration) *starveClock {
	c := &starveClock{threshold: int64(max(threshold, time.Millisecond))}
	c.sample = []metrics.Sample{{Name: schedLatencies}}
	return c
}

// note counts the interval of length stall ending at now (unix
// nanoseconds) as starved, when stall reaches the threshold.
func (c *starveClock) note(now int64, stall int64) {
	if stall < c.threshold {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noteLocked(now, stall)
}

func (c *starveClock) noteLocked(now, stall int64) {
	from := max(now-stall, c.covered)
	if now > from {
		c.total.Add(now - from)
		c.covered = now
	}
}

// starved reads the scheduler's latencies (at most once a millisecond),
// counts the longest wait since the last reading when it reaches the
// threshold, and returns the total starved time.
func (c *starveClock) starved(now int64) int64 {
	if now-c.read.Load() < int64(time.Millisecond) || !c.mu.TryLock() {
		return c.total.Load() // read just now, or being read
	}
	defer c.mu.Unlock()
	c.read.Store(now)
	metrics.Read(c.sample)
	if c.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return c.total.Load() // not supported by this Go: the timers' lateness only
	}
	h := c.sample[0].Value.Float64Histogram()
	if c.prev != nil && len(c.prev) == len(h.Counts) {
		// The lower bound of the highest bucket that grew: a wait at
		// least that long ended since the last reading.
		for i := len(h.Counts) - 1; i >= 0; i-- {
			if h.Counts[i] > c.prev[i] {
				if w := int64(h.Buckets[i] * float64(time.Second)); w >= c.threshold {
					c.noteLocked(now, w)
				}
				break
			}
		}
	}
	c.prev = append(c.prev[:0], h.Counts...)
	return c.total.Load()
}

// starveCap is how many detection timeouts an input may stay silent
// while this process is starved before it counts as failed anyway: a
// process that never gets enough CPU still detects a failure, later. It
// is at least minStarveCap of wall time: a whole process stood still for
// a second now and then at load 30 on two cores (nine in-process workers
// with 10 ms boundaries, a detection timeout of 100 ms), and a cap of
// one second took live replicas for failed there.
const starveCap = 10

// minStarveCap is the least wall silence starveCap allows.
const minStarveCap = 5 * time.Second

// starveLimit is the wall silence past which an input is failed however
// starved this process was.
func starveLimit(detect time.Duration) int64 {
	return int64(max(starveCap*detect, minStarveCap))
}

// starveCap is the wall silence past which an input of the task is
// failed however starved its process was: starveLimit, less for an
// operator task of a replicated query (dcaaRun.starveCap).
func (t *task) starveCap() int64 {
	if d := t.dm; d != nil {
		return d.starveCap
	}
	return starveLimit(t.detectTimeout())
}

// starve is the runtime's starvation clock (created on first use: only
// DCAA tasks detect failures).
func (r *Runtime) starve() *starveClock {
	r.starveOnce.Do(func() { r.starveClk = newStarveClock(r.opts.DetectTimeout / 10) })
	return r.starveClk
}

// hear notes that the input heard its upstream replica at now (unix
// nanoseconds).
func (in *input) hear(now int64) {
	in.health.heardRun.Store(now - in.t.r.starve().starved(now))
	in.health.heard.Store(now)
}

// listenAfresh restarts the input's silence at now as counted over the
// time this process could run (the failure detector's own timer ran late:
// this process stood still), but not its wall silence: the task's
// starvation cap (task.starveCap) bounds that one. Restarting both
// (hear), a process starved again and again (load 25 on two cores: the
// detector's 25 ms timer more than half a detection timeout late every
// second or so) never counted an input silent, however long its replica
// had been unreachable: a worker partitioned from every other
// (TestReplicationWalk) and its consumers never took its replicas for
// failed, and the query never went tentative.
func (in *input) listenAfresh(now int64) {
	in.health.heardRun.Store(now - in.t.r.starve().starved(now))
}

// silence is how long the input has heard nothing at now, counted over
// the time this process could run; past the task's starvation cap of
// wall time it is the wall time (past starveLimit until some replica was
// heard: the start grace is longer than the cap, and upstream tasks
// starting late under load are no failure).
func (in *input) silence(now int64) int64 {
	wall := now - in.health.heard.Load()
	limit := in.t.starveCap()
	switch {
	case !in.health.spoke.Load():
		limit = max(limit, starveLimit(in.t.detectTimeout()))
	case in.t.dm != nil:
		// The machine times an input out a DetectLimit after the last
		// vouch for it (confirmHeard): vouching stops that much before
		// the cap, so that the cap bounds the detection itself.
		// (starveCapOf is at least dcaa.HealthLimitMax + Detect: at least one
		// detection timeout is left.)
		limit -= in.t.dm.limit.Load()
	}
	if wall > limit {
		return wall
	}
	return min(wall, now-in.t.r.starve().starved(now)-in.health.heardRun.Load())
}
