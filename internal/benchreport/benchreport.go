// Package benchreport is what every `fedstream bench` command shares to
// show itself to people: a progress reporter that prints one line on
// stderr per step of a run (scenario, round, elapsed time, a figure), and
// a PNG writer that draws figures per round as line charts (gonum/plot).
//
// A benchmark library takes a *Progress in its configuration and calls
// Step as it goes (a nil *Progress prints nothing, so libraries call it
// unconditionally); the command builds it with NewProgress(os.Stderr, ...)
// and, with --plot FILE, turns the result into Charts for WritePNG.
package benchreport

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Progress prints the progress of one benchmark run, one line per step:
//
//	bench dataplane [ 12.3s] forward        round 2/5  4.52 M records/s
//
// Safe for concurrent use. A nil *Progress does nothing.
type Progress struct {
	mu    sync.Mutex
	w     io.Writer
	name  string
	start time.Time
	now   func() time.Time
}

// NewProgress reports the run of the benchmark called name (e.g. "bench
// dataplane") on w, timing from now.
func NewProgress(w io.Writer, name string) *Progress {
	return &Progress{w: w, name: name, start: time.Now(), now: time.Now}
}

// Step reports that scenario finished (or started) round of rounds, with
// a short figure or note (may be empty). round <= 0 means a step outside
// the measured rounds, such as sizing; rounds <= 0 prints no total.
func (p *Progress) Step(scenario string, round, rounds int, figure string) {
	if p == nil {
		return
	}
	var r string
	switch {
	case round <= 0:
		r = "          "
	case rounds <= 0:
		r = fmt.Sprintf("round %-4d", round)
	default:
		r = fmt.Sprintf("round %d/%d", round, rounds)
	}
	p.printf("%-22s %-11s %s", scenario, r, figure)
}

// Note reports a free-form line (a phase starting, a warning).
func (p *Progress) Note(format string, args ...any) {
	if p == nil {
		return
	}
	p.printf(format, args...)
}

func (p *Progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	elapsed := p.now().Sub(p.start).Seconds()
	// Progress is best effort: a failing stderr must not fail the run.
	_, _ = fmt.Fprintf(p.w, "%s [%6.1fs] %s\n", p.name, elapsed, fmt.Sprintf(format, args...))
}

// Rate formats a rate with an SI prefix: "4.52 M records/s".
func Rate(perSecond float64, unit string) string {
	switch {
	case perSecond >= 1e9:
		return fmt.Sprintf("%.2f G %s/s", perSecond/1e9, unit)
	case perSecond >= 1e6:
		return fmt.Sprintf("%.2f M %s/s", perSecond/1e6, unit)
	case perSecond >= 1e3:
		return fmt.Sprintf("%.1f k %s/s", perSecond/1e3, unit)
	default:
		return fmt.Sprintf("%.1f %s/s", perSecond, unit)
	}
}
