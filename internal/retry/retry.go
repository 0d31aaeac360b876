// Package retry is the one retry helper of fedstream: exponential backoff
// with jitter, bounded by a context and optionally by a number of attempts.
// It is a leaf package (standard library only) so the coordinator, the
// worker and the runtime share it.
//
// Jitter spreads the retries of many callers that failed together (every
// worker after a leader change, every subscriber after a peer restart) so
// they do not hammer the recovered server in lock step.
package retry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Policy describes a backoff schedule. The zero value is usable: it takes
// the defaults named on each field.
type Policy struct {
	// Initial is the first delay (default 100ms).
	Initial time.Duration
	// Max caps every delay (default 5s; never below Initial).
	Max time.Duration
	// Multiplier grows the delay after each failure (default 2; values
	// below 1 are taken as 1).
	Multiplier float64
	// Jitter is the fraction of each delay that is random: a delay d is
	// drawn uniformly from [d*(1-Jitter), d]. 0 takes the default 0.2;
	// NoJitter disables it (tests that need exact delays).
	Jitter float64
}

// NoJitter as Policy.Jitter makes delays exact.
const NoJitter = -1

func (p Policy) filled() Policy {
	if p.Initial <= 0 {
		p.Initial = 100 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 5 * time.Second
	}
	p.Max = max(p.Max, p.Initial)
	if p.Multiplier < 1 {
		if p.Multiplier == 0 {
			p.Multiplier = 2
		} else {
			p.Multiplier = 1
		}
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = 0.2
	case p.Jitter < 0:
		p.Jitter = 0
	case p.Jitter > 1:
		p.Jitter = 1
	}
	return p
}

// Backoff is the state of one retry loop: the delay before the next
// attempt. It is not safe for concurrent use; each loop owns its own.
type Backoff struct {
	p    Policy
	next time.Duration
}

// New starts a backoff schedule at the policy's initial delay.
func (p Policy) New() *Backoff {
	p = p.filled()
	return &Backoff{p: p, next: p.Initial}
}

// Next returns the delay to wait before the next attempt (with jitter) and
// grows the schedule.
func (b *Backoff) Next() time.Duration {
	d := b.next
	grown := time.Duration(float64(b.next) * b.p.Multiplier)
	if grown > b.p.Max || grown < b.next { // cap, and guard overflow
		grown = b.p.Max
	}
	b.next = grown
	if b.p.Jitter > 0 {
		d -= time.Duration(rand.Float64() * b.p.Jitter * float64(d))
	}
	return d
}

// Reset returns the schedule to the initial delay, after a success.
func (b *Backoff) Reset() { b.next = b.p.Initial }

// Wait sleeps for Next() or until ctx is done, in which case it returns
// ctx.Err().
func (b *Backoff) Wait(ctx context.Context) error {
	return Sleep(ctx, b.Next())
}

// Sleep waits for d or until ctx is done, in which case it returns
// ctx.Err().
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// permanent marks an error that must not be retried.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so Do returns it at once instead of retrying. Do
// returns err itself, unwrapped.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// ErrAttemptsExhausted is wrapped (with the last attempt's error) by Do when
// every allowed attempt failed.
var ErrAttemptsExhausted = errors.New("retry attempts exhausted")

// Do calls fn until it succeeds, returns a Permanent error, ctx is done, or
// attempts calls have failed (attempts <= 0: no bound). Between attempts it
// waits per the policy. onRetry, if not nil, is called after each failure
// that will be retried, with the attempt number (1-based), the error and
// the coming delay: the place to log.
func Do(ctx context.Context, p Policy, attempts int, onRetry func(attempt int, err error, delay time.Duration), fn func(ctx context.Context) error) error {
	b := p.New()
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		var perm permanent
		if errors.As(err, &perm) {
			return perm.err
		}
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), err)
		}
		if attempts > 0 && attempt >= attempts {
			return errors.Join(ErrAttemptsExhausted, err)
		}
		d := b.Next()
		if onRetry != nil {
			onRetry(attempt, err, d)
		}
		if serr := Sleep(ctx, d); serr != nil {
			return errors.Join(serr, err)
		}
	}
}
