package benchmark

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/trace"
	"slices"
	"sync"
	"time"
)

// The stall sampler: what a process was doing while a bench's output
// stalled. Each bench worker (and the parent) runs one. A goroutine
// wakes every stallTick and records every wake-up that came more than
// stallLate after the one before: for that long no goroutine of the
// process could run it (the process was descheduled, every P was busy,
// or the world was stopped). The collector's stop-the-world pauses come
// from runtime.MemStats (their end times and lengths), read when the
// events are asked for. A gap at the sink that every process shows as a
// late wake-up is the machine's; one that a single process shows, or a
// GC pause, is that process's.
const (
	stallTick = time.Millisecond
	stallLate = 4 * time.Millisecond
	// stallKeep bounds the late wake-ups kept (the oldest are dropped).
	stallKeep = 4096
)

// stallEvent is one interval a process was stalled, in Unix nanoseconds.
// Kind is "late" (a late wake-up of the sampler) or "gc" (a stop-the-
// world pause of the collector).
type stallEvent struct {
	Kind  string `json:"kind"`
	Start int64  `json:"start"`
	End   int64  `json:"end"`
}

// stallSampler records a process's late wake-ups until its context ends.
type stallSampler struct {
	mu   sync.Mutex
	late []stallEvent
	done chan struct{}
}

// startStallSampler starts a sampler whose goroutine ends with ctx (wait
// for it with stop's result).
func startStallSampler(ctx context.Context) *stallSampler {
	s := &stallSampler{done: make(chan struct{})}
	go s.run(ctx)
	return s
}

func (s *stallSampler) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(stallTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			// The tick's own time is when it was due; now is when this
			// goroutine ran.
			now = time.Now()
			if d := now.Sub(last); d > stallLate {
				s.mu.Lock()
				if len(s.late) == stallKeep {
					s.late = slices.Delete(s.late, 0, stallKeep/4)
				}
				s.late = append(s.late, stallEvent{Kind: "late", Start: last.UnixNano(), End: now.UnixNano()})
				s.mu.Unlock()
			}
			last = now
		}
	}
}

// events is the late wake-ups recorded so far and the process's recent
// GC pauses (the runtime keeps the last 256), by start.
func (s *stallSampler) events() []stallEvent {
	s.mu.Lock()
	out := slices.Clone(s.late)
	s.mu.Unlock()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	for i := range min(ms.NumGC, uint32(len(ms.PauseEnd))) {
		k := (ms.NumGC - 1 - i) % uint32(len(ms.PauseEnd))
		end := int64(ms.PauseEnd[k])
		out = append(out, stallEvent{Kind: "gc", Start: end - int64(ms.PauseNs[k]), End: end})
	}
	slices.SortFunc(out, func(a, b stallEvent) int { return int(a.Start - b.Start) })
	return out
}

// StallCause is what one process showed during a stall of the output:
// the longest late wake-up of its sampler that overlaps the stall, and
// the GC pauses that do.
type StallCause struct {
	Process  string  `json:"process"`
	LateMs   float64 `json:"late_ms"`
	GCPauses int     `json:"gc_pauses"`
	GCMs     float64 `json:"gc_ms"`
}

// stallCauses is, for the interval [from, to] (Unix nanoseconds), what
// each process's events overlapping it say; processes that show nothing
// are left out.
func stallCauses(from, to int64, procs []string, events [][]stallEvent) []StallCause {
	var out []StallCause
	for i, evs := range events {
		c := StallCause{Process: procs[i]}
		for _, e := range evs {
			if e.End < from || e.Start > to {
				continue
			}
			d := ms(time.Duration(e.End - e.Start))
			switch e.Kind {
			case "gc":
				c.GCPauses++
				c.GCMs = math.Round((c.GCMs+d)*100) / 100
			default:
				c.LateMs = max(c.LateMs, d)
			}
		}
		if c.LateMs > 0 || c.GCPauses > 0 {
			out = append(out, c)
		}
	}
	return out
}

// describeCauses is stallCauses as one line for the progress output.
func describeCauses(cs []StallCause) string {
	if len(cs) == 0 {
		return "no process stalled or paused for GC"
	}
	s := ""
	for i, c := range cs {
		if i > 0 {
			s += "; "
		}
		s += fmt.Sprintf("%s: late %.1f ms, %d GC pauses %.2f ms", c.Process, c.LateMs, c.GCPauses, c.GCMs)
	}
	return s
}

// flightRecorderAge is how much execution trace a bench worker's flight
// recorder keeps (opHello FlightRecorder): a write right after the live
// move holds the move and the second before it.
const flightRecorderAge = 3 * time.Second

// startFlightRecorder starts this process's flight recorder (only one
// may run in a process).
func startFlightRecorder() (*trace.FlightRecorder, error) {
	fr := trace.NewFlightRecorder(trace.FlightRecorderConfig{MinAge: flightRecorderAge, MaxBytes: 128 << 20})
	if err := fr.Start(); err != nil {
		return nil, fmt.Errorf("flight recorder: %w", err)
	}
	return fr, nil
}

// writeFlightRecording writes what fr holds to the file path.
func writeFlightRecording(fr *trace.FlightRecorder, path string) error {
	if fr == nil {
		return errors.New("trace_write: the worker was started without a flight recorder (hello flight_recorder)")
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := fr.WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("trace_write %s: %w", path, err)
	}
	return f.Close()
}
