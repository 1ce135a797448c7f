// Package testutil holds what tests share that is not the database harness
// (internal/testenv): today, the one way a test waits for something to
// happen. Production packages must not import it; tools/importcheck fails
// `make lint` when one does.
//
// A test that waits polls for the effect it expects instead of sleeping for
// a guessed time, so it passes as soon as the effect is there and fails only
// when it never comes. This package is the one place test code sleeps.
package testutil

import (
	"context"
	"testing"
	"time"
)

// Interval is the pause between two checks of a condition: short enough
// that a wait ends soon after its condition holds, long enough that a
// condition querying the database does not busy it.
const Interval = 20 * time.Millisecond

// Eventually checks cond every Interval until it is true, and fails t if it
// is still false after timeout; what names the awaited effect in the
// failure ("the row to reach the replica"). cond runs on the caller's
// goroutine, so it may call t.Fatal itself.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if !Until(ctx, cond) {
		t.Fatalf("after %v, still waiting for %s", timeout, what)
	}
}

// EventuallyNil checks check every Interval until it returns nil, and fails
// t with the last error if it has not after timeout: the error says how far
// things got.
func EventuallyNil(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	var last error
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if !Until(ctx, func() bool { last = check(); return last == nil }) {
		t.Fatalf("after %v: %v", timeout, last)
	}
}

// Until checks cond every Interval until it is true (it answers true) or
// ctx ends (it answers false, without a last check). It is for a caller
// that bounds the wait by a context it already has, or that must not fail
// the test from the goroutine it runs on.
func Until(ctx context.Context, cond func() bool) bool {
	if cond() {
		return true
	}
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
			if cond() {
				return true
			}
		}
	}
}
