package drivers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDriver serves power for the registry's own tests: the protocol
// drivers are tested against real peers in drivers/bmc.
type fakeDriver struct {
	name string
	ep   func(Machine) *Endpoint
	err  error
	// gate, when set, holds each call until it is sent a value.
	gate               chan struct{}
	inside, maxInside  atomic.Int64
	entered, completed atomic.Int64
}

func (f *fakeDriver) Name() string                 { return f.name }
func (f *fakeDriver) Endpoint(m Machine) *Endpoint { return f.ep(m) }

func (f *fakeDriver) PowerState(ctx context.Context, m Machine) (PowerState, error) {
	n := f.inside.Add(1)
	defer f.inside.Add(-1)
	for {
		old := f.maxInside.Load()
		if n <= old || f.maxInside.CompareAndSwap(old, n) {
			break
		}
	}
	f.entered.Add(1)
	defer f.completed.Add(1)
	if f.gate != nil {
		<-f.gate
	}
	return PowerOn, f.err
}

func (f *fakeDriver) SetPower(ctx context.Context, m Machine, a PowerAction) (PowerState, error) {
	return f.PowerState(ctx, m)
}

func redfishEP(m Machine) *Endpoint { return m.Redfish }
func ipmiEP(m Machine) *Endpoint    { return m.IPMI }

func both() Machine {
	return Machine{NodeID: "nod_1", SiteID: "sit_1", Redfish: &Endpoint{Address: "https://10.0.0.5"}, IPMI: &Endpoint{Address: "10.0.0.5"}}
}

func TestRegistryResolvesBindings(t *testing.T) {
	rf := &fakeDriver{name: DriverRedfish, ep: redfishEP}
	ipmi := &fakeDriver{name: DriverIPMI, ep: ipmiEP}
	r := NewRegistry(Limits{}, nil, rf, ipmi)
	ctx := context.Background()

	m := both()
	if _, served, err := r.PowerState(ctx, m); err != nil || served != DriverRedfish {
		t.Fatalf("unbound: served by %q, %v; want redfish/v1 (the first)", served, err)
	}
	m.Bindings = map[Concern]string{ConcernPower: DriverIPMI}
	if _, served, err := r.PowerState(ctx, m); err != nil || served != DriverIPMI {
		t.Fatalf("bound to ipmi: served by %q, %v", served, err)
	}
	m.IPMI = nil
	if _, _, err := r.PowerState(ctx, m); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("bound to a protocol without an endpoint: %v, want ErrUnsupported", err)
	}
	m.Bindings[ConcernPower] = "vendor/v9"
	if _, _, err := r.PowerState(ctx, m); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("bound to an unknown driver: %v, want ErrUnsupported", err)
	}
	// Neither fake serves inspection.
	if _, _, err := r.Inspect(ctx, both()); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a concern no driver serves: %v, want ErrUnsupported", err)
	}
}

