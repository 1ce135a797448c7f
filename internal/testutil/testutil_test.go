package testutil

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf records the failure and ends the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	failed atomic.Bool
	msg    atomic.Value
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed.Store(true)
	r.msg.Store(format)
	panic(r)
}

// run calls f on r and swallows the panic Fatalf uses to stop it.
func run(r *recorder, f func()) {
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
	}()
	f()
}

func TestEventuallyReturnsOnceTrue(t *testing.T) {
	var n atomic.Int32
	r := &recorder{TB: t}
	run(r, func() {
		Eventually(r, time.Minute, "the third check", func() bool { return n.Add(1) >= 3 })
	})
	if r.failed.Load() || n.Load() != 3 {
		t.Fatalf("failed %v after %d checks; want success on the third", r.failed.Load(), n.Load())
	}
}

func TestEventuallyFailsWhenNeverTrue(t *testing.T) {
	r := &recorder{TB: t}
	run(r, func() { Eventually(r, 3*Interval, "nothing", func() bool { return false }) })
	if !r.failed.Load() {
		t.Fatal("Eventually of a false condition did not fail the test")
	}
}

func TestEventuallyNilReportsTheLastError(t *testing.T) {
	r := &recorder{TB: t}
	var n atomic.Int32
	run(r, func() {
		EventuallyNil(r, 3*Interval, func() error {
			n.Add(1)
			return errors.New("still 2 of 3 nodes")
		})
	})
	if !r.failed.Load() || n.Load() < 2 {
		t.Fatalf("failed %v after %d checks; want a failure after several", r.failed.Load(), n.Load())
	}
	if f, _ := r.msg.Load().(string); !strings.Contains(f, "%v") {
		t.Fatalf("message format %q does not carry the last error", f)
	}
}

func TestUntilStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Until(ctx, func() bool { return false }) {
		t.Fatal("Until answered true for a false condition")
	}
	if !Until(ctx, func() bool { return true }) {
		t.Fatal("Until did not check a true condition before looking at ctx")
	}
}
