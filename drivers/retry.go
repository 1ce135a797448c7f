package drivers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy bounds a driver's retries and read-backs. The zero value takes
// the defaults.
type Policy struct {
	// RetryFor bounds the retries of one transient failure (default 20s).
	RetryFor time.Duration
	// RetryInterval is the first wait between retries; later waits grow
	// (default 200ms).
	RetryInterval time.Duration
	// ReadBackFor is how long reads wait for one write to show (default
	// 30s: a BMC may take seconds to apply a power change).
	ReadBackFor time.Duration
	// ReadBackInterval is the first wait between reads (default 100ms).
	ReadBackInterval time.Duration
	// Writes is how many times a write that does not read back is
	// issued before ErrNotApplied (default 3).
	Writes int
}

// WithDefaults fills the zero fields.
func (p Policy) WithDefaults() Policy {
	if p.RetryFor <= 0 {
		p.RetryFor = 20 * time.Second
	}
	if p.RetryInterval <= 0 {
		p.RetryInterval = 200 * time.Millisecond
	}
	if p.ReadBackFor <= 0 {
		p.ReadBackFor = 30 * time.Second
	}
	if p.ReadBackInterval <= 0 {
		p.ReadBackInterval = 100 * time.Millisecond
	}
	if p.Writes <= 0 {
		p.Writes = 3
	}
	return p
}

func (p Policy) backoff(initial time.Duration) backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = initial
	b.MaxInterval = 10 * initial
	return b
}

// Retry runs op until it succeeds, fails with anything but ErrTransient,
// or the policy's RetryFor is spent (then the last transient error).
func Retry[T any](ctx context.Context, p Policy, op func() (T, error)) (T, error) {
	p = p.WithDefaults()
	return backoff.Retry(ctx, func() (T, error) {
		v, err := op()
		if err != nil && !errors.Is(err, ErrTransient) {
			return v, backoff.Permanent(err)
		}
		return v, err
	}, backoff.WithBackOff(p.backoff(p.RetryInterval)), backoff.WithMaxElapsedTime(p.RetryFor))
}

// errNotYet is a read that does not show the write yet.
var errNotYet = errors.New("not yet")

// WriteAndReadBack issues write (retrying transient failures), then reads
// with check until it reports the change applied. A BMC may acknowledge a
// write and drop it, so a write whose reads never show it is issued again,
// up to Writes times, and then fails with ErrNotApplied naming what the
// last read saw. check answers whether the change shows and what it read.
func WriteAndReadBack(ctx context.Context, p Policy, what string, write func() error, check func() (bool, string, error)) error {
	p = p.WithDefaults()
	seen := ""
	for n := 1; n <= p.Writes; n++ {
		if _, err := Retry(ctx, p, func() (struct{}, error) { return struct{}{}, write() }); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		_, err := backoff.Retry(ctx, func() (struct{}, error) {
			ok, s, err := check()
			switch {
			case err != nil && errors.Is(err, ErrTransient):
				return struct{}{}, err
			case err != nil:
				return struct{}{}, backoff.Permanent(err)
			}
			seen = s
			if !ok {
				return struct{}{}, errNotYet
			}
			return struct{}{}, nil
		}, backoff.WithBackOff(p.backoff(p.ReadBackInterval)), backoff.WithMaxElapsedTime(p.ReadBackFor))
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case !errors.Is(err, errNotYet) && !errors.Is(err, ErrTransient):
			return fmt.Errorf("%s: reading back: %w", what, err)
		}
	}
	return wrapf(ErrNotApplied, "%s: acknowledged %d times, the BMC still reads %q", what, p.Writes, seen)
}