func TestRegistryFailsOverOnlyWhenUnavailable(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		err        error
		wantServed string
	}{
		{fmt.Errorf("%w: dial tcp: connection refused", ErrUnreachable), DriverIPMI},
		{fmt.Errorf("%w: 503", ErrTransient), DriverIPMI},
		{fmt.Errorf("%w: 401", ErrAuth), ""},
		{fmt.Errorf("%w: reads off", ErrNotApplied), ""},
		{errors.New("400: bad request"), ""},
	} {
		rf := &fakeDriver{name: DriverRedfish, ep: redfishEP, err: c.err}
		ipmi := &fakeDriver{name: DriverIPMI, ep: ipmiEP}
		_, served, err := NewRegistry(Limits{}, nil, rf, ipmi).SetPower(ctx, both(), ActionOn)
		if served != c.wantServed {
			t.Errorf("redfish failing with %v: served by %q, want %q", c.err, served, c.wantServed)
		}
		if c.wantServed == "" && !errors.Is(err, c.err) {
			t.Errorf("redfish failing with %v: the error is %v", c.err, err)
		}
	}
	// Both down: both errors are reported.
	rf := &fakeDriver{name: DriverRedfish, ep: redfishEP, err: ErrUnreachable}
	ipmi := &fakeDriver{name: DriverIPMI, ep: ipmiEP, err: fmt.Errorf("%w: no answer", ErrUnreachable)}
	if _, _, err := NewRegistry(Limits{}, nil, rf, ipmi).PowerState(ctx, both()); !errors.Is(err, ErrUnreachable) ||
		!containsAll(err.Error(), DriverRedfish, DriverIPMI) {
		t.Fatalf("both down: %v", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// waitFor is the package's one polling helper.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Calls past a limit wait; each release lets exactly the next one in.
func TestRegistryLimitsCallsInFlight(t *testing.T) {
	for _, c := range []struct {
		name            string
		limits          Limits
		machines, calls int
		want            int64
	}{
		{"per BMC", Limits{PerBMC: 2, PerSite: 100}, 1, 7, 2},
		{"per site", Limits{PerBMC: 5, PerSite: 3}, 4, 12, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &fakeDriver{name: DriverRedfish, ep: redfishEP, gate: make(chan struct{})}
			r := NewRegistry(c.limits, nil, d)
			var wg sync.WaitGroup
			for i := 0; i < c.calls; i++ {
				m := Machine{NodeID: "n", SiteID: "sit_1", Redfish: &Endpoint{Address: fmt.Sprintf("https://10.0.0.%d", i%c.machines)}}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, _, err := r.PowerState(context.Background(), m); err != nil {
						t.Error(err)
					}
				}()
			}
			waitFor(t, "the first calls to enter", func() bool { return d.entered.Load() == c.want })
			for i := 1; i <= c.calls; i++ {
				d.gate <- struct{}{}
				waitFor(t, "a call to complete", func() bool { return d.completed.Load() == int64(i) })
				if want := min(int64(c.calls), int64(i)+c.want); i < c.calls {
					waitFor(t, "the next call to enter", func() bool { return d.entered.Load() == want })
				}
			}
			wg.Wait()
			if got := d.maxInside.Load(); got != c.want {
				t.Fatalf("%d calls were in flight at most, want %d", got, c.want)
			}
		})
	}
}

func TestRegistryWaitForASlotEndsWithTheContext(t *testing.T) {
	d := &fakeDriver{name: DriverRedfish, ep: redfishEP, gate: make(chan struct{})}
	r := NewRegistry(Limits{PerBMC: 1}, nil, d)
	m := both()
	done := make(chan struct{})
	go func() { defer close(done); _, _, _ = r.PowerState(context.Background(), m) }()
	waitFor(t, "the first call to enter", func() bool { return d.entered.Load() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := r.PowerState(ctx, m); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call waiting for a slot, cancelled: %v", err)
	}
	d.gate <- struct{}{}
	<-done
}

func TestWriteAndReadBack(t *testing.T) {
	p := Policy{ReadBackFor: 50 * time.Millisecond, ReadBackInterval: time.Millisecond, RetryInterval: time.Millisecond, RetryFor: time.Second}
	ctx := context.Background()

	// Applied at the second write.
	writes, state := 0, "off"
	err := WriteAndReadBack(ctx, p, "power on", func() error {
		writes++
		if writes == 2 {
			state = "on"
		}
		return nil
	}, func() (bool, string, error) { return state == "on", state, nil })
	if err != nil || writes != 2 {
		t.Fatalf("applied at the second write: %v after %d writes", err, writes)
	}

	// Never applied.
	writes = 0
	err = WriteAndReadBack(ctx, p, "power on", func() error { writes++; return nil },
		func() (bool, string, error) { return false, "off", nil })
	if !errors.Is(err, ErrNotApplied) || writes != 3 || !strings.Contains(err.Error(), `"off"`) {
		t.Fatalf("never applied: %v after %d writes", err, writes)
	}

	// A transient write failure is retried; a refused one is not.
	writes = 0
	err = WriteAndReadBack(ctx, p, "power on", func() error {
		writes++
		if writes < 3 {
			return ErrTransient
		}
		return nil
	}, func() (bool, string, error) { return true, "on", nil })
	if err != nil || writes != 3 {
		t.Fatalf("transient writes: %v after %d writes", err, writes)
	}
	// Reads that keep failing are not a dropped write.
	err = WriteAndReadBack(ctx, p, "power on", func() error { return nil },
		func() (bool, string, error) { return false, "", fmt.Errorf("%w: 503", ErrTransient) })
	if !errors.Is(err, ErrTransient) || errors.Is(err, ErrNotApplied) {
		t.Fatalf("failing reads: %v, want ErrTransient", err)
	}
	writes = 0
	err = WriteAndReadBack(ctx, p, "power on", func() error { writes++; return ErrAuth },
		func() (bool, string, error) { return true, "on", nil })
	if !errors.Is(err, ErrAuth) || writes != 1 {
		t.Fatalf("refused write: %v after %d writes", err, writes)
	}
}
