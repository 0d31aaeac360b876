package worker

import (
	"context"
	"sync"
	"time"

	pb "github.com/fedstream/fedstream/rpc/fedstreampb"
	wrt "github.com/fedstream/fedstream/worker/runtime"
)

// The health manager's sensors (issue 14): every task's figures over
// windows of SensorWindow (one second by default), whatever the
// heartbeat interval.
//
// The sensor goroutine reads the tasks' counters at the end of each
// window (aligned to multiples of the window on the wall clock, so the
// windows of an org's workers end together) and turns two readings into
// one window per task: rates, busy share and blocked time over the
// window, levels (queue, backlog) at its end, and the key slots sampled
// during it. Closed windows queue until a heartbeat delivers them; the
// heartbeat is sent as soon as a window closes (and at least every
// quarter of the TTL), so the leader has each second's figures about a
// second after they were taken. A heartbeat that fails leaves its windows
// queued for the next (at most maxSensorRounds of them: older ones are
// dropped, a policy has no use for them after so long).

// DefaultSensorWindow is the sensor window when Config.SensorWindow is 0.
const DefaultSensorWindow = time.Second

// maxSensorRounds bounds the closed windows a worker keeps for delivery.
const maxSensorRounds = 10

// sensors holds the readings and the closed windows not yet delivered.
type sensors struct {
	mu sync.Mutex
	// last is the previous reading of every task's figures.
	last map[string]statsReading
	// rounds are the windows closed and not yet delivered, one round (one
	// entry per task) per window, oldest first; latest is the newest round
	// ever closed, sent again while no new window closes.
	rounds [][]*pb.TaskStats
	latest []*pb.TaskStats
	// closed receives a value (without blocking) when a window closes.
	closed chan struct{}
	// window is the nominal window reported (window_ms): the leader
	// matches windows of one second by it. The rates are over the time
	// between the two readings, a little more when a tick was late.
	window time.Duration
}

func newSensors(window time.Duration) *sensors {
	return &sensors{last: map[string]statsReading{}, closed: make(chan struct{}, 1), window: window}
}

// statsReading is one reading of a task's figures and when it was taken.
type statsReading struct {
	s  wrt.TaskStats
	at time.Time
}

// sensorLoop closes a window at every multiple of the sensor window until
// ctx ends.
func (w *Worker) sensorLoop(ctx context.Context) {
	win := w.sensors.window
	timer := time.NewTimer(time.Until(time.Now().Truncate(win).Add(win)))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		now := time.Now()
		id, _, _ := w.identity()
		w.sensors.close(id, w.runtime.Stats(), w.runtime.TakeKeySamples(), now)
		// The next multiple of the window after now: a late tick (a
		// starved process) makes one longer window, not a burst of short
		// ones.
		timer.Reset(time.Until(now.Truncate(win).Add(win)))
	}
}

// close turns a reading of the tasks' figures into one window per task
// read before (a task seen for the first time, or restarted since, has
// no window yet), queues the round and says so on closed.
func (s *sensors) close(workerID string, stats []wrt.TaskStats, samples []wrt.KeySamples, now time.Time) {
	s.mu.Lock()
	round := withKeySamples(s.rates(workerID, stats, now), samples)
	s.latest = round
	s.rounds = append(s.rounds, round)
	if len(s.rounds) > maxSensorRounds {
		s.rounds = s.rounds[len(s.rounds)-maxSensorRounds:]
	}
	s.mu.Unlock()
	select {
	case s.closed <- struct{}{}:
	default:
	}
}

// rates turns a reading of the tasks' figures into windows against the
// previous reading, and keeps it for the next. Callers hold s.mu (or own
// s alone).
func (s *sensors) rates(workerID string, stats []wrt.TaskStats, now time.Time) []*pb.TaskStats {
	next := make(map[string]statsReading, len(stats))
	out := make([]*pb.TaskStats, 0, len(stats))
	for _, st := range stats {
		next[st.TaskID] = statsReading{s: st, at: now}
		p, ok := s.last[st.TaskID]
		if !ok || !rateable(p.s, st) || !now.After(p.at) {
			continue
		}
		d := now.Sub(p.at)
		secs := d.Seconds()
		nominal := s.window
		if nominal <= 0 {
			nominal = d
		}
		busy := min(1, float64(st.BusyNanos-p.s.BusyNanos)/1e9/secs)
		out = append(out, &pb.TaskStats{Task: st.TaskID, Worker: workerID, Queue: int64(st.Queue), OutputBufferBytes: st.OutputBytes,
			UnackedTuples: st.Unacked, SubscriptionSwitches: int64(st.Switches), ReportedAtMs: now.UnixMilli(),
			WindowMs: max(1, nominal.Milliseconds()),
			InTps:    float64(st.InTuples-p.s.InTuples) / secs,
			OutTps:   float64(st.OutTuples-p.s.OutTuples) / secs,
			Busy:     busy,
			// Processing time is the CPU a task uses, near enough: a
			// task processes on one goroutine.
			CpuSecondsPerS:     busy,
			BackpressureMsPerS: float64(st.BlockedNanos-p.s.BlockedNanos) / 1e6 / secs,
			SourceLagS:         st.SourceLag.Seconds(),
			OpenBusyS:          float64(st.OpenBusyNanos) / 1e9,
		})
		for _, h := range st.Held {
			ts := out[len(out)-1]
			ts.Held = append(ts.Held, &pb.HealthHeldBacklog{Fragment: h.Fragment, Partition: int32(h.Partition), Tuples: h.Tuples})
		}
	}
	s.last = next
	return out
}

// report returns what the next heartbeat carries: every round not yet
// delivered, oldest first, or the latest round again when none is new;
// n is the number of rounds to mark delivered once the heartbeat got
// through.
func (s *sensors) report() (tasks []*pb.TaskStats, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.rounds) == 0 {
		return s.latest, 0
	}
	for _, r := range s.rounds {
		tasks = append(tasks, r...)
	}
	return tasks, len(s.rounds)
}

// delivered drops the n oldest rounds (a heartbeat carried them).
func (s *sensors) delivered(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = min(n, len(s.rounds))
	s.rounds = s.rounds[n:]
}

// rateable reports whether two readings of a task are of the same copy
// with counters that only grew.
func rateable(a, b wrt.TaskStats) bool {
	return a.Generation == b.Generation && b.InTuples >= a.InTuples && b.OutTuples >= a.OutTuples &&
		b.BusyNanos >= a.BusyNanos && b.BlockedNanos >= a.BlockedNanos
}

// withKeySamples adds to each task's window the key slots it sampled
// during it (the health manager's data-skew sensor).
func withKeySamples(report []*pb.TaskStats, samples []wrt.KeySamples) []*pb.TaskStats {
	byTask := make(map[string]wrt.KeySamples, len(samples))
	for _, ks := range samples {
		byTask[ks.TaskID] = ks
	}
	for _, ts := range report {
		ks, ok := byTask[ts.Task]
		if !ok {
			continue
		}
		for _, k := range ks.Top {
			ts.KeySample = append(ts.KeySample, &pb.HealthKeySample{Fragment: k.Fragment, Slot: int32(k.Slot), Count: k.Count})
		}
		for _, n := range ks.Sampled {
			ts.KeysSampled += n
		}
	}
	return report
}
